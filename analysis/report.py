"""Build ``report.md`` plus figures and CSV tables for a results folder.

:func:`compute_tables` does all statistics (pure, testable); :func:`build_report` draws the
figures from those tables and writes the markdown, so every number in report.md is the
number behind the figure linked next to it.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path

import numpy as np
import pandas as pd

from harness.io import atomic_write_text

from . import figures as figs
from . import groups, stats
from .load import CLAIMS_FOLDER_PREFIX, KINDS, RUN_KEYS, label_variants, load, run_configs
from .options import EXPECTED

__all__ = ["NoRunsError", "Options", "Tables", "compute_tables", "build_report", "FIGURES", "MIN_PROFILE_RUNS",
           "figures_left_out", "headline_text", "poi_pairs"]

#: figure key -> (file name, caption)
FIGURES = {
    "learning_curves": ("learning_curves.png", "Learning curves"),
    "final_scores": ("final_scores.png", "Final scores (IQM, 95% CI)"),
    "probability_of_improvement": ("probability_of_improvement.png", "Probability of improvement"),
    "performance_profiles": ("performance_profiles.png", "Performance profiles"),
    "stability": ("stability.png", "Training stability diagnostics"),
    "sensitivity": ("sensitivity.png", "Hyperparameter sensitivity"),
    "failures": ("failures.png", "Diverged and collapsed runs"),
}

#: Fewest scored runs of every estimator on a task for which performance profiles are drawn: below
#: it a profile is a staircase of a few steps whose bootstrap band spans most of the axis.
MIN_PROFILE_RUNS = 5
#: Fewest runs per estimator and task below which the headline calls its intervals rough.
ROUGH_BELOW_RUNS = 10



class NoRunsError(ValueError):
    """The folder holds no finished, scoreable run (message says what was expected).
    ``left_out``: the runs left out, as in :attr:`Tables.left_out`."""

    def __init__(self, message: str, left_out: list | None = None):
        super().__init__(message)
        self.left_out = list(left_out or [])


@dataclass
class Tables:
    """Every table behind the report."""

    metrics: pd.DataFrame            # loaded frame, one row per iteration
    runs: pd.DataFrame               # one row per run: score, auc, collapsed, hyperparameters
    scores: pd.DataFrame             # task x estimator: n, IQM/mean/AUC with CIs, counts
    aggregate: pd.DataFrame          # estimator over tasks, min-max normalised scores
    poi: pd.DataFrame                # ordered estimator pairs: P(X > Y) with CI
    profiles: pd.DataFrame           # panel, estimator, tau, fraction, low, high
    sensitivity: pd.DataFrame        # task, estimator, hyperparameter, value, n, IQM with CI
    failures: pd.DataFrame           # estimator: n_runs, diverged, collapsed, left_out
    budgets: dict = field(default_factory=dict)   # task -> (x column, budget every run is cut at)
    skipped: list = field(default_factory=list)   # unreadable metrics files (also in left_out)
    run_dirs: pd.DataFrame | None = None          # every run directory, with or without metrics
    left_out: list = field(default_factory=list)  # runs not scored: {"run_dir", "path", "reason", ...}
    diverged: str = stats.DEFAULT_DIVERGED        # how diverged runs were scored (stats.DIVERGED_RULES)
    budget_info: dict = field(default_factory=dict)  # task -> stats.task_budgets' record (source, largest)
    swept: dict = field(default_factory=dict)     # estimator name -> the settings its labels show
    group: str = ""                               # the comparison group (groups.Group.name; "" if one)
    groups: list = field(default_factory=list)    # every group's Tables, where the folder has several
    group_keys: list = field(default_factory=list)  # the budget settings that split the folder
    other_kinds: dict = field(default_factory=dict)  # kind (load.KINDS) -> its run directories
    results: Path = Path(".")                     # the folder reported on


def _ci(scores, statistic: str, reps: int, seed: int, prefix: str) -> dict:
    iv = stats.stratified_bootstrap(scores, statistic, reps=reps, seed=seed)
    return {prefix: iv.point, f"{prefix}_low": iv.low, f"{prefix}_high": iv.high}


def _status_counts(g: pd.DataFrame) -> dict:
    """Scored runs are finished: completed or diverged (harness.io.finished)."""
    s = g["status"].value_counts()
    return {k: int(s.get(k, 0)) for k in ("completed", "diverged")}


def format_left_out(left_out: list) -> list[str]:
    """One line per run left out: ``path: reason``."""
    return [f"{r['path']}: {r['reason']}" for r in left_out]


def _label_configs(df: pd.DataFrame, configs: dict | None) -> tuple[pd.DataFrame, dict, pd.Series]:
    """``df`` with each run's config label in ``estimator`` (:func:`analysis.groups.config_labels`)
    and its budget in samples in ``sample_budget``; the settings each name's labels show; and the
    number of distinct configs per (task, label), which is 1 by construction."""
    frame = groups.config_frame(df, configs)
    labels, swept = groups.config_labels(frame)
    idx = pd.MultiIndex.from_frame(df[RUN_KEYS])
    df["estimator"] = labels.reindex(idx).to_numpy()
    budgets = groups.sample_budgets(frame).reindex(idx)
    df["sample_budget"] = budgets["sample_budget"].to_numpy()
    df["sample_axis"] = budgets["sample_axis"].to_numpy()
    settings = [c for c in frame.columns if c not in ("run_dir", "seed", "task", "estimator_name")]
    text = frame[settings].astype(object).apply(lambda r: "|".join(map(groups.text, r)), axis=1) \
        if settings else pd.Series("", index=frame.index)
    n_configs = text.groupby([frame["task"], labels.to_numpy()]).nunique()
    return df, swept, n_configs


def compute_tables(df: pd.DataFrame, *, last_n: int = 5, reps: int = stats.DEFAULT_REPS,
                   seed: int = stats.DEFAULT_SEED, diverged: str = stats.DEFAULT_DIVERGED,
                   configs: dict | None = None) -> Tables:
    """All statistics of a loaded results frame (see :func:`analysis.load`); ``diverged``:
    how diverged runs are scored (:data:`analysis.stats.DIVERGED_RULES`); ``configs``: each run
    directory's config (:func:`analysis.load.run_configs`; without it, the hyperparameters and
    variant settings the metrics record).

    Runs whose configs differ (but for the seed) are never pooled: each config of an estimator
    carries its own ``estimator`` label (:func:`analysis.groups.config_labels`), the registered
    name staying in ``estimator_name``. Every run is cut at its budget
    (:func:`analysis.stats.task_budgets`): final scores, AUC and curves are over the same
    number of samples for every run."""
    attrs = df.attrs
    df = label_variants(df)
    # pandas deep-copies attrs into the result of every operation: with load's (a frame of the
    # runs, a list of every run left out) that cost minutes at 10,000 runs. Kept aside instead.
    df.attrs = {}
    df, swept, n_configs = _label_configs(df, configs)
    runs = stats.run_table(df, last_n=last_n, diverged=diverged)
    names = df.drop_duplicates(RUN_KEYS).set_index(RUN_KEYS)["estimator_name"]
    runs["estimator_name"] = names.reindex(pd.MultiIndex.from_frame(runs[RUN_KEYS])).to_numpy()
    runs["norm_score"] = stats.normalize_by_task(runs, "score")
    budget_info = stats.task_budgets(df)
    df["within_budget"] = stats.within_budget(df, budget_info)
    boot = {"reps": reps, "seed": seed}
    left_out = list(attrs.get("left_out", []))
    scores, aggregate = _by_score(_scores(runs, n_configs, boot)), _by_score(_aggregate(runs, boot))
    order = figs.score_order(aggregate if not aggregate.empty else scores)
    return Tables(metrics=df, runs=runs, scores=scores, aggregate=aggregate,
                  poi=_poi(runs, boot), profiles=_profiles(runs, boot), sensitivity=_sensitivity(runs, boot),
                  failures=_in_order(_failures(runs, left_out), order),
                  budgets={t: (b["x_col"], b["budget"]) for t, b in budget_info.items()},
                  skipped=list(attrs.get("skipped", [])), run_dirs=attrs.get("runs"),
                  left_out=left_out, diverged=diverged, budget_info=budget_info, swept=swept)


def _in_order(table: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """``table``'s rows in the estimator order ``order`` (estimators not in it last, by label)."""
    rank = {e: i for i, e in enumerate(order)}
    key = table["estimator"].map(lambda e: (rank.get(e, len(rank)), e))
    return table.iloc[sorted(range(len(table)), key=lambda i: key.iloc[i])].reset_index(drop=True)


