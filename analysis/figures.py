"""Seaborn/matplotlib figures for a results folder.

Every figure is drawn on a ``matplotlib.figure.Figure`` created directly (no pyplot state,
so nothing leaks between figures and it renders with the Agg canvas whatever the
interactive backend is), carries its own title, axis labels with units and legend.
Plot functions take the tables :mod:`analysis.report` computes, so a figure and the
table printed next to it come from the same numbers.

Encodings, the same in every figure and every report:

* colour = the estimator (its registered name, :func:`estimator_color`), so ``grpo``,
  ``grpo[update=clip]`` and ``grpo[update=gspo]`` share grpo's colour whatever the sweep;
* marker, line style and hatch = the setting that splits an estimator's runs (``update``, the
  policy loss, or ``loss_agg``: the ``[...]`` of its label, :func:`analysis.load.label_variants`),
  :func:`variant_styles`, with a legend naming the setting;
* comparison figures (final scores) list estimators by the score they show, best first, and the
  failure bars follow the report's table (the same order);
* counts sit on whole-number ticks, and "estimator" names what is compared in every label.
"""

from __future__ import annotations

import functools
import io
import math
import warnings
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from harness.io import atomic_write_bytes

from . import stats
from .load import split_label

__all__ = [
    "ESTIMATOR_COLORS",
    "VariantStyle",
    "estimator_color",
    "estimator_palette",
    "variant_styles",
    "score_order",
    "x_label",
    "human_count",
    "plot_learning_curves",
    "plot_final_scores",
    "plot_probability_of_improvement",
    "plot_performance_profiles",
    "plot_stability",
    "plot_sensitivity",
    "plot_failure_counts",
]

#: The colours estimators take, all readable on white: seaborn's ``tab10``, then the darkest
#: shade of each hue of ``tab20b`` and of ``tab20c``.
ESTIMATOR_COLORS: tuple[str, ...] = tuple(sns.color_palette("tab10").as_hex()
                                          + sns.color_palette("tab20b").as_hex()[0::4]
                                          + sns.color_palette("tab20c").as_hex()[0::4])
#: The colours of estimators outside the registry (a plugin's), in order: picked apart from every
#: colour above (black, teal, violet-red, amber), then the ones the registry leaves free.
PLUGIN_COLORS: tuple[str, ...] = ("#000000", "#008b8b", "#c71585", "#ffb000")
#: Second encoding, in order: the first for labels without settings, then one per setting.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
HATCHES = ("", "///", "...", "xxx", "\\\\\\", "+++", "ooo", "---")

STABILITY_METRICS = {
    "approx_kl": "approx. KL(old ‖ new) (nats)",
    "clip_frac": "clip fraction (share of samples)",
    "entropy": "policy entropy (nats)",
    "grad_norm": "gradient norm (L2)",
    "explained_variance": "explained variance of V (1 = perfect)",
}
CURVE_METRICS = {
    "eval_return": "evaluation return (per episode)",
    "episode_return": "training episode return",
}
_X_LABELS = {
    "env_steps": "environment steps",
    "tokens": "sampled tokens",
    "wall_time_s": "wall-clock time (s)",
    "iteration": "training iteration",
}
_DPI = 130


@functools.cache
def _registered() -> tuple[str, ...]:
    # imported here: the registry brings torch, which only drawing a figure needs
    from harness.estimators.registry import estimator_names
    return tuple(estimator_names())


def estimator_color(name: str) -> str:
    """The colour of the estimator ``name`` (a label ``name[...]`` counts as its ``name``) in every
    figure: the i-th estimator of :func:`harness.estimators.registry.estimator_names` (registration
    order) takes the i-th of :data:`ESTIMATOR_COLORS` (cycling); any other name (a plugin's
    estimator, one renamed since the results were written) the colour its CRC-32 picks among the
    free ones (:data:`PLUGIN_COLORS` first), so it too is the same in every process;
    :func:`estimator_palette` gives several such names distinct colours."""
    name = split_label(name)[0]
    known = _registered()
    if name in known:
        return ESTIMATOR_COLORS[known.index(name) % len(ESTIMATOR_COLORS)]
    free = _free_colors()
    return free[zlib.crc32(name.encode()) % len(free)]


