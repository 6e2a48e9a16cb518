"""A run's final score, defined once: the report's (``analysis.stats.final_scores``) and the
tuning objective's (``harness.tune.objective``).

Final score of one run (one seed of a run directory): the mean of its last ``last_n`` finite
``eval_return`` values by iteration, or of ``episode_return`` for a run that never evaluated;
NaN when neither has a finite value.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SCORE_COLUMNS = ("eval_return", "episode_return")


def score_column(run: pd.DataFrame) -> str | None:
    """The column a run is scored on: ``eval_return`` if it has a finite value, else ``episode_return``."""
    for col in SCORE_COLUMNS:
        if col in run and np.isfinite(run[col].to_numpy(dtype=float)).any():
            return col
    return None


def by_iteration(run: pd.DataFrame) -> pd.DataFrame:
    """One run's rows in iteration order: a stable sort, skipped where they are in that order
    already (as ``analysis.load`` gives them; 20,000 sorts were a tenth of a report on 10,000
    runs), which is the same rows in the same order."""
    if run["iteration"].is_monotonic_increasing:
        return run
    return run.sort_values("iteration", kind="stable")


def final_score(run: pd.DataFrame, last_n: int) -> tuple[float, str | None, int]:
    """``(score, column, n_points)`` of one run's rows (any order; sorted by iteration here)."""
    run = by_iteration(run)
    col = score_column(run)
    if col is None:
        return float("nan"), None, 0
    vals = run[col].to_numpy(dtype=float)
    vals = vals[np.isfinite(vals)][-last_n:]
    return float(vals.mean()), col, int(vals.size)


def run_dir_scores(path: Path, last_n: int) -> list[float]:
    """Final scores of the seeds in run directory ``path`` (none if it has no readable metrics)."""
    from .files import read_table  # the one reader of run files

    try:
        df = read_table(Path(path) / "metrics.parquet").to_pandas()
    except (OSError, ValueError):  # RunFileError is a ValueError
        return []
    if "seed" not in df or not len(df):
        return [final_score(df, last_n)[0]] if len(df) else []
    return [final_score(run, last_n)[0] for _, run in df.groupby("seed", dropna=False, sort=True)]
