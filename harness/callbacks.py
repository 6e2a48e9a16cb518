"""Hydra callback: results_dir checked before Hydra writes its job folder there, and one line
at the end of a sweep with how many runs were skipped, done, failed (exit code 1 if any failed)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from .config import path_problem, results_path
from .io.files import read_json


def refuse_unusable_results_dir(config: DictConfig) -> None:
    """Hydra creates its job folder under results_dir before the task starts: a results_dir
    that is a file, or under a file or a read-only place, would end there in a traceback. One
    line (as :func:`harness.app.main_entry` words an invalid config) and exit code 2 instead."""
    try:
        path = results_path(config)
    except Exception:  # an interpolation Hydra will report itself
        return
    problem = path_problem(path, writable=True)
    if problem:
        print(f"invalid config: results_dir must be a folder the harness can create and write ({problem}), "
              f"got {str(config.results_dir)!r}")
        raise SystemExit(2)


class SweepSummary(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unusable_results_dir(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unusable_results_dir(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        totals: dict[str, int] = {}
        for f in Path(config.hydra.sweep.dir).glob("*/outcome.json"):
            try:
                for k, v in read_json(f).items():  # harness.io.files: a regular file, bounded
                    totals[k] = totals.get(k, 0) + int(v)
            except (OSError, ValueError):
                continue
        if totals:
            listed = ", ".join(f"{v} {k}" for k, v in sorted(totals.items()) if v)
            print(f"[harness] sweep done: {listed} (skipped = already finished in {config.results_dir})")
        if totals.get("failed"):  # the other runs were done; the sweep as a whole did not succeed
            raise SystemExit(1)