def _free_colors() -> tuple[str, ...]:
    """The colours for names outside the registry: :data:`PLUGIN_COLORS`, then those of
    :data:`ESTIMATOR_COLORS` the registry leaves free."""
    return PLUGIN_COLORS + ESTIMATOR_COLORS[len(_registered()):]


def estimator_palette(estimators: Iterable[str]) -> dict[str, str]:
    """Label -> colour for each of ``estimators``: a registered estimator's own
    (:func:`estimator_color`); the names outside the registry (plugins' estimators), in sorted
    order, take the colours the registry leaves free one after another, so no two of them share a
    colour while free ones remain, and a set of names gets the same colours in every figure and
    process."""
    labels = sorted(set(estimators))
    free = _free_colors()
    others = sorted({split_label(n)[0] for n in labels} - set(_registered()))
    theirs = {name: free[i % len(free)] for i, name in enumerate(others)}
    return {n: theirs.get(split_label(n)[0]) or estimator_color(n) for n in labels}


@dataclass(frozen=True)
class VariantStyle:
    """The second encoding of one label: its setting (``''`` when none differs) drawn as a
    marker (points), a line style (curves) and a hatch (bars)."""
    setting: str
    marker: str
    linestyle: str | tuple
    hatch: str


def variant_styles(labels: Iterable[str]) -> dict[str, VariantStyle]:
    """Label -> :class:`VariantStyle`: labels without settings take the first marker, line style
    and hatch, the distinct settings (``update=clip``, ...) the next ones in sorted order. Built
    once per report from all its labels, so a setting has the same style in each of its figures."""
    labels = sorted(set(map(str, labels)))
    settings = sorted({split_label(x)[1] for x in labels} - {""})
    first = 1 if any(split_label(x)[1] == "" for x in labels) else 0
    index = {"": 0} | {v: first + i for i, v in enumerate(settings)}

    def style(setting: str) -> VariantStyle:
        i = index[setting]
        return VariantStyle(setting, MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)],
                            HATCHES[i % len(HATCHES)])
    return {x: style(split_label(x)[1]) for x in labels}


def score_order(table: pd.DataFrame, col: str = "iqm") -> list[str]:
    """The estimators of ``table`` by ``col``, highest first (ties and NaN scores: by label, NaN
    last): the row order of a comparison figure."""
    t = table[["estimator", col]].drop_duplicates("estimator")
    t = t.assign(_nan=t[col].isna()).sort_values(["_nan", col, "estimator"],
                                                  ascending=[True, False, True], kind="mergesort")
    return t["estimator"].tolist()


def _variant_keys(styles: Mapping[str, VariantStyle]) -> list[str]:
    keys: list[str] = []
    for st in styles.values():
        for kv in filter(None, st.setting.split(", ")):
            k = kv.split("=", 1)[0]
            if k not in keys:
                keys.append(k)
    return keys


_KEY_NAMES = {"update": "update (policy loss)", "loss_agg": "loss_agg (loss aggregation)"}


@dataclass(frozen=True)
class Look:
    """How every figure of one report encodes what it draws: each estimator label's colour
    (``palette``, :func:`estimator_palette`), its second encoding (``styles``,
    :func:`variant_styles`; None: worked out from the labels drawn) and each task's budget
    (``budgets``: task -> (sample axis, budget), in the panel titles; curves end there)."""

    palette: Mapping[str, str]
    styles: Mapping[str, VariantStyle] | None = None
    budgets: Mapping[str, tuple[str, float]] | None = None


@dataclass(frozen=True)
class Curves:
    """How mean curves are drawn: the x axis (``env_steps``, ``wall_time_s``), the bootstrap
    replicates of their bands and its seed."""

    x: str = "env_steps"
    reps: int = 1000
    seed: int = 0


def _as_look(look: Look | Mapping[str, str]) -> Look:
    """A :class:`Look`, from a palette alone where that is what was given."""
    return look if isinstance(look, Look) else Look(palette=look)


def _styles_for(names: Iterable[str], styles: Mapping[str, VariantStyle] | None) -> dict[str, VariantStyle]:
    names = sorted(set(map(str, names)))
    styles = styles or variant_styles(names)
    return {n: styles.get(n) or variant_styles([n])[n] for n in names}


