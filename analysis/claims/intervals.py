"""Interval methods of the claims report: each gives an interval at *any* confidence level.

A claim's primary statistic is an :class:`Estimate`: its point, the number of units per arm
(seeds or batches), the per-unit standard deviation on the scale the interval is formed on, and
a function that returns the interval at a given level. The multiplicity control
(:mod:`.protocol`) asks for intervals at levels such as 99.8%, so every method here is analytic
(no bootstrap percentiles, whose tails at those levels rest on a handful of replicates), and
its coverage at the n the report uses is tested by simulation (``tests/test_claims_coverage.py``,
which also shows the percentile bootstrap failing at n = 4).

The methods, fixed before any claim's data is read:

* :func:`mean_estimate` - the mean of per-unit values: one arm's per-seed values, per-seed paired
  differences ``a_s - b_s`` (every arm of a claim experiment runs the same seeds, so two arms are
  always paired by seed), or per-seed log ratios ``log(a_s / b_s)`` (a ratio claim: the geometric
  mean ratio). The interval is the union of Student's t interval and Hall's skewness-corrected t
  interval (Hall 1992, "On the removal of skewness by transformation", JRSS B 54: the
  transformation ``g(T) = T + a T^2 + a^2 T^3 / 3 + b`` with ``a = gamma / (3 sqrt n)``,
  ``b = gamma / (6 sqrt n)``, ``gamma`` the sample skewness). Student's t alone undercovers with
  skewed data (0.90 at n = 10 for exponential data), Hall's alone with heavy tails (0.93 at
  n = 20-40 for t(3) data); their union covers at least what the better of the two does, and
  equals the t interval for symmetric data.
* :func:`proportion_difference` - the difference of two proportions of binary per-run outcomes
  (e.g. "the run collapsed"): Agresti & Caffo (2000), one success and one failure added to each
  arm, then the Wald interval. Its coverage is computed exactly (by enumeration) in the tests.
* :func:`delta_estimate` - a smooth function of batch means (the probes' variance ratios,
  C17's up-weighting): the delta method with the sample covariance of the per-batch values,
  normal, on the log scale for ratios. For the thousands of batches the probes draw.
* :func:`normal_estimate` - a probe statistic with its bootstrap standard error
  (``<column>_se``, :mod:`harness.probes.stats`): point +- z se.

:func:`decision_p` turns a rule and an estimate into the p-value that the interval-inversion
gives: the largest level at which the interval still decides the rule (either way).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.stats

LOG, IDENTITY = "log", "identity"


@dataclass
class Estimate:
    """A primary (or check, or reported) statistic with intervals at any level.

    ``interval_at(alpha)`` gives the ``1 - alpha`` interval ``(low, high)`` in the statistic's own
    units (alpha, not the level: p-values of 1e-300 stay representable); ``scale`` is the
    scale the interval is formed on (``identity`` or ``log``), on which ``sd`` (the per-unit
    standard deviation) lives: it sizes the n a registered effect needs (:func:`n_needed`)."""

    point: float
    n: int  # units per arm (the smaller arm's)
    unit: str  # "seeds" | "batches"
    method: str
    sd: float
    interval_at: Callable[[float], tuple[float, float]]
    n_text: str = ""
    scale: str = IDENTITY
    values: dict = field(default_factory=dict)  # per-unit values, for the figures

    def interval(self, level: float) -> tuple[float, float]:
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        return self.interval_alpha(1 - level)

    def interval_alpha(self, alpha: float) -> tuple[float, float]:
        """The two-sided ``1 - alpha`` interval."""
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        lo, hi = self.interval_at(alpha)
        return float(lo), float(hi)

    def to_scale(self, x: float) -> float:
        """A value in the statistic's units on the interval's scale."""
        if self.scale == LOG:
            return math.log(x) if x > 0 else -math.inf
        return float(x)


# ============================================================================ means

def _hall_inverse(y, a, b):
    """The inverse of Hall's g(t) = ((1 + a t)^3 - 1) / (3 a) + b (monotone for every t)."""
    y = np.asarray(y, dtype=float) - b
    a = np.asarray(a, dtype=float)
    small = np.abs(a) < 1e-12
    with np.errstate(all="ignore"):
        out = (np.cbrt(1.0 + 3.0 * a * y) - 1.0) / np.where(small, 1.0, a)
    return np.where(small, y, out)


