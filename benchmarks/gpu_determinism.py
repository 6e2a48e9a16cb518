"""Bitwise reproducibility on a GPU: the same LM config and seed run twice with
``deterministic=true`` and twice without, on ``device=cuda``; prints which pairs give identical
``metrics.parquet`` (wall-clock and throughput columns aside).

    python benchmarks/gpu_determinism.py [--iterations 5] [--results results/gpu_det]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.train.lm import MEASURED_COLUMNS  # noqa: E402  (measurements, not results)
DEVICE = "cuda"
TINY = ["lm.data.train_size=256", "lm.arch.n_layer=1", "lm.arch.n_embd=64", "lm.arch.n_head=2", "lm.sft.steps=60",
        "lm.rm.prompts=64", "lm.rm.epochs=1", "lm.rm.include_reference=true", "lm.eval_prompts=16", "eval_every=1",
        "progress=false"]


def run(results: Path, tag: str, iterations: int, deterministic: bool) -> pd.DataFrame:
    out = results / tag
    cmd = [sys.executable, "-m", "harness", "task=lm_summarize", "estimator=ppo_gae", f"device={DEVICE}", "seed=0",
           f"budget.iterations={iterations}", f"deterministic={str(deterministic).lower()}", f"results_dir={out}",
           f"lm.cache_dir={results / 'cache'}", *TINY]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:  # the run's own last lines say why (the harness logs one line per failure)
        sys.exit(f"{tag}: exit {done.returncode}: " + " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:]))
    [f] = out.glob("lm_summarize/*/seed*/metrics.parquet")
    df = pd.read_parquet(f)
    return df[[c for c in df.columns if c not in MEASURED_COLUMNS and c != "run_id"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--results", default="results/gpu_det")
    ap.add_argument("--device", default="cuda", help="cuda (the point), or cpu for a dry run")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    results = Path(args.results).resolve()
    for det in (True, False):
        a = run(results, f"det{int(det)}_a", args.iterations, det)
        b = run(results, f"det{int(det)}_b", args.iterations, det)
        same = a.equals(b)
        diff = [c for c in a.columns if not a[c].equals(b[c])]
        print(f"deterministic={str(det).lower()}: two runs bitwise identical: {same}"
              + ("" if same else f" (columns that differ: {', '.join(diff)})"))


if __name__ == "__main__":
    main()
