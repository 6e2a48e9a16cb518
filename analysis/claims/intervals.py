"""Interval methods of the claims report: each gives an interval at *any* confidence level.

A claim's primary statistic is an :class:`Estimate`: its point, the number of units per arm
(seeds or batches), the per-unit standard deviation, and a function that returns the interval at
a given level. The multiplicity control (:mod:`.protocol`) asks for intervals at levels up to
1 - 0.05/51, where an interval that is right at 95% can miss thirty times too often on skewed
data; so each method is one whose error is controlled on the shapes RL results take (bounded,
skewed, some seeds failing, ties at a ceiling), checked by simulation at every level the report
uses (:mod:`.calibration`, ``tests/test_claims_calibration.py``).

* :func:`bounded_mean_estimate` - the mean of per-seed values in a registered range ``[lo, hi]``
  (one arm's values, or per-seed paired differences ``a_s - b_s`` in ``[lo - hi, hi - lo]``; 0/1
  outcomes on [0, 1]): the betting confidence interval of Waudby-Smith & Ramdas, "Estimating
  means of bounded random variables by betting", JRSS-B (2023; arXiv 2010.09686):
  the hedged capital process with predictable plug-in bets tuned to n, truncated at ``c / m``
  and ``c / (1 - m)``, c = 1/2. The authors' ``confseq`` package (``betting_mart``,
  ``betting_ci``) is the reference; it is not a dependency because it computes one interval on a
  grid of means at a time, where the calibration needs tens of thousands vectorised, and it
  imports matplotlib and a multiprocessing package at import. Its error is at most alpha for
  *every* distribution on the range, at every n and every look (Ville's inequality), so failing
  seeds, ceilings and ties need no approximation. With ten seeds it decides only effects large
  against the range: ten CartPole seeds at 500 show the mean above 152 at alpha / 51.
* :func:`delta_estimate` - a smooth function of batch means (the probes' variance ratios,
  C17's up-weighting): the delta method with the sample covariance of the per-batch values,
  normal, on the log scale for ratios; for the thousands of batches the probes draw.
* :func:`normal_estimate` - a probe statistic with its bootstrap standard error
  (``<column>_se``, :mod:`harness.probes.stats`): point +- z se.

:func:`decision_p` turns a rule and an estimate into the p-value of the interval inversion: the
smallest alpha at which the interval decides the rule (either way). :func:`n_needed` is the
number of units per arm at which the rule decides the registered effect with the registered
power.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.stats

from .rules import Rule

LOG, IDENTITY = "log", "identity"
DELTA = "delta method"
BOOTSTRAP_SE = "bootstrap se"
SQUARED_NORM = "bootstrap se, with the square-root scale for a squared norm"


class OutOfRange(ValueError):
    """A per-unit value outside its registered range: the range was wrong, so no interval on it holds."""


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
    units: np.ndarray | None = None  # the per-unit values the interval is formed on (seed-level methods)
    bounds: tuple[float, float] | None = None  # the registered range of those values (betting)

    @property
    def bounded(self) -> bool:
        return self.bounds is not None

    @property
    def flat(self) -> bool:
        """No spread information: every unit's value equal, or a standard error of 0."""
        return not self.sd > 0

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


# ============================================================================ bounded means (betting)

#: c of the bets' truncation ``lambda <= c / m`` (and ``c / (1 - m)``), which keeps every factor of
#: the capital at least 1 - c; ``confseq.betting.betting_mart`` defaults to 1/2.
TRUNCATION = 0.5
#: The method's name, as the report and the registered protocol state it.
BETTING = f"betting (Waudby-Smith & Ramdas 2023, c = {TRUNCATION:g})"
#: Bisection steps for an interval's end on [0, 1] (2^-45: far below any reported digit).
_STEPS = 45


