from .rundir import (
    RunDir, atomic_write_bytes, atomic_write_json, atomic_write_text, check_finished, config_hash,
    run_dir_for, run_status, versions,
)

__all__ = ["RunDir", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "check_finished",
           "config_hash", "run_dir_for", "run_status", "versions"]
