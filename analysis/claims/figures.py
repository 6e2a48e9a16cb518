"""One figure per judged claim, chosen by statistic kind.

Left: every part's point and 95% interval against its rule (the threshold as a line, a tolerance
band shaded), one axis per part on its own scale. Right, when the claim has training evidence (``run_metric``
parts): the mean curve of the first such part's metric column for each compared group; when it
has probe evidence, each compared config's per-batch values as box plots.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np

from .evidence import ExpData, NotRun


def _interval_axis(ax, p) -> None:
    """One part: its point and interval against its rule, on the part's own scale."""
    color = {"supported": "tab:green", "refuted": "tab:red"}.get(p.verdict, "tab:grey")
    xs = [x for x in (p.point, p.low, p.high) if np.isfinite(x)]
    rule = p.spec
    if rule is not None:
        if rule.kind in ("equivalent", "between"):
            lo, hi = rule.band
            ax.axvspan(lo, hi, color="tab:blue", alpha=0.15, lw=0)
            xs += [lo, hi]
        elif rule.kind in ("greater", "less"):
            ax.axvline(rule.a, color="tab:blue", lw=1)
            xs.append(rule.a)
            if rule.b:  # the smallest effect that counts: the line the interval is read against
                ax.axvline(rule.threshold, color="tab:blue", lw=1, ls="--")
                xs.append(rule.threshold)
    if np.isfinite(p.low) and np.isfinite(p.high):
        ax.plot([p.low, p.high], [0, 0], color=color, lw=4, solid_capstyle="butt")
    if np.isfinite(p.point):
        ax.plot([p.point], [0], "o", color="black", ms=4)
    if xs:
        lo, hi = min(xs), max(xs)
        pad = 0.08 * (hi - lo) or 0.1 * max(abs(hi), 1e-9)
        ax.set_xlim(lo - pad, hi + pad)
    ax.set_yticks([])
    ax.tick_params(axis="x", labelsize=6)
    role = ", power check" if p.role == "power" else ""
    tail = f" [{p.rule}{role}]: {p.verdict}"  # the rule and the verdict are never cut; a long name is
    ax.set_title(textwrap.shorten(p.name, max(95 - len(tail), 20)) + tail, fontsize=6.5, loc="left")


def _curve_panel(ax, claim, data: dict[str, ExpData]) -> bool:
    ps = next((p for p in claim.parts if p.stat == "run_metric"), None)
    if ps is None or ps.experiment not in data:
        return False
    e = data[ps.experiment]
    col = ps.args["metric"]["column"]
    if e.metrics.empty or col not in e.metrics:
        return False
    x = "env_steps" if "env_steps" in e.metrics and e.metrics.env_steps.notna().any() else "iteration"
    drawn = False
    for tag in ("a", "b"):
        where = ps.args.get(tag)
        if where is None:
            continue
        try:
            m = e.select(e.metrics, where, "metrics")
        except NotRun:
            continue
        curve = m.groupby(x)[col].mean()
        ax.plot(curve.index, curve.values, label=", ".join(f"{k}={v}" for k, v in where.items()))
        drawn = True
    ax.set_xlabel(x, fontsize=7)
    ax.set_ylabel(f"{col} (mean over seeds)", fontsize=7)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # five-digit step counts ran into each other
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    return drawn


def _batch_panel(ax, claim, data: dict[str, ExpData]) -> bool:
    ps = next((p for p in claim.parts if p.stat == "batch_ratio"), None)
    if ps is None or ps.experiment not in data:
        return False
    e = data[ps.experiment]
    col = ps.args.get("column", "dev_sq")
    vals, labels = [], []
    for tag in ("num", "den"):
        try:
            rows = e.select(e.batches, {**(ps.args.get(tag) or {}), "scope": "all"}, "batches")
        except NotRun:
            return False
        vals.append(rows[col].to_numpy(dtype=float))
        labels.append(", ".join(f"{k}={v}" for k, v in ps.args[tag].items())[:40])
    ax.boxplot(vals, showfliers=False)
    ax.set_xticks([1, 2], labels, fontsize=6)
    ax.set_ylabel(f"per-batch {col}", fontsize=7)
    return True


def claim_figure(verdict, claim, data: dict[str, ExpData], out: Path) -> str | None:
    """``out/<id>.png``; None when the claim has nothing to draw. A figure never sinks the report."""
    import matplotlib.pyplot as plt

    if verdict.not_run or not verdict.parts:
        return None
    n = len(verdict.parts)
    fig = plt.figure(figsize=(10, 0.8 + 0.62 * max(n, 3)))
    side_kind = any(p.stat in ("run_metric", "batch_ratio") for p in claim.parts)
    grid = fig.add_gridspec(n, 2, width_ratios=[1.3, 1])
    try:
        for i, p in enumerate(verdict.parts):  # the intervals take the whole width when there is no side panel
            _interval_axis(fig.add_subplot(grid[i, 0] if side_kind else grid[i, :]), p)
        if side_kind:
            side = fig.add_subplot(grid[:, 1])
            if not (_curve_panel(side, claim, data) or _batch_panel(side, claim, data)):
                side.axis("off")
        fig.suptitle(f"{claim.id}: {verdict.label}", fontsize=9)
        fig.tight_layout()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{claim.id.lower()}.png"
        fig.savefig(path, dpi=110)
        return str(path)
    except Exception as exc:  # noqa: BLE001
        print(f"[claims] figure for {claim.id} failed: {exc}", file=sys.stderr)
        return None
    finally:
        plt.close(fig)


__all__ = ["claim_figure"]