def _bets(z: np.ndarray, alpha: float) -> np.ndarray:
    """Predictable plug-in bets ``lambda_i = sqrt(2 log(2 / alpha) / (n sigma_{i-1}^2))`` (Waudby-Smith &
    Ramdas 2023, tuned to the fixed n), ``sigma^2`` the running variance of the values before
    ``i`` with one prior pseudo-observation of mean 1/2 and variance 1/4 (as ``confseq``'s
    ``lambda_predmix_eb``)."""
    n = z.shape[-1]
    t = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(z, axis=-1)) / (t + 1)
    s2 = (0.25 + np.cumsum((z - mu) ** 2, axis=-1)) / (t + 1)
    before = np.concatenate([np.full(z.shape[:-1] + (1,), 0.25), s2[..., :-1]], axis=-1)
    return np.sqrt(2.0 * math.log(2.0 / alpha) / (n * before))


def _log_wealth(z: np.ndarray, bets: np.ndarray, m, side: int) -> np.ndarray:
    """``max_t log K_t(m)`` of the capital betting that the mean lies above ``m`` (``side`` +1:
    ``prod (1 + lambda (z - m))``) or below it (-1: ``prod (1 - lambda (z - m))``); ``m`` has the
    shape of ``z`` without its last axis. Each factor is positive and monotone in ``m``, so the
    ``m`` a side rejects form an interval that ends at the mean's bound."""
    m = np.asarray(m, dtype=float)[..., None]
    with np.errstate(divide="ignore"):
        cap = TRUNCATION / (m if side > 0 else 1.0 - m)
    lam = np.minimum(bets, cap)
    return np.max(np.cumsum(np.log1p(side * lam * (z - m)), axis=-1), axis=-1)


def rejects(z: np.ndarray, alpha: float, m, side: int, bets: np.ndarray | None = None) -> np.ndarray:
    """Whether the hedged test (``max(K+ / 2, K- / 2) >= 1 / alpha``, the hedged capital of
    Waudby-Smith & Ramdas 2023) rejects the mean ``m`` on ``side`` (+1: the mean lies above ``m``;
    -1: below) for values ``z`` in [0, 1] (last axis). The running maximum over t is valid by
    Ville's inequality."""
    bets = _bets(z, alpha) if bets is None else bets
    return _log_wealth(z, bets, m, side) >= math.log(2.0 / alpha)


