"""Is this checkout slower than another one? Both run side by side, interleaved, in one script.

For each round, each checkout (``--base`` and this one, order alternating between rounds) runs
the same commands in a fresh subprocess with ``PYTHONPATH`` set to that checkout:

* LM (``task=lm_summarize``, default sizes, one thread, ``eval_every=0``) for each of
  ``--lm-estimators`` over ``--lm-iterations`` iterations: the median ``iter_time_s`` (one
  iteration: sampling, scoring, update), the first ``--warmup`` iterations left out;
* control: CartPole-v1 ppo_gae with the rl-zoo preset for ``--control-steps`` env steps: the
  training wall time from ``summary.json``.

The LM pipeline cache (``--cache``) is built once, before the rounds, and shared. Prints each
measurement, then the median over rounds per checkout and the ratio this / base (> 1: slower).
The machine is shared: interleaving spreads its noise over both sides; read ratios, not times.

Usage::

    git worktree add /tmp/base <commit>
    python benchmarks/checkout_speed.py --base /tmp/base [--rounds 3] [--lm-iterations 30] [--docs]

``--docs`` also writes the medians as a table into docs/benchmarks.md (block ``checkout-speed``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.docs import write_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ZOO = ["task=cartpole", "estimator=ppo_gae", "progress=false", "eval_every=0", "threads=1"]  # harness/conf/tuned preset


def harness(checkout: Path, overrides: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=checkout, env=env, check=True,
                   capture_output=True)


def lm_time(checkout: Path, estimator: str, iterations: int, warmup: int, cache: Path) -> float:
    with tempfile.TemporaryDirectory() as out:
        harness(checkout, ["task=lm_summarize", f"estimator={estimator}", "progress=false", "threads=1",
                           "eval_every=0", "budget.tokens=null", f"budget.iterations={iterations}",
                           f"lm.cache_dir={cache}", f"results_dir={out}"])
        (path,) = Path(out).rglob("metrics.parquet")
        return float(pd.read_parquet(path)["iter_time_s"].iloc[warmup:].median())


def control_time(checkout: Path, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        harness(checkout, ZOO + [f"budget.env_steps={steps}", f"results_dir={out}"])
        (path,) = Path(out).rglob("summary.json")
        return float(json.loads(path.read_text())["wall_time_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lm-iterations", type=int, default=30)
    ap.add_argument("--lm-estimators", nargs="*", default=["rloo", "ppo_gae"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--control-steps", type=int, default=50_000)
    ap.add_argument("--cache", type=Path, default=None, help="LM pipeline cache (default: a temporary folder)")
    ap.add_argument("--docs", action="store_true", help="also write the medians into docs/benchmarks.md's "
                    "checkout-speed block, stamped with this command and today's date")
    args = ap.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="lm-cache-"))
    sides = {"base": args.base.resolve(), "this": ROOT}
    if args.lm_estimators:  # build the pipeline once (``--lm-estimators`` with none: control only)
        lm_time(ROOT, args.lm_estimators[0], 1, 0, cache)
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
        for side in order:
            for est in args.lm_estimators:
                t = lm_time(sides[side], est, args.lm_iterations, args.warmup, cache)
                times.setdefault((f"lm {est} s/iteration", side), []).append(t)
                print(f"round {r} {side}: lm {est} {t:.4f} s/iteration", flush=True)
            if args.control_steps:
                t = control_time(sides[side], args.control_steps)
                times.setdefault(("control ppo_gae training s", side), []).append(t)
                print(f"round {r} {side}: control ppo_gae {args.control_steps} steps {t:.2f} s", flush=True)
    print(f"\nmedians over {args.rounds} rounds (base = {sides['base']}):")
    md = [f"Medians over {args.rounds} rounds; base: `{sides['base']}`.", "",
          "| measurement | base | this | this / base |", "| --- | --- | --- | --- |"]
    for what in dict.fromkeys(k for k, _ in times):
        b, t = statistics.median(times[what, "base"]), statistics.median(times[what, "this"])
        print(f"{what}: base {b:.4f}, this {t:.4f}, this / base = {t / b:.3f}")
        md.append(f"| {what} | {b:.4f} | {t:.4f} | {t / b:.3f} |")
    if args.docs:
        print(f"wrote {write_block('docs/benchmarks.md', 'checkout-speed', chr(10).join(md))}")


if __name__ == "__main__":
    main()
