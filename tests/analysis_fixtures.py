"""Build synthetic results folders in the trainer's output contract (for analysis tests).

    RESULTS/<task>/<estimator>/seed<k>/{config.yaml, metrics.parquet, summary.json}
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Final level and learning speed per estimator: distinct so statistics have something to rank.
_LEVEL = {"ppo_gae": 0.95, "rloo": 0.7, "reinforce": 0.45, "grpo": 0.8, "a2c": 0.6}
_TASKS = {  # task -> (worst return, best return, samples per iteration factor)
    "CartPole-v1": (10.0, 500.0),
    "Acrobot-v1": (-500.0, -80.0),
}


def write_run(run_dir: Path, columns: dict, *, summary: dict | None = None,
              config: str | None = None, schema: pa.Schema | None = None) -> Path:
    """Write one run directory: metrics.parquet from ``columns``; summary.json if given."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns, schema=schema) if schema is not None else pa.table(columns)
    pq.write_table(table, run_dir / "metrics.parquet")
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (run_dir / "config.yaml").write_text(config)
    return run_dir


def curve_columns(task: str, estimator: str, seed: int, *, iterations: int = 40,
                  n_steps: int = 512, eval_every: int = 4, critic: bool = True,
                  gae_lambda: float | None = None, diverge_at: int | None = None) -> dict:
    """Plausible columns for one run: a noisy saturating return curve."""
    worst, best = _TASKS[task]
    rng = np.random.default_rng(zlib.crc32(f"{task}/{estimator}/{seed}".encode()))
    it = np.arange(iterations)
    env_steps = (it + 1) * n_steps
    level = _LEVEL.get(estimator, 0.5)
    frac = level * (1 - np.exp(-it / (8 + 4 * seed))) + rng.normal(0, 0.03, iterations)
    ep = worst + (best - worst) * np.clip(frac, 0, 1)
    ev = np.where(it % eval_every == eval_every - 1, ep + rng.normal(0, 5, iterations), np.nan)
    kl = np.abs(rng.normal(0.01, 0.004, iterations))
    if diverge_at is not None:
        ep[diverge_at:] = np.nan
        ev[diverge_at:] = np.nan
        kl[diverge_at - 1] = np.inf
        keep = slice(0, diverge_at)
    else:
        keep = slice(None)
    cols = {
        "run_id": [f"{task}-{estimator}-{seed}"] * iterations,
        "task": [task] * iterations,
        "estimator": [estimator] * iterations,
        "seed": np.full(iterations, seed, dtype=np.int64),
        "iteration": (it + 1).astype(np.int64),  # the harness logs iterations 1..n
        "env_steps": env_steps.astype(np.int64),
        "wall_time_s": (it + 1) * 0.5 + seed * 0.01,
        "episode_return": ep,
        "eval_return": ev,
        "gamma": np.full(iterations, 0.99),
        "gae_lambda": np.full(iterations, np.nan if gae_lambda is None else gae_lambda),
        "clip_eps": np.full(iterations, 0.2),
        "lr": np.full(iterations, 3e-4),
        "n_steps": np.full(iterations, n_steps, dtype=np.int64),
        "policy_loss": rng.normal(0, 0.1, iterations),
        "entropy": np.linspace(0.69, 0.3, iterations),
        "approx_kl": kl,
        "clip_frac": np.abs(rng.normal(0.1, 0.02, iterations)),
        "grad_norm": np.abs(rng.normal(1.0, 0.2, iterations)),
        "adv_mean": rng.normal(0, 0.01, iterations),
        "adv_std": np.ones(iterations),
    }
    if critic:
        cols["value_loss"] = np.abs(rng.normal(1.0, 0.3, iterations))
        cols["explained_variance"] = np.clip(np.linspace(0, 0.9, iterations), -1, 1)
    return {k: list(np.asarray(v)[keep]) if diverge_at is not None else v for k, v in cols.items()}


def _summary(run_id: str, status: str | None, iterations: int) -> dict | None:
    if status is None:
        return None
    return {"run_id": run_id, "status": status,
            "reason": "non-finite loss" if status == "diverged" else None,
            "final": {}, "wall_time_s": 1.0, "versions": {}, "git_commit": None,
            "iterations": iterations}


def make_sweep(root: Path, *, estimators=("ppo_gae", "rloo", "reinforce"),
               tasks=("CartPole-v1", "Acrobot-v1"), seeds=(0, 1, 2), extras: bool = False) -> Path:
    """A completed sweep: estimators x tasks x seeds. Runs log at different steps
    (n_steps differs per estimator), rloo/reinforce have no critic columns, and
    ppo_gae sweeps gae_lambda over seeds (0.9, 0.95, 0.95...).

    ``extras`` adds three CartPole-v1 runs with seed 3: ppo_gae diverged at iteration 15
    (status diverged, NaN returns after), rloo collapsed (rises, then falls to the start
    level), reinforce still running (no summary.json)."""
    root = Path(root)
    if extras:
        task = "CartPole-v1"
        cols = curve_columns(task, "ppo_gae", 3, iterations=40, diverge_at=15, gae_lambda=0.95)
        write_run(root / task / "ppo_gae" / "seed3", cols,
                  summary=_summary(f"{task}-ppo_gae-3", "diverged", 15))
        cols = curve_columns(task, "rloo", 3, iterations=53, n_steps=384, critic=False)
        ev = np.asarray(cols["eval_return"], dtype=float)
        late = np.arange(ev.size) >= 35
        cols["eval_return"] = np.where(late & np.isfinite(ev), 30.0, ev)
        write_run(root / task / "rloo" / "seed3", cols,
                  summary=_summary(f"{task}-rloo-3", "completed", 53))
        cols = curve_columns(task, "reinforce", 3, iterations=12, n_steps=640, critic=False)
        write_run(root / task / "reinforce" / "seed3", cols, summary=None)
    n_steps = {"ppo_gae": 512, "rloo": 384, "reinforce": 640}
    for task in tasks:
        for est in estimators:
            for seed in seeds:
                cols = curve_columns(task, est, seed, n_steps=n_steps.get(est, 500),
                                     iterations=int(20480 / n_steps.get(est, 500)),
                                     critic=est in ("ppo_gae", "a2c"),
                                     gae_lambda=(0.9 if seed == 0 else 0.95) if est == "ppo_gae" else None)
                write_run(root / task / est / f"seed{seed}", cols,
                          summary=_summary(f"{task}-{est}-{seed}", "completed",
                                           len(cols["iteration"])),
                          config=f"seed: {seed}\ntask:\n  name: {task}\nestimator:\n  name: {est}\n")
    return root


def run_analysis_cli(*args, timeout: int = 300):
    """``python -m analysis ARGS`` in a subprocess of this checkout (text output captured)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-m", "analysis", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=timeout)