def _variant_legend(fig: Figure, styles: Mapping[str, VariantStyle], names: Iterable[str], what: str,
                    loc: str = "outside right lower") -> None:
    """A legend of the second encoding (``what``: marker, line or hatch) when ``names`` differ in
    it, titled by the setting it stands for."""
    used = {styles[n].setting: styles[n] for n in names if n in styles}
    if len(used) < 2:
        return
    keys = _variant_keys(styles)
    handles, texts = [], []
    for setting, st in sorted(used.items()):
        if what == "hatch":
            handles.append(Patch(facecolor="white", edgecolor="0.25", hatch=st.hatch))
        else:
            handles.append(Line2D([], [], color="0.25", lw=1.8 if what == "line" else 0,
                                  ls=st.linestyle, marker=st.marker if what == "marker" else None, ms=7))
        text = setting if len(keys) != 1 else setting.split("=", 1)[-1]
        texts.append(text or "one setting only")
    title = " / ".join(_KEY_NAMES.get(k, k) for k in keys)
    fig.legend(handles, texts, title=f"{what}: {title}", loc=loc, frameon=False)


def x_label(x: str) -> str:
    return _X_LABELS.get(x, x)


def human_count(n: float) -> str:
    """100000 -> '100k', 1500000 -> '1.5M'."""
    if not np.isfinite(n):
        return "?"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.3g}"


def _budget_title(task: str, budgets: Mapping[str, tuple[str, float]] | None) -> str:
    if not budgets or task not in budgets:
        return task
    col, b = budgets[task]
    return f"{task} · budget {human_count(b)} {x_label(col).replace('environment ', 'env ')}"


# ----------------------------------------------------------------------------- layout

def _figure(nrows: int, ncols: int, w: float = 4.2, h: float = 3.2, **kw):
    with sns.axes_style("whitegrid"), sns.plotting_context("paper", font_scale=1.05):
        # at least 8 in wide so the two-line suptitle of a one-panel figure fits
        fig = Figure(figsize=(max(8.0, w * ncols + 1.8), h * nrows + 0.6), layout="constrained",
                     dpi=_DPI)
        axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False, **kw))
    return fig, axes


def _legend(fig: Figure, palette: Mapping[str, str], names: Iterable[str], title="estimator",
            marker=None, lw: float = 2.2, styles: Mapping[str, VariantStyle] | None = None) -> None:
    """One entry per label in its colour (and, when the labels differ in a setting, its line
    style and marker, the title saying which setting)."""
    names = [n for n in sorted(set(names)) if n in palette]
    styles = _styles_for(names, styles)
    split = len({styles[n].setting for n in names}) > 1
    handles = [Line2D([], [], color=palette[n], lw=lw, marker=styles[n].marker if split and marker and lw else marker,
                      ls=styles[n].linestyle if split else "-", ms=8 if not lw else 6)
               for n in names]
    if split and lw:
        title += "\nline style: " + " / ".join(_KEY_NAMES.get(k, k) for k in _variant_keys(styles))
    if handles:
        fig.legend(handles, names, title=title, loc="outside right center", frameon=False)


def _save(fig: Figure, path: Path, dpi: int = _DPI) -> Path:
    """Write ``fig`` to ``path`` in the format its suffix names, through
    :func:`harness.io.atomic_write_bytes` (a reader sees the old file or the new one; a failed write
    names the file)."""
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or None, dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _empty(path: Path, title: str, message: str) -> Path:
    fig, axes = _figure(1, 1, w=6, h=2.2)
    ax = axes[0, 0]
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes)
    fig.suptitle(title)
    return _save(fig, path)


def _grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    ncols = min(n, max_cols)
    return math.ceil(n / ncols), ncols


# ----------------------------------------------------------------------------- curves

def _format_x(ax, x: str) -> None:
    if x in ("env_steps", "tokens"):
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: "0" if v == 0 else human_count(v)))


def _draw_bands(ax, bands: pd.DataFrame, palette: Mapping[str, str],
                styles: Mapping[str, VariantStyle]) -> None:
    for est, b in bands.groupby("estimator", sort=True):
        color = palette.get(est, "black")
        st = styles[est]
        sparse = len(b) < 4  # too few grid points for a line to be visible on its own
        sns.lineplot(x=b["x"].to_numpy(), y=b["mean"].to_numpy(), ax=ax, color=color, ls=st.linestyle,
                     lw=1.8, errorbar=None, legend=False, marker=st.marker if sparse else None)
        if sparse:
            ax.errorbar(b["x"], b["mean"], yerr=[b["mean"] - b["low"], b["high"] - b["mean"]],
                        fmt="none", ecolor=color, capsize=3)
        ax.fill_between(b["x"], b["low"], b["high"], color=color, alpha=0.2, lw=0)


