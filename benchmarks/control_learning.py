"""Learning table: median eval_return of every estimator at 100k and 500k env steps.

Runs (each seed group as one population, 2 joblib workers; a rerun reuses finished runs):

* CartPole-v1 and Acrobot-v1, every registered estimator's preset, seeds 0-4, 500k env steps,
  evaluated (10 greedy episodes) each time env_steps crosses a multiple of 10k;
* CartPole-v1 ppo_gae with its rl-zoo preset (lr annealed over the budget), seeds 0-9,
  100k env steps: a median of at least 475 at 100k over 10 seeds is what the zoo's preset reaches.

The value "at S steps" is the eval logged at the first iteration whose env_steps >= S
(the final eval for S = budget). Prints a Markdown table; ``--docs`` also writes it into
docs/benchmarks.md (block ``control-learning``).

Usage: python benchmarks/control_learning.py [--out results/learning] [--seeds 5] [--table-only] [--docs]
           [--tasks cartpole,acrobot] [--estimators ppo_gae,...] [--skip-ppo100k]

``--tasks``/``--estimators`` rerun part of the long sweep (e.g. the rows a change affects) into
the same folder; the table is always made from every run in it.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402
from harness.estimators import estimator_names  # noqa: E402  (after the sys.path line)

ESTIMATORS = estimator_names()  # every registered estimator, in registration order


def sweep(out: str, tasks: str, estimators: str, seeds: int, steps: int, eval_every_steps: int = 10_000) -> None:
    """``tasks`` x ``estimators``, each a population of ``seeds`` (seeds 0..seeds-1), two processes at a
    time (joblib); finished runs are skipped."""
    cmd = [sys.executable, "-m", "harness", "-m", f"task={tasks}", f"estimator={estimators}", "seed=0",
           f"population={seeds}", f"budget.env_steps={steps}", "eval_every=0", f"eval_every_steps={eval_every_steps}",
           f"results_dir={out}", "progress=false", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def value_at(df, steps: int):
    """Per run: eval_return at the first eval with env_steps >= steps."""
    ev = df[df["eval_return"].notna() & (df["env_steps"] >= steps)]
    return ev.sort_values("env_steps").groupby(["run_dir", "seed"]).first()["eval_return"]


def table(out: str) -> str:
    import analysis

    lines = ["| task | estimator | seeds | median eval_return at 100k | at 500k | diverged |",
             "| --- | --- | --- | --- | --- | --- |"]
    long_runs = analysis.load(Path(out) / "long")
    for task in ("cartpole", "acrobot"):
        for est in ESTIMATORS:
            d = long_runs[(long_runs["task"] == task) & (long_runs["estimator"] == est)]
            if d.empty:
                continue
            at100, at500 = value_at(d, 100_000), value_at(d, 500_000)
            n = d.groupby(["run_dir", "seed"]).ngroups
            div = d.drop_duplicates(["run_dir", "seed"])["status"].eq("diverged").sum()
            fmt = lambda s: f"{s.median():.1f}" if len(s) else "n/a"  # noqa: E731
            lines.append(f"| {task} | {est} | {n} | {fmt(at100)} | {fmt(at500)} | {div} |")
    if (Path(out) / "ppo100k").is_dir():  # absent after --skip-ppo100k on a fresh --out
        at = value_at(analysis.load(Path(out) / "ppo100k"), 100_000)
        lines.append("")
        lines.append(f"CartPole-v1 ppo_gae, rl-zoo preset, 100k budget: median over {len(at)} seeds "
                     f"= {at.median():.1f} (min {at.min():.1f}, max {at.max():.1f})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/learning")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--tasks", default="cartpole,acrobot")
    ap.add_argument("--estimators", default=",".join(ESTIMATORS))
    ap.add_argument("--skip-ppo100k", action="store_true")
    ap.add_argument("--docs", action="store_true",
                    help="also write the table into docs/benchmarks.md's control-learning block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    if not args.table_only:
        if not args.skip_ppo100k:
            sweep(f"{args.out}/ppo100k", "cartpole", "ppo_gae", 10, 100_000)
        sweep(f"{args.out}/long", args.tasks, args.estimators, args.seeds, 500_000)
    md = table(args.out)
    print(md)
    if args.docs:
        print(f"wrote {write_block('docs/benchmarks.md', 'control-learning', md)}")


if __name__ == "__main__":
    main()