def _by_score(table: pd.DataFrame) -> pd.DataFrame:
    """A task x estimator table with each task's rows in the order its final-score panel lists
    them (:func:`analysis.figures.score_order`: IQM, best first); tasks sorted, as the panels are."""
    if table.empty:
        return table
    return pd.concat([_in_order(g, figs.score_order(g)) for _, g in table.groupby("task", sort=True)],
                     ignore_index=True)


def _scores(runs: pd.DataFrame, n_configs: pd.Series, boot: dict) -> pd.DataFrame:
    """Per task x estimator: runs, IQM / mean / AUC with intervals, counts."""
    reps, seed = boot["reps"], boot["seed"]
    rows = []
    for (task, est), g in runs.groupby(["task", "estimator"], sort=True):
        sc = g["score"].to_numpy(dtype=float)
        rows.append({
            "task": task, "estimator": est, "n_runs": len(g),
            "n_scored": int(np.isfinite(sc).sum()),
            **_ci([sc], "iqm", reps, seed, "iqm"),
            **_ci([sc], "mean", reps, seed, "mean"),
            **_ci([g["auc"].to_numpy(dtype=float)], "iqm", reps, seed, "auc"),
            "collapsed": int(g["collapsed"].sum()),
            **_status_counts(g),
            "n_configs": int(n_configs.get((task, est), 1)),
        })
    return pd.DataFrame(rows)