def _task_x(df: pd.DataFrame, x: str) -> str:
    # an LM task's env_steps count its sampled tokens: label the axis by what it counts
    if x == "env_steps" and "tokens" in df.columns and df["tokens"].notna().any():
        return "tokens"
    return x


def _band_panels(df: pd.DataFrame, metrics: list, axes, look: Look, curves: Curves):
    """The panels of a metrics x tasks grid of mean curves (row ``i``: a metric, column: a task,
    sorted; ``look.styles`` complete for the labels drawn):
    each one's bands (:func:`stats.curve_bands` over the task's own x axis) drawn and its x axis
    formatted; yields ``(i, metric, task, ax, x of the task, bands)`` for the caller's labels.
    Curves end at the task's budget (``look.budgets``: task -> (sample axis, budget)): on the sample
    axis the grid ends there, on another axis (wall time) the rows past it are left out (column
    ``within_budget`` where the frame has one, :func:`stats.within_budget`)."""
    for j, task in enumerate(sorted(df["task"].unique())):
        tdf = df[df["task"] == task]
        col, budget = (look.budgets or {}).get(task, (None, None))
        # the sample axis is the column the task's budget counts (the toy task's env_steps are
        # sequences, though it logs tokens too); without a budget, tokens where logged
        tx = col if col is not None and curves.x == "env_steps" and col in tdf else _task_x(tdf, curves.x)
        if col != tx and "within_budget" in tdf:
            tdf = tdf[tdf["within_budget"].to_numpy(dtype=bool)]
        for i, metric in enumerate(metrics):
            ax = axes[i, j]
            bands = stats.curve_bands(tdf, metric, tx, reps=curves.reps, seed=curves.seed,
                                      x_max={task: budget} if col == tx else None)
            _draw_bands(ax, bands, look.palette, look.styles)
            _format_x(ax, tx)
            yield i, metric, task, ax, tx, bands


def _axis_words(xs: set[str], x: str) -> str:
    """The x axis a figure's title names: its panels' own (tokens for an LM task, :func:`_task_x`),
    ``x`` where panels differ or none was drawn."""
    return x_label(next(iter(xs)) if len(xs) == 1 else x)


def plot_learning_curves(df: pd.DataFrame, path: Path, look: Look | Mapping[str, str],
                         curves: Curves = Curves()) -> Path:
    """Rows: eval_return and training episode_return (when logged); columns: tasks.
    Mean over runs with a 95% bootstrap band, runs interpolated onto a common grid."""
    metrics = [m for m in CURVE_METRICS if df[m].notna().any()]
    tasks = sorted(df["task"].unique())
    title = "Learning curves"
    if not metrics or not tasks:
        return _empty(path, title, "no eval_return or episode_return logged")
    look = _as_look(look)
    look = Look(look.palette, _styles_for(df["estimator"].unique(), look.styles), look.budgets)
    x, budgets = curves.x, look.budgets
    fig, axes = _figure(len(metrics), len(tasks))
    xs = set()
    for i, metric, task, ax, tx, bands in _band_panels(df, metrics, axes, look, curves):
        xs.add(tx)
        ax.set_xlabel(x_label(tx))
        ax.set_ylabel(CURVE_METRICS[metric])
        ax.set_title(_budget_title(task, budgets) if i == 0 else f"{task}: {metric}",
                     fontsize="medium")
        if bands.empty:
            ax.text(0.5, 0.5, f"no {metric}", ha="center", transform=ax.transAxes)
    n_runs = df.drop_duplicates(["task", "estimator", "run_dir", "seed"]).groupby(
        ["task", "estimator"]).size()
    n_txt = (f"{n_runs.min()}" if n_runs.min() == n_runs.max() else f"{n_runs.min()}–{n_runs.max()}")
    fig.suptitle(f"{title} vs {_axis_words(xs, x)}\nmean over runs with 95% bootstrap band "
                 f"({n_txt} runs per estimator and task)")
    _legend(fig, look.palette, df["estimator"].unique(), styles=look.styles)
    return _save(fig, path)