def mean_interval(x: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``1 - alpha`` union of Student's t and Hall's skewness-corrected t interval for the mean
    of ``x`` (along its last axis: a ``[sims, n]`` array gives ``sims`` intervals, as the coverage
    simulation uses it)."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    m = x.mean(axis=-1)
    s = x.std(axis=-1, ddof=1)
    se = s / math.sqrt(n)
    q = float(scipy.stats.t.isf(alpha / 2, n - 1))
    with np.errstate(all="ignore"):
        gamma = np.where(s > 0, ((x - m[..., None]) ** 3).mean(axis=-1) / np.where(s > 0, s, 1.0) ** 3, 0.0)
    a, b = gamma / (3 * math.sqrt(n)), gamma / (6 * math.sqrt(n))
    # T = (mean - mu) / se and g(T) ~ t: mu in [m - se g^-1(q), m - se g^-1(-q)]
    with np.errstate(invalid="ignore"):
        lo = np.minimum(m - q * se, m - se * _hall_inverse(q, a, b))
        hi = np.maximum(m + q * se, m - se * _hall_inverse(-q, a, b))
    # values all equal (se = 0): the interval is the point at every level; at alpha so small that
    # q is infinite (decision_p goes down to 1e-300) 0 * inf would make it NaN
    flat = se == 0
    return np.where(flat, m, lo)[()], np.where(flat, m, hi)[()]


def mean_estimate(x, unit: str = "seeds", n_text: str | None = None, scale: str = IDENTITY,
                  values: dict | None = None) -> Estimate:
    """The mean of per-unit values ``x`` (``scale="log"``: ``x`` are logs; the estimate and its
    interval are reported as ``exp``, a geometric mean)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"needs at least 2 values, got {x.size}")
    def back(v: float) -> float:
        if scale != LOG:
            return v
        with np.errstate(over="ignore"):
            return float(np.exp(v))

    def at(alpha):
        lo, hi = mean_interval(x, alpha)
        return back(float(lo)), back(float(hi))

    return Estimate(float(back(x.mean())), int(x.size), unit, "t ∪ Hall", float(x.std(ddof=1)), at,
                    n_text or f"{x.size} {unit}", scale, values or {"value": x})


# ============================================================================ proportions

def proportion_difference(a, b, unit: str = "seeds", values: dict | None = None) -> Estimate:
    """``mean(a) - mean(b)`` of two arms of 0/1 outcomes, Agresti & Caffo's interval."""
    a, b = (np.asarray(v, dtype=float) for v in (a, b))
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2:
        raise ValueError(f"needs at least 2 runs per arm, got {a.size} and {b.size}")
    if not set(np.unique(np.concatenate([a, b]))) <= {0.0, 1.0}:
        raise ValueError("proportion_difference needs 0/1 outcomes")
    qa, qb = (a.sum() + 1) / (a.size + 2), (b.sum() + 1) / (b.size + 2)
    se = math.sqrt(qa * (1 - qa) / (a.size + 2) + qb * (1 - qb) / (b.size + 2))

    def at(alpha):
        z = float(scipy.stats.norm.isf(alpha / 2))
        return qa - qb - z * se, qa - qb + z * se

    n = min(a.size, b.size)
    sd = math.sqrt(qa * (1 - qa) + qb * (1 - qb))  # per run and arm: se ~ sd / sqrt(n)
    return Estimate(float(a.mean() - b.mean()), n, unit, "Agresti-Caffo", sd, at,
                    f"{a.size}+{b.size} {unit}", IDENTITY, values or {"a": a, "b": b})


# ============================================================================ functions of batch means

def delta_estimate(arrays: dict[str, np.ndarray], f: Callable[[dict[str, float]], float], *, paired: bool = True,
                   log: bool = True, unit: str = "batches", values: dict | None = None) -> Estimate:
    """``f`` of the means of per-batch arrays, delta-method interval (on ``log f`` when ``log``).

    ``paired``: the arrays are aligned (the same batches: common random numbers) and their
    covariance enters; otherwise each mean's variance is its own. The gradient of ``f`` is taken
    by central differences."""
    arrays = {k: np.asarray(v, dtype=float) for k, v in arrays.items()}
    if paired and len({v.size for v in arrays.values()}) != 1:
        raise ValueError("paired arrays must have equal lengths")
    if min(v.size for v in arrays.values()) < 2:
        raise ValueError("needs at least 2 batches per array")
    keys = list(arrays)
    mu = {k: float(arrays[k].mean()) for k in keys}
    g = (lambda m: math.log(f(m))) if log else f
    point = g(mu)
    grad = {}
    for k in keys:
        h = 1e-6 * max(abs(mu[k]), 1e-12)
        up, dn = dict(mu), dict(mu)
        up[k] += h
        dn[k] -= h
        grad[k] = (g(up) - g(dn)) / (2 * h)
    if paired:
        infl = sum(grad[k] * (arrays[k] - mu[k]) for k in keys)
        n = arrays[keys[0]].size
        sd = float(np.std(infl, ddof=1))
        se = sd / math.sqrt(n)
    else:
        var = sum(grad[k] ** 2 * arrays[k].var(ddof=1) / arrays[k].size for k in keys)
        se = math.sqrt(var)
        n = min(v.size for v in arrays.values())
        sd = se * math.sqrt(n)
    def back(v: float) -> float:
        if not log:
            return v
        with np.errstate(over="ignore"):
            return float(np.exp(v))

    def at(alpha):
        z = float(scipy.stats.norm.isf(alpha / 2))
        return back(point - z * se), back(point + z * se)

    n_text = f"{n} {unit}" if paired else "+".join(str(v.size) for v in arrays.values()) + f" {unit}"
    return Estimate(float(back(point)), int(n), unit, "delta method", sd, at, n_text, LOG if log else IDENTITY,
                    values or {})


def normal_estimate(point: float, se: float, n: int, unit: str = "batches", method: str = "bootstrap se") -> Estimate:
    """``point +- z se`` (a probe statistic with its bootstrap standard error)."""
    if not (np.isfinite(point) and np.isfinite(se) and se >= 0):
        raise ValueError(f"needs a finite point and standard error, got {point}, {se}")

    def at(alpha):
        z = float(scipy.stats.norm.isf(alpha / 2))
        return point - z * se, point + z * se

    return Estimate(float(point), int(n), unit, method, float(se) * math.sqrt(max(n, 1)), at, f"{n} {unit}")


def transformed(est: Estimate, fn: Callable[[float], float], decreasing: bool = False) -> Estimate:
    """``fn`` of an estimate (a monotone map, e.g. ``1 - x``): the same intervals, mapped."""

    def at(alpha):
        lo, hi = est.interval_alpha(alpha)
        lo, hi = fn(lo), fn(hi)
        return (hi, lo) if decreasing else (lo, hi)

    return Estimate(fn(est.point), est.n, est.unit, est.method, est.sd, at, est.n_text, est.scale, est.values)


# ============================================================================ rules and p-values

def decision_p(est: Estimate, judge: Callable[[float, float, float], str]) -> float:
    """The p-value of the interval-inversion: the smallest alpha whose ``1 - alpha`` interval
    decides the rule (``judge(point, low, high)`` in supported | refuted), found by bisection on
    log alpha (intervals shrink as alpha grows, and a rule an interval decides, every interval
    inside it decides the same way). 1 when not even a near-zero-width interval decides it."""
    def decided(alpha: float) -> bool:
        lo, hi = est.interval_alpha(alpha)
        return judge(est.point, lo, hi) in ("supported", "refuted")

    hi_a, lo_a = 1 - 1e-9, 1e-300
    if not decided(hi_a):
        return 1.0
    if decided(lo_a):
        return lo_a
    a, b = math.log(lo_a), math.log(hi_a)
    for _ in range(80):
        mid = (a + b) / 2
        if decided(math.exp(mid)):
            b = mid
        else:
            a = mid
    return float(math.exp(b))


def n_needed(est: Estimate, distance: float, alpha: float, power: float = 0.8) -> float | None:
    """Units per arm for ``power`` to decide the rule when the truth lies ``distance`` (the
    registered smallest effect or margin, on the estimate's scale) from the rule's boundary, at a
    two-sided level ``alpha``: ``((z_{1 - alpha/2} + z_power) sd / distance)^2`` with the
    estimate's per-unit sd (normal approximation)."""
    if not (distance > 0 and np.isfinite(est.sd) and est.sd > 0):
        return None
    z = float(scipy.stats.norm.isf(alpha / 2)) + float(scipy.stats.norm.ppf(power))
    return float(math.ceil((z * est.sd / distance) ** 2))


__all__ = ["Estimate", "IDENTITY", "LOG", "decision_p", "delta_estimate", "mean_estimate", "mean_interval", "n_needed",
           "normal_estimate", "proportion_difference", "transformed"]