def _aggregate(runs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Per estimator over tasks (where there are several), min-max normalised scores."""
    rows = []
    if runs["task"].nunique() > 1:
        for est, g in runs.groupby("estimator", sort=True):
            by_task = {t: gt["norm_score"].to_numpy(dtype=float)
                       for t, gt in g.groupby("task", sort=True)}
            rows.append({"task": "all (normalised)", "estimator": est,
                         "n_tasks": len(by_task), "n_runs": len(g),
                         **_ci(by_task, "iqm", boot["reps"], boot["seed"], "iqm"),
                         **_ci(by_task, "mean", boot["reps"], boot["seed"], "mean")})
    return pd.DataFrame(rows)


def _poi(runs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Probability of improvement of every ordered pair of estimators with a task in common."""
    by_est = {e: {t: gt["score"].to_numpy(dtype=float) for t, gt in g.groupby("task", sort=True)}
              for e, g in runs.groupby("estimator", sort=True)}
    rows = []
    for a, b in permutations(sorted(runs["estimator"].unique()), 2):
        common = [t for t in by_est[a] if t in by_est[b]]
        if not common:
            continue
        iv = stats.probability_of_improvement_interval(by_est[a], by_est[b], **boot)
        rows.append({"x": a, "y": b, "n_tasks": len(common), "p": iv.point, "low": iv.low, "high": iv.high})
    return pd.DataFrame(rows, columns=["x", "y", "n_tasks", "p", "low", "high"])


def _profiles(runs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Performance profiles per task (and over tasks, normalised, where there are several)."""
    prof = []
    for task, g in runs.groupby("task", sort=True):
        sc = g["score"].dropna()
        if sc.empty:
            continue
        lo, hi = float(sc.min()), float(sc.max())
        pad = 0.05 * (hi - lo) if hi > lo else max(1.0, abs(lo) * 0.05)
        taus = np.linspace(lo - pad, hi + pad, 80)
        for est, ge in g.groupby("estimator", sort=True):
            p = stats.performance_profile([ge["score"].to_numpy(dtype=float)], taus, **boot)
            prof.append(p.assign(panel=task, estimator=est))
    if runs["task"].nunique() > 1:
        taus = np.linspace(-0.02, 1.02, 80)
        for est, g in runs.groupby("estimator", sort=True):
            by_task = {t: gt["norm_score"].to_numpy(dtype=float) for t, gt in g.groupby("task")}
            p = stats.performance_profile(by_task, taus, **boot)
            prof.append(p.assign(panel="All tasks (min–max normalised per task)", estimator=est))
    return (pd.concat(prof, ignore_index=True) if prof else
            pd.DataFrame(columns=["tau", "fraction", "low", "high", "panel", "estimator"]))


def _sensitivity(runs: pd.DataFrame, boot: dict) -> pd.DataFrame:
    """Final-score IQM per value of each hyperparameter swept over an estimator's configs on a task."""
    rows = []
    for (task, est), hps in stats.swept_hyperparameters(runs, by="estimator_name").items():
        g = runs[(runs["task"] == task) & (runs["estimator_name"] == est)]
        for hp in hps:
            for value, gv in g.groupby(hp, sort=True):
                rows.append({"task": task, "estimator": est, "hyperparameter": hp,
                             "value": float(value), "n": len(gv),
                             **_ci([gv["score"].to_numpy(dtype=float)], "iqm", boot["reps"], boot["seed"], "iqm")})
    return pd.DataFrame(rows, columns=["task", "estimator", "hyperparameter", "value", "n", "iqm", "iqm_low",
                                       "iqm_high"])


def _failures(runs: pd.DataFrame, left_out: list) -> pd.DataFrame:
    """Per estimator: runs scored, diverged, collapsed, left out (left-out runs of an estimator
    with no scored run, or of none known, are in left_out only)."""
    left_by_est = pd.Series([r.get("estimator") or "unknown" for r in left_out], dtype=object).value_counts()
    rows = [{"estimator": est, "n_runs": len(g), "collapsed": int(g["collapsed"].sum()),
             **_status_counts(g), "left_out": int(left_by_est.get(est, 0))}
            for est, g in runs.groupby("estimator", sort=True)]
    return pd.DataFrame(rows, columns=["estimator", "n_runs", "collapsed", "completed", "diverged", "left_out"])


# ----------------------------------------------------------------------------- markdown

def fmt(x: float) -> str:
    """Numbers for tables: 4 significant figures, at least 2 decimals above 1."""
    if x is None or not np.isfinite(x):
        return "–"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    return f"{x:.3g}"


def diverged_rule_text(t: Tables, last_n: int) -> str:
    """The report's sentence on how diverged runs were scored (plus, under ``worst``, the worst
    returns used and any fallback to the lowest observed score)."""
    if t.diverged == "last":
        return ("Diverged runs are scored by carrying their last evaluations forward (`--diverged last`): "
                f"final score = mean of the last {last_n} evaluations logged before diverging, and the AUC "
                "holds the last one to the budget.")
    text = ("Diverged runs are scored with their task's worst return from the divergence on (`--diverged "
            "worst`, the default): final score = that worst return, and the AUC integrates the curve up to "
            "the divergence point and the worst return from there to the budget.")
    d = t.runs[t.runs["status"] == "diverged"]
    used = []
    for task, g in d.groupby("task", sort=True):
        for (value, source), gv in g.groupby(["worst_return", "worst_source"], sort=True):
            used.append(f"{task}: {fmt(value)} ({source}, {len(gv)} run{'' if len(gv) == 1 else 's'})")
    if used:
        text += " Worst returns used: " + "; ".join(used) + "."
    fallback = d[d["worst_source"] == stats.WORST_OBSERVED]
    if len(fallback):
        text += (f" {len(fallback)} diverged run{' records' if len(fallback) == 1 else 's record'} no "
                 "`task.worst_return` (written before the field existed, or a task without a known bound), "
                 "so the lowest score observed among all runs of its task in this folder is used instead "
                 "('lowest observed').")
    return text


def budget_text(t: Tables) -> str:
    """The report's paragraph on the budget each task's runs are cut at, and why."""
    parts, cut = [], False
    for task, b in t.budget_info.items():
        unit = figs.x_label(b["x_col"])
        if b["source"] == stats.BUDGET_CONFIGURED:
            over = t.runs.loc[t.runs["task"] == task, "samples"] > t.runs.loc[t.runs["task"] == task, "budget"]
            cut |= bool(over.any())
            logged = (f"; runs logged up to {b['largest']:,.0f}, {int(over.sum())} of {len(over)} past it"
                      if over.any() else "")
            parts.append(f"{task}: {figs.human_count(b['budget'])} {unit} (configured{logged})")
        else:
            parts.append(f"{task}: {figs.human_count(b['budget'])} {unit} (no sample budget configured: the largest "
                         "logged)")
    text = "Budgets: " + "; ".join(parts) + "."
    if cut:
        text += (" A run stops after the whole episode or group that crosses its budget, so some log past it; "
                 "every run is cut at the budget: its final score reads only the evaluations at or below it, and "
                 "its learning curve and AUC are interpolated to it, so every estimator is compared on the same "
                 "number of samples.")
    else:
        text += " Every curve, final score and AUC is cut at the budget (no run logged past it)."
    return text


def comparison_text(t: Tables) -> list[str]:
    """The report's lines on what it pooled, what it kept apart and what it left out, and why."""
    text = ("Runs are pooled (one row, one curve) only when their configs are equal but for the seed: "
            "config.yaml's settings (the part the harness hashes into the run's folder name), else the "
            "hyperparameters and variant settings the metrics record (the 'configs pooled' column counts "
            "the configs in a row: 1).")
    if t.swept:
        text += (" Settings that differ between runs of one estimator on a task are part of its label, so each "
                 "row is one config: " + "; ".join(f"{name}: {', '.join(f'`{k}`' for k in keys)}"
                                                  for name, keys in sorted(t.swept.items())) + ".")
    else:
        text += " Every estimator's runs on a task share one config here."
    L = [text]
    for kind, dirs in t.other_kinds.items():
        L.append(f"\nNot compared here: {len(dirs)} {KINDS[kind]}, "
                 + ", ".join(f"`{d}`" for d in dirs[:5]) + (", ..." if len(dirs) > 5 else "")
                 + (f": their verdicts come from {claims_command(t.results, dirs)}." if kind == "claims"
                    else ": they hold no learning curve to score."))
    L.append("\n")
    return L


def claims_command(results: Path, run_dirs: list[str]) -> str:
    """``python -m analysis claims DIR`` for each claims folder holding ``run_dirs`` (the folder
    above their ``claim_*`` experiment folder, :func:`analysis.load.run_kind`)."""
    roots = []
    for d in run_dirs:
        parts = Path(d).parts
        at = next(i for i, p in enumerate(parts) if p.startswith(CLAIMS_FOLDER_PREFIX))
        roots.append((results / Path(*parts[:at])).as_posix() if at else results.as_posix())
    return ", ".join(f"`python -m analysis claims {r}`" for r in dict.fromkeys(roots))


def poi_pairs(poi: pd.DataFrame) -> pd.DataFrame:
    """Each unordered pair of :attr:`Tables.poi` once, the better estimator as ``x`` (P(X > Y) ≥ 0.5;
    at exactly 0.5 the first by label), highest P first; ``clear``: its 95% interval excludes 0.5."""
    best: dict[frozenset, tuple] = {}
    for r in poi.itertuples(index=False):
        key, rank = frozenset((r.x, r.y)), (r.p, r.y)  # at a tie the larger y: x is the first label
        if key not in best or rank > best[key][0]:
            best[key] = (rank, r._asdict())
    rows = [r for _, r in best.values()]
    out = pd.DataFrame(rows, columns=list(poi.columns))
    out["clear"] = out["low"] > 0.5
    return out.sort_values(["p", "x", "y"], ascending=[False, True, True], kind="mergesort").reset_index(drop=True)


def _ci_text(point: float, lo: float, hi: float) -> str:
    return f"{fmt(point)} {_ci_str(lo, hi)}"


def _names(names: list[str]) -> str:
    return ", ".join(f"**{n}**" for n in names)


def headline_text(t: Tables, opts: Options) -> list[str]:
    """report.md's opening paragraph, worked out from the tables: per task the estimator with the
    highest IQM final score and which others its IQM interval clears; the pairs whose
    probability-of-improvement interval excludes 0.5; then the rule and the caveats (runs per
    estimator, the interval method)."""
    L = ["## Headline\n"]
    for task, g in t.scores.groupby("task", sort=True):  # rows by IQM, best first (_by_score)
        g = g[np.isfinite(g["iqm"].to_numpy(dtype=float))]
        if g.empty:
            L.append(f"- **{task}**: no estimator has a final score.")
            continue
        top = g.iloc[0]
        text = (f"- **{task}**: **{top.estimator}** has the highest IQM final score, "
                f"{_ci_text(top.iqm, top.iqm_low, top.iqm_high)}")
        rest = g.iloc[1:]
        if rest.empty:
            L.append(text + "; no other estimator ran this task.")
            continue
        single = top["n_scored"] < 2 or rest["n_scored"] < 2  # a point, not an interval
        apart = rest[(rest["iqm_high"] < top["iqm_low"]) & ~single]["estimator"].tolist()
        near = [e for e in rest["estimator"] if e not in apart]
        parts = []
        if apart:
            parts.append(f"its interval lies above {'those' if len(apart) > 1 else 'that'} of {_names(apart)}")
        if near:
            parts.append(f"its lead over {_names(near)} is not clear (the intervals overlap, or one is a "
                         "single run's point)")
        L.append(text + "; " + "; ".join(parts) + ".")
    pairs = poi_pairs(t.poi)
    if not pairs.empty:
        clear = pairs[pairs["clear"]]
        where = (f"averaged over the {t.runs['task'].nunique()} tasks" if t.runs["task"].nunique() > 1
                 else "on the final score")
        if clear.empty:
            text = f"- Probability of improvement ({where}): no pair is clearly ordered"
        else:
            text = (f"- Probability of improvement ({where}): " + "; ".join(
                f"**{r.x}** > **{r.y}** (P = {_ci_text(r.p, r.low, r.high)})" for r in clear.itertuples()))
        other = len(pairs) - len(clear)
        L.append(text + (f"; {other} other pair{'s' if other != 1 else ''} not clearly ordered." if other and len(clear)
                         else "."))
    n = t.scores["n_scored"]
    n_text = f"{n.min()}" if n.min() == n.max() else f"{n.min()}–{n.max()}"
    rough = (f" With fewer than {ROUGH_BELOW_RUNS} runs these intervals are rough: a bootstrap over few runs "
             "understates the spread, and an interval of width 0 means every resample ordered the runs the same "
             "way, not certainty." if n.min() < ROUGH_BELOW_RUNS else "")
    if n.min() < 2:
        rough += " An estimator with a single run on a task has a point, not an interval: no lead over it is clear."
    L.append(f"\nRule: a difference is called clear when the 95% interval of the probability of improvement "
             f"P(X > Y) excludes 0.5, or, for the highest IQM, when its 95% IQM interval (of 2 runs or more) does "
             f"not overlap the "
             f"other's. Caveats: {n_text} scored run{'s' if n.max() != 1 else ''} per estimator and task; "
             f"intervals are 95% percentile bootstrap intervals ({opts.reps} replicates, seed {opts.seed}) "
             f"resampling runs within each task.{rough}\n")
    return L


def figures_left_out(t: Tables) -> dict[str, str]:
    """Figure key (:data:`FIGURES`) -> why it is not drawn for ``t``: a figure with nothing to
    show is left out, the report saying so in one line instead."""
    out = {}
    if t.sensitivity.empty:
        out["sensitivity"] = ("No hyperparameter among " + ", ".join(stats.HYPERPARAMETERS)
                              + " varies within an estimator × task, so there is no sensitivity figure.")
    n = t.scores["n_scored"]
    if len(n) and n.min() < MIN_PROFILE_RUNS:
        out["performance_profiles"] = (
            f"Left out: performance profiles need at least {MIN_PROFILE_RUNS} scored runs of every estimator "
            f"on a task (here as few as {n.min()}); with fewer, each profile is a staircase of a few steps whose "
            "band spans most of the axis. The final-score figure shows every run's score instead.")
    return out


def _index_markdown(results: Path, done: list, keys: list, others: dict, left_out: list, opts: Options) -> str:
    """report.md of a folder with several comparison groups: what differs, one line per group."""
    L = [f"# Benchmark report: `{results}`\n",
         f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} by `python -m analysis report {results} "
         f"--x {opts.x} --last-n {opts.last_n} --diverged {opts.diverged}`.\n",
         f"The training runs differ in {', '.join(f'`{k}`' for k in keys)} within a task: runs at different budgets "
         "are never pooled nor compared (their curves, AUC and final scores cover different numbers of samples), "
         f"so each of the {len(done)} comparison groups has its own report:\n"]
    for g, t in done:
        L.append(f"- [{g.name}]({g.folder}/report.md): {len(t.runs)} runs, {t.runs['task'].nunique()} task(s), "
                 f"estimators {', '.join(sorted(t.runs['estimator'].unique()))}")
    for kind, dirs in others.items():
        L.append(f"\nNot compared: {len(dirs)} {KINDS[kind]}"
                 + (f"; {claims_command(results, dirs)}." if kind == "claims" else "."))
    if left_out:
        L.append(f"\n{len(left_out)} left out:\n")
        L += [f"- `{r['path']}`: {r['reason']}" for r in left_out]
    return "\n".join(L) + "\n"


def _ci_str(lo: float, hi: float) -> str:
    return f"[{fmt(lo)}, {fmt(hi)}]"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _runs_markdown(t: Tables, results: Path, opts: Options) -> list[str]:
    """report.md's head: the command, the group, the runs scored and left out, the budgets and
    what is compared."""
    runs = t.runs
    n = len(runs)
    st = _status_counts(runs)
    L = []
    L.append(f"# Benchmark report: `{results}`\n")
    L.append(f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} by "
             f"`python -m analysis report {results} --x {opts.x} --last-n {opts.last_n} --diverged {t.diverged}` "
             f"(bootstrap: {opts.reps} replicates, seed {opts.seed}, 95% percentile intervals).\n")
    if t.group:
        L.append(f"Comparison group **{t.group}** of the folder (its runs differ in "
                 f"{', '.join(f'`{k}`' for k in t.group_keys)}; runs at different budgets are never compared; "
                 f"[all groups](../report.md)).\n")
    L += headline_text(t, opts)
    L.append("## Runs\n")
    L.append(f"{n} runs scored over {runs['task'].nunique()} task(s) and {runs['estimator'].nunique()} "
             f"estimator(s): {st['completed']} completed, {st['diverged']} diverged; "
             f"**{len(t.left_out)} left out** (see below).")
    L.append("\nOnly finished runs are scored, by the harness's own definition (the one that decides "
             "skip or rerun, `harness.io.finished`): summary.json is a JSON object with a string status "
             "`completed` or `diverged` and an int `iterations` within config.yaml's `budget.iterations`, "
             "and metrics.parquet reads with iterations exactly 1..n. A run whose `eval_return` or "
             "`episode_return` holds ±inf is left out too (never rescored on the other column), and "
             "symlinked folders are not followed.\n")
    L.append("### Runs left out\n")
    if t.left_out:
        L.append(f"{len(t.left_out)} run director{'y' if len(t.left_out) == 1 else 'ies'}, not scored:\n")
        L += [f"- `{r['path']}`: {r['reason']}" for r in t.left_out]
    else:
        L.append("None.")
    L.append("\n" + budget_text(t) + "\n")
    L.append("### What is compared\n")
    L += comparison_text(t)
    return L