def plot_stability(df: pd.DataFrame, path: Path, look: Look | Mapping[str, str],
                   curves: Curves = Curves(reps=500)) -> Path:
    """One row per logged diagnostic (approx_kl, clip_frac, entropy, grad_norm,
    explained_variance; absent or all-null ones skipped), one column per task."""
    metrics = [m for m in STABILITY_METRICS if m in df and df[m].notna().any()]
    tasks = sorted(df["task"].unique())
    title = "Training stability diagnostics"
    if not metrics or not tasks:
        return _empty(path, title, "none of " + ", ".join(STABILITY_METRICS) + " was logged")
    look = _as_look(look)
    look = Look(look.palette, _styles_for(df["estimator"].unique(), look.styles), look.budgets)
    x, budgets = curves.x, look.budgets
    fig, axes = _figure(len(metrics), len(tasks), h=2.6)
    xs = set()
    for i, metric, task, ax, tx, bands in _band_panels(df, metrics, axes, look, curves):
        xs.add(tx)
        ax.set_ylabel(STABILITY_METRICS[metric])
        ax.set_xlabel(x_label(tx) if i == len(metrics) - 1 else "")
        if i == 0:
            ax.set_title(_budget_title(task, budgets), fontsize="medium")
        if bands.empty:
            ax.text(0.5, 0.5, f"{metric} not logged", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
    fig.suptitle(f"{title} vs {_axis_words(xs, x)}\nmean over runs with 95% bootstrap band")
    _legend(fig, look.palette, df["estimator"].unique(), styles=look.styles)
    return _save(fig, path)


# ----------------------------------------------------------------------------- scores

def plot_final_scores(table: pd.DataFrame, runs: pd.DataFrame, path: Path,
                      look: Look | Mapping[str, str], *, last_n: int = 5,
                      aggregate: pd.DataFrame | None = None) -> Path:
    """IQM of final scores with 95% stratified-bootstrap intervals, one panel per task
    (dots: individual runs), plus min-max-normalised scores over all tasks. Each panel lists
    its estimators by the IQM it shows, best on top (:func:`score_order`); the marker tells
    apart the settings an estimator was run with (:func:`variant_styles`)."""
    tasks = sorted(table["task"].unique())
    panels = [(t, table[table["task"] == t]) for t in tasks]
    if aggregate is not None and not aggregate.empty and len(tasks) > 1:
        panels.append(("All tasks (min–max normalised per task)", aggregate))
    title = (f"Final score: IQM over runs of each run's mean of its last {last_n} evaluations, "
             "95% CI")
    if not panels:
        return _empty(path, title, "no run has a final score")
    look = _as_look(look)
    palette, budgets = look.palette, look.budgets
    styles = _styles_for(table["estimator"].unique(), look.styles)
    n_rows = max(t["estimator"].nunique() for _, t in panels)
    nrows, ncols = _grid_shape(len(panels))
    fig, axes = _figure(nrows, ncols, h=0.45 * n_rows + 1.6)
    rng = np.random.default_rng(0)
    for k, (name, t) in enumerate(panels):
        ax = axes.flat[k]
        order = score_order(t)
        for pos, est in enumerate(order):
            row = t[t["estimator"] == est]
            if row.empty or not np.isfinite(row["iqm"].iloc[0]):
                continue
            row = row.iloc[0]
            c = palette.get(est, "black")
            if name in tasks:
                pts = runs[(runs["task"] == name) & (runs["estimator"] == est)]["score"].dropna()
                ax.scatter(pts, pos + rng.uniform(-0.15, 0.15, len(pts)), s=9, color=c,
                           alpha=0.45, lw=0, zorder=2)
            ax.errorbar(row["iqm"], pos, xerr=[[row["iqm"] - row["iqm_low"]],
                                               [row["iqm_high"] - row["iqm"]]],
                        fmt=styles[est].marker, color=c, capsize=4, lw=2, ms=6, zorder=3)
        ax.set_yticks(range(len(order)), order)
        for label in ax.get_yticklabels():
            label.set_color(palette.get(label.get_text(), "black"))
        ax.set_ylim(len(order) - 0.5, -0.5)
        ax.set_title(_budget_title(name, budgets), fontsize="medium")
        ax.set_xlabel("normalised score (0 = worst run, 1 = best)" if name not in tasks
                      else "final return (IQM, 95% CI; dots = runs)")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    # the y axis names each estimator, in its colour, best first; a legend for the marker only
    fig.suptitle(title + "\nrows by IQM, best first; colour = estimator")
    _variant_legend(fig, styles, table["estimator"].unique(), "marker", loc="outside right center")
    return _save(fig, path)


def plot_probability_of_improvement(poi: pd.DataFrame, path: Path,
                                    palette: Mapping[str, str], *, n_tasks: int) -> Path:
    """Matrix of P(row estimator > column estimator), averaged over tasks; rows and columns
    by the row's mean P(X > Y) over the others, highest first."""
    title = "Probability of improvement"
    if poi.empty:
        return _empty(path, title, "needs at least two estimators sharing a task")
    mean_p = poi.groupby("x", as_index=False)["p"].mean().rename(columns={"x": "estimator"})
    order = score_order(mean_p, "p")
    order += sorted((set(poi["x"]) | set(poi["y"])) - set(order))
    mat = poi.pivot(index="x", columns="y", values="p").reindex(index=order, columns=order)
    n = len(order)
    with sns.axes_style("white"), sns.plotting_context("paper", font_scale=1.05):
        # at least 6.5 in wide so the three-line title fits above a small matrix
        fig = Figure(figsize=(max(6.5, 0.85 * n + 3.2), 0.7 * n + 2.0), layout="constrained", dpi=_DPI)
        ax = fig.subplots()
        ax.set_facecolor("0.92")  # the diagonal (X = Y) is left blank
        with warnings.catch_warnings():  # seaborn 0.13 calls a soon-deprecated cmap API
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            sns.heatmap(mat, ax=ax, vmin=0, vmax=1, center=0.5, cmap="vlag_r", annot=True, fmt=".2f",
                        square=True, linewidths=0.5,
                        cbar_kws={"label": "P(X > Y) + ½ P(X = Y)"}, annot_kws={"fontsize": "small"})
    ax.tick_params(axis="y", rotation=0)
    ax.tick_params(axis="x", rotation=30)
    ax.set_xlabel("estimator Y (column)")
    ax.set_ylabel("estimator X (row)")
    for lab in list(ax.get_xticklabels()) + list(ax.get_yticklabels()):
        lab.set_color(palette.get(lab.get_text(), "black"))
    ax.set_title(f"{title}: P(X > Y) on final score,\naveraged over {n_tasks} task(s); "
                 "rows by mean, best first\n(95% intervals in report.md)", fontsize="medium")
    return _save(fig, path)


def plot_performance_profiles(profiles: pd.DataFrame, path: Path, look: Look | Mapping[str, str]) -> Path:
    """Score distributions: fraction of runs with final score > tau, 95% CI bands.
    ``profiles`` has columns panel, estimator, tau, fraction, low, high."""
    title = "Performance profiles (score distributions)"
    if profiles.empty:
        return _empty(path, title, "no final scores")
    panels = list(dict.fromkeys(profiles["panel"]))
    look = _as_look(look)
    palette, budgets = look.palette, look.budgets
    styles = _styles_for(profiles["estimator"].unique(), look.styles)
    nrows, ncols = _grid_shape(len(panels))
    fig, axes = _figure(nrows, ncols)
    for k, name in enumerate(panels):
        ax = axes.flat[k]
        p = profiles[profiles["panel"] == name]
        for est, e in p.groupby("estimator", sort=True):
            c = palette.get(est, "black")
            ax.step(e["tau"], e["fraction"], where="post", color=c, lw=1.8, ls=styles[est].linestyle)
            ax.fill_between(e["tau"], e["low"], e["high"], step="post", color=c, alpha=0.15, lw=0)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(_budget_title(name, budgets), fontsize="medium")
        ax.set_xlabel("normalised score threshold τ" if name not in (budgets or {})
                      else "final return threshold τ")
        ax.set_ylabel("fraction of runs with score > τ")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title}, 95% stratified-bootstrap bands")
    _legend(fig, palette, profiles["estimator"].unique(), styles=styles)
    return _save(fig, path)


