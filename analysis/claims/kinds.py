"""Statistic kinds: each computes one statistic of a claim's evidence as an :class:`Estimate`.

A part of a claim names its kind (``stat:``) in ``harness/conf/claims.yaml``; the kinds are few and
reusable, and each uses one interval method of :mod:`.intervals` (intervals at any level):

* ``probe_value``: a column of a probe row (bias, weight, cosine, ...) with its bootstrap
  standard error (``<column>_se``, :mod:`harness.probes.stats`), a normal interval;
  ``transform: one_minus`` reads ``1 - x`` (e.g. ``1 - cos``), ``divide_by: <column>`` scales.
* ``probe_diff``: the difference of one column between two probe rows (``a``, ``b``: e.g. the
  bias at batch 16 and at batch 256), drawn independently: ``se = sqrt(se_a^2 + se_b^2)``.
* ``batch_ratio``: ``mean`` (or ``var``) of a per-batch probe column of config ``num`` over that of
  ``den``, by the delta method on the log scale; over the batches both saw (same seed and batch
  index: common random numbers, their covariance counted) unless ``paired: false``.
* ``run_metric``: one value per training run (``metric: {column, reduce}``, reducers below), then
  ``op: mean`` of arm ``a`` or ``diff`` (per-seed ``a - b``) of arms ``a`` and ``b``, paired by
  seed (every arm of a claim experiment runs the same seeds), with the betting interval of a
  bounded mean on the part's registered ``range`` (of one arm's per-seed value; a difference lies
  in ``[lo - hi, hi - lo]``); ``method: proportion`` for 0/1 values (``reduce: collapsed``, range
  [0, 1]). Without a range, or for ``op: ratio``, the part is :class:`Undecidable`: no interval
  with controlled error exists for an unbounded mean of a few seeds.
* ``prompt_upweighting`` (C17) and ``frontier_gap`` (C21): one claim's own statistic each.

Exact claims are not a kind: their unit tests carry ``@pytest.mark.claim("C<k>")`` and the
harness records the outcomes (``python -m harness.experiments claims``).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..stats import run_table
from .evidence import ExpData, NotRun
from .intervals import (
    BETTING, BOOTSTRAP_SE, DELTA, SQUARED_NORM, Estimate, OutOfRange, bounded_mean_estimate, delta_estimate,
    normal_estimate, transformed,
)


class Undecidable(Exception):
    """The evidence exists but no method with controlled error can judge it (no registered range,
    a value outside it): the claim is undecided, with this reason, inside Holm's family."""


def _estimate(fn, *args, **kw) -> Estimate:
    try:
        return fn(*args, **kw)
    except OutOfRange as exc:  # the registered range does not hold: no interval on it does
        raise Undecidable(str(exc)) from None
    except ValueError as exc:  # too few values: no evidence to judge
        raise NotRun(str(exc)) from None


def value_range(part: dict, what: str) -> tuple[float, float]:
    """The registered range ``[lo, hi]`` of one arm's per-seed value (``range:`` of the part)."""
    r = part.get("range")
    if r is None:
        raise Undecidable(f"{what}: no registered range for the per-seed values, and a mean of a few seeds has no "
                          "interval with controlled error without one (register `range: [lo, hi]`)")
    lo, hi = (float(v) for v in r)
    return lo, hi


# ============================================================================ probe kinds

def probe_row(e: ExpData, where: dict | None, scope: str = "all") -> pd.Series:
    rows = e.select(e.probe, {**(where or {}), "scope": scope}, "probe row")
    return rows.sort_values("seed").iloc[0]


#: Probe columns that are debiased squared norms (:mod:`harness.probes.stats`): their normal interval
#: is joined with the square-root scale's (:func:`.intervals.normal_estimate`, ``squared``).
SQUARED_NORMS = frozenset({"bias_sq", "rel_bias_sq", "mean_sq", "rel_mean_sq"})


def _probe_estimate(e: ExpData, row: pd.Series, col: str) -> Estimate:
    if col not in row.index:
        raise NotRun(f"{e.name}: probe column {col} missing")
    if f"{col}_se" not in row.index or (np.isfinite(float(row[col])) and not np.isfinite(float(row[f"{col}_se"]))):
        raise NotRun(f"{e.name}: probe column {col}_se missing (a probe.parquet without standard errors: run "
                     "the probe again)")
    n = int(row.get("batches", 0) or 0)
    return _estimate(normal_estimate, float(row[col]), float(row[f"{col}_se"]), n, squared=col in SQUARED_NORMS)


