"""Does RL raise held-out pass@1 above the warm-start (SFT) policy's on ``task=lm_arith``?

Reads a results folder of ``task=lm_arith`` runs, for example::

    python -m harness -m task=lm_arith estimator=grpo,dr_grpo,rloo,ppo_gae seed=0,1,2 \\
        results_dir=/tmp/arith_gain hydra/launcher=joblib hydra.launcher.n_jobs=2 progress=false
    python benchmarks/lm_arith_gain.py /tmp/arith_gain

and prints a markdown table: per estimator, held-out pass@1 (greedy answer correct) of the
warm-start policy (``pass_at_1_init`` in summary.json, scored before the first update) -> the
final policy's (the last evaluation row) for each seed, the mean gain with a 95% Student-t
interval over seeds (bold: the interval excludes 0), and the same for pass@k (unbiased, from
``lm.eval_samples`` sampled answers) and the sampled accuracy (``eval_return``). The loading and
the interval are :mod:`benchmarks.lm_gain`'s. ``--docs`` also writes both tables into docs/lm.md
(block ``lm-arith-gain``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lm_gain import final_rows, gain_markdown  # noqa: E402  (lm_gain puts the repository on sys.path)

from harness.docs import write_block  # noqa: E402

METRICS = (("pass@1 (greedy)", "pass_at_1"), ("pass@k", "pass_at_k"), ("sampled accuracy", "eval_return"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--docs", action="store_true",
                    help="also write the tables into docs/lm.md's lm-arith-gain block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    df = final_rows(args.folder, METRICS, task="lm_arith")
    if df.empty:
        raise SystemExit(f"{args.folder}: no finished task=lm_arith runs with pass_at_1_init (run the harness first)")
    lines = [gain_markdown(df, METRICS, start="warm start"), "",
             "| estimator | runs | status | iterations | tokens | wall s per run | kl_ref (last 10 measured iters) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for est, g in df.groupby("estimator"):
        lines.append(f"| {est} | {len(g)} | {','.join(sorted(set(g.status)))} | {g.iterations.mean():.0f} | "
                     f"{g.tokens.mean():.0f} | {g.wall_s.mean():.0f} | {g.kl_ref.mean():.3f} |")
    md = "\n".join(lines)
    print(md)
    if args.docs:
        print(f"wrote {write_block('docs/lm.md', 'lm-arith-gain', md)}")


if __name__ == "__main__":
    main()
