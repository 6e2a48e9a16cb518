"""``python -m analysis probes DIR``: the gradient probes' bias and variance, as tables and a figure.

A probe run (``mode=probe``, :mod:`harness.probes`) writes ``probe.parquet``: per estimator, the
statistics of M independent gradient estimates against the truth (the exact gradient on the toy
task, a high-sample reference on a control task), each with a bootstrap interval over batches
(:mod:`harness.probes.stats` defines them). This module reads every finished probe run under a
folder (through :mod:`harness.io.files`, the one reader of run files), groups the rows by the
probe's setting (task, target, policy, batch size, truth, ...: whatever the rows do not share is
named in each group's heading) and writes ``probes.md`` and ``probes.png``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.io import atomic_write_text
from harness.io.files import RunFileError, read_table
from harness.io.finished import check_run

from .groups import text
from .load import find_run_dirs

__all__ = ["SHOWN", "ProbeData", "Settings", "load_probes", "probe_groups", "split_settings", "write_probe_report"]

PROBE_FILE = "probe.parquet"

#: The statistics the tables show, in order: column -> (heading, what it is; harness.probes.stats).
SHOWN: dict[str, tuple[str, str]] = {
    "rel_bias_sq": ("rel. bias²", "||E g - t||² / ||t||², debiased: 0 for an unbiased estimator"),
    "rel_total_var": ("rel. variance", "tr Cov(g) / ||t||²: the noise of one batch's estimate"),
    "snr": ("SNR", "||E g||² / tr Cov(g): signal per unit of noise in one batch"),
    "cos": ("cos(g, t)", "mean over batches of one estimate's cosine with the truth"),
    "cos_exp": ("cos(E g, t)", "the expected estimate's direction against the truth's"),
    "weight": ("weight", "<E g, t> / ||t||²: 1 for an unbiased estimator"),
}
#: Columns that name a run or a row rather than the probe's setting.
_ROW_KEYS = ("run_id", "run_dir", "estimator", "label", "seed", "wall_time_s", "scope", "prompt_kind",
             "prompt_success")
#: Measured columns without an interval (everything with one is a statistic too).
_MEASURED = ("grad_dim", "true_grad_norm", "mean_grad_norm", "bias_norm", "cos_mean", "rel_bias", "critic_rmse",
             "critic_ev", "value_true", "value_mean", "is_weight_m2", "reward_std_tok", "tokens_per_batch")


class NoProbesError(ValueError):
    """No finished probe run under the folder."""


@dataclass
class ProbeData:
    """The rows of every finished probe run's ``probe.parquet`` (``run_dir`` added) and the probe
    runs left out, each ``{"run_dir", "reason"}``."""

    rows: pd.DataFrame
    left_out: list[dict] = field(default_factory=list)


def load_probes(path: str | Path) -> ProbeData:
    """Every probe run under ``path``: a run folder holding ``probe.parquet``. One that is not
    finished (:func:`harness.io.finished.check_run`) or whose file does not read is left out, with
    the reason; ``NoProbesError`` when none is left."""
    frames, left_out = [], []
    for d in find_run_dirs(path):
        if not (d / PROBE_FILE).is_file():
            continue
        check = check_run(d)
        if not check.finished:
            left_out.append({"run_dir": str(d), "reason": check.reason or str(check.status)})
            continue
        try:
            frames.append(read_table(d / PROBE_FILE).to_pandas().assign(run_dir=str(d)))
        except (RunFileError, OSError, ValueError) as exc:
            left_out.append({"run_dir": str(d), "reason": f"unreadable {PROBE_FILE} ({exc})".splitlines()[0]})
    if not frames:
        raise NoProbesError(f"no finished probe run (a run folder with {PROBE_FILE}, from mode=probe) under {path}")
    return ProbeData(pd.concat(frames, ignore_index=True), left_out)


def _is_statistic(col: str, columns: set[str]) -> bool:
    if col in _MEASURED or col.endswith(("_low", "_high", "_se")):
        return True
    return f"{col}_low" in columns or f"{col}_se" in columns


def setting_columns(rows: pd.DataFrame) -> list[str]:
    """The columns that describe how a probe was run (not a row's name, not a statistic)."""
    cols = set(rows.columns)
    return [c for c in rows.columns if c not in _ROW_KEYS and not _is_statistic(c, cols)]


@dataclass
class Settings:
    """How the rows' settings (:func:`setting_columns`) split. ``shared``: ``{column: value}``
    every row has. ``probe``: the columns that vary within an estimator (a batch size, a policy):
    their values are separate comparisons. ``own``: those that take one value per estimator (its
    critic, its whitening), shown as a column beside it. ``keyed``: the rows with every setting as
    its label text (:func:`analysis.groups.text`), what the three are read from."""

    shared: dict[str, str]
    probe: list[str]
    own: list[str]
    keyed: pd.DataFrame


def split_settings(rows: pd.DataFrame) -> Settings:
    """The rows' settings, split (:class:`Settings`)."""
    columns = setting_columns(rows)
    keyed = rows.assign(**{c: rows[c].map(text) for c in columns})
    varying = [c for c in columns if keyed[c].nunique() > 1]
    own = [c for c in varying if keyed.groupby("estimator")[c].nunique().max() == 1]
    shared = {c: keyed[c].iloc[0] for c in columns if c not in varying}
    return Settings(shared, [c for c in varying if c not in own], own, keyed)


def probe_groups(rows: pd.DataFrame, settings: Settings | None = None) -> list[tuple[str, pd.DataFrame]]:
    """``(heading, rows)`` per distinct probe setting, the heading naming the task, the target and
    every probe setting the groups differ in (:func:`split_settings`, computed when not given;
    the settings all rows share are stated once, by :func:`report_markdown`)."""
    settings = settings if settings is not None else split_settings(rows)
    heading_keys = list(dict.fromkeys(["task", "target", *settings.probe]))
    out = []
    for key, g in settings.keyed.groupby(heading_keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        heading = " · ".join(f"{k}={v}" for k, v in zip(heading_keys, key))
        out.append((heading, rows.loc[g.index]))
    return out


def _whole(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the whole-batch scope (``scope`` all; every row when there is no scope)."""
    return rows[rows["scope"].fillna("all") == "all"] if "scope" in rows else rows


def _cell(row: pd.Series, col: str) -> str:
    if col not in row.index or pd.isna(row[col]):
        return "—"
    low, high = row.get(f"{col}_low"), row.get(f"{col}_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return f"{row[col]:.4g}"
    return f"{row[col]:.4g} [{low:.4g}, {high:.4g}]"


def _name(row: pd.Series) -> str:
    label = row.get("label")
    return str(label) if isinstance(label, str) and label else str(row["estimator"])


def group_table(rows: pd.DataFrame, own: list[str]) -> str:
    """Markdown: one row per estimator and seed (the whole-batch scope), ordered by relative
    variance, with the estimator settings ``own`` (:class:`Settings`) beside its name; each
    cell ``value [95% bootstrap interval]``."""
    whole = _whole(rows)
    shown = [c for c in SHOWN if c in whole.columns and whole[c].notna().any()]
    order = whole.sort_values(["rel_total_var" if "rel_total_var" in whole else shown[0], "seed"])
    head = "| estimator | seed | " + "".join(f"{c} | " for c in own) + " | ".join(SHOWN[c][0] for c in shown) + " |"
    lines = [head, "|" + " --- |" * (len(shown) + len(own) + 2)]
    lines += [f"| {_name(r)} | {r['seed']} | " + "".join(f"{text(r[c])} | " for c in own)
              + " | ".join(_cell(r, c) for c in shown) + " |" for _, r in order.iterrows()]
    return "\n".join(lines)


def prompt_table(rows: pd.DataFrame) -> str | None:
    """Markdown: relative variance and squared bias per prompt (rows of a prompt scope), or None."""
    per = rows[rows["scope"].fillna("all") != "all"] if "scope" in rows else rows.iloc[:0]
    if per.empty:
        return None
    lines = ["| estimator | seed | prompt | kind | success | rel. variance | rel. bias² |", "|" + " --- |" * 7]
    for _, r in per.sort_values(["estimator", "seed", "scope"]).iterrows():
        success = r.get("prompt_success")
        lines.append(f"| {_name(r)} | {r['seed']} | {r['scope']} | {text(r.get('prompt_kind'))} | "
                     f"{'—' if success is None or pd.isna(success) else f'{success:.3g}'} | "
                     f"{_cell(r, 'rel_total_var')} | {_cell(r, 'rel_bias_sq')} |")
    return "\n".join(lines)


def report_markdown(data: ProbeData, settings: Settings, groups: list[tuple[str, pd.DataFrame]],
                    figure: str) -> str:
    """``probes.md``: what the statistics are, the settings every row shares, one section per group
    (:func:`probe_groups`), the figure's file name."""
    rows = data.rows
    parts = ["# Gradient probes", "",
             f"{rows['run_dir'].nunique()} probe runs, {rows['estimator'].nunique()} estimators. Each statistic is "
             "estimated from the run's batches, with a 95% percentile bootstrap interval over batches in brackets "
             "(`harness/probes/stats.py`):", ""]
    parts += [f"- **{head}**: {what}" for head, what in SHOWN.values()]
    shared = ", ".join(f"{c}={v}" for c, v in settings.shared.items())
    parts += ["", f"Shared by every row: {shared}.", "", f"![relative variance and squared bias]({figure})", ""]
    for heading, g in groups:
        parts += [f"## {heading}", "", group_table(g, settings.own), ""]
        per_prompt = prompt_table(g)
        if per_prompt:
            parts += ["Per prompt:", "", per_prompt, ""]
    if data.left_out:
        parts += ["## Left out", ""] + [f"- `{x['run_dir']}`: {x['reason']}" for x in data.left_out] + [""]
    return "\n".join(parts)


def plot_probes(groups: list[tuple[str, pd.DataFrame]], path: Path) -> Path:
    """``probes.png``: per group (a row of panels), each estimator's relative variance (log scale)
    and relative squared bias with their bootstrap intervals, one point per seed, in the estimator's
    colour of every figure (:func:`analysis.figures.estimator_palette`)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from .figures import _figure, _save, estimator_palette

    palette = estimator_palette(name for _, g in groups for name in g.apply(_name, axis=1))
    panels = (("rel_total_var", "relative variance (log)"), ("rel_bias_sq", "relative squared bias"))
    fig, axes = _figure(len(groups), 2, w=5.0, h=2.8)
    for (heading, g), row in zip(groups, axes):
        whole = _whole(g)
        names = list(dict.fromkeys(whole.sort_values("rel_total_var").apply(_name, axis=1)))  # the table's order
        for ax, (col, title) in zip(row, panels):
            for i, name in enumerate(names):
                mine = whole[whole.apply(_name, axis=1) == name]
                xs = i + np.linspace(-0.15, 0.15, len(mine)) if len(mine) > 1 else np.array([float(i)])
                y = mine[col].to_numpy(float)
                err = np.abs(np.vstack([y - mine[f"{col}_low"].to_numpy(float), mine[f"{col}_high"].to_numpy(float) - y]))
                ax.errorbar(xs, y, yerr=err, fmt="o", color=palette[name], capsize=3, ms=5)
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
            ax.set_title(f"{title}\n{heading}", fontsize=9)
            if col == "rel_total_var":
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(NullFormatter())
            else:
                ax.axhline(0.0, color="0.4", lw=0.8, ls="--")
    fig.suptitle("Gradient probes: each point one run's estimate, bars its 95% bootstrap interval")
    return _save(fig, path)


def write_probe_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Read the probe runs under ``path``; write ``probes.md`` and ``probes.png`` into ``out``
    (default ``path/probes``); returns the markdown's path."""
    data = load_probes(path)
    out = Path(out) if out is not None else Path(path) / "probes"
    out.mkdir(parents=True, exist_ok=True)
    settings = split_settings(data.rows)
    groups = probe_groups(data.rows, settings)
    figure = plot_probes(groups, out / "probes.png")
    page = out / "probes.md"
    atomic_write_text(page, report_markdown(data, settings, groups, figure.name))
    return page
