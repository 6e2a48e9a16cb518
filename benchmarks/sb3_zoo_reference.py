"""Published PPO returns beside the MuJoCo learning table: rl-baselines3-zoo's evaluation curves.

rl-baselines3-zoo publishes its trained agents with their training logs in the repository
DLR-RM/rl-trained-agents. For each agent, ``ppo/<env>_1/evaluations.npz`` is the file SB3's
``EvalCallback`` wrote while the agent trained: ``timesteps`` (every 25,000 env steps, 40 rows for
the 1M-step runs), ``results`` (the return of each of the 20 deterministic evaluation episodes at
each of them) and ``ep_lengths``. The Hopper-v3 and HalfCheetah-v3 agents were trained with the
same tuned hyperparameters as ``harness/conf/tuned/{hopper,halfcheetah}_ppo_gae.yaml`` (their
``config.yml``), one training seed each.

This script reads those two files from a checkout of that repository and writes
``benchmarks/data/sb3_zoo_ppo_eval.csv`` (one row per evaluation: env, timesteps, episodes, mean,
min, max), which ``benchmarks/mujoco_learning.py`` reads to put SB3's return at the table's budget
beside ours. The CSV is committed, so the table needs no network; this script is how it was made::

    git clone https://github.com/DLR-RM/rl-trained-agents
    python benchmarks/sb3_zoo_reference.py rl-trained-agents

The ``.npz`` files are read with ``allow_pickle=False`` (arrays only; nothing is unpickled).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "data" / "sb3_zoo_ppo_eval.csv"
ENVS = ("Hopper-v3", "HalfCheetah-v3")


def rows(checkout: Path) -> list[tuple[str, int, int, float, float, float]]:
    out = []
    for env in ENVS:
        with np.load(checkout / "ppo" / f"{env}_1" / "evaluations.npz", allow_pickle=False) as z:
            steps, results = z["timesteps"], z["results"]
        for t, r in zip(steps, results):
            out.append((env, int(t), int(r.size), float(r.mean()), float(r.min()), float(r.max())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", type=Path, help="a checkout of github.com/DLR-RM/rl-trained-agents")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    for env in ENVS:
        if not (args.checkout / "ppo" / f"{env}_1" / "evaluations.npz").is_file():
            print(f"sb3_zoo_reference: {args.checkout}/ppo/{env}_1/evaluations.npz: no such file (the argument "
                  "is a checkout of github.com/DLR-RM/rl-trained-agents)", file=sys.stderr)
            sys.exit(2)
    commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    data = rows(args.checkout)
    lines = [
        "# rl-baselines3-zoo's published PPO agents, evaluation during training (SB3 EvalCallback:",
        "# every 25,000 env steps, 20 deterministic episodes; one training seed per env; hyperparameters",
        "# as harness/conf/tuned/<task>_ppo_gae.yaml). Source: github.com/DLR-RM/rl-trained-agents at commit",
        f"# {commit}, files ppo/<env>_1/evaluations.npz.",
        "# Written by: python benchmarks/sb3_zoo_reference.py <checkout>",
        "env,timesteps,episodes,mean,min,max",
    ]
    lines += [f"{e},{t},{n},{m:.1f},{lo:.1f},{hi:.1f}" for e, t, n, m, lo, hi in data]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({len(data)} evaluations)")


if __name__ == "__main__":
    main()