def plot_sensitivity(sens: pd.DataFrame, path: Path, look: Look | Mapping[str, str], *,
                     last_n: int = 5) -> Path:
    """Final score (IQM, 95% CI) against each swept hyperparameter, per task.
    ``sens`` has columns task, estimator, hyperparameter, value, n, iqm, iqm_low, iqm_high."""
    title = "Hyperparameter sensitivity"
    if sens.empty:
        return _empty(path, title, "no hyperparameter among " + ", ".join(stats.HYPERPARAMETERS)
                      + " varies within any estimator × task")
    panels = list(sens.groupby(["hyperparameter", "task"], sort=True).groups)
    look = _as_look(look)
    palette, budgets = look.palette, look.budgets
    styles = _styles_for(sens["estimator"].unique(), look.styles)
    nrows, ncols = _grid_shape(len(panels))
    fig, axes = _figure(nrows, ncols)
    for k, (hp, task) in enumerate(panels):
        ax = axes.flat[k]
        p = sens[(sens["hyperparameter"] == hp) & (sens["task"] == task)]
        for est, e in p.groupby("estimator", sort=True):
            e = e.sort_values("value")
            c = palette.get(est, "black")
            ax.errorbar(e["value"], e["iqm"], yerr=[e["iqm"] - e["iqm_low"], e["iqm_high"] - e["iqm"]],
                        color=c, marker=styles[est].marker, ls=styles[est].linestyle, capsize=3, lw=1.6, ms=5)
            for v, y, n in zip(e["value"], e["iqm"], e["n"]):
                ax.annotate(f"n={n}", (v, y), textcoords="offset points", xytext=(5, 4),
                            fontsize="x-small", color=c)
        vals = p["value"].to_numpy(dtype=float)
        if (vals > 0).all() and vals.max() / vals.min() >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(hp)
        ax.set_ylabel(f"final return (IQM of last {last_n} evals)")
        ax.set_title(f"{_budget_title(task, budgets)}\nswept: {hp}", fontsize="medium")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title}: final score vs swept value, IQM with 95% bootstrap CI "
                 "(n = runs per value)")
    _legend(fig, palette, sens["estimator"].unique(), marker="o", styles=styles)
    return _save(fig, path)


