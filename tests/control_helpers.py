"""Compose configs the way ``python -m harness`` does, with tiny budgets: :func:`harness.testing.compose`
(the registry's contract tests use the same), so ``--pg-searchpath`` reaches these tests too."""
import json
from pathlib import Path

import pandas as pd

from harness.app import run
from harness.testing import TINY
from harness.testing import compose as make_cfg

CONF = str(Path(__file__).resolve().parents[1] / "harness" / "conf")


def run_frames(root, seed: int) -> tuple[str, pd.DataFrame]:
    """The run folder name and the metrics (wall clock dropped) of seed ``seed``'s run below ``root``."""
    (p,) = Path(root).rglob(f"seed{seed}-*/metrics.parquet")
    return p.parent.name, pd.read_parquet(p).drop(columns=["wall_time_s"])


def population_against_lone_runs(common: list[str], root, n: int = 3, **tolerance) -> dict[int, tuple[dict, pd.DataFrame]]:
    """Train ``common`` as a population of ``n`` (seed 0) under ``root/pop`` and each seed as a lone
    run under ``root/lone``; assert that every member writes its lone run's folder, outcome (status,
    reason, iterations), samples (budget use and episode returns, exactly) and metrics
    (``pandas.testing.assert_frame_equal`` with ``tolerance``).
    Returns each seed's lone ``(outcome, metrics)``."""
    root = Path(root)
    run(make_cfg(common + ["seed=0", f"population={n}", f"results_dir={root}/pop"]))
    out = {}
    for seed in range(n):
        run(make_cfg(common + [f"seed={seed}", f"results_dir={root}/lone"]))
        outcome = {}
        for kind in ("pop", "lone"):
            (s,) = (root / kind).rglob(f"seed{seed}-*/summary.json")
            outcome[kind] = {k: json.loads(s.read_text())[k] for k in ("status", "reason", "iterations")}
        (name_p, a), (name_l, b) = run_frames(root / "pop", seed), run_frames(root / "lone", seed)
        assert name_p == name_l and outcome["pop"] == outcome["lone"], seed
        assert a["env_steps"].equals(b["env_steps"]) and a["episode_return"].equals(b["episode_return"])  # same samples
        pd.testing.assert_frame_equal(a, b, check_exact=False, **tolerance)
        out[seed] = (outcome["lone"], b)
    return out


__all__ = ["CONF", "TINY", "make_cfg", "population_against_lone_runs", "run_frames"]
