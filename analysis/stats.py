"""Aggregate statistics following rliable (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice", NeurIPS), written with numpy/scipy only.

Scores are organised by task. Every function accepts either

* a 2-D array ``scores[run, task]`` (rliable's ``num_runs x num_tasks`` matrix), or
* a sequence or mapping of 1-D arrays, one per task (tasks may have different run counts).

Conventions shared with rliable (``rliable/metrics.py``, ``rliable/library.py``):

* IQM: ``scipy.stats.trim_mean(all scores pooled, 0.25)`` - drop ``floor(0.25 n)`` scores at
  each end, average the rest (rliable ``aggregate_iqm``).
* mean: mean over tasks of the per-task mean over runs (rliable ``aggregate_mean``).
* Stratified bootstrap: each replicate resamples runs with replacement *within each task
  independently*, keeping each task's run count (rliable ``StratifiedBootstrap``);
  intervals are percentile intervals of the replicates (``np.percentile``, linear).
* Probability of improvement: for each task ``P(X > Y) + 0.5 P(X = Y)`` over all run pairs
  (the Mann-Whitney U statistic divided by ``n_x n_y``), averaged over tasks; its interval
  resamples X's and Y's runs independently within each task
  (rliable ``StratifiedIndependentBootstrap``).
* Performance profile: fraction of runs whose score is strictly above ``tau``
  (rliable ``run_score_deviation``), here averaged over tasks so each task weighs the same
  (identical to rliable's pooled fraction when tasks have equal run counts).

Randomness: one ``numpy.random.default_rng(seed)`` per call (default seed 0), tasks drawn in
the order given, so every interval is reproducible.

Diverged runs (status ``diverged`` in summary.json; their rows stop at the divergence) are
scored by one of :data:`DIVERGED_RULES`, chosen with ``diverged=`` on :func:`final_scores` and
:func:`run_table` (``python -m analysis report --diverged``):

* ``worst`` (the default, conservative): from the divergence on the run scores its task's
  worst return ``w`` for the rest of the budget: final score ``w``; AUC integrates the curve
  up to the divergence point (the run's last logged sample count) and ``w`` from there to
  the budget (:func:`area_under_curve` with ``stop``/``after``). ``w`` is the run's own
  ``task.worst_return`` (a known lower bound, recorded in its config.yaml; column
  ``worst_return`` of :func:`analysis.load.load`); a run without one falls back to the lowest
  finite value of its score column among all runs of its task in the frame (column
  ``worst_source`` says which);
* ``last``: the run keeps its last evaluations, as if carried forward to the budget: final
  score the mean of its last ``last_n`` evaluations, AUC holds its last value to the budget.

A run that did not diverge is scored the same under both rules.
"""

from __future__ import annotations

import warnings

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import scipy.stats

from harness.io.scores import SCORE_COLUMNS, by_iteration, final_score, score_column

from .load import HYPERPARAMETERS, RUN_KEYS, VARIANT_KEYS
from .options import DEFAULT_DIVERGED, DEFAULT_REPS, DEFAULT_SEED, DIVERGED_RULES

__all__ = [
    "Interval",
    "as_task_list",
    "iqm",
    "aggregate_iqm",
    "aggregate_mean",
    "stratified_bootstrap",
    "probability_of_improvement",
    "probability_of_improvement_interval",
    "performance_profile",
    "fraction_above",
    "area_under_curve",
    "task_budgets",
    "within_budget",
    "is_collapsed",
    "worst_returns",
    "final_scores",
    "run_table",
    "normalize_by_task",
    "curve_bands",
    "swept_hyperparameters",
    "DEFAULT_REPS",
    "DEFAULT_SEED",
    "CONFIDENCE",
    "DIVERGED_RULES",
    "DEFAULT_DIVERGED",
]

CONFIDENCE = 0.95
#: ``worst_source``: where a diverged run's worst return came from.
WORST_FROM_TASK = "task.worst_return"
WORST_OBSERVED = "lowest observed"

_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 only has trapz

Scores = np.ndarray | Sequence[np.ndarray] | Mapping[str, np.ndarray]


class Interval(NamedTuple):
    """Point estimate with a percentile bootstrap interval."""

    point: float
    low: float
    high: float


