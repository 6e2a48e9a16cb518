"""Claim C10 at length: proxy reward, gold score and KL to the reference over training, by kl.beta.

Reads a results folder of LM runs that differ in ``kl.beta`` (for example the ``c10`` folder that
``benchmarks/gpu_check.sh`` writes, or ``python -m harness -m task=lm_summarize estimator=rloo
kl.beta=0,0.05,0.2 seed=0,1 budget.tokens=800000 eval_every=25 results_dir=results/c10_long``) and
draws three panels against sampled tokens: the optimized proxy reward (training batches, rolling
mean), the gold score of the policy (``eval_return``: held-out prompts, sampled responses) and the
KL to the reference (nats per response, rolling mean); one line per seed, in the estimator's colour
(:func:`analysis.figures.estimator_color`, as in every figure), the betas told apart by line style and by
shades of that colour (seaborn's ``dark_palette``: darker = larger beta). Prints the first and
last values per beta; ``--docs`` also writes that table into docs/lm.md (block ``lm-c10-kl``).

    python benchmarks/lm_kl_curves.py results/gpu/c10 --out docs/figures/lm_c10_kl.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.figures import LINESTYLES, estimator_color  # noqa: E402
from analysis.load import load  # noqa: E402
from harness.docs import write_block  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--out", default=None, help="PNG path (default: FOLDER/kl_curves.png)")
    ap.add_argument("--window", type=int, default=50, help="rolling window (iterations) for reward and KL")
    ap.add_argument("--docs", action="store_true",
                    help="also write the first/last table into docs/lm.md's lm-c10-kl block, "
                         "stamped with this command and today's date")
    args = ap.parse_args()
    df = load(args.folder)
    df = df[df.task == "lm_summarize"].sort_values(["run_dir", "seed", "iteration"])
    if df.empty:
        raise SystemExit(f"{args.folder}: no LM runs")
    df["beta"] = df.kl_beta.map(lambda b: f"{b:g}")
    g = df.groupby(["run_dir", "seed"])
    df["proxy reward"] = g.reward.transform(lambda x: x.rolling(args.window, min_periods=1).mean())
    df["KL to reference (nats)"] = g.kl_ref.transform(lambda x: x.rolling(args.window, min_periods=1).mean())
    df["gold score (eval)"] = df.eval_return
    df["sampled tokens (k)"] = df.tokens / 1e3
    run = df.run_dir + "/" + df.seed.astype(str)
    df["run"] = run
    betas = sorted(df.beta.unique(), key=float)
    style = {b: LINESTYLES[i % len(LINESTYLES)] for i, b in enumerate(betas)}
    ests = sorted(df.estimator.unique())
    # (estimator, beta) -> colour: the estimator's colour for beta 0, darker shades of it for larger ones
    shade = {(e, b): c for e in ests
             for b, c in zip(betas, sns.dark_palette(estimator_color(e), len(betas) + 1, reverse=True))}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    for ax, col in zip(axes, ["proxy reward", "gold score (eval)", "KL to reference (nats)"]):
        for (e, beta, _), x in df.dropna(subset=[col]).groupby(["estimator", "beta", "run"], sort=True):
            ax.plot(x["sampled tokens (k)"], x[col], color=shade[(e, beta)], ls=style[beta], lw=1.3)
        ax.set(title=col, xlabel="sampled tokens (k)", ylabel=col)
        ax.grid(alpha=0.3)
    line = (lambda b: shade[(ests[0], b)]) if len(ests) == 1 else (lambda b: "0.25")
    axes[0].legend([Line2D([], [], color=line(b), ls=style[b], lw=1.5) for b in betas], betas,
                   title="kl.beta (line style, shade)", handlelength=3)
    if len(ests) > 1:
        fig.legend([Line2D([], [], color=estimator_color(e), lw=2) for e in ests], ests, title="estimator",
                   loc="outside right center", frameon=False)
    est = ", ".join(ests)
    fig.suptitle(f"LM task, {est} on the learned proxy reward: KL penalty strength (C10); one line per seed")
    out = Path(args.out) if args.out else Path(args.folder) / "kl_curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")
    k = 10
    rows = []
    for (beta, r), x in df.groupby(["beta", "run"]):
        ev = x.dropna(subset=["eval_return"])
        rows.append({"kl.beta": float(beta), "run": r, "iterations": int(x.iteration.max()),
                     "tokens": int(x.tokens.max()),
                     "proxy first": x.reward.head(k).mean(), "proxy last": x.reward.tail(k * 5).mean(),
                     "gold eval first": ev.eval_return.iloc[0], "gold eval last": ev.eval_return.iloc[-1],
                     "gold eval max": ev.eval_return.max(), "KL last": x.kl_ref.tail(k * 5).mean()})
    pd.set_option("display.width", 200)
    table = pd.DataFrame(rows).drop(columns="run").round(3)
    note = (f"(first = mean of the first {k} iterations or the first eval; last = mean of the last {5 * k} "
            "iterations or the last eval)")
    print(table.to_string(index=False))
    print(note)
    if args.docs:
        md = "\n".join(["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
                       + ["| " + " | ".join(f"{v:g}" for v in row) + " |" for row in table.itertuples(index=False)])
        print(f"wrote {write_block('docs/lm.md', 'lm-c10-kl', md + chr(10) + chr(10) + note + f' Figure: `{out}`.')}")


if __name__ == "__main__":
    main()