def plot_failure_counts(counts: pd.DataFrame, path: Path, palette: Mapping[str, str], *,
                        styles: Mapping[str, VariantStyle] | None = None) -> Path:
    """Bars: diverged and collapsed runs per estimator, summed over tasks, labelled k/n, in the
    order of ``counts``' rows (the report's: by score, best first); counts on integer ticks; the
    hatch tells apart the settings an estimator was run with.
    ``counts`` has columns estimator, n_runs, diverged, collapsed."""
    title = "Diverged and collapsed runs"
    if counts.empty:
        return _empty(path, title, "no runs")
    ests = counts["estimator"].tolist()
    styles = _styles_for(ests, styles)
    fig, axes = _figure(1, 2, w=max(3.2, 0.55 * len(ests) + 1.5), h=3.2)
    for ax, col, what in ((axes[0, 0], "diverged", "diverged (NaN/inf; status = diverged)"),
                          (axes[0, 1], "collapsed", "collapsed (fell below ½ of its best)")):
        sns.barplot(x=counts["estimator"], y=counts[col], hue=counts["estimator"], ax=ax,
                    palette=dict(palette), legend=False, order=ests, hue_order=ests,
                    saturation=1)  # the palette's colour itself, as in every other figure
        for bar in ax.patches:  # bar i stands at x = i
            est = ests[round(bar.get_x() + bar.get_width() / 2)]
            bar.set_hatch(styles[est].hatch)
            bar.set_edgecolor("0.25")
        for pos, (k, n) in enumerate(zip(counts[col], counts["n_runs"])):
            ax.text(pos, k, f"{int(k)}/{int(n)}", ha="center", va="bottom", fontsize="small")
        ax.set_ylim(0, max(1, counts["n_runs"].max()) * 1.12)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # runs are counted whole
        ax.set_xlabel("estimator")
        ax.set_ylabel("runs (count, all tasks)")
        ax.set_title(what, fontsize="medium")
        for lab in ax.get_xticklabels():  # long labels (name[update=...]) end under their bar
            lab.set(rotation=30, ha="right", rotation_mode="anchor")
    fig.suptitle(f"{title} per estimator (labels: count / runs)")
    _legend(fig, palette, ests, marker="s", lw=0, styles=styles)
    _variant_legend(fig, styles, ests, "hatch")
    return _save(fig, path)