def betting_interval(z: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``1 - alpha`` betting interval for the mean of values ``z`` in [0, 1] (along the last
    axis: ``[sims, n]`` gives ``sims`` intervals). Each end by bisection, kept on the wide side."""
    z = np.asarray(z, dtype=float)
    bets = _bets(z, alpha)
    shape = z.shape[:-1]
    ends = []
    for side, edge in ((1, 0.0), (-1, 1.0)):
        # side +1 rejects [0, lo), side -1 rejects (hi, 1]: bisect between a rejected m and an accepted one
        out, acc = np.full(shape, edge), np.full(shape, 1.0 - edge)
        any_rejected = rejects(z, alpha, out, side, bets)
        for _ in range(_STEPS):
            mid = (out + acc) / 2
            r = rejects(z, alpha, mid, side, bets)
            out, acc = np.where(r, mid, out), np.where(r, acc, mid)
        ends.append(np.where(any_rejected, out, edge))
    return ends[0][()], ends[1][()]


def to_unit(x, lo: float, hi: float) -> np.ndarray:
    """Values in ``[lo, hi]`` mapped onto [0, 1]; a value outside the range is an error."""
    x = np.asarray(x, dtype=float)
    if not hi > lo:
        raise ValueError(f"a range needs lo < hi, got [{lo:g}, {hi:g}]")
    bad = x[(x < lo) | (x > hi) | ~np.isfinite(x)]
    if bad.size:
        raise OutOfRange(f"value {bad[0]:g} outside the registered range [{lo:g}, {hi:g}]")
    return (x - lo) / (hi - lo)


def bounded_mean_estimate(x, lo: float, hi: float, unit: str = "seeds", n_text: str | None = None,
                          values: dict | None = None) -> Estimate:
    """The mean of per-unit values ``x`` in ``[lo, hi]`` with its betting interval (the values in
    seed order: the bets are predictable in that order)."""
    x = np.asarray(x, dtype=float)
    if x.size < 2:
        raise ValueError(f"needs at least 2 values, got {x.size}")
    z = to_unit(x, lo, hi)

    def at(alpha):
        a, b = betting_interval(z, alpha)
        return lo + float(a) * (hi - lo), lo + float(b) * (hi - lo)

    return Estimate(float(x.mean()), int(x.size), unit, BETTING, float(x.std(ddof=1)), at,
                    n_text or f"{x.size} {unit}", IDENTITY, values or {"value": x}, units=x,
                    bounds=(float(lo), float(hi)))


# ============================================================================ functions of batch means

def delta_point_se(arrays: dict[str, np.ndarray], f: Callable[[dict], object], paired: bool = True,
                   log: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(point, se, n)`` of ``g = f`` (or ``log f``) of the means of per-batch arrays, by the
    delta method: ``se^2 = var(sum_k dg/dmu_k x_k) / n`` over aligned batches (``paired``: their
    covariance enters) or ``sum_k (dg/dmu_k)^2 var(x_k) / n_k`` (independent arrays). The gradient
    of ``f`` by central differences. Vectorised over leading axes (``[sims, n]`` arrays give
    ``sims`` estimates) for the calibration simulation; ``f`` must take arrays of means."""
    keys = list(arrays)
    mu = {k: arrays[k].mean(axis=-1) for k in keys}
    g = (lambda m: np.log(f(m))) if log else f
    with np.errstate(all="ignore"):
        point = np.asarray(g(mu), dtype=float)
        grad = {}
        for k in keys:
            h = 1e-6 * np.maximum(np.abs(mu[k]), 1e-12)
            grad[k] = (np.asarray(g({**mu, k: mu[k] + h})) - np.asarray(g({**mu, k: mu[k] - h}))) / (2 * h)
        if paired:
            infl = sum(grad[k][..., None] * (arrays[k] - mu[k][..., None]) for k in keys)
            n = np.asarray(arrays[keys[0]].shape[-1])
            se = infl.std(axis=-1, ddof=1) / np.sqrt(n)
        else:
            se = np.sqrt(sum(grad[k] ** 2 * arrays[k].var(axis=-1, ddof=1) / arrays[k].shape[-1] for k in keys))
            n = np.asarray(min(v.shape[-1] for v in arrays.values()))
    return point, se, n


def normal_ends(point, se, alpha: float, log: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``point +- z_{1 - alpha/2} se``, elementwise, exponentiated when ``log`` (the point and se on
    the log scale): the delta method's interval, in the report and in the calibration simulation."""
    z = float(scipy.stats.norm.isf(alpha / 2))
    lo, hi = np.subtract(point, z * se), np.add(point, z * se)
    if log:
        with np.errstate(over="ignore"):
            lo, hi = np.exp(lo), np.exp(hi)
    return lo, hi


def delta_estimate(arrays: dict[str, np.ndarray], f: Callable[[dict], object], *, paired: bool = True,
                   log: bool = True, unit: str = "batches", values: dict | None = None) -> Estimate:
    """``f`` of the means of per-batch arrays, delta-method interval (on ``log f`` when ``log``):
    :func:`delta_point_se`, then ``point +- z se`` (exponentiated when ``log``)."""
    arrays = {k: np.asarray(v, dtype=float) for k, v in arrays.items()}
    if paired and len({v.size for v in arrays.values()}) != 1:
        raise ValueError("paired arrays must have equal lengths")
    if min(v.size for v in arrays.values()) < 2:
        raise ValueError("needs at least 2 batches per array")
    point, se, n = (float(v) for v in delta_point_se(arrays, f, paired, log))
    n = int(n)

    def at(alpha):
        lo, hi = normal_ends(point, se, alpha, log)
        return float(lo), float(hi)

    n_text = f"{n} {unit}" if paired else "+".join(str(v.size) for v in arrays.values()) + f" {unit}"
    back = float(np.exp(point)) if log else point
    return Estimate(back, n, unit, DELTA, se * math.sqrt(n), at, n_text, LOG if log else IDENTITY,
                    values or {})


def normal_estimate(point: float, se: float, n: int, unit: str = "batches", method: str = BOOTSTRAP_SE,
                    squared: bool = False) -> Estimate:
    """``point +- z se`` (a probe statistic with its bootstrap standard error). ``squared``: the
    statistic is a (debiased) squared norm ``||d||^2``, whose variance grows with it
    (``4 d' Sigma d / M + 2 tr Sigma^2 / M^2``), so a standard error read off a low estimate is too
    small where the truth is larger; the interval is then the union with the normal interval on
    the square-root scale (``sqrt(point) +- z se / (2 sqrt(point))``, squared back), where that
    variance is nearly constant. :mod:`.calibration` measures both on the probes' squared bias."""
    if not (np.isfinite(point) and np.isfinite(se) and se >= 0):
        raise ValueError(f"needs a finite point and standard error, got {point}, {se}")

    def at(alpha):
        z = float(scipy.stats.norm.isf(alpha / 2))
        lo, hi = point - z * se, point + z * se
        if squared and point > 0 and se > 0:
            root, root_se = math.sqrt(point), se / (2 * math.sqrt(point))
            lo, hi = min(lo, max(root - z * root_se, 0.0) ** 2), max(hi, (root + z * root_se) ** 2)
        return lo, hi

    name = SQUARED_NORM if squared else method
    return Estimate(float(point), int(n), unit, name, float(se) * math.sqrt(max(n, 1)), at, f"{n} {unit}")


def transformed(est: Estimate, fn: Callable[[float], float], decreasing: bool = False) -> Estimate:
    """``fn`` of an estimate, for a *linear* map (``1 - x``, ``x / s``): the same intervals, mapped,
    and the per-unit sd scaled by the map's slope (so n needed stays in the new units)."""

    def at(alpha):
        lo, hi = est.interval_alpha(alpha)
        lo, hi = fn(lo), fn(hi)
        return (hi, lo) if decreasing else (lo, hi)

    slope = abs(fn(est.point + 1.0) - fn(est.point))
    return Estimate(fn(est.point), est.n, est.unit, est.method, est.sd * slope, at, est.n_text, est.scale, est.values)


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


#: n needed beyond this many units per arm is reported as "more than" it.
MAX_N = 2 ** 14


def _target(rule: Rule, effect: float) -> tuple[float, tuple[float, ...]]:
    """Where the truth is put to size a design: ``effect`` past a threshold rule's boundary on its
    supported side, or the centre of an equivalence or between band; and the rule's boundaries."""
    if rule.kind == "greater":
        return rule.threshold + effect, (rule.threshold,)
    if rule.kind == "less":
        return rule.threshold - effect, (rule.threshold,)
    lo, hi = rule.band
    return (lo + hi) / 2, (lo, hi)


def _normal_n(est: Estimate, rule: Rule, effect: float, alpha: float, power: float) -> float | None:
    """``ceil(((z_{1 - alpha/2} + z_b) sd / d)^2)`` on the estimate's scale, ``d`` the distance from
    the truth to the nearest boundary; ``z_b = z_power`` for a threshold rule (one boundary), and
    ``z_{(1 + power)/2}`` for a band, whose interval must clear both ends (TOST)."""
    truth, edges = _target(rule, effect)
    d = min(abs(est.to_scale(truth) - est.to_scale(b)) for b in edges)
    if not (math.isfinite(d) and d > 0 and np.isfinite(est.sd) and est.sd > 0):
        return None
    zb = scipy.stats.norm.ppf(power if len(edges) == 1 else (1 + power) / 2)
    z = float(scipy.stats.norm.isf(alpha / 2)) + float(zb)
    return float(math.ceil((z * est.sd / d) ** 2))


def betting_supports(z: np.ndarray, alpha: float, rule: Rule, lo: float, hi: float) -> np.ndarray:
    """Whether the betting interval of values ``z`` (in [0, 1], last axis; the statistic's range
    ``[lo, hi]``) lies on the supported side of every boundary of ``rule``: each boundary tested
    directly (the interval's ends are where these tests switch)."""
    bets = _bets(z, alpha)
    out = np.ones(z.shape[:-1], dtype=bool)
    sides = {"greater": (1,), "less": (-1,)}.get(rule.kind, (1, -1))
    for edge, side in zip(rule.boundaries, sides):
        m = np.full(z.shape[:-1], (edge - lo) / (hi - lo))
        if not 0 <= m.flat[0] <= 1:  # a boundary outside the range: nothing lies beyond it
            return np.zeros(z.shape[:-1], dtype=bool)
        out &= rejects(z, alpha, m, side, bets)
    return out


def _shift_to(pool: np.ndarray, mean: float) -> np.ndarray:
    """``pool`` moved to mean ``mean`` inside [0, 1] (shifted and clipped until the mean is right)."""
    y = pool.astype(float)
    for _ in range(100):
        y = np.clip(y + (mean - y.mean()), 0.0, 1.0)
        if abs(y.mean() - mean) < 1e-9:
            break
    return y


def betting_power(pool: np.ndarray, n: int, alpha: float, rule: Rule, bounds: tuple[float, float],
                  sims: int = 400, seed: int = 0) -> float:
    """The share of ``sims`` samples of ``n`` values drawn from ``pool`` (in [0, 1]) whose betting
    interval supports ``rule``."""
    rng = np.random.default_rng(seed)
    hits, chunk = 0, max(1, 2_000_000 // n)
    for start in range(0, sims, chunk):
        z = rng.choice(pool, size=(min(chunk, sims - start), n))
        hits += int(betting_supports(z, alpha, rule, *bounds).sum())
    return hits / sims


def _betting_n(est: Estimate, rule: Rule, effect: float, alpha: float, power: float) -> float | None:
    """The smallest n whose simulated power reaches ``power`` when the per-unit values are the
    observed ones moved to the truth of :func:`_target` (resampled with replacement)."""
    lo, hi = est.bounds
    truth, _ = _target(rule, effect)
    if not lo < truth < hi:
        return None
    pool = _shift_to(to_unit(est.units, lo, hi), (truth - lo) / (hi - lo))
    sims = 1 if np.ptp(pool) == 0 else 400  # equal values: every sample is the same one

    def reached(n: int) -> bool:
        return betting_power(pool, n, alpha, rule, (lo, hi), sims) >= power
    n = 2
    while not reached(n):
        if n >= MAX_N:
            return None
        n *= 2
    low = n // 2
    while n - low > 1:  # reached(n), not reached(low)
        mid = (low + n) // 2
        low, n = (low, mid) if reached(mid) else (mid, n)
    return float(n)


def n_needed(est: Estimate, rule: Rule, effect: float, alpha: float, power: float = 0.8) -> float | None:
    """Units per arm at which ``rule`` is decided (supported) with probability ``power`` at the
    two-sided level ``alpha`` when the truth lies the registered ``effect`` beyond the rule's
    boundary (a threshold rule) or at the centre of its band (equivalence, between: the interval
    must clear both ends). Normal methods: the closed form of :func:`_normal_n`; betting: by
    simulation of the betting rule itself (:func:`_betting_n`). None when it cannot be sized (no
    spread information, a truth outside the range, or more than :data:`MAX_N`)."""
    if est.bounded:
        return _betting_n(est, rule, effect, alpha, power)
    return _normal_n(est, rule, effect, alpha, power)


__all__ = ["BETTING", "BOOTSTRAP_SE", "DELTA", "SQUARED_NORM", "Estimate", "IDENTITY", "LOG", "OutOfRange",
           "betting_interval", "betting_power", "betting_supports", "bounded_mean_estimate", "decision_p",
           "delta_estimate", "delta_point_se", "n_needed", "normal_ends", "normal_estimate", "rejects", "to_unit",
           "transformed"]
