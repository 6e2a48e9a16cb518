"""One figure per statistical claim: its deciding statistic.

Left: the primary test's estimate and interval at the level it was judged at, against its rule
(the threshold as a line, the smallest effect that counts dashed, a band shaded), then each check.
Right, for a claim on training runs: the per-seed values of the compared arms (dots, each seed's
pair joined) and, below, the mean curve of the primary's metric column per arm with a 95% t band
over seeds and the number of seeds; for a claim on probe batches: the per-batch values of the
compared configs as box plots. An arm is drawn in the colour of the estimator its runs share
(:func:`analysis.figures.estimator_color`, as in every report; grey when they share none), the
two arms told apart by marker and line style.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import scipy.stats

from harness.config import DISK_FULL

from .evidence import ExpData, NotRun


def _level_text(level: float) -> str:
    pct = 100 * level
    return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.3g}%"


#: font sizes (points) of the figure's text: panel titles, axis labels, ticks, legends
_TITLE, _LABEL, _TICK, _LEGEND = 8.5, 8, 7.5, 7


def _setting(k: str, v) -> str:
    """``key=value`` as the command line writes it (``None`` is Hydra's ``null``)."""
    return f"{k}={'null' if v is None else v}"


def _interval_axis(ax, p) -> None:
    """One part: its point and interval against its rule, on the part's own scale; the rule's
    lines and band named in a legend on the primary's axis."""
    color = {"supported": "tab:green", "refuted": "tab:red", "reported": "tab:purple"}.get(p.verdict, "tab:grey")
    xs = [x for x in (p.point, p.low, p.high) if np.isfinite(x)]
    rule = p.spec
    if rule is not None:
        if rule.kind in ("equivalent", "between"):
            lo, hi = rule.band
            ax.axvspan(lo, hi, color="tab:blue", alpha=0.15, lw=0,
                       label="equivalence margin" if rule.kind == "equivalent" else "bounds")
            xs += [lo, hi]
        elif rule.kind in ("greater", "less"):
            ax.axvline(rule.a, color="tab:blue", lw=1, label="threshold")
            xs.append(rule.a)
            if rule.b:  # the smallest effect that counts: the line the interval is read against
                ax.axvline(rule.threshold, color="tab:blue", lw=1, ls="--", label="smallest effect that counts")
                xs.append(rule.threshold)
    if np.isfinite(p.low) and np.isfinite(p.high):
        ax.plot([p.low, p.high], [0, 0], color=color, lw=4, solid_capstyle="butt", label="interval")
    if np.isfinite(p.point):
        ax.plot([p.point], [0], "o", color="black", ms=4, label="estimate")
    if xs:
        lo, hi = min(xs), max(xs)
        pad = 0.08 * (hi - lo) or 0.1 * max(abs(hi), 1e-9)
        ax.set_xlim(lo - pad, hi + pad)
    ax.set_yticks([])
    ax.tick_params(axis="x", labelsize=_TICK)
    if p.role == "primary" and rule is not None:
        ax.legend(fontsize=_LEGEND - 1, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                  handlelength=1.5)
    tail = (f" [{p.rule}, {_level_text(p.level)}]: {p.verdict}" if p.role != "reported"
            else f" [{_level_text(p.level)}]")  # the rule and the verdict are never cut
    role = "" if p.role == "primary" else f"{p.role}: "
    ax.set_title(textwrap.shorten(role + p.name, max(90 - len(tail), 20)) + tail, fontsize=_TITLE, loc="left")


#: arm -> (marker, line style, colour when its runs share no estimator)
_ARM_STYLE = {"a": ("o", "-", "0.15"), "b": ("s", "--", "0.55")}


def _arm_colors(claim, data: dict[str, ExpData]) -> dict[str, str]:
    """Arm tag -> the colour of the one estimator its runs share, else its grey."""
    from ..figures import estimator_color  # (seaborn) only when a figure is drawn

    ps = claim.primary
    e = data.get(ps.experiment) if ps is not None else None
    out = {}
    for tag, (_, _, grey) in _ARM_STYLE.items():
        names = []
        where = ps.args.get(tag) if ps is not None else None
        if e is not None and where is not None and "estimator" in e.metrics:
            try:
                names = e.select(e.metrics, where, "metrics")["estimator"].dropna().unique()
            except NotRun:
                pass
        out[tag] = estimator_color(str(names[0])) if len(names) == 1 else grey
    return out


def _arm(claim, tag: str) -> str:
    where = (claim.primary.args.get(tag) or {}) if claim.primary else {}
    return ", ".join(_setting(k, v) for k, v in where.items()) or tag


def _seed_panel(ax, verdict, claim, colors: dict[str, str] | None = None) -> bool:
    """Per-seed values of the primary's arms (training claims): dots, pairs joined by seed."""
    colors = colors or {tag: grey for tag, (_, _, grey) in _ARM_STYLE.items()}
    est = verdict.estimate
    vals = getattr(est, "values", None) or {}
    if est is None or est.unit != "seeds" or not vals:
        return False
    if "a" in vals and "b" in vals and len(vals["a"]) == len(vals["b"]):
        a, b = np.asarray(vals["a"], float), np.asarray(vals["b"], float)
        for ya, yb in zip(a, b):
            ax.plot([0, 1], [yb, ya], color="tab:grey", lw=0.5, alpha=0.6)
        for x, k, y in ((0, "b", b), (1, "a", a)):
            ax.plot(np.full_like(y, x), y, _ARM_STYLE[k][0], ms=3, color=colors[k],
                    label=f"{_arm(claim, k)} (n={y.size})")
        ax.set_xticks([0, 1], ["b", "a"], fontsize=_TICK)
    elif "a" in vals and "b" in vals:
        for i, k in enumerate(("b", "a")):
            y = np.asarray(vals[k], float)
            jitter = np.random.default_rng(0).uniform(-0.08, 0.08, y.size)
            ax.plot(i + jitter, y, _ARM_STYLE[k][0], ms=3, alpha=0.6, color=colors[k],
                    label=f"{_arm(claim, k)} (n={y.size}, mean {y.mean():.2f})")
        ax.set_xticks([0, 1], ["b", "a"], fontsize=_TICK)
    else:
        (k, y), = list(vals.items())[:1]
        y = np.asarray(y, float)
        ax.plot(np.random.default_rng(0).uniform(-0.1, 0.1, y.size), y, "o", ms=3, color=colors["a"],
                label=f"{_arm(claim, 'a') if k == 'a' else k} (n={y.size})")
        ax.set_xticks([])
    ax.set_ylabel("per-seed value", fontsize=_LABEL)
    ax.tick_params(labelsize=_TICK)
    ax.legend(fontsize=_LEGEND)
    ax.set_title("the primary's per-seed values (a, b: its arms)", fontsize=_TITLE, loc="left")
    return True


def _curve_panel(ax, claim, data: dict[str, ExpData], colors: dict[str, str] | None = None) -> bool:
    ps = claim.primary
    if ps is None or ps.stat != "run_metric" or ps.experiment not in data:
        return False
    colors = colors or _arm_colors(claim, data)
    e = data[ps.experiment]
    col = ps.args["metric"]["column"]
    if e.metrics.empty or col not in e.metrics:
        return False
    x = "env_steps" if "env_steps" in e.metrics and e.metrics.env_steps.notna().any() else "iteration"
    drawn = False
    for tag, color in colors.items():
        where = ps.args.get(tag)
        if where is None:
            continue
        try:
            m = e.select(e.metrics, where, "metrics")
        except NotRun:
            continue
        m = m.dropna(subset=[col]).sort_values(x)
        # the k-th evaluation of every seed is one point, at the seeds' median step: runs whose
        # episodes end at different steps evaluate at slightly different env_steps, and grouping by
        # the step itself left 3 or 4 seeds per point
        run = "run_dir" if "run_dir" in m else "run_id"
        m = m.assign(_k=m.groupby(run).cumcount())
        g = m.groupby("_k")
        mean, sd, n, xs = g[col].mean(), g[col].std(ddof=1), g[col].count(), g[x].median()
        q = scipy.stats.t.ppf(0.975, np.maximum(n - 1, 1))
        half = (q * sd / np.sqrt(n)).fillna(0.0)
        label = f"{tag}: " + ", ".join(_setting(k, v) for k, v in where.items()) + f" (n={int(n.max())} seeds)"
        ax.plot(xs.values, mean.values, color=color, ls=_ARM_STYLE[tag][1], label=label, lw=1)
        ax.fill_between(xs.values, (mean - half).values, (mean + half).values, color=color, alpha=0.2, lw=0)
        drawn = True
    ax.set_xlabel(x, fontsize=_LABEL)
    ax.set_ylabel(col, fontsize=_LABEL)
    ax.set_title("mean over seeds, 95% t band", fontsize=_TITLE, loc="left")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # five-digit step counts ran into each other
    ax.tick_params(labelsize=_TICK)
    ax.legend(fontsize=_LEGEND)
    return drawn


def _batch_panel(ax, claim, data: dict[str, ExpData]) -> bool:
    ps = claim.primary
    if ps is None or ps.stat != "batch_ratio" or ps.experiment not in data:
        return False
    e = data[ps.experiment]
    col = ps.args.get("column", "dev_sq")
    vals, labels = [], []
    num, den = (ps.args.get(tag) or {} for tag in ("num", "den"))
    for where in (num, den):
        try:
            rows = e.select(e.batches, {**where, "scope": "all"}, "batches")
        except NotRun:
            return False
        vals.append(rows[col].to_numpy(dtype=float))
        differ = {k: v for k, v in where.items() if (num if where is den else den).get(k) != v} or where
        labels.append(textwrap.fill(", ".join(_setting(k, v) for k, v in differ.items()), 28) + f"\n(n={len(rows)})")
    ax.boxplot(vals, showfliers=False)
    ax.set_xticks([1, 2], labels, fontsize=_TICK)
    ax.set_ylabel(f"per-batch {col}", fontsize=_LABEL)
    ax.tick_params(axis="y", labelsize=_TICK)
    ax.set_title("per-batch values (box: quartiles; whiskers: 1.5 IQR)", fontsize=_TITLE, loc="left")
    return True


def claim_figure(verdict, claim, data: dict[str, ExpData], out: Path) -> str | None:
    """``out/<id>.png``; None when the claim has nothing to draw. A figure never sinks the report
    (a full disk ends the command: no later file fits either)."""
    import matplotlib.pyplot as plt

    if verdict.not_run or not verdict.parts:
        return None
    from ..figures import _save  # (seaborn) only when a figure is drawn
    panels = list(verdict.parts) + list(verdict.reported)[:6]
    n = len(panels)
    training = claim.primary is not None and claim.primary.stat in ("run_metric", "frontier_gap")
    side_kind = training or (claim.primary is not None and claim.primary.stat == "batch_ratio")
    rows = max(n, 4 if training else 2)
    fig = plt.figure(figsize=(11, 1.0 + 0.75 * max(rows, 3)))
    grid = fig.add_gridspec(rows, 2, width_ratios=[1.3, 1])
    try:
        for i, p in enumerate(panels):  # the intervals take the whole width when there is no side panel
            _interval_axis(fig.add_subplot(grid[i, 0] if side_kind else grid[i, :]), p)
        if training:
            colors = _arm_colors(claim, data)
            half = rows // 2
            top = fig.add_subplot(grid[:half, 1])
            if not _seed_panel(top, verdict, claim, colors):
                top.axis("off")
            bottom = fig.add_subplot(grid[half:, 1])
            if not _curve_panel(bottom, claim, data, colors):
                bottom.axis("off")
        elif side_kind:
            side = fig.add_subplot(grid[:, 1])
            if not _batch_panel(side, claim, data):
                side.axis("off")
        fig.suptitle(textwrap.shorten(f"{claim.id}: {verdict.label} — {claim.short}", 120), fontsize=10)
        fig.tight_layout()
        return str(_save(fig, out / f"{claim.id.lower()}.png", dpi=110))
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:  # no figure will fit: the command ends (analysis.cli)
            raise
        print(f"[claims] figure for {claim.id} failed: {exc}", file=sys.stderr)
        return None
    finally:
        plt.close(fig)


__all__ = ["claim_figure"]