# ----------------------------------------------------------------------------- inputs

def as_task_list(scores: Scores) -> list[np.ndarray]:
    """Normalise scores to a list of 1-D float arrays, one per task (NaNs dropped).

    A 2-D array is read as rliable's ``[run, task]`` matrix; a 1-D array as one task.
    """
    if isinstance(scores, Mapping):
        arrays = list(scores.values())
    elif isinstance(scores, np.ndarray):
        if scores.ndim == 1:
            arrays = [scores]
        elif scores.ndim == 2:
            arrays = [scores[:, j] for j in range(scores.shape[1])]
        else:
            raise ValueError(f"scores must be [run, task]; got shape {scores.shape}")
    else:
        arrays = list(scores)
    out = []
    for a in arrays:
        a = np.asarray(a, dtype=float).ravel()
        out.append(a[np.isfinite(a)])
    return out


# ----------------------------------------------------------------------------- statistics
# Each statistic takes a list of per-task arrays shaped [reps, n_task] and returns [reps]:
# the same code serves the point estimate (reps = 1) and every bootstrap replicate.

def _iqm_stat(tasks: list[np.ndarray]) -> np.ndarray:
    pooled = np.concatenate(tasks, axis=1)
    return scipy.stats.trim_mean(pooled, proportiontocut=0.25, axis=1)


def _mean_stat(tasks: list[np.ndarray]) -> np.ndarray:
    return np.mean(np.stack([t.mean(axis=1) for t in tasks], axis=0), axis=0)


_STATISTICS: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "iqm": _iqm_stat,
    "mean": _mean_stat,
}


def iqm(values) -> float:
    """Interquartile mean of a flat set of values: ``scipy.stats.trim_mean(values, 0.25)``."""
    values = np.asarray(values, dtype=float).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan")
    return float(scipy.stats.trim_mean(values, 0.25))


def _nonempty(tasks: list[np.ndarray]) -> list[np.ndarray]:
    return [t for t in tasks if t.size]


def aggregate_iqm(scores: Scores) -> float:
    """IQM of all runs of all tasks pooled (rliable ``aggregate_iqm``)."""
    tasks = _nonempty(as_task_list(scores))
    if not tasks:
        return float("nan")
    return float(_iqm_stat([t[None, :] for t in tasks])[0])


def aggregate_mean(scores: Scores) -> float:
    """Mean over tasks of the mean over runs (rliable ``aggregate_mean``)."""
    tasks = _nonempty(as_task_list(scores))
    if not tasks:
        return float("nan")
    return float(_mean_stat([t[None, :] for t in tasks])[0])


def _resample(rng: np.random.Generator, values: np.ndarray, reps: int) -> np.ndarray:
    """[reps, n] draws with replacement from ``values`` (one task's runs)."""
    idx = rng.integers(0, values.size, size=(reps, values.size))
    return values[idx]