def _scores_markdown(t: Tables) -> list[str]:
    """The final-score table (and the normalised one over tasks, where there are several)."""
    rows = []
    for r in t.scores.itertuples():
        rows.append([r.task, r.estimator, f"{r.n_scored}/{r.n_runs}", fmt(r.iqm),
                     _ci_str(r.iqm_low, r.iqm_high), fmt(r.mean), _ci_str(r.mean_low, r.mean_high),
                     fmt(r.auc), _ci_str(r.auc_low, r.auc_high), r.diverged, r.collapsed,
                     r.n_configs])
    L = [_md_table(["task", "estimator", "runs (scored/all)", "IQM", "IQM 95% CI", "mean",
                    "mean 95% CI", "AUC (IQM)", "AUC 95% CI", "diverged", "collapsed",
                    "configs pooled"], rows)]
    if not t.aggregate.empty:
        L.append("\n### All tasks, min–max normalised\n")
        L.append("Each run's final score is mapped to (s − min) / (max − min) with min/max over all "
                 "runs of all estimators on that task; the bootstrap is stratified over tasks.\n")
        rows = [[r.estimator, r.n_tasks, r.n_runs, fmt(r.iqm), _ci_str(r.iqm_low, r.iqm_high),
                 fmt(r.mean), _ci_str(r.mean_low, r.mean_high)] for r in t.aggregate.itertuples()]
        L.append(_md_table(["estimator", "tasks", "runs", "IQM", "IQM 95% CI", "mean",
                            "mean 95% CI"], rows))
    return L


