"""MuJoCo learning table (issue 18): ppo_gae and three other estimators on Hopper-v5 and
HalfCheetah-v5, 5 seeds each as one population, at a budget this machine affords (state it).

ppo_gae runs with rl-baselines3-zoo's tuned preset for the task (``conf/tuned/<task>_ppo_gae.yaml``,
loaded by itself); a2c, baseline (REINFORCE with a learned baseline) and rloo with their own
defaults on the task presets (CleanRL's sizes: one env, 2048 steps per iteration, observation and
reward normalisation). Each run ends with a 10-episode greedy evaluation (its final return); the
table gives per task and estimator the median final return over seeds (min, max), the mean
training-episode return over the run (the area under the training curve), and the diverged
count. Two populations train at a time (joblib, one thread each); a rerun reuses finished runs.

Published PPO returns on these tasks (rl-baselines3-zoo, CleanRL) are at 1M steps; this table's
default budget is 100k (51 minutes on 2 cores, shared part of the time with another job), so it
is not compared with them.

Usage: python benchmarks/mujoco_learning.py [--out results/mujoco_learning] [--steps 100000]
       [--seeds 5] [--tasks hopper,halfcheetah] [--estimators ppo_gae,a2c,baseline,rloo]
       [--table-only] [--docs]
``--docs`` also writes the table into docs/continuous.md (block ``mujoco-learning``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._docs import write_block  # noqa: E402
from benchmarks.control_learning import sweep  # noqa: E402  (the one sweep command of the learning tables)


def table(out: str, tasks: list[str], estimators: list[str]) -> str:
    import analysis

    df = analysis.load(out)
    lines = [f"| task | estimator | seeds | env steps | final eval return, median (min, max) | "
             "mean training return | diverged |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for task in tasks:
        for est in estimators:
            d = df[(df["task"] == task) & (df["estimator_name"] == est)]
            if d.empty:
                continue
            runs = d.groupby(["run_dir", "seed"])
            final = runs["eval_return"].last()  # the final evaluation (NaN for a run that diverged before it)
            train = runs["episode_return"].mean()
            div = int(runs["status"].first().eq("diverged").sum())
            lines.append(f"| {task} | {est} | {runs.ngroups} | {int(runs['env_steps'].max().max()):,} | "
                         f"{final.median():.0f} ({final.min():.0f}, {final.max():.0f}) | {train.median():.0f} | {div} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/mujoco_learning")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", default="hopper,halfcheetah")
    ap.add_argument("--estimators", default="ppo_gae,a2c,baseline,rloo")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--docs", action="store_true",
                    help="also write the table into docs/continuous.md's mujoco-learning block, stamped with "
                         "this command and today's date")
    args = ap.parse_args()
    if not args.table_only:
        # one evaluation, at the end: 10 episodes (the presets' eval_episodes)
        sweep(args.out, args.tasks, args.estimators, args.seeds, args.steps, eval_every_steps=args.steps)
    md = table(args.out, args.tasks.split(","), args.estimators.split(","))
    print(md)
    if args.docs:
        print(f"wrote {write_block('docs/continuous.md', 'mujoco-learning', md)}")


if __name__ == "__main__":
    main()