def probe_value(e: ExpData, part: dict) -> Estimate:
    row = probe_row(e, part.get("where"), part.get("scope", "all"))
    est = _probe_estimate(e, row, part["column"])
    if part.get("divide_by"):
        s = float(row[part["divide_by"]])
        est = transformed(est, lambda x: x / s, decreasing=s < 0)
    if part.get("transform") == "one_minus":
        est = transformed(est, lambda x: 1 - x, decreasing=True)
    return est


def probe_diff(e: ExpData, part: dict) -> Estimate:
    col = part["column"]
    a = _probe_estimate(e, probe_row(e, part["a"], part.get("scope", "all")), col)
    b = _probe_estimate(e, probe_row(e, part["b"], part.get("scope", "all")), col)
    se = float(np.hypot(a.sd / np.sqrt(a.n), b.sd / np.sqrt(b.n)))
    est = _estimate(normal_estimate, a.point - b.point, se, min(a.n, b.n), method="bootstrap se, independent rows")
    est.n_text = f"{a.n}+{b.n} batches"
    return est


def _batches(e: ExpData, where: dict | None, column: str, scope: str = "all") -> pd.Series:
    rows = e.select(e.batches, {**(where or {}), "scope": scope}, "per-batch probe data")
    if column not in rows.columns:
        raise NotRun(f"{e.name}: per-batch column {column} missing")
    return rows.set_index(["seed", "batch"])[column].sort_index()


def batch_ratio(e: ExpData, part: dict) -> Estimate:
    col, of = part.get("column", "dev_sq"), part.get("of", "mean")
    num = _batches(e, part["num"], col, part.get("scope", "all"))
    den = _batches(e, part["den"], col, part.get("scope", "all"))
    paired = part.get("paired", True)
    if paired:
        j = pd.concat([num.rename("a"), den.rename("b")], axis=1, join="inner")
        if j.empty:
            raise NotRun(f"{e.name}: no common batches to pair")
        a, b = j.a.to_numpy(), j.b.to_numpy()
    else:
        a, b = num.to_numpy(), den.to_numpy()
    arrays, f = ratio_terms(a, b, of)
    return _estimate(delta_estimate, arrays, f, paired=paired, values={"a": a, "b": b})


def ratio_terms(a: np.ndarray, b: np.ndarray, of: str) -> tuple[dict[str, np.ndarray], Callable[[dict], object]]:
    """The per-batch arrays and the function of their means whose value is the ratio of ``a``'s
    mean (``of: mean``) or variance (``of: var``: a smooth function of the means of x and x^2) to
    ``b``'s (:func:`.intervals.delta_estimate`; arrays of any leading shape, as the calibration's)."""
    if of == "mean":
        return {"a": a, "b": b}, lambda m: m["a"] / m["b"]
    if of == "var":
        return ({"a": a, "a2": a**2, "b": b, "b2": b**2},
                lambda m: (m["a2"] - m["a"] ** 2) / (m["b2"] - m["b"] ** 2))
    raise ValueError(f"of must be mean or var, got {of!r}")


# ============================================================================ training runs

