"""Every estimator x the main policy losses on the LM task, side by side.

    python -m harness -m experiment=lm_compare                    # the sweep (harness/conf/experiment/lm_compare.yaml)
    python benchmarks/lm_compare.py results/lm_compare --docs     # report, figure, README and docs blocks

The numbers are the report's (:func:`analysis.report.build_report`, the same call as ``python -m
analysis report``): a run's final score is the IQM of its last 5 ``eval_return`` values (the gold
score expected under sampling on held-out prompts), each estimator-and-loss pair's the IQM over its
seeds with a 95% stratified-bootstrap interval. This script adds two numbers the report has no
table for: the SFT policy's score the runs start from (``eval_return_init`` in summary.json), and
GSPO minus PPO's clip paired by estimator and seed (mean with a Student-t interval over the pairs).

``--docs`` copies the report's final-score figure to docs/figures/lm_compare_final_scores.png and
writes README's ``lm-compare`` block (figure and summary) and docs/lm.md's ``lm-compare-table``
block (every pair's interval). Incomplete sweeps are reported as such (runs found of runs planned).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.report import build_report  # noqa: E402
from harness.docs import write_block  # noqa: E402
from benchmarks.lm_gain import final_rows, t_interval  # noqa: E402

FIGURE = "docs/figures/lm_compare_final_scores.png"
LOSSES = ("clip", "gspo")  # harness/conf/experiment/lm_compare.yaml's policy_loss axis
SEEDS = 3


def planned_runs() -> int:
    from harness.estimators.registry import estimator_names
    return len(estimator_names()) * len(LOSSES) * SEEDS


def tables(results: Path) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """``(pairs, runs, sft)``: per estimator x loss the report's IQM and interval;
    per run its estimator, loss, seed and score; the SFT start's mean score."""
    t = build_report(results)
    runs = t.runs.assign(base=t.runs["estimator"].str.split("[").str[0])
    pairs = t.scores.merge(runs[["estimator", "base", "update"]].drop_duplicates(), on="estimator")
    sft = float(final_rows(str(results))["eval_return_init"].mean())
    return pairs, runs, sft


def paired_difference(runs: pd.DataFrame, a: str = "gspo", b: str = "clip") -> tuple[tuple[float, float, float], int, int, int]:
    """``a - b`` final scores paired by estimator and seed: (mean, low, high), pairs, and of the
    estimators with both, how many have a higher mean under ``a``, and how many in all."""
    wide = runs.pivot_table(index=["base", "seed"], columns="update", values="score").dropna(subset=[a, b])
    d = (wide[a] - wide[b]).to_numpy(dtype=float)
    by_est = (wide[a] - wide[b]).groupby(level="base").mean()
    return t_interval(d), len(d), int((by_est > 0).sum()), len(by_est)


def fmt(x: float, lo: float, hi: float) -> str:
    return f"{x:.3f} [{lo:.3f}, {hi:.3f}]"


def readme_block(pairs: pd.DataFrame, runs: pd.DataFrame, sft: float, budget: float) -> str:
    ranked = pairs.sort_values("iqm", ascending=False)
    show = lambda rows: "; ".join(f"`{r.estimator}` {fmt(r.iqm, r.iqm_low, r.iqm_high)}"  # noqa: E731
                                  for r in rows.itertuples())
    (m, lo, hi), n_pairs, higher, n_est = paired_difference(runs)
    done = int((runs["status"] == "completed").sum())
    diverged = int((runs["status"] == "diverged").sum())
    return "\n".join([
        f"**Every estimator x PPO's clip and GSPO on the LM task** (`python -m harness -m experiment=lm_compare`: "
        f"{runs['base'].nunique()} estimators x {len(LOSSES)} losses x {SEEDS} seeds, about {budget / 1e3:.0f}k sampled "
        f"tokens each, the same lr and epochs for all; {len(runs)} of {planned_runs()} runs, {done} completed, "
        f"{diverged} diverged). Final gold score, IQM with 95% bootstrap interval; the SFT policy they start "
        f"from scores {sft:.3f}:",
        "",
        f"![LM comparison: final scores]({FIGURE})",
        "",
        f"- highest: {show(ranked.head(3))}",
        f"- lowest: {show(ranked.tail(2))}",
        f"- GSPO - clip, paired by estimator and seed: {fmt(m, lo, hi)} over {n_pairs} pairs "
        f"(GSPO higher for {higher} of {n_est} estimators)",
        "",
        "Every pair's interval: [The LM tasks](docs/lm.md#every-estimator-x-policy-loss).",
    ])


def table_block(pairs: pd.DataFrame) -> str:
    wide = {(r.base, r.update): (fmt(r.iqm, r.iqm_low, r.iqm_high), int(r.n_runs)) for r in pairs.itertuples()}
    order = pairs.groupby("base")["iqm"].max().sort_values(ascending=False).index
    lines = ["| estimator | " + " | ".join(f"`update={u}`" for u in LOSSES) + " |",
             "| --- |" + " --- |" * len(LOSSES)]
    for base in order:
        cells = [f"{wide[(base, u)][0]} (n={wide[(base, u)][1]})" if (base, u) in wide else "not run" for u in LOSSES]
        lines.append(f"| `{base}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", default="results/lm_compare")
    ap.add_argument("--docs", action="store_true", help="write the figure, README's lm-compare block and docs/lm.md's table")
    args = ap.parse_args(argv)
    results = Path(args.results)
    pairs, runs, sft = tables(results)
    budget = float(runs["budget"].max())
    readme = readme_block(pairs, runs, sft, budget)
    table = table_block(pairs)
    print(readme, "\n\n" + table)
    if args.docs:
        shutil.copyfile(results / "report" / "final_scores.png", ROOT / FIGURE)
        write_block("README.md", "lm-compare", readme)
        write_block("docs/lm.md", "lm-compare-table", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
