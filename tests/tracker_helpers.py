"""What a tracker must hold, worked out from a run's metrics.parquet alone (tests/test_tensorboard.py,
tests/test_trackers.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in Path(root).rglob("metrics.parquet"))


def expected_from_parquet(run_dir: Path, cast: Callable[[float], float] = float) -> dict[str, list[tuple[int, float]]]:
    """column -> [(env_steps, value)] of every numeric non-null cell of metrics.parquet read with
    pandas (strings such as run_id or update are no values); ``cast`` rounds a value the way
    the tracker stores it (TensorBoard: float32)."""
    df = pd.read_parquet(Path(run_dir) / "metrics.parquet")
    out = {}
    for col in df.columns:
        if not (pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])):
            continue  # run_id, task, estimator, update, loss_agg
        rows = df[df[col].notna()]
        if len(rows):
            out[col] = [(int(s), float(cast(v))) for s, v in zip(rows["env_steps"], rows[col])]
    return out
