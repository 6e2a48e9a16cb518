"""Does RL raise the gold score above the SFT policy's? (issue 5's acceptance check)

Reads a results folder of LM runs made by the harness, for example::

    python -m harness -m task=lm_summarize estimator=ppo_gae,rloo seed=0,1,2 results_dir=results/lm_gain
    python benchmarks/lm_gain.py results/lm_gain

and prints, per estimator, each seed's gold score of the SFT policy it started from
(``eval_return_init`` in summary.json) and of the final policy (the last ``eval_return`` row),
both scored by the same evaluation (``lm.eval_prompts`` held-out prompts x ``lm.eval_samples``
sampled responses, one eval seed shared by all runs), then the mean gain with a 95% Student-t
interval over seeds. "beats SFT" means the interval's lower bound is above 0. The greedy-decoding
gold (``eval_gold_greedy``) is reported beside it, judged the same way.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.load import load_runs  # noqa: E402


def t_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of the mean (n - 1 degrees of freedom)."""
    m = float(np.mean(x))
    if len(x) < 2:
        return m, float("nan"), float("nan")
    h = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))
    return m, m - h, m + h


def final_rows(folder: str) -> pd.DataFrame:
    import json

    runs = load_runs(folder)
    rows = []
    for _, r in runs.iterrows():
        run_dir = Path(folder) / r.run_dir
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        m = pd.read_parquet(run_dir / "metrics.parquet")
        if "eval_gold_greedy" not in m or summary.get("eval_return_init") is None:
            continue  # made before the sampled evaluation existed
        ev = m.dropna(subset=["eval_return"])
        if ev.empty or not summary:
            continue  # still running (or killed): not a finished run
        last = ev.iloc[-1]
        rows.append({"estimator": last.estimator, "seed": int(last.seed), "status": summary.get("status", "incomplete"),
                     "iterations": int(m.iteration.max()), "tokens": int(m.tokens.max()),
                     "sft": summary["eval_return_init"], "final": float(last.eval_return),
                     "sft_greedy": summary["eval_gold_greedy_init"], "final_greedy": float(last.eval_gold_greedy),
                     "kl_ref": float(m.kl_ref.tail(10).mean())})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    args = ap.parse_args()
    df = final_rows(args.folder)
    if df.empty:
        raise SystemExit(f"{args.folder}: no LM runs with eval_return_init (run the harness first)")
    pd.set_option("display.width", 160)
    print(df.sort_values(["estimator", "seed"]).round(3).to_string(index=False))
    print()
    for est, g in df.groupby("estimator"):
        for label, a, b in (("sampled", "final", "sft"), ("greedy", "final_greedy", "sft_greedy")):
            m, lo, hi = t_interval((g[a] - g[b]).to_numpy())
            verdict = "beats SFT" if lo > 0 else "does not beat SFT"
            print(f"{est:8s} {label:7s} gold: SFT {g[b].mean():.3f} -> {g[a].mean():.3f}; gain {m:+.3f} "
                  f"[{lo:+.3f}, {hi:+.3f}] (95% t, n={len(g)}): {verdict}")


if __name__ == "__main__":
    main()
