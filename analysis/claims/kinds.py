"""Statistic kinds: each computes one statistic of a claim's evidence with its own 95% interval.

A part of a claim names its kind (``stat:``) in ``conf/claims.yaml``; the kinds are few and
reusable:

* ``probe_value``: a column of a probe row (bias, weight, cosine, ...), with the interval the
  probe computed (``<column>_low``/``_high``, bootstrap over batches, :mod:`harness.probes.stats`);
  ``transform: one_minus`` reads ``1 - x`` (e.g. ``1 - cos``), ``divide_by: <column>`` scales.
* ``batch_ratio``: ``mean`` (or ``var``) of a per-batch probe column of config ``num`` over that of
  ``den``. Paired (default): over the batches both saw (same seed and batch index: common random
  numbers), resampling the same indices for both; ``paired: false``: each resampled on its own.
* ``run_metric``: one value per training run (``metric: {column, reduce}``, reducers below), then
  ``op: mean`` of group ``a``, or ``diff``/``ratio`` of groups ``a`` and ``b`` (``center: mean``
  or ``iqm``); seeds resampled per group, or in pairs (``paired: true``, the same seed in both).
* ``prompt_upweighting`` (C17) and ``frontier_gap`` (C21): one claim's own statistic each.

Exact claims are not a kind: their unit tests carry ``@pytest.mark.claim("C<k>")`` and the
harness records the outcomes (``python -m harness.experiments claims``).

Every kind returns a :class:`Stat`; the claim's rule (:mod:`.rules`) judges it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.probes.stats import percentile_interval  # one percentile rule for probes and claims

from ..stats import iqm, run_table
from .evidence import ExpData, NotRun

CONFIDENCE = 0.95
REPS = 2000
SEED = 0


@dataclass
class Stat:
    point: float
    low: float
    high: float
    n_units: float  # per group: batches or seeds (what more data would add)
    n: str  # as printed, e.g. "10+10 seeds"
    unit: str  # "batches" | "seeds" | "runs"


# ============================================================================ bootstrap

def _interval(reps: np.ndarray) -> tuple[float, float]:
    return percentile_interval(reps, CONFIDENCE)


def _mean(x):
    return x.mean(axis=-1)


def paired_bootstrap(arrays: dict[str, np.ndarray], stat: Callable[[dict[str, np.ndarray]], np.ndarray],
                     reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """Statistic of equally long arrays, resampling the *same* indices for all (common random
    numbers). ``stat`` maps ``{name: [reps, n]}`` to ``[reps]``."""
    n = {len(a) for a in arrays.values()}
    if len(n) != 1:
        raise ValueError(f"paired arrays must have equal lengths, got {sorted(n)}")
    m = n.pop()
    if m < 2:
        raise NotRun(f"needs at least 2 pairs, got {m}")
    point = float(stat({k: np.asarray(a, float)[None, :] for k, a in arrays.items()})[0])
    idx = np.random.default_rng(seed).integers(0, m, size=(reps, m))
    r = stat({k: np.asarray(a, float)[idx] for k, a in arrays.items()})
    return (point, *_interval(r))


def group_bootstrap(groups: dict[str, np.ndarray], stat: Callable[[dict[str, np.ndarray]], np.ndarray],
                    reps: int = REPS, seed: int = SEED) -> tuple[float, float, float]:
    """Statistic of independent groups (e.g. seeds of two configs), each resampled on its own."""
    rng = np.random.default_rng(seed)
    groups = {k: np.asarray(v, float)[np.isfinite(np.asarray(v, float))] for k, v in groups.items()}
    if any(v.size < 2 for v in groups.values()):  # one value gives a zero-width interval: no evidence of spread
        raise NotRun("needs at least 2 values per group, got " + ", ".join(f"{k}: {v.size}" for k, v in groups.items()))
    point = float(stat({k: v[None, :] for k, v in groups.items()})[0])
    r = stat({k: v[rng.integers(0, v.size, size=(reps, v.size))] for k, v in groups.items()})
    return (point, *_interval(r))


def _center(name: str) -> Callable[[np.ndarray], np.ndarray]:
    if name == "mean":
        return _mean
    if name == "iqm":
        return lambda x: np.array([iqm(row) for row in np.atleast_2d(x)])
    raise ValueError(f"center must be mean or iqm, got {name!r}")


# ============================================================================ probe kinds

def probe_row(e: ExpData, where: dict | None, scope: str = "all") -> pd.Series:
    rows = e.select(e.probe, {**(where or {}), "scope": scope}, "probe row")
    return rows.sort_values("seed").iloc[0]


def probe_value(e: ExpData, part: dict) -> Stat:
    row = probe_row(e, part.get("where"), part.get("scope", "all"))
    col = part["column"]
    if col not in row.index:
        raise NotRun(f"{e.name}: probe column {col} missing")
    pt = float(row[col])
    lo, hi = (float(row.get(f"{col}_low", np.nan)), float(row.get(f"{col}_high", np.nan)))
    if part.get("divide_by"):
        s = float(row[part["divide_by"]])
        pt, lo, hi = pt / s, lo / s, hi / s
        lo, hi = min(lo, hi), max(lo, hi)
    if part.get("transform") == "one_minus":
        pt, lo, hi = 1 - pt, 1 - hi, 1 - lo
    n = int(row.get("batches", 0) or 0)
    return Stat(pt, lo, hi, n, f"{n} batches", "batches")


def _batches(e: ExpData, where: dict | None, column: str, scope: str = "all") -> pd.Series:
    rows = e.select(e.batches, {**(where or {}), "scope": scope}, "per-batch probe data")
    if column not in rows.columns:
        raise NotRun(f"{e.name}: per-batch column {column} missing")
    return rows.set_index(["seed", "batch"])[column].sort_index()


def batch_ratio(e: ExpData, part: dict) -> Stat:
    col, of = part.get("column", "dev_sq"), part.get("of", "mean")
    agg = {"mean": lambda x: x.mean(axis=-1), "var": lambda x: x.var(axis=-1)}[of]
    num = _batches(e, part["num"], col, part.get("scope", "all"))
    den = _batches(e, part["den"], col, part.get("scope", "all"))
    if part.get("paired", True):
        j = pd.concat([num.rename("a"), den.rename("b")], axis=1, join="inner")
        if j.empty:
            raise NotRun(f"{e.name}: no common batches to pair")
        pt, lo, hi = paired_bootstrap({"a": j.a.to_numpy(), "b": j.b.to_numpy()}, lambda d: agg(d["a"]) / agg(d["b"]))
        return Stat(pt, lo, hi, len(j), f"{len(j)} batches", "batches")
    pt, lo, hi = group_bootstrap({"a": num.to_numpy(), "b": den.to_numpy()}, lambda d: agg(d["a"]) / agg(d["b"]))
    return Stat(pt, lo, hi, min(len(num), len(den)), f"{len(num)}+{len(den)} batches", "batches")


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
RUN_TABLE = ("score", "auc")  # per-run score (final evaluations) and AUC: analysis.stats.run_table


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
        return t[["run_dir", "seed", col if col in t else red]].rename(columns={col if col in t else red: "value"})
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


def run_metric(e: ExpData, part: dict) -> Stat:
    op, center = part.get("op", "diff" if "b" in part else "mean"), _center(part.get("center", "mean"))
    a = run_values(e, part.get("a"), part["metric"])
    if op == "mean":
        pt, lo, hi = group_bootstrap({"a": a.value.to_numpy()}, lambda g: center(g["a"]))
        return Stat(pt, lo, hi, len(a), f"{len(a)} seeds", "seeds")
    b = run_values(e, part.get("b"), part["metric"])
    f = {"diff": lambda g: center(g["a"]) - center(g["b"]), "ratio": lambda g: center(g["a"]) / center(g["b"])}[op]
    if part.get("paired"):
        j = a.merge(b, on="seed", suffixes=("_a", "_b"))
        pt, lo, hi = paired_bootstrap({"a": j.value_a.to_numpy(), "b": j.value_b.to_numpy()}, f)
        return Stat(pt, lo, hi, len(j), f"{len(j)} seed pairs", "seeds")
    pt, lo, hi = group_bootstrap({"a": a.value.to_numpy(), "b": b.value.to_numpy()}, f)
    return Stat(pt, lo, hi, min(len(a), len(b)), f"{len(a)}+{len(b)} seeds", "seeds")


# ============================================================================ one claim's own

def prompt_upweighting(e: ExpData, part: dict) -> Stat:
    """C17: (mean gradient weight of the extreme prompts / weight of the middle prompt), with the
    group std over without it, paired over batches. A prompt's weight is 1 + its per-batch
    projected error ``err_proj`` (:mod:`harness.probes.stats`)."""
    extreme, middle = part["extreme"], part["middle"]
    arrays = {}
    for tag, where in (("on", part["num"]), ("off", part["den"])):
        for sc in (*extreme, middle):
            arrays[f"{tag}_{sc}"] = _batches(e, where, "err_proj", scope=sc)
    j = pd.concat(arrays, axis=1, join="inner")

    def up(dd, tag):
        w = {sc: 1.0 + _mean(dd[f"{tag}_{sc}"]) for sc in (*extreme, middle)}
        return sum(w[s] for s in extreme) / len(extreme) / w[middle]

    pt, lo, hi = paired_bootstrap({k: j[k].to_numpy() for k in j.columns}, lambda dd: up(dd, "on") / up(dd, "off"))
    return Stat(pt, lo, hi, len(j), f"{len(j)} batches", "batches")


def _lm_curves(e: ExpData, where: dict | None) -> list[np.ndarray]:
    m = e.select(e.metrics, where, "LM metrics")
    # rows without kl_ref (a kl.beta=0 run measures it every lm.kl_ref_every iterations) are no curve points
    return [g.sort_values("iteration")[["kl_ref", "gold_reward"]].dropna().to_numpy()
            for _, g in m.groupby(["run_dir", "seed"])]


def frontier_gap(e: ExpData, part: dict) -> Stat:
    """C21: mean gold gap of the penalised runs (``a``) to the frontier of the unpenalised ones
    (``b``: gold against sqrt(KL to the reference), pooled over seeds, linearly interpolated) at
    equal sqrt(KL), in units of the frontier's gold std."""
    pts = np.concatenate(_lm_curves(e, part["b"]))
    order = np.argsort(pts[:, 0])
    x0, y0 = np.sqrt(np.clip(pts[order, 0], 0, None)), pts[order, 1]
    gaps = []
    for c in _lm_curves(e, part["a"]):
        x = np.sqrt(np.clip(c[:, 0], 0, None))
        inside = (x >= x0.min()) & (x <= x0.max())
        if inside.any():
            gaps.append(float(np.mean(c[inside, 1] - np.interp(x[inside], x0, y0))))
    if not gaps:
        raise NotRun(f"{e.name}: the penalised runs never reach the KL range of the unpenalised ones")
    scale = float(np.nanstd(y0)) or 1.0
    pt, lo, hi = group_bootstrap({"a": np.array(gaps) / scale}, lambda g: _mean(g["a"]))
    return Stat(pt, lo, hi, len(gaps), f"{len(gaps)} runs", "runs")


KINDS: dict[str, Callable[[ExpData, dict], Stat]] = {
    "probe_value": probe_value, "batch_ratio": batch_ratio, "run_metric": run_metric,
    "prompt_upweighting": prompt_upweighting, "frontier_gap": frontier_gap,
}