def _markdown(t: Tables, results: Path, opts: Options, figure_files: dict[str, str]) -> str:
    L = _runs_markdown(t, results, opts)
    last_n = opts.last_n
    missing = figures_left_out(t)

    def section(title: str, *figure_keys: str, text: str | None = None) -> None:
        """A section with figures: its heading (after a blank line, where the text before ends
        without one), its FIGURES (or the line saying why one is left out), then the text that
        explains them."""
        L.append(("" if L[-1].endswith("\n") else "\n") + f"## {title}\n")
        L.extend(missing[key] + "\n" if key in missing else f"![{FIGURES[key][1]}]({figure_files[key]})\n"
                 for key in figure_keys)
        if text is not None and not all(key in missing for key in figure_keys):
            L.append(text)

    section("Final scores", "final_scores",
            text=f"Final score of a run: mean `eval_return` over its last {last_n} evaluations "
                 "(`episode_return` for a run that never evaluated). IQM = interquartile mean over "
                 "runs; AUC = normalised area under the learning curve (mean return over the "
                 "budget, higher = more sample-efficient). Intervals: 95% stratified bootstrap. "
                 "IQM trims floor(n/4) runs at each end, so with fewer than 4 runs it equals the "
                 "mean. Rows are in the figure's order: by IQM, best first. "
                 + diverged_rule_text(t, last_n) + "\n")
    L += _scores_markdown(t)
    section("Learning curves", "learning_curves",
            text="Mean over runs with a 95% bootstrap band; each run is linearly interpolated onto a "
                 "common grid of 50 points per task, only inside its logged range.\n")
    section("Probability of improvement", "probability_of_improvement",
            text="P(X > Y) + ½ P(X = Y) over pairs of runs on the final score, per task, averaged over "
                 "the tasks both estimators ran; 95% CI from resampling each estimator's runs "
                 "within each task. The matrix holds every ordered pair (row X, column Y); the table "
                 "lists each pair whose interval excludes 0.5 once, the better estimator as X.\n")
    pairs = poi_pairs(t.poi)
    clear = pairs[pairs["clear"]]
    rows = [[r.x, r.y, r.n_tasks, f"{r.p:.3f}", f"[{r.low:.3f}, {r.high:.3f}]"] for r in clear.itertuples()]
    if pairs.empty:
        L.append("_fewer than two estimators_")
    else:
        if rows:
            L.append(_md_table(["X (better)", "Y", "tasks", "P(X > Y)", "95% CI"], rows))
        other = len(pairs) - len(clear)
        if other:
            L.append(f"\n{other} of {len(pairs)} pair{'s' if len(pairs) != 1 else ''}: the interval includes 0.5 "
                     "(in the matrix and `probability_of_improvement.csv`).")
    section("Performance profiles", "performance_profiles",
            text="Fraction of runs whose final score is above τ (averaged over tasks in the "
                 "normalised panel), with 95% stratified-bootstrap bands.\n")
    section("Stability", "stability", "failures",
            text="Diverged: the trainer recorded status `diverged` (NaN/inf loss or parameters). "
                 "Collapsed: with s = score − min(0, m) where m is the task's lowest observed "
                 "score (eval_return, else episode_return), let s* be the run's best s, first "
                 "reached at evaluation t*; the run collapsed if s* > 0 and some later evaluation "
                 "has s < s*/2.\n")
    rows = [[r.estimator, r.n_runs, r.diverged, r.collapsed, r.left_out] for r in t.failures.itertuples()]
    L.append(_md_table(["estimator", "runs scored", "diverged", "collapsed", "left out"], rows))
    section("Sensitivity", "sensitivity")
    if not t.sensitivity.empty:
        L.append("Hyperparameters detected as swept (more than one value within an "
                 "estimator × task); final-score IQM per value with 95% bootstrap CI.\n")
        rows = [[r.task, r.estimator, r.hyperparameter, f"{r.value:g}", r.n, fmt(r.iqm),
                 _ci_str(r.iqm_low, r.iqm_high)] for r in t.sensitivity.itertuples()]
        L.append(_md_table(["task", "estimator", "hyperparameter", "value", "runs", "IQM",
                            "95% CI"], rows))
    L.append("\n## Files\n")
    L.append("Per-run table: `runs.csv`; tables above: `scores.csv`, `aggregate.csv`, "
             "`probability_of_improvement.csv`, `sensitivity.csv`, `failures.csv`, `left_out.csv`.\n")
    return "\n".join(L) + "\n"


