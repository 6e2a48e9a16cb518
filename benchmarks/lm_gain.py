"""Does RL raise the gold score above the SFT policy's?

Reads a results folder of LM runs made by the harness, for example::

    python -m harness -m task=lm_summarize estimator=ppo_gae,rloo seed=0,1,2 results_dir=results/lm_gain
    python benchmarks/lm_gain.py results/lm_gain

and prints, per estimator, each seed's gold score of the SFT policy it started from
(``eval_return_init`` in summary.json) and of the final policy (the last ``eval_return`` row),
both scored by the same evaluation (``lm.eval_prompts`` held-out prompts x ``lm.eval_samples``
sampled responses, one eval seed shared by all runs), then the mean gain with a 95% Student-t
interval over seeds. "beats SFT" means the interval's lower bound is above 0. The greedy-decoding
gold (``eval_gold_greedy``) is reported beside it, judged the same way. ``--docs`` also writes the
markdown table into docs/lm.md (block ``lm-gain``).

:func:`final_rows` and :func:`gain_markdown` take the metrics to compare (a column of the
evaluation rows whose starting value is ``<column>_init`` in summary.json), so other LM tasks
reuse them (``benchmarks/lm_arith_gain.py``: pass@1 and pass@k of ``task=lm_arith``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.load import load_runs  # noqa: E402
from harness.docs import write_block  # noqa: E402

#: (label, column): what this script compares for task=lm_summarize
GOLD_METRICS = (("sampled", "eval_return"), ("greedy", "eval_gold_greedy"))


def t_interval(x: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of the mean (n - 1 degrees of freedom)."""
    m = float(np.mean(x))
    if len(x) < 2:
        return m, float("nan"), float("nan")
    h = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * np.std(x, ddof=1) / np.sqrt(len(x)))
    return m, m - h, m + h


def final_rows(folder: str, metrics=GOLD_METRICS, task: str | None = None) -> pd.DataFrame:
    """One row per finished LM run under ``folder`` (of ``task``, if given): estimator, seed,
    status, iterations, tokens, and for each metric column ``c`` the starting value ``c_init``
    (summary.json) and the final one ``c`` (the last evaluation row); KL to the reference."""
    runs = load_runs(folder)
    rows = []
    for _, r in runs.iterrows():
        run_dir = Path(folder) / r.run_dir
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
        m = pd.read_parquet(run_dir / "metrics.parquet")
        if task is not None and not (m.task == task).all():
            continue
        cols = [c for _, c in metrics]
        if any(c not in m for c in cols) or any(summary.get(f"{c}_init") is None for c in cols):
            continue  # made before these evaluations existed
        ev = m.dropna(subset=[cols[0]])
        if ev.empty or not summary:
            continue  # still running (or killed): not a finished run
        last = ev.iloc[-1]
        row = {"estimator": last.estimator, "seed": int(last.seed), "status": summary.get("status", "incomplete"),
               "iterations": int(m.iteration.max()), "tokens": int(m.tokens.max()),
               "wall_s": float(m.wall_time_s.max())}
        for c in cols:
            row[f"{c}_init"], row[c] = float(summary[f"{c}_init"]), float(last[c])
        row["kl_ref"] = float(m.kl_ref.dropna().tail(10).mean())  # kl.beta=0: measured every lm.kl_ref_every
        rows.append(row)
    return pd.DataFrame(rows)


def gain_markdown(df: pd.DataFrame, metrics, start: str = "SFT") -> str:
    """A markdown table: per estimator and metric, ``start -> final`` per seed and the mean gain
    with its 95% t interval over seeds (bold when the interval excludes 0)."""
    head = ["estimator", "n"]
    for label, _ in metrics:
        head += [f"{label}: {start} -> final (per seed)", f"{label} gain [95% t]"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for est, g in df.sort_values(["estimator", "seed"]).groupby("estimator"):
        cells = [est, str(len(g))]
        for _, c in metrics:
            m, lo, hi = t_interval((g[c] - g[f"{c}_init"]).to_numpy())
            init = g[f"{c}_init"].unique()
            start_txt = f"{init[0]:.3f}" if len(init) == 1 else "/".join(f"{x:.3f}" for x in g[f"{c}_init"])
            cells.append(f"{start_txt} -> " + " / ".join(f"{x:.3f}" for x in g[c]))
            gain = f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            cells.append(f"**{gain}**" if lo > 0 else gain)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--docs", action="store_true",
                    help="also write the table into docs/lm.md's lm-gain block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    df = final_rows(args.folder)
    if df.empty:
        raise SystemExit(f"{args.folder}: no LM runs with eval_return_init (run the harness first)")
    md = gain_markdown(df, (("gold, sampled", "eval_return"), ("gold, greedy", "eval_gold_greedy")))
    df = df.rename(columns={"eval_return_init": "sft", "eval_return": "final", "eval_gold_greedy_init": "sft_greedy",
                            "eval_gold_greedy": "final_greedy"}).drop(columns="wall_s")
    pd.set_option("display.width", 160)
    print(df.sort_values(["estimator", "seed"]).round(3).to_string(index=False))
    print()
    for est, g in df.groupby("estimator"):
        for label, a, b in (("sampled", "final", "sft"), ("greedy", "final_greedy", "sft_greedy")):
            m, lo, hi = t_interval((g[a] - g[b]).to_numpy())
            verdict = "beats SFT" if lo > 0 else "does not beat SFT"
            print(f"{est:8s} {label:7s} gold: SFT {g[b].mean():.3f} -> {g[a].mean():.3f}; gain {m:+.3f} "
                  f"[{lo:+.3f}, {hi:+.3f}] (95% t, n={len(g)}): {verdict}")
    print()
    print(md)
    if args.docs:
        print(f"wrote {write_block('docs/lm.md', 'lm-gain', md)}")


if __name__ == "__main__":
    main()
