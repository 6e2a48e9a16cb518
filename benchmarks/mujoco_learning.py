"""MuJoCo learning table: ppo_gae and three other estimators on Hopper-v5 and
HalfCheetah-v5, 5 seeds each as one population, at a budget this machine affords (state it).

ppo_gae runs with rl-baselines3-zoo's tuned preset for the task (``harness/conf/tuned/<task>_ppo_gae.yaml``,
loaded by itself); a2c, baseline (REINFORCE with a learned baseline) and rloo with their own
defaults on the task presets (CleanRL's sizes: one env, 2048 steps per iteration, observation and
reward normalisation). Each run ends with a 10-episode greedy evaluation (its final return); the
table gives per task and estimator the median final return over seeds (min, max), the mean
training-episode return over the run (the area under the training curve), and the diverged
count. Two populations train at a time (joblib, one thread each); a rerun reuses finished runs.

Beside ppo_gae stands rl-baselines3-zoo's published PPO run with the same tuned settings at the
same budget: its evaluation at the largest logged step not above the budget (SB3's
``EvalCallback``, 20 deterministic episodes, one training seed; MuJoCo v3 envs), read from
``benchmarks/data/sb3_zoo_ppo_eval.csv`` (written by ``benchmarks/sb3_zoo_reference.py`` from the
zoo's ``evaluations.npz`` files). "within" says whether our median final return lies inside the
range of SB3's evaluation episodes there. The default budget is 100k env steps (51 minutes on 2
cores); 1M steps, the zoo's budget, would be about 16 CPU-hours.

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

from harness.docs import write_block  # noqa: E402
from benchmarks.control_learning import sweep  # noqa: E402  (the one sweep command of the learning tables)


REFERENCE = ROOT / "benchmarks" / "data" / "sb3_zoo_ppo_eval.csv"
ZOO_ENV = {"hopper": "Hopper-v3", "halfcheetah": "HalfCheetah-v3"}  # the zoo's agents ran on the v3 envs


def published_at(reference, env: str, steps: int):
    """The zoo's evaluation of ``env`` at the largest logged step <= ``steps`` (a row of the
    reference table: timesteps, episodes, mean, min, max), or None when it logged none."""
    rows = reference[(reference["env"] == env) & (reference["timesteps"] <= steps)]
    return None if rows.empty else rows.loc[rows["timesteps"].idxmax()]


def table(out: str, tasks: list[str], estimators: list[str], steps: int) -> str:
    import analysis
    import pandas as pd

    df = analysis.load(out)
    reference = pd.read_csv(REFERENCE, comment="#")
    lines = [f"| task | estimator | seeds | env steps | final eval return, median (min, max) | "
             "mean training return | diverged | SB3 zoo PPO eval at the same steps: mean (min, max) | within |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task in tasks:
        for est in estimators:
            d = df[(df["task"] == task) & (df["estimator_name"] == est)]
            if d.empty:
                continue
            runs = d.groupby(["run_dir", "seed"])
            final = runs["eval_return"].last()  # the final evaluation (NaN for a run that diverged before it)
            train = runs["episode_return"].mean()
            div = int(runs["status"].first().eq("diverged").sum())
            zoo = published_at(reference, ZOO_ENV[task], steps) if est == "ppo_gae" and task in ZOO_ENV else None
            published, within = "", ""
            if zoo is not None:
                published = f"{zoo['mean']:.0f} ({zoo['min']:.0f}, {zoo['max']:.0f}) at {int(zoo['timesteps']):,}"
                within = "yes" if zoo["min"] <= final.median() <= zoo["max"] else "no"
            lines.append(f"| {task} | {est} | {runs.ngroups} | {int(runs['env_steps'].max().max()):,} | "
                         f"{final.median():.0f} ({final.min():.0f}, {final.max():.0f}) | {train.median():.0f} | {div} | "
                         f"{published} | {within} |")
    for task in tasks:  # one seed's evaluation moves a lot between logged steps: show the neighbours
        if task not in ZOO_ENV:
            continue
        env = ZOO_ENV[task]
        near = reference[(reference["env"] == env) & (reference["timesteps"] >= steps // 2)
                         & (reference["timesteps"] <= steps * 3 // 2)]
        if not near.empty:
            lines += ["", f"SB3 zoo {env}, mean evaluation return at the logged steps around the budget: "
                      + ", ".join(f"{int(t):,}: {m:.0f}" for t, m in zip(near["timesteps"], near["mean"])) + "."]
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
    md = table(args.out, args.tasks.split(","), args.estimators.split(","), args.steps)
    print(md)
    if args.docs:
        print(f"wrote {write_block('docs/continuous.md', 'mujoco-learning', md)}")


if __name__ == "__main__":
    main()