@dataclass(frozen=True)
class Options:
    """How a report is drawn and scored (the ``python -m analysis report`` options)."""

    x: str = "env_steps"
    last_n: int = 5
    reps: int = stats.DEFAULT_REPS
    seed: int = stats.DEFAULT_SEED
    diverged: str = stats.DEFAULT_DIVERGED


def _kinds(df: pd.DataFrame) -> dict[str, str]:
    """run_dir -> kind (:data:`analysis.load.KINDS`) of every run directory load surveyed."""
    runs = df.attrs.get("runs")
    if runs is None or "kind" not in runs:
        return {}
    return dict(zip(runs["run_dir"], runs["kind"]))


def _no_training_runs(results: Path, others: dict) -> str:
    what = "; ".join(f"{len(v)} {KINDS[k]}" for k, v in others.items())
    hint = f"; claims: {claims_command(results, others['claims'])}" if "claims" in others else ""
    return f"{results}: no training runs to compare ({what}){hint}"


def build_report(results: str | Path, out: str | Path | None = None, opts: Options | None = None,
                 progress: Callable[[str], None] | None = None) -> Tables:
    """Load ``results``, compute every table, draw every figure, write report.md (``opts``: the
    command's options, :class:`Options`; ``opts.diverged``: how diverged runs are scored,
    :data:`analysis.stats.DIVERGED_RULES`; report.md says which).

    Only training runs are compared; probe and claim runs (:func:`analysis.load.run_kind`) are
    named in a section of their own. Runs are pooled only where their configs are equal but for
    the seed (:mod:`analysis.groups`): a budget that differs between runs of a task splits the
    folder into comparison groups, each reported on its own in ``out/<group>/`` (report.md,
    figures, tables), with ``out/report.md`` naming them; with one group everything is in ``out``.

    Writes into ``out`` (default ``<results>/report/``): ``report.md``, the PNGs of
    :data:`FIGURES` and CSVs of the tables (``left_out.csv``: every run not scored, and why). Returns
    the :class:`Tables` (of the first group; ``groups`` holds every group's where there are
    several). Raises :class:`NoRunsError` if nothing is readable.
    """
    opts = opts or Options()
    x = opts.x
    results = Path(results)
    if not results.exists():
        raise NoRunsError(f"{results}: does not exist; expected {EXPECTED}")
    if not results.is_dir():
        raise NoRunsError(f"{results}: is a file, not a folder; expected {EXPECTED}")
    df = load(results)
    kinds = _kinds(df)
    others: dict[str, list[str]] = {}
    for run_dir, kind in sorted(kinds.items()):
        if kind != "train":
            others.setdefault(kind, []).append(run_dir)
    left_out = [r for r in df.attrs.get("left_out", []) if r.get("kind", "train") in ("train", None)]
    df.attrs["left_out"] = left_out
    if others:
        attrs = df.attrs
        df = df[df["run_dir"].map(kinds).fillna("train").to_numpy() == "train"].reset_index(drop=True)
        df.attrs = attrs
    if df.empty:
        if others:
            raise NoRunsError(_no_training_runs(results, others), left_out)
        what = (f"no finished run to score, {len(left_out)} left out" if left_out else
                "no metrics.parquet with rows found")
        raise NoRunsError(f"{results}: {what}; expected {EXPECTED}", left_out)
    if x not in df.columns or not df[x].notna().any():
        raise NoRunsError(f"{results}: no run logged {x!r}; use --x with a logged column")
    progress = progress or (lambda s: None)
    out = Path(out) if out is not None else results / "report"
    out.mkdir(parents=True, exist_ok=True)
    surveyed = [r["run_dir"] for r in left_out if "kind" in r]  # not the symlinks
    configs = run_configs(results, sorted({*df["run_dir"].unique(), *surveyed}))
    keys, comparison = groups.comparison_groups(groups.config_frame(label_variants(df), configs))
    if len(comparison) == 1:
        t = _report(df, configs, results, out, opts, progress)
        t.other_kinds, t.results = others, results
        _write_markdown(t, results, out, opts)
        return t
    done = []
    for g in comparison:
        sub = df[df["run_dir"].isin(g.run_dirs).to_numpy()].reset_index(drop=True)
        sub.attrs = {**df.attrs, "left_out": [r for r in left_out if _in_group(r, g, configs)]}
        t = _report(sub, configs, results, out / g.folder, opts, progress)
        t.group, t.group_keys, t.other_kinds, t.results = g.name, keys, others, results
        done.append((g, t))
    for g, t in done:
        t.groups = [u for _, u in done]
        _write_markdown(t, results, out / g.folder, opts)
    first = done[0][1]
    index = _index_markdown(results, done, keys, others, [r for r in left_out if not any(
        _in_group(r, g, configs) for g, _ in done)], opts)
    atomic_write_text(out / "report.md", index)
    return first


