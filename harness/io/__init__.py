from . import schema
from .rundir import (
    RunDir, atomic_write_bytes, atomic_write_json, atomic_write_text, check_finished, config_hash,
    run_dir_for, run_status, versions,
)
from .schema import METRIC_COLUMNS, REQUIRED, metric_schema, missing_required

__all__ = ["RunDir", "atomic_write_bytes", "atomic_write_json", "atomic_write_text", "check_finished",
           "config_hash", "run_dir_for", "run_status", "versions",
           "schema", "METRIC_COLUMNS", "REQUIRED", "metric_schema", "missing_required"]
