"""Hydra callback: results_dir checked before Hydra writes its job folder there, and one line
at the end of a sweep with how many runs were skipped, done, failed (exit code 1 if any failed)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .config import error_line, expand_path, path_problem, results_path


def refuse_unusable_results_dir(config: DictConfig, job_dir: str | None = None) -> None:
    """Hydra creates its job folder under results_dir before the task starts: a results_dir
    that is a file, or under a file or a read-only place, would end there in a traceback; so
    would any component of the job folder's path Hydra cannot make (a name longer than the file
    system takes, a symlink loop, a dangling symlink, ``results_dir/.hydra`` a regular file).
    ``job_dir``: the key of the job folder (``hydra.run.dir`` or ``hydra.sweep.dir``), whose
    whole path is checked too (:func:`harness.config.path_problem`). One line (as
    :func:`harness.app.main_entry` words an invalid config) and exit code 2 instead."""
    try:
        path = results_path(config)
    except Exception as exc:  # an unresolvable interpolation (${oc.env:UNSET}): Hydra's traceback
        print(f"invalid config: {error_line(exc)}")
        raise SystemExit(2)
    problem = path_problem(path, writable=True)
    field = "results_dir"
    if not problem and job_dir is not None:
        try:
            folder = expand_path(OmegaConf.select(config, job_dir, default=None))
        except Exception as exc:  # e.g. hydra.run.dir=${oc.env:UNSET}
            print(f"invalid config: {error_line(exc)}")
            raise SystemExit(2)
        if folder and folder != "None":
            inside = os.path.abspath(folder).startswith(os.path.join(os.path.abspath(path), ""))
            problem = path_problem(path, writable=True, below=os.path.relpath(folder, path)) if inside \
                else path_problem(folder, writable=True)
            field = "results_dir" if inside else job_dir
    if problem:
        print(f"invalid config: {field} must be a folder the harness can create and write ({problem}), "
              f"got {str(config[field] if field == 'results_dir' else OmegaConf.select(config, field))!r}")
        raise SystemExit(2)


def refuse_bad_launcher(config: DictConfig) -> None:
    """Launcher settings the launcher would refuse with a traceback after the sweep started:
    ``hydra.launcher.n_jobs`` (joblib) must be a non-zero integer (-1: every core) or null. One
    line and exit code 2 instead."""
    n_jobs = OmegaConf.select(config, "hydra.launcher.n_jobs", default=None)
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs == 0):
        print("invalid config: hydra.launcher.n_jobs must be a non-zero integer (n parallel jobs; -1 every "
              f"core, -2 all but one, ...) or null, got {n_jobs!r}")
        raise SystemExit(2)


class SweepSummary(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unusable_results_dir(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_bad_launcher(config)
        refuse_unusable_results_dir(config, "hydra.sweep.dir")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        totals: dict[str, int] = {}
        for f in Path(config.hydra.sweep.dir).glob("*/outcome.json"):
            try:
                for k, v in json.loads(f.read_text()).items():
                    totals[k] = totals.get(k, 0) + int(v)
            except (OSError, ValueError):
                continue
        if totals:
            listed = ", ".join(f"{v} {k}" for k, v in sorted(totals.items()) if v)
            print(f"[harness] sweep done: {listed} (skipped = already finished in {config.results_dir})")
        if totals.get("failed"):  # the other runs were done; the sweep as a whole did not succeed
            raise SystemExit(1)
