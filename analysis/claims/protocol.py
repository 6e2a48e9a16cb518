"""The claims report's error control: Holm across claims, a group-sequential plan within one.

Fixed before any data (``harness/conf/claims.yaml``'s ``protocol`` block sets the numbers):

* **Family-wise error rate, Holm (1979).** Every statistical claim that is tested in a report
  (its evidence present, its premise met, its power check passed, at least ``min_seeds`` seeds
  per arm for a learning claim) contributes one primary test with a p-value
  (:func:`.intervals.decision_p`, the interval inverted at the rule's boundary). Holm's step-down
  procedure decides the claims in order of their p-values at ``alpha / m``, ``alpha / (m - 1)``,
  ... and stops at the first that fails; the probability that *any* decided verdict is wrong is
  at most ``alpha`` whatever the dependence between claims (several share runs: C5/C6,
  C10/C21, C34-C38). Each claim's interval is shown at the level it was tested at
  (:func:`holm`): a decided claim's interval decides its rule there, an undecided one's does not.
  Holm rather than Benjamini-Hochberg: a reader acts on single verdicts ("is C26 true?"), not on
  the share of wrong ones among many, and BH's guarantee needs a positive dependence that
  claims read off the same runs in opposite directions (C5 and C6) do not have.
* **Group-sequential seeds (stage two).** A learning experiment may register *looks*: seeds
  per arm at which it is judged, e.g. ``(40, 80)``. At every look before the last, a claim whose
  nominal p-value crosses the O'Brien-Fleming-type boundary (Lan-DeMets alpha spending, at the
  Bonferroni level ``alpha / m_registered`` so the boundary is known before any data) stops;
  when every claim of the experiment has stopped, it is not extended. The plan is in runs, so
  the same command decides the same way on a busy or a quiet machine. A claim's p-value is the
  stage-wise one, bounded above (so valid) by the alpha spent before its last look plus its
  nominal p-value there (:func:`sequential_p`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.stats


@dataclass(frozen=True)
class Protocol:
    alpha: float = 0.05
    power: float = 0.8
    min_seeds: int = 10
    check_level: float = 0.95  # premise and power checks: nominal, not adjusted

    @classmethod
    def from_dict(cls, d: dict | None) -> "Protocol":
        d = dict(d or {})
        unknown = set(d) - {"alpha", "power", "min_seeds", "check_level", "multiplicity", "spending"}
        if unknown:
            raise ValueError(f"harness/conf/claims.yaml protocol: unknown field(s) {sorted(unknown)}")
        if d.get("multiplicity", "holm") != "holm":
            raise ValueError("harness/conf/claims.yaml protocol.multiplicity: only 'holm' is implemented")
        if d.get("spending", "obrien_fleming") != "obrien_fleming":
            raise ValueError("harness/conf/claims.yaml protocol.spending: only 'obrien_fleming' is implemented")
        return cls(float(d.get("alpha", 0.05)), float(d.get("power", 0.8)), int(d.get("min_seeds", 10)),
                   float(d.get("check_level", 0.95)))


@dataclass(frozen=True)
class HolmResult:
    rank: int  # 1 = smallest p-value
    m: int
    level: float  # the two-sided alpha this claim's interval is shown (and was tested) at
    p_adjusted: float
    decided: bool


def holm(pvalues: dict[str, float], alpha: float) -> dict[str, HolmResult]:
    """Holm's step-down procedure over ``{claim: p}``. Decided: ranks 1..k* where k* is the
    first rank r with ``p_(r) > alpha / (m - r + 1)``, minus one. Levels: ``alpha / (m - r + 1)``
    for ranks up to k* + 1 (the ones tested), ``alpha / (m - k*)`` after (never reached: shown at
    the level where testing stopped). Ties keep the order given."""
    m = len(pvalues)
    order = sorted(pvalues, key=lambda c: pvalues[c])
    out: dict[str, HolmResult] = {}
    stopped = None  # k*: number decided
    running = 0.0
    for r, c in enumerate(order, 1):
        running = max(running, min(1.0, (m - r + 1) * pvalues[c]))
        if stopped is None and pvalues[c] > alpha / (m - r + 1):
            stopped = r - 1
        tested_at = r if stopped is None or r <= stopped + 1 else stopped + 1
        out[c] = HolmResult(r, m, alpha / (m - tested_at + 1), running, stopped is None or r <= stopped)
    return out


# ============================================================================ group-sequential

def _spent(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: alpha spent by information fraction t (two-sided)."""
    if t <= 0:
        return 0.0
    return float(2.0 - 2.0 * scipy.stats.norm.cdf(scipy.stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def _inside(c: list[float], t: list[float]) -> float:
    """P(|Z_j| < c_j for every look j) for the z-statistics at information fractions t
    (Brownian motion: corr(Z_i, Z_j) = sqrt(t_i / t_j), i < j)."""
    k = len(c)
    if k == 1:
        return float(2 * scipy.stats.norm.cdf(c[0]) - 1)
    cov = np.array([[math.sqrt(min(t[i], t[j]) / max(t[i], t[j])) for j in range(k)] for i in range(k)])
    c = np.asarray(c, dtype=float)
    return float(scipy.stats.multivariate_normal(mean=np.zeros(k), cov=cov).cdf(c, lower_limit=-c))


def spending_boundaries(looks: list[int] | tuple[int, ...], alpha: float) -> list[float]:
    """Two-sided z boundaries ``c_k`` at the looks (units per arm): the alpha spent at look k,
    ``alpha(t_k) - alpha(t_{k-1})``, is the chance under the null of crossing first there."""
    looks = [float(n) for n in looks]
    if sorted(looks) != looks or len(set(looks)) != len(looks) or looks[0] <= 0:
        raise ValueError(f"looks must be increasing positive counts, got {looks}")
    t = [n / looks[-1] for n in looks]
    c: list[float] = []
    for k in range(len(t)):
        target = _spent(t[k], alpha) - (_spent(t[k - 1], alpha) if k else 0.0)
        if k == 0:
            c.append(float(scipy.stats.norm.ppf(1 - target / 2)))
            continue
        before = _inside(c, t[:k])

        def crossed_first(x: float) -> float:
            return before - _inside(c + [x], t[: k + 1]) - target

        c.append(float(scipy.optimize.brentq(crossed_first, 0.5, 40.0, xtol=1e-6)))
    return c


def nominal_level(boundary: float) -> float:
    """The nominal two-sided p-value a z boundary corresponds to."""
    return float(2 * (1 - scipy.stats.norm.cdf(boundary)))


def sequential_p(p_nominal: float, look: int, looks: list[int] | tuple[int, ...], alpha_stop: float) -> float:
    """A valid p-value for a claim that stopped at look ``look`` (0-based) of ``looks``: the alpha
    spent at the earlier looks plus its nominal p-value there (the exact stage-wise p-value is
    ``1 - P(|Z_j| < c_j, j < k; |Z_k| < |z_k|)``, which this bounds from above)."""
    if look == 0 or len(looks) == 1:
        return float(p_nominal)
    t_prev = looks[look - 1] / looks[-1]
    return float(min(1.0, _spent(t_prev, alpha_stop) + p_nominal))


__all__ = ["HolmResult", "Protocol", "holm", "nominal_level", "sequential_p", "spending_boundaries"]