def _percentiles(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    tail = 100.0 * (1.0 - confidence) / 2.0
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN bounds
        lo, hi = np.nanpercentile(replicates, [tail, 100.0 - tail], axis=0)
    return lo, hi


def stratified_bootstrap(
    scores: Scores,
    statistic: str | Callable[[list[np.ndarray]], np.ndarray] = "iqm",
    *,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Point estimate and stratified-bootstrap percentile interval of an aggregate statistic.

    ``statistic`` is ``"iqm"``, ``"mean"`` or a callable taking a list (one entry per task)
    of ``[reps, n_task]`` arrays and returning ``[reps]`` values. Each replicate draws
    ``n_task`` runs with replacement from each task's own runs, so per-task counts are kept
    and no run moves between tasks. The interval is the ``(1-confidence)/2`` and
    ``(1+confidence)/2`` percentiles of the replicates. Tasks without scores are ignored;
    no scores at all gives NaNs.
    """
    stat = _STATISTICS[statistic] if isinstance(statistic, str) else statistic
    tasks = _nonempty(as_task_list(scores))
    if not tasks:
        return Interval(float("nan"), float("nan"), float("nan"))
    point = float(np.asarray(stat([t[None, :] for t in tasks]))[0])
    rng = np.random.default_rng(seed)
    replicates = np.asarray(stat([_resample(rng, t, reps) for t in tasks]), dtype=float)
    lo, hi = _percentiles(replicates, confidence)
    return Interval(point, float(lo), float(hi))


# ----------------------------------------------------------------------------- improvement

def _paired_tasks(scores_x: Scores, scores_y: Scores) -> list[tuple[np.ndarray, np.ndarray]]:
    if isinstance(scores_x, Mapping) and isinstance(scores_y, Mapping):
        keys = [k for k in scores_x if k in scores_y]
        xs = as_task_list({k: scores_x[k] for k in keys})
        ys = as_task_list({k: scores_y[k] for k in keys})
    else:
        xs, ys = as_task_list(scores_x), as_task_list(scores_y)
        if len(xs) != len(ys):
            raise ValueError(f"X has {len(xs)} tasks and Y has {len(ys)}; they must match")
    return [(x, y) for x, y in zip(xs, ys) if x.size and y.size]


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) for batches: x [reps, nx], y [reps, ny] -> [reps]."""
    greater = (x[:, :, None] > y[:, None, :]).mean(axis=(1, 2))
    ties = (x[:, :, None] == y[:, None, :]).mean(axis=(1, 2))
    return greater + 0.5 * ties


def probability_of_improvement(scores_x: Scores, scores_y: Scores) -> float:
    """Average over tasks of ``P(X_m > Y_m) + 0.5 P(X_m = Y_m)`` (rliable).

    Per task this is the Mann-Whitney ``U`` of X against Y divided by ``n_x n_y``: the
    share of (x-run, y-run) pairs X wins, ties counting half. With mappings, only tasks
    present in both (with at least one run each) are averaged.
    """
    pairs = _paired_tasks(scores_x, scores_y)
    if not pairs:
        return float("nan")
    return float(np.mean([_improvement(x[None], y[None])[0] for x, y in pairs]))


def probability_of_improvement_interval(
    scores_x: Scores,
    scores_y: Scores,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
    chunk: int = 250,
) -> Interval:
    """Probability of improvement with a percentile interval from a stratified bootstrap
    that resamples X's and Y's runs independently within each task."""
    pairs = _paired_tasks(scores_x, scores_y)
    if not pairs:
        return Interval(float("nan"), float("nan"), float("nan"))
    point = probability_of_improvement(
        [x for x, _ in pairs], [y for _, y in pairs])
    rng = np.random.default_rng(seed)
    per_task = np.zeros((len(pairs), reps))
    for i, (x, y) in enumerate(pairs):
        xb, yb = _resample(rng, x, reps), _resample(rng, y, reps)
        for start in range(0, reps, chunk):  # bounds memory at chunk * nx * ny
            sl = slice(start, start + chunk)
            per_task[i, sl] = _improvement(xb[sl], yb[sl])
    lo, hi = _percentiles(per_task.mean(axis=0), confidence)
    return Interval(point, float(lo), float(hi))


# ----------------------------------------------------------------------------- profiles

def fraction_above(draws: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """``[reps, n_tau]``: for each row of ``draws`` (``[reps, n]``), the fraction of its ``n``
    values ``> tau`` (NaN is never above), i.e. ``(draws[:, :, None] > taus).mean(axis=1)``,
    counted from each row sorted instead of that ``reps x n x n_tau`` comparison (10,000 runs,
    2,000 resamples and 100 taus made two billion)."""
    draws = np.asarray(draws, dtype=float)
    taus = np.asarray(taus, dtype=float)
    n = draws.shape[1]
    ordered = np.sort(draws, axis=1)  # NaN last
    valid = n - np.isnan(draws).sum(axis=1)
    out = np.empty((draws.shape[0], taus.size))
    for i, (row, m) in enumerate(zip(ordered, valid)):
        out[i] = m - np.searchsorted(row[:m], taus, side="right")
    return out / n if n else np.full_like(out, np.nan)


def performance_profile(
    scores: Scores,
    taus,
    *,
    reps: int = DEFAULT_REPS,
    seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """Score distribution: for each ``tau``, the fraction of runs with score ``> tau``.

    The fraction is computed per task and averaged over tasks. Returns a frame with
    columns ``tau, fraction, low, high`` (stratified-bootstrap percentile interval).
    """
    taus = np.asarray(taus, dtype=float).ravel()
    tasks = _nonempty(as_task_list(scores))
    if not tasks:
        nan = np.full(taus.shape, np.nan)
        return pd.DataFrame({"tau": taus, "fraction": nan, "low": nan, "high": nan})

    def frac(batch: list[np.ndarray]) -> np.ndarray:  # -> [reps, n_tau]
        return np.mean([fraction_above(t, taus) for t in batch], axis=0)

    point = frac([t[None, :] for t in tasks])[0]
    rng = np.random.default_rng(seed)
    lo, hi = _percentiles(frac([_resample(rng, t, reps) for t in tasks]), confidence)
    return pd.DataFrame({"tau": taus, "fraction": point, "low": lo, "high": hi})


# ----------------------------------------------------------------------------- per-run

def area_under_curve(x, y, budget: float, *, stop: float | None = None,
                     after: float | None = None) -> float:
    """Normalised area under a learning curve, in units of return.

    ``(1 / budget) * integral_0^budget f(s) ds`` where ``f`` joins the points ``(x, y)``
    (sorted by x, non-finite points dropped) linearly - the trapezoid rule - and is held
    at its first value before the first point and at its last value after the last point;
    points past the budget only give ``f(budget)``, by linear interpolation between the last
    point before it and the first after (a run whose last episode or group crossed the budget is
    cut there, so every run is integrated over the same number of samples).
    A run evaluated from 0 to the budget gets exactly ``trapezoid(y, x) / budget``: the
    average return over the budget, so an estimator that learns sooner scores higher.

    With ``stop`` and ``after`` (a run that diverged at ``stop``, scored ``after`` from then
    on): ``f`` as above on ``[0, stop]`` and the constant ``after`` on ``(stop, budget]``, i.e.
    ``(integral_0^stop f(s) ds + after * (budget - stop)) / budget``, ``stop`` clipped to
    ``[0, budget]``.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size == 0 or not np.isfinite(budget) or budget <= 0:
        return float("nan")
    end = budget if stop is None else float(np.clip(stop, 0.0, budget))
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if x[-1] > end:  # a run logged past the end (its last episode or group crossed the budget): cut there
        y_end = float(np.interp(end, x, y))
        keep = x <= end
        x, y = np.append(x[keep], end), np.append(y[keep], y_end)
    x = np.clip(x, 0.0, end)
    x = np.concatenate([[0.0], x, [end]])
    y = np.concatenate([[y[0]], y, [y[-1]]])
    area = _trapezoid(y, x)
    if stop is not None:
        area += float(after) * (budget - end)
    return float(area / budget)


def is_collapsed(returns, shift: float = 0.0) -> bool:
    """Collapse rule: after its best evaluation, the run falls below half of that best.

    With ``s_t = returns_t - shift`` (NaNs ignored) and ``t*`` the first time ``s`` reaches
    its maximum ``s*``: collapsed iff ``s* > 0`` and some ``s_t < s*/2`` with ``t > t*``.
    For tasks whose returns can be negative pass ``shift`` = the task's minimum observed
    return, so ``s >= 0`` and "half of the best" means half-way back to the worst score.
    """
    s = np.asarray(returns, dtype=float) - shift
    s = s[np.isfinite(s)]
    if s.size < 2:
        return False
    t_best = int(np.argmax(s))
    best = s[t_best]
    return bool(best > 0 and np.any(s[t_best + 1:] < 0.5 * best))


def _x_column(df: pd.DataFrame) -> str:
    """Sample axis of a frame: sampled tokens where logged (LM tasks, whose env_steps count the
    same tokens), else env_steps, else iteration."""
    for col in ("tokens", "env_steps", "iteration"):
        if col in df.columns and df[col].notna().any():
            return col
    return "iteration"


def _check_rule(diverged: str) -> None:
    if diverged not in DIVERGED_RULES:
        raise ValueError(f"diverged must be one of {list(DIVERGED_RULES)}, got {diverged!r}")


def _scored_worst(run: pd.DataFrame, diverged: str) -> bool:
    """Does rule ``diverged`` score this run (one run's rows) with its task's worst return?"""
    return diverged == "worst" and run["status"].iloc[0] == "diverged"


def _runs(df: pd.DataFrame, *columns: str):
    """``df.groupby(RUN_KEYS)`` over only :data:`RUN_KEYS` and those of ``columns`` it has:
    slicing a few columns per run instead of all of them (tens of seconds at 10,000 runs)."""
    keep = [c for c in dict.fromkeys([*RUN_KEYS, *columns]) if c in df.columns]
    return df[keep].groupby(RUN_KEYS, dropna=False, sort=True)


def worst_returns(df: pd.DataFrame) -> pd.DataFrame:
    """The worst return of each run's task: ``run_dir, seed, worst_return, worst_source``.

    The run's own ``worst_return`` (its config.yaml's ``task.worst_return``; source
    :data:`WORST_FROM_TASK`) when finite; else the lowest finite value of the run's score
    column (:func:`harness.io.scores.score_column`; ``eval_return`` first when the run has
    none) over every row of every run of its task in ``df`` (source :data:`WORST_OBSERVED`);
    NaN and None when the task has no finite score at all.
    """
    lowest = {}
    for task, tdf in df.groupby("task", sort=True):
        for col in SCORE_COLUMNS:
            v = tdf[col].to_numpy(dtype=float) if col in tdf else np.array([])
            v = v[np.isfinite(v)]
            lowest[(task, col)] = float(v.min()) if v.size else np.nan
    rows = []
    for (run_dir, seed), run in _runs(df, "task", "worst_return", *SCORE_COLUMNS):
        known = run["worst_return"].to_numpy(dtype=float) if "worst_return" in run else np.array([])
        known = known[np.isfinite(known)]
        if known.size:
            w, src = float(known[0]), WORST_FROM_TASK
        else:
            task = run["task"].iloc[0]
            col = score_column(run)
            cols = [col] if col is not None else list(SCORE_COLUMNS)
            w = next((lowest[(task, c)] for c in cols if np.isfinite(lowest[(task, c)])), np.nan)
            src = WORST_OBSERVED if np.isfinite(w) else None
        rows.append({"run_dir": run_dir, "seed": seed, "worst_return": w, "worst_source": src})
    return pd.DataFrame(rows, columns=["run_dir", "seed", "worst_return", "worst_source"])


def final_scores(df: pd.DataFrame, last_n: int = 5, *, diverged: str = DEFAULT_DIVERGED) -> pd.DataFrame:
    """Per-run final score: mean of the last ``last_n`` finite ``eval_return`` values
    (by iteration), or of ``episode_return`` for a run with no evaluation; a diverged run
    under ``diverged="worst"`` (the default) scores its task's worst return instead
    (:func:`worst_returns`), under ``"last"`` the mean of the last evaluations it logged
    (module docstring, "Diverged runs"). A run that did not diverge scores the same either way.

    Returns one row per run (``run_dir, seed``) with ``task, estimator, status, score,
    score_source`` (``eval_return`` | ``episode_return`` | None: the column of its curve),
    ``n_points`` (evaluations averaged; 0 for a run scored its worst return), and
    ``worst_return``, ``worst_source`` (the value and where it came from, for a run scored
    with it; NaN/None otherwise).
    """
    _check_rule(diverged)
    worst = worst_returns(df).set_index(RUN_KEYS) if diverged == "worst" else None
    rows = []
    for (run_dir, seed), run in _runs(df, "task", "estimator", "status", "iteration", *SCORE_COLUMNS):
        score, col, n = final_score(run, last_n)
        w, src = np.nan, None
        if _scored_worst(run, diverged):
            w, src = worst.loc[(run_dir, seed), ["worst_return", "worst_source"]]
            score, n = float(w), 0
        rows.append({"run_dir": run_dir, "seed": seed, "task": run["task"].iloc[0],
                     "estimator": run["estimator"].iloc[0], "status": run["status"].iloc[0],
                     "score": score, "score_source": col, "n_points": n,
                     "worst_return": float(w), "worst_source": src})
    return pd.DataFrame(rows, columns=["run_dir", "seed", "task", "estimator", "status",
                                       "score", "score_source", "n_points", "worst_return",
                                       "worst_source"])


#: ``source`` of a task's budget in :func:`task_budgets`.
BUDGET_CONFIGURED = "configured"
BUDGET_LOGGED = "largest logged"


def task_budgets(df: pd.DataFrame) -> dict[str, dict]:
    """Each task's sample axis and budget: ``{task: {"x_col", "budget", "source", "largest"}}``.
    ``x_col``: the column the runs' configured budget counts (``sample_axis``,
    :func:`analysis.groups.sample_budgets`), else tokens where logged (LM tasks), else env_steps,
    else iteration; ``budget``: the
    runs' configured budget (column ``sample_budget``, :func:`analysis.groups.sample_budgets`;
    the largest where runs of the task differ, which a report's comparison group never holds;
    source :data:`BUDGET_CONFIGURED`), else the largest logged ``x_col`` value (source
    :data:`BUDGET_LOGGED`); ``largest``: the largest logged value."""
    out = {}
    for task, tdf in df.groupby("task", sort=True):
        x_col = _x_column(tdf)
        axes = tdf["sample_axis"].dropna().unique() if "sample_axis" in tdf else []
        if len(axes) == 1 and axes[0] in tdf and tdf[axes[0]].notna().any():
            x_col = str(axes[0])  # the column the configured budget counts
        xs = tdf[x_col].to_numpy(dtype=float)
        largest = float(np.nanmax(xs)) if np.isfinite(xs).any() else np.nan
        conf = tdf["sample_budget"].to_numpy(dtype=float) if "sample_budget" in tdf else np.array([])
        conf = conf[np.isfinite(conf)]
        if conf.size and x_col != "iteration":
            out[task] = {"x_col": x_col, "budget": float(conf.max()), "source": BUDGET_CONFIGURED, "largest": largest}
        else:
            out[task] = {"x_col": x_col, "budget": largest, "source": BUDGET_LOGGED, "largest": largest}
    return out


def row_budgets(df: pd.DataFrame, budgets: Mapping[str, dict]) -> tuple[np.ndarray, np.ndarray]:
    """``(x, budget)`` per row of ``df``: the row's value of its task's sample axis and the
    budget its run is cut at (its own configured ``sample_budget``, else its task's, :func:`task_budgets`)."""
    x = np.full(len(df), np.nan)
    budget = np.full(len(df), np.nan)
    tasks = df["task"].to_numpy(dtype=object)
    for task, b in budgets.items():
        rows = tasks == task
        x[rows] = df.loc[rows, b["x_col"]].to_numpy(dtype=float)
        budget[rows] = b["budget"]
    if "sample_budget" in df:
        own = df["sample_budget"].to_numpy(dtype=float)
        budget = np.where(np.isfinite(own), own, budget)
    return x, budget


def within_budget(df: pd.DataFrame, budgets: Mapping[str, dict]) -> np.ndarray:
    """The rows of ``df`` at or below their run's budget (:func:`row_budgets`; a row without a
    sample count is kept): what final scores and diagnostics read, so every run is scored on the
    same number of samples."""
    x, budget = row_budgets(df, budgets)
    return ~(x > budget)


def run_table(df: pd.DataFrame, last_n: int = 5, *, diverged: str = DEFAULT_DIVERGED) -> pd.DataFrame:
    """Everything per run the report needs: final score, AUC, collapse flag, hyperparameters.

    Every run is cut at its budget (:func:`task_budgets`: the configured one, else its task's
    largest logged sample count): its final score reads only the rows at or below it
    (:func:`within_budget`), its AUC integrates its curve up to it. Adds to :func:`final_scores`
    (``diverged`` as there; scored on those rows): ``x_col`` and ``budget`` (the sample axis and
    the run's budget on it), ``samples`` (the largest logged value, past the budget where the run's
    last episode or group crossed it), ``auc`` (:func:`area_under_curve` of
    the score curve over that axis to the budget; a diverged run under ``diverged="worst"`` scores its worst
    return from its last logged ``x_col`` value - the divergence point - to the budget, and
    the worst return throughout when it logged no score), ``collapsed`` (:func:`is_collapsed`
    on the score curve, shifted by the task's minimum observed score when that is negative),
    ``iterations``, one
    column per hyperparameter (its first logged value) and per :data:`VARIANT_KEYS` setting
    (``update``, ``loss_agg``: its first logged value, None when the run did not log it).
    """
    budgets = task_budgets(df)
    inside = within_budget(df, budgets)
    scores = final_scores(df[inside], last_n=last_n, diverged=diverged).set_index(RUN_KEYS)
    extra = []
    for task, tdf in df.groupby("task", sort=True):
        x_col, task_budget = budgets[task]["x_col"], budgets[task]["budget"]
        score_min = {}
        for col in ("eval_return", "episode_return"):
            v = tdf[col].to_numpy(dtype=float)
            v = v[np.isfinite(v)]
            score_min[col] = float(v.min()) if v.size else 0.0
        for (run_dir, seed), run in _runs(tdf, "status", "iteration", x_col, "sample_budget", *SCORE_COLUMNS):
            run = by_iteration(run)
            col = score_column(run)
            own = run["sample_budget"].iloc[0] if "sample_budget" in run else np.nan
            budget = float(own) if np.isfinite(own) else task_budget
            xs = run[x_col].to_numpy(dtype=float)
            row = {"run_dir": run_dir, "seed": seed, "x_col": x_col, "budget": budget,
                   "iterations": int(run["iteration"].notna().sum()) or len(run),
                   "samples": float(np.nanmax(xs)) if np.isfinite(xs).any() else np.nan}
            cut = {}
            if _scored_worst(run, diverged):  # the rule of the module docstring, "Diverged runs"
                at = xs[np.isfinite(xs)]
                cut = {"stop": float(at.max()) if at.size else 0.0,
                       "after": float(scores.loc[(run_dir, seed), "worst_return"])}
            if col is None:
                row.update(auc=cut["after"] if cut else np.nan, collapsed=False)
            else:
                ys = run[col].to_numpy(dtype=float)
                row["auc"] = area_under_curve(xs, ys, budget, **cut)
                row["collapsed"] = is_collapsed(ys[~(xs > budget)], shift=min(score_min[col], 0.0))
            extra.append(row)
    extra = pd.DataFrame(extra)
    if extra.empty:
        return scores.reset_index()
    # each hyperparameter's and variant setting's first logged value (by iteration) per run
    have = [c for c in (*HYPERPARAMETERS, *VARIANT_KEYS) if c in df.columns]
    firsts = first_values(df, have)
    for hp in HYPERPARAMETERS:
        firsts[hp] = firsts[hp].astype(float) if hp in have else np.nan
    for key in VARIANT_KEYS:
        v = firsts[key] if key in have else [None] * len(firsts)
        firsts[key] = pd.Series([None if pd.isna(x) else str(x) for x in v], index=firsts.index)
    extra = extra.set_index(RUN_KEYS).join(firsts[[*HYPERPARAMETERS, *VARIANT_KEYS]])
    return scores.join(extra).reset_index()


def first_values(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Each run's (index :data:`RUN_KEYS`) first logged value (by iteration; nulls skipped) of each of ``columns``."""
    return (df[[*RUN_KEYS, "iteration", *columns]].sort_values("iteration", kind="stable")
            .groupby(RUN_KEYS, dropna=False, sort=True)[columns].first())


def normalize_by_task(runs: pd.DataFrame, column: str = "score") -> pd.Series:
    """Min-max normalise ``column`` within each task over all runs of all estimators:
    ``(s - min_task) / (max_task - min_task)``; 0.5 where a task's scores are all equal."""
    g = runs.groupby("task")[column]
    lo, hi = g.transform("min"), g.transform("max")
    span = hi - lo
    out = (runs[column] - lo) / span.where(span > 0)
    return out.where(span > 0, 0.5).where(runs[column].notna())


def swept_hyperparameters(runs: pd.DataFrame, by: str = "estimator") -> dict[tuple[str, str], list[str]]:
    """Hyperparameters that take more than one value across the runs of an
    (estimator, task) pair: ``{(task, estimator): [names]}`` (``by``: the column naming the
    estimator, e.g. ``estimator_name`` for the registered name over its config labels)."""
    out = {}
    for (task, est), g in runs.groupby(["task", by], sort=True):
        swept = [hp for hp in HYPERPARAMETERS if hp in g and g[hp].dropna().nunique() > 1]
        if swept:
            out[(task, est)] = swept
    return out


# ----------------------------------------------------------------------------- curves

def curve_bands(
    df: pd.DataFrame,
    metric: str,
    x: str = "env_steps",
    *,
    n_grid: int = 50,
    reps: int = 1000,
    seed: int = DEFAULT_SEED,
    x_max: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Mean learning curve with a bootstrap band (a :data:`CONFIDENCE` percentile interval), per
    task and estimator.

    Runs log at different steps, so each run's finite ``(x, metric)`` points are linearly
    interpolated onto a per-task grid of ``n_grid`` points from 0 to ``x_max[task]`` (the
    budget: points past it only interpolate the curve there), else the task's largest
    ``x`` (no extrapolation: a run counts only inside its logged range; a run with a single
    point counts at the nearest grid point). At every grid
    point the band is the percentile interval of the mean over runs resampled with
    replacement. Columns: ``task, estimator, x, mean, low, high, n_runs``.
    """
    cols = ["task", "estimator", "x", "mean", "low", "high", "n_runs"]
    if metric not in df.columns or x not in df.columns:
        return pd.DataFrame(columns=cols)
    sub = df[np.isfinite(df[metric].to_numpy(dtype=float)) & np.isfinite(df[x].to_numpy(dtype=float))]
    out = []
    rng = np.random.default_rng(seed)
    for task, tdf in sub.groupby("task", sort=True):
        xmax = float((x_max or {}).get(task, tdf[x].max()))
        if not xmax > 0:
            continue
        grid = np.linspace(0.0, xmax, n_grid)
        for est, edf in tdf.groupby("estimator", sort=True):
            curves = _run_curves(edf, metric, x, grid)  # [runs, grid]
            n_runs = np.isfinite(curves).sum(axis=0)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # grid points no run covers
                mean = np.nanmean(curves, axis=0)
                idx = rng.integers(0, len(curves), size=(reps, len(curves)))
                # the mean over each resample's runs, from how often it drew each run (a matrix
                # product), not from a [reps, runs, grid] copy of the curves
                counts = np.bincount((np.arange(reps)[:, None] * len(curves) + idx).ravel(),
                                     minlength=reps * len(curves)).reshape(reps, len(curves)).astype(float)
                finite = np.isfinite(curves)
                boot = (counts @ np.where(finite, curves, 0.0)) / (counts @ finite.astype(float))
            lo, hi = _percentiles(boot, CONFIDENCE)
            keep = n_runs > 0
            out.append(pd.DataFrame({"task": task, "estimator": est, "x": grid[keep],
                                     "mean": mean[keep], "low": lo[keep], "high": hi[keep],
                                     "n_runs": n_runs[keep]}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _run_curves(df: pd.DataFrame, metric: str, x: str, grid: np.ndarray) -> np.ndarray:
    """One row per run (:data:`RUN_KEYS`, in sorted order) of ``df``: its ``(x, metric)``
    points (the last row where an ``x`` repeats) linearly interpolated onto ``grid``, NaN
    outside its logged range; a run with a single point sits on its nearest grid point."""
    run = df.groupby(RUN_KEYS, dropna=False, sort=True).ngroup().to_numpy()
    xs_all, ys_all = df[x].to_numpy(dtype=float), df[metric].to_numpy(dtype=float)
    order = np.lexsort((xs_all, run))  # by run, then x; stable, so repeats keep their row order
    run, xs_all, ys_all = run[order], xs_all[order], ys_all[order]
    last = np.r_[(run[1:] != run[:-1]) | (xs_all[1:] != xs_all[:-1]), True]  # last row of each (run, x)
    run, xs_all, ys_all = run[last], xs_all[last], ys_all[last]
    bounds = np.flatnonzero(np.r_[True, run[1:] != run[:-1], True])
    curves = np.full((len(bounds) - 1, len(grid)), np.nan)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        xs, ys = xs_all[a:b], ys_all[a:b]
        if len(xs) == 1:
            curves[i, np.argmin(np.abs(grid - xs[0]))] = ys[0]
        else:
            c = np.interp(grid, xs, ys)
            c[(grid < xs[0]) | (grid > xs[-1])] = np.nan
            curves[i] = c
    return curves
