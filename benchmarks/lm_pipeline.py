"""Cost and effect of the LM task on this machine, with the default task settings.

1. The cached pipeline: SFT + reward-model build time from an empty cache, then the time to
   load it again (cached), with the SFT policy's gold score and the reward model's held-out
   pair accuracy.
2. One RL run per estimator (``--iterations``, default 200): wall time, iterations/s, sampled
   tokens/s, and the gold score of sampled responses (first 10 vs last 20 iterations) and of
   greedy held-out responses (``eval_return``) against the SFT policy's.

Usage::

    python benchmarks/lm_pipeline.py [--iterations 200] [--estimators rloo ppo_gae]
        [--threads 1] [--cache DIR] [--set lr=1e-4 kl.beta=0.05 ...]

The LM sizes are tiny: intra-op threads buy little and, on a shared 2-core machine, two
threads per process can be many times slower than one, hence ``--threads 1`` by default.
``--set`` overrides apply to every run (the estimator group's lr/epochs are tuned for control
tasks; pass LM values here until harness/conf/tuned/lm_summarize_*.yaml exist).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.app import run  # noqa: E402
from harness.config import register_configs  # noqa: E402
from harness.tasks.lm.pipeline import build_task  # noqa: E402


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "harness" / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--estimators", nargs="*", default=["rloo", "ppo_gae"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=None, help="cache folder (default: a fresh temporary one)")
    ap.add_argument("--results", default=None, help="results folder (default: a fresh temporary one)")
    ap.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    results = Path(args.results or tempfile.mkdtemp(prefix="lm-bench-"))
    cache = Path(args.cache or results / ".cache" / "lm")
    base = ["task=lm_summarize", f"results_dir={results}", f"lm.cache_dir={cache}", f"threads={args.threads}",
            "progress=false", "budget.tokens=null", f"budget.iterations={args.iterations}"]
    report: dict = {"threads": args.threads, "overrides": args.set}

    cfg = compose(base + ["estimator=rloo"] + args.set)
    t0 = time.time()
    task = build_task(cfg)
    report["pipeline_build_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    task = build_task(cfg)
    report["pipeline_cached_load_s"] = round(time.time() - t0, 1)
    report["sft"] = {k: task.meta["sft"].get(k) for k in
                     ("build_seconds", "sft_gold_sampled", "sft_gold_greedy", "reference_gold")}
    report["rm"] = {k: task.meta.get("rm", {}).get(k) for k in
                    ("build_seconds", "rm_eval_accuracy", "rm_gold_corr", "rm_train_pairs", "rm_calibration")}
    print(json.dumps(report, indent=2), flush=True)

    report["rl"] = {}
    for est in args.estimators:
        cfg = compose(base + [f"estimator={est}"] + args.set)
        t0 = time.time()
        counts = run(cfg)
        wall = time.time() - t0
        [path] = list((results / "lm_summarize" / est).glob("seed*/metrics.parquet"))
        df = pd.read_parquet(path)
        evals = df.eval_return.dropna()
        r = {
            "status": counts, "wall_s": round(wall, 1), "iterations": len(df),
            "iter_per_s": round(len(df) / float(df.wall_time_s.iloc[-1]), 3),
            "tokens": int(df.tokens.iloc[-1]), "tokens_per_s": round(float(df.tokens_per_s.iloc[-1]), 1),
            "gold_sampled_first10": round(float(df.gold_reward.head(10).mean()), 3),
            "gold_sampled_last20": round(float(df.gold_reward.tail(20).mean()), 3),
            "reward_first10": round(float(df.reward.head(10).mean()), 3),
            "reward_last20": round(float(df.reward.tail(20).mean()), 3),
            "eval_gold_greedy_first": round(float(evals.iloc[0]), 3) if len(evals) else None,
            "eval_gold_greedy_last": round(float(evals.iloc[-1]), 3) if len(evals) else None,
            "kl_ref_last20": round(float(df.kl_ref.dropna().tail(20).mean()), 3),  # measured iterations
            "response_len_last20": round(float(df.response_len.tail(20).mean()), 2),
            "peak_mem_mb": round(float(df.peak_mem_mb.max()), 1),
        }
        report["rl"][est] = r
        print(est, json.dumps(r), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