def _k(g: pd.DataFrame, spec: dict) -> int:
    return int(spec.get("k") or max(1, min(3, len(g) // 3)))


REDUCERS: dict[str, Callable[[pd.DataFrame, str, dict], float]] = {
    "last": lambda g, c, s: float(g[c].iloc[-_k(g, s):].mean()),  # mean of the last k rows
    "first_half": lambda g, c, s: float(g[c].iloc[: max(1, len(g) // 2)].mean()),
    "mean": lambda g, c, s: float(g[c].mean()),
    "max": lambda g, c, s: float(g[c].max()),
    "growth": lambda g, c, s: float(g[c].iloc[-_k(g, s):].mean() - g[c].iloc[0]),  # last k minus the first
    "change": lambda g, c, s: float(g[c].iloc[-_k(g, s):].mean() - g[c].iloc[:_k(g, s)].mean()),  # last k - first k
}
#: per-run columns of :func:`analysis.stats.run_table`: final score, area under the score curve,
#: collapsed (after its best evaluation, the run falls below half of that best: analysis.stats.is_collapsed)
RUN_TABLE = ("score", "auc", "collapsed")


def extreme_vs_middle(g: pd.DataFrame, prefix: str, s: dict) -> float:
    """C28, per run: the mean per-prompt update size (``<prefix><x>``, e.g. ``update_prompt2``) of
    the prompts whose success probability before the update (``success_prompt<x>``) is below
    ``lo`` or above ``hi``, over that of the prompts in between, pooled over the iterations where
    both groups have a prompt (toy task with ``toy.log_prompts``)."""
    lo, hi = float(s.get("lo", 0.1)), float(s.get("hi", 0.9))
    ids = sorted(c[len("success_prompt"):] for c in g.columns if c.startswith("success_prompt"))
    p = g[[f"success_prompt{i}" for i in ids]].to_numpy(dtype=float)
    u = g[[f"{prefix}{i}" for i in ids]].to_numpy(dtype=float)
    ext, mid = (p < lo) | (p > hi), (p >= lo) & (p <= hi)  # NaN (a dense prompt) is in neither
    both = ext.any(axis=1) & mid.any(axis=1)
    if not both.any():
        return float("nan")
    return float(u[both][ext[both]].mean() / u[both][mid[both]].mean())


MULTI_COLUMN = {"extreme_vs_middle": extreme_vs_middle}  # reducers reading several columns


def run_values(e: ExpData, where: dict | None, metric: dict) -> pd.DataFrame:
    """One row per training run (run_dir, seed, value) of the runs selected by ``where``."""
    m = e.select(e.metrics, where, "training metrics")
    col, red = metric["column"], metric.get("reduce", "last")
    if red in RUN_TABLE:
        t = run_table(m, last_n=int(metric.get("k", 5)), diverged=e.diverged)
        key = col if red == "score" and col in t else red
        out = t[["run_dir", "seed", key]].rename(columns={key: "value"})
        out["value"] = out["value"].astype(float)
        return out
    if red in MULTI_COLUMN:
        return pd.DataFrame([{"run_dir": rd, "seed": seed, "value": MULTI_COLUMN[red](g, col, metric)}
                             for (rd, seed), g in m.groupby(["run_dir", "seed"])])
    if red not in REDUCERS:
        raise ValueError(f"reduce must be one of {sorted([*REDUCERS, *RUN_TABLE, *MULTI_COLUMN])}, got {red!r}")
    if col not in m.columns:
        raise NotRun(f"{e.name}: metric column {col} missing")
    rows = []
    for (run_dir, seed), g in m.groupby(["run_dir", "seed"]):
        g = g.sort_values("iteration")
        rows.append({"run_dir": run_dir, "seed": seed, "value": REDUCERS[red](g.dropna(subset=[col]), col, metric)})
    return pd.DataFrame(rows)


def run_metric(e: ExpData, part: dict) -> Estimate:
    """Per-seed values of arm ``a`` (``op: mean``) or per-seed differences ``a - b`` (``op: diff``;
    ``method: proportion`` checks the values are 0/1, range [0, 1] by default), with the betting
    interval of a bounded mean on the registered range (differences: ``[lo - hi, hi - lo]``)."""
    op = part.get("op", "diff" if "b" in part else "mean")
    if op not in ("mean", "diff", "ratio"):
        raise ValueError(f"op must be mean, diff or ratio, got {op!r}")
    if op == "ratio":
        raise Undecidable(f"{e.name}: a ratio of per-seed values has no interval with controlled error at a few "
                          "seeds (register a difference on a bounded quantity instead)")
    proportion = part.get("method") == "proportion"
    lo, hi = (0.0, 1.0) if proportion and "range" not in part else value_range(part, e.name)
    a = run_values(e, part.get("a"), part["metric"])
    if op == "mean":
        return _estimate(bounded_mean_estimate, a.value.to_numpy(), lo, hi, values={"a": a.value.to_numpy()})
    b = run_values(e, part.get("b"), part["metric"])
    j = a.merge(b, on="seed", suffixes=("_a", "_b")).sort_values("seed")
    va, vb = j.value_a.to_numpy(dtype=float), j.value_b.to_numpy(dtype=float)
    if proportion and not set(np.unique(np.concatenate([va, vb]))) <= {0.0, 1.0}:
        raise ValueError("method: proportion needs 0/1 outcomes")
    return _estimate(bounded_mean_estimate, va - vb, lo - hi, hi - lo, n_text=f"{len(j)} seed pairs",
                     values={"a": va, "b": vb})


# ============================================================================ one claim's own

def prompt_upweighting(e: ExpData, part: dict) -> Estimate:
    """C17: (mean gradient weight of the extreme prompts / weight of the middle prompt), with the
    group std over without it, over the batches both variants saw (delta method). A prompt's
    weight is 1 + its per-batch projected error ``err_proj`` (:mod:`harness.probes.stats`)."""
    extreme, middle = part["extreme"], part["middle"]
    arrays = {}
    for tag, where in (("on", part["num"]), ("off", part["den"])):
        for sc in (*extreme, middle):
            arrays[f"{tag}_{sc}"] = _batches(e, where, "err_proj", scope=sc)
    j = pd.concat(arrays, axis=1, join="inner")

    def up(m, tag):
        w = {sc: 1.0 + m[f"{tag}_{sc}"] for sc in (*extreme, middle)}
        return sum(w[s] for s in extreme) / len(extreme) / w[middle]

    return _estimate(delta_estimate, {k: j[k].to_numpy() for k in j.columns}, lambda m: up(m, "on") / up(m, "off"))


def _lm_curve(g: pd.DataFrame) -> np.ndarray:
    # rows without kl_ref (a kl.beta=0 run measures it every lm.kl_ref_every iterations) are no curve points
    return g.sort_values("iteration")[["kl_ref", "gold_reward"]].dropna().to_numpy()


def frontier_gap(e: ExpData, part: dict) -> Estimate:
    """C21, per seed: the mean gold gap of that seed's penalised runs (arm ``a``, e.g. every
    kl.beta > 0) to the same seed's unpenalised run's curve (arm ``b``: gold against sqrt(KL to
    the reference), linearly interpolated), over the iterations whose sqrt(KL) lies within that
    curve's range; then the mean over seeds (betting interval: ``range`` is the gold reward's, so a
    gap lies in ``[lo - hi, hi - lo]``). In gold units."""
    pen = e.select(e.metrics, part["a"], "LM metrics")
    ref = e.select(e.metrics, part["b"], "LM metrics")
    per_seed = {}
    for seed, g0 in ref.groupby("seed"):
        c0 = _lm_curve(g0)
        if len(c0) < 2:
            continue
        order = np.argsort(c0[:, 0])
        x0, y0 = np.sqrt(np.clip(c0[order, 0], 0, None)), c0[order, 1]
        gaps = []
        for _, g in pen[pen.seed == seed].groupby("run_dir"):
            c = _lm_curve(g)
            x = np.sqrt(np.clip(c[:, 0], 0, None))
            inside = (x >= x0.min()) & (x <= x0.max())
            if inside.any():
                gaps.append(float(np.mean(c[inside, 1] - np.interp(x[inside], x0, y0))))
        if gaps:
            per_seed[seed] = float(np.mean(gaps))
    if not per_seed:
        raise NotRun(f"{e.name}: the penalised runs never reach the KL range of the unpenalised ones")
    vals = np.array(list(per_seed.values()))
    lo, hi = value_range(part, e.name)  # the gold reward's range: a gap lies in [lo - hi, hi - lo]
    return _estimate(bounded_mean_estimate, vals, lo - hi, hi - lo, n_text=f"{len(vals)} seeds", values={"gap": vals})


#: The interval method each kind uses (part of the registered protocol: changing one is a new registration).
METHODS: dict[str, str] = {
    "probe_value": f"{BOOTSTRAP_SE}; {SQUARED_NORM} ({', '.join(sorted(SQUARED_NORMS))})",
    "probe_diff": BOOTSTRAP_SE, "batch_ratio": DELTA, "run_metric": BETTING, "prompt_upweighting": DELTA,
    "frontier_gap": BETTING,
}

KINDS: dict[str, Callable[[ExpData, dict], Estimate]] = {
    "probe_value": probe_value, "probe_diff": probe_diff, "batch_ratio": batch_ratio, "run_metric": run_metric,
    "prompt_upweighting": prompt_upweighting, "frontier_gap": frontier_gap,
}
