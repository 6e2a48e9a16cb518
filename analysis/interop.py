"""Scores in rliable's format (google-research/rliable; Agarwal et al. 2021): a dict
``estimator -> numpy array [runs x tasks]``, for ``rliable.library.get_interval_estimates`` and
the other rliable functions, or for :mod:`analysis.stats` (which reads the same matrices).

Each entry is a run's final score exactly as the report computes it
(:func:`analysis.stats.final_scores`: the mean of its last ``last_n`` evaluations; a diverged
run scored by the ``diverged`` rule), optionally min-max normalised within each task over all
runs of all estimators (:func:`analysis.stats.normalize_by_task`, the report's "all tasks"
scores). Estimator keys are the report's labels (:func:`analysis.load.label_variants`): runs of
one estimator that differ in ``update`` or ``loss_agg`` are separate keys, never pooled.

Columns are tasks, in the order of ``tasks`` (default: every task of the frame, sorted by name).
Rows are an estimator's runs of each task ordered by seed (then run directory); rliable's
stratified bootstrap resamples the runs of each task independently, so row ``i`` of two tasks
need not be the same seed. rliable needs the same number of runs for every task of an estimator:
``ragged="error"`` (the default) refuses a matrix with a missing or unscored run, naming the
estimator and the counts; ``ragged="nan"`` pads short columns with NaN (:mod:`analysis.stats`
drops NaNs; rliable's functions do not).

The ``.npz`` (:func:`write_rliable_npz`, ``python -m analysis rliable``) holds one array per
estimator under its label and the task names under ``_tasks``; :func:`read_rliable_npz` gives
``(scores, tasks)`` back.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from harness.io import atomic_write_bytes

from . import stats
from .load import label_variants, load
from .options import RAGGED

__all__ = ["RAGGED", "TASKS_KEY", "rliable_scores", "score_matrices", "write_rliable_npz", "read_rliable_npz"]

TASKS_KEY = "_tasks"  # the .npz entry holding the column (task) names
_NPZ_RESERVED = (TASKS_KEY, "file", "allow_pickle")  # keys np.savez or this format use itself


def rliable_scores(results: str | os.PathLike | pd.DataFrame, *, last_n: int = 5,
                   diverged: str = stats.DEFAULT_DIVERGED, normalize: bool = False,
                   tasks: Sequence[str] | None = None, ragged: str = "error") -> dict[str, np.ndarray]:
    """``{estimator: scores[run, task]}`` (float64) of a results folder or of a frame loaded
    with :func:`analysis.load` (module docstring for rows, columns and ``ragged``).

    Raises ``ValueError`` naming the argument for a bad ``ragged``, ``diverged``, ``last_n`` or
    an unknown task, when nothing is scored, and under ``ragged="error"`` for a ragged matrix.
    """
    return score_matrices(results, last_n=last_n, diverged=diverged, normalize=normalize, tasks=tasks,
                          ragged=ragged)[0]


def score_matrices(results: str | os.PathLike | pd.DataFrame, *, last_n: int = 5,
                   diverged: str = stats.DEFAULT_DIVERGED, normalize: bool = False,
                   tasks: Sequence[str] | None = None,
                   ragged: str = "error") -> tuple[dict[str, np.ndarray], list[str]]:
    """:func:`rliable_scores` and the task names of its columns."""
    if ragged not in RAGGED:
        raise ValueError(f"ragged must be one of {list(RAGGED)}, got {ragged!r}")
    if not (isinstance(last_n, int) and last_n >= 1):
        raise ValueError(f"last_n must be an integer >= 1, got {last_n!r}")
    df = results if isinstance(results, pd.DataFrame) else load(results)
    runs = stats.final_scores(label_variants(df), last_n=last_n, diverged=diverged)
    if runs.empty:
        raise ValueError("no finished, scoreable run to put in a score matrix")
    if normalize:
        runs = runs.assign(score=stats.normalize_by_task(runs, "score"))
    known = sorted(runs["task"].unique())
    if tasks is None:
        tasks = known
    else:
        tasks = list(tasks)
        unknown = [t for t in tasks if t not in known]
        if unknown or not tasks:
            raise ValueError(f"tasks must be a non-empty list of tasks among {known}, got {tasks!r}")
    runs = runs.sort_values(["seed", "run_dir"], kind="stable")
    out = {}
    for est, g in runs.groupby("estimator", sort=True):
        columns = [g.loc[g["task"] == t, "score"].to_numpy(dtype=float) for t in tasks]
        scored = [int(np.isfinite(c).sum()) for c in columns]
        if ragged == "error" and (len(set(scored)) > 1 or any(c.size != n for c, n in zip(columns, scored))):
            counts = ", ".join(f"{t}: {n}" + (f" of {c.size}" if c.size != n else "")
                               for t, c, n in zip(tasks, columns, scored))
            raise ValueError(f"ragged must be 'nan' for this folder (rliable needs as many scored runs on every "
                             f"task): estimator {est} has scored runs {counts}")
        rows = max(c.size for c in columns)
        m = np.full((rows, len(tasks)), np.nan)
        for j, c in enumerate(columns):
            m[:c.size, j] = c
        out[str(est)] = m
    return out, tasks


def write_rliable_npz(path: str | os.PathLike, scores: Mapping[str, np.ndarray], tasks: Sequence[str]) -> Path:
    """Write ``scores`` (as from :func:`rliable_scores`) and the column names ``tasks`` to an
    ``.npz`` (atomically; no pickled objects). Returns the path."""
    path = Path(path)
    clash = [k for k in scores if k in _NPZ_RESERVED]
    if clash:
        raise ValueError(f"estimator names must not be one of {list(_NPZ_RESERVED)} in an .npz, got {clash[0]!r}")
    for k, m in scores.items():
        if np.ndim(m) != 2 or np.shape(m)[1] != len(tasks):
            raise ValueError(f"scores[{k!r}] must be [runs x {len(tasks)} tasks], got shape {np.shape(m)}")
    buf = io.BytesIO()
    np.savez(buf, **{TASKS_KEY: np.array(list(tasks), dtype=str)},
             **{k: np.asarray(m, dtype=float) for k, m in scores.items()})
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_rliable_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], list[str]]:
    """``(scores, tasks)`` of an .npz written by :func:`write_rliable_npz`."""
    with np.load(path, allow_pickle=False) as z:
        tasks = [str(t) for t in z[TASKS_KEY]]
        return {k: z[k] for k in z.files if k != TASKS_KEY}, tasks