def _in_group(left: dict, group: groups.Group, configs: dict) -> bool:
    """Whether the run left out ``left`` belongs to ``group``: its config records the group's
    budget settings (one without a readable config belongs to none: the index lists it)."""
    cfg = configs.get(left.get("run_dir")) or {}
    return bool(cfg) and all(groups.text(cfg.get(k)) == groups.text(v) for k, v in group.settings)


def _report(df: pd.DataFrame, configs: dict, results: Path, out: Path, opts: Options,
            progress: Callable[[str], None]) -> Tables:
    """Tables, figures and CSVs of one comparison group's runs ``df`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    t = compute_tables(df, last_n=opts.last_n, reps=opts.reps, seed=opts.seed, diverged=opts.diverged,
                       configs=configs)
    df = t.metrics  # with the estimator labels the tables use
    labels = pd.concat([t.runs["estimator"], t.runs["estimator_name"]]).dropna().unique()
    look = figs.Look(palette=figs.estimator_palette(labels),  # names too: the sensitivity figure's
                     styles=figs.variant_styles(t.runs["estimator"]),  # one second encoding for every figure
                     budgets=t.budgets)
    curves = figs.Curves(x=opts.x, seed=opts.seed)
    files = {k: name for k, (name, _) in FIGURES.items()}
    draw = {
        "learning_curves": lambda p: figs.plot_learning_curves(df, p, look, curves),
        "final_scores": lambda p: figs.plot_final_scores(t.scores, t.runs, p, look, last_n=opts.last_n,
                                                         aggregate=t.aggregate),
        "probability_of_improvement": lambda p: figs.plot_probability_of_improvement(
            t.poi, p, look.palette, n_tasks=t.runs["task"].nunique()),
        "performance_profiles": lambda p: figs.plot_performance_profiles(t.profiles, p, look),
        "stability": lambda p: figs.plot_stability(df, p, look, figs.Curves(x=opts.x, reps=500, seed=opts.seed)),
        "sensitivity": lambda p: figs.plot_sensitivity(t.sensitivity, p, look, last_n=opts.last_n),
        "failures": lambda p: figs.plot_failure_counts(t.failures, p, look.palette, styles=look.styles),
    }
    missing = figures_left_out(t)
    for key, fn in draw.items():
        if key in missing:
            (out / files[key]).unlink(missing_ok=True)  # an earlier report's figure would be stale
            continue
        path = fn(out / files[key])
        progress(f"figure: {path}")

    left_out = pd.DataFrame(t.left_out, columns=["run_dir", "path", "reason", "task", "estimator"])
    for name, table in (("runs", t.runs), ("scores", t.scores), ("aggregate", t.aggregate),
                        ("probability_of_improvement", t.poi), ("sensitivity", t.sensitivity),
                        ("failures", t.failures), ("left_out", left_out)):
        atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
    return t


def _write_markdown(t: Tables, results: Path, out: Path, opts: Options) -> None:
    files = {k: name for k, (name, _) in FIGURES.items()}
    md = _markdown(t, results, opts, files)
    atomic_write_text(out / "report.md", md)
