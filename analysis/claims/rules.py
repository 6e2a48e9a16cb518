"""Verdict rules: a statistic's 95% interval read against a threshold or a tolerance band.

Each rule is fixed before any data is read (it is part of the claim's entry in
``conf/claims.yaml``) and writes its own text for the report, so the text cannot drift from what
is applied. With the interval ``[lo, hi]`` of a statistic ``s``:

* ``greater: t`` (an effect ``s > t``): supported if ``lo > t``, refuted if ``hi < t``, else
  inconclusive.
* ``greater: {than: t, by: d}`` (an effect of at least ``d``, the smallest effect that counts):
  the same read at ``t + d``: supported if ``lo > t + d``, refuted if ``hi < t + d``. With
  ``d = 0`` a null effect is never refuted: its interval shrinks onto ``t`` and the verdict
  stays inconclusive, or falls either way by chance at any n (the interval of a tiny effect
  excludes ``t`` once n is large). With ``d > 0`` (the region of practical equivalence, Kruschke
  2018) more data converges on one verdict: supported when the effect exceeds ``d``, refuted
  when it is smaller, including when it is none.
* ``less: t`` and ``less: {than: t, by: d}``: the mirror image (supported if ``hi < t - d``).
* ``equivalent: {tol, to}`` (a null ``s = to`` within ``+-tol``; ``to`` defaults to 0): the
  two one-sided tests (TOST, Schuirmann 1987) read on the same interval: supported if the
  interval lies inside ``[to - tol, to + tol]``, refuted if it lies wholly outside it, else
  inconclusive. Unlike "refuted when the interval excludes 0", more data can only sharpen an
  equivalence verdict, never turn a negligible effect into a refutation.
* ``between: [a, b]`` (an effect that is present but small, ``a < s < b``): supported if the
  interval lies inside ``(a, b)``, refuted if it lies wholly outside it, else inconclusive.
* ``exact: tol`` (an identity, no interval): supported if ``|s| <= tol``, else refuted.

Deciding needs more data (:func:`needed_n`): an undecided part's interval half-width ``h`` at
``n`` shrinks like ``1/sqrt(n)``; the margin ``m`` is the distance from the point estimate to the
nearest boundary whose crossing would decide it. The interval stops straddling that boundary when
``h' < m``, i.e. at ``n' = n (h/m)^2`` (a 50% chance); for 80% power the interval's half-width
must be ``z_0.975 / (z_0.975 + z_0.8)`` of the margin, ``n80 = n (h/m)^2 ((1.96 + 0.84)/1.96)^2``.
The report states ``n80`` with the numbers it came from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VERDICTS = ("supported", "refuted", "inconclusive")
Z975, Z80 = 1.959964, 0.841621
POWER_FACTOR = ((Z975 + Z80) / Z975) ** 2  # 80% power at a two-sided 5% level


def _finite(*xs) -> bool:
    return all(x is not None and np.isfinite(x) for x in xs)


@dataclass(frozen=True)
class Rule:
    """One of the rules above: ``kind`` in greater | less | equivalent | between | exact."""

    kind: str
    a: float = 0.0  # threshold, centre (equivalent), lower end (between), tolerance (exact)
    b: float = 0.0  # tolerance (equivalent), upper end (between), smallest effect (greater, less)

    @classmethod
    def parse(cls, spec) -> "Rule":
        """From a claims.yaml entry: ``{greater: 1}``, ``{less: {than: 0, by: 0.1}}``,
        ``{equivalent: 0.1}``, ``{equivalent: {tol: 0.05, to: 1}}``, ``{between: [0, 0.1]}``,
        ``{exact: 1e-9}``."""
        if not isinstance(spec, dict) or len(spec) != 1:
            raise ValueError(f"rule must be one of greater|less|equivalent|between|exact, got {spec!r}")
        (kind, v), = spec.items()
        if kind in ("greater", "less") and isinstance(v, dict):
            if set(v) - {"than", "by"} or "by" not in v:
                raise ValueError(f"rule {kind}: needs {{than: t, by: d}} (than defaults to 0), got {v!r}")
            by = float(v["by"])
            if not by >= 0:
                raise ValueError(f"rule {kind}: by (the smallest effect that counts) must be >= 0, got {v['by']!r}")
            return cls(kind, float(v.get("than", 0.0)), by)
        if kind in ("greater", "less", "exact"):
            return cls(kind, float(v))
        if kind == "equivalent":
            if isinstance(v, dict):
                return cls(kind, float(v.get("to", 0.0)), float(v["tol"]))
            return cls(kind, 0.0, float(v))
        if kind == "between":
            lo, hi = (float(x) for x in v)
            if not lo < hi:
                raise ValueError(f"rule between: needs a < b, got {v!r}")
            return cls(kind, lo, hi)
        raise ValueError(f"unknown rule {kind!r}; allowed: greater, less, equivalent, between, exact")

    @property
    def threshold(self) -> float:
        """Where a ``greater``/``less`` rule reads the interval: ``than`` moved by the smallest effect."""
        return self.a + self.b if self.kind == "greater" else self.a - self.b

    @property
    def text(self) -> str:
        if self.kind in ("greater", "less"):
            sign = ">" if self.kind == "greater" else "<"
            return f"{sign} {self.a:g}" + (f" by {self.b:g}" if self.b else "")
        if self.kind == "equivalent":
            return f"= {self.a:g} (+-{self.b:g})"
        if self.kind == "between":
            return f"in ({self.a:g}, {self.b:g})"
        return f"|.| <= {self.a:g}"

    @property
    def sentence(self) -> str:
        """The rule in words, for the report."""
        if self.kind in ("greater", "less"):
            side, other = ("above", "below") if self.kind == "greater" else ("below", "above")
            by = (f" ({self.a:g} {'+' if self.kind == 'greater' else '-'} {self.b:g}, the smallest effect that counts)"
                  if self.b else "")
            return f"supported if the interval lies {side} {self.threshold:g}{by}, refuted if {other}"
        if self.kind == "equivalent":
            return (f"equivalence to {self.a:g} within +-{self.b:g} (TOST): supported if the interval lies inside "
                    f"[{self.a - self.b:g}, {self.a + self.b:g}], refuted if wholly outside")
        if self.kind == "between":
            return f"supported if the interval lies inside ({self.a:g}, {self.b:g}), refuted if wholly outside"
        return f"exact: supported if |value| <= {self.a:g}"

    def judge(self, point: float, low: float, high: float) -> str:
        if self.kind == "exact":
            return "inconclusive" if not _finite(point) else "supported" if abs(point) <= self.a else "refuted"
        if not _finite(low, high):
            return "inconclusive"
        if self.kind == "greater":
            t = self.threshold
            return "supported" if low > t else "refuted" if high < t else "inconclusive"
        if self.kind == "less":
            t = self.threshold
            return "supported" if high < t else "refuted" if low > t else "inconclusive"
        lo_b, hi_b = self.band
        if low >= lo_b and high <= hi_b and (self.kind == "equivalent" or (low > lo_b and high < hi_b)):
            return "supported"
        if high < lo_b or low > hi_b:
            return "refuted"
        return "inconclusive"

    @property
    def band(self) -> tuple[float, float]:
        if self.kind == "equivalent":
            return self.a - self.b, self.a + self.b
        return self.a, self.b

    def margin(self, point: float, low: float, high: float) -> tuple[float, float] | None:
        """``(h, m)`` for an undecided interval: its half-width on the side that must move and
        the distance from the point estimate to the boundary it must clear; None when no
        amount of data decides it (the point estimate sits on a boundary)."""
        if not _finite(point, low, high) or self.kind == "exact":
            return None
        if self.kind in ("greater", "less"):
            t = self.threshold
            m = abs(point - t)
            h = (point - low) if point > t else (high - point)
            return (h, m) if m > 0 else None
        lo_b, hi_b = self.band
        if lo_b < point < hi_b:  # heading for "supported": both ends must come inside the band
            need = []
            if low < lo_b:
                need.append((point - low, point - lo_b))
            if high > hi_b:
                need.append((high - point, hi_b - point))
            return max(need, key=lambda hm: hm[0] / hm[1]) if need else None
        m = (lo_b - point) if point <= lo_b else (point - hi_b)  # heading for "refuted"
        h = (high - point) if point <= lo_b else (point - low)
        return (h, m) if m > 0 else None


def needed_n(rule: Rule, point: float, low: float, high: float, n: float) -> float | None:
    """About how many units (batches, seeds) an undecided part needs for 80% power (module doc)."""
    hm = rule.margin(point, low, high)
    if hm is None or not n or not np.isfinite(n):
        return None
    h, m = hm
    if h <= 0:
        return None
    return float(math.ceil(n * (h / m) ** 2 * POWER_FACTOR))


@dataclass
class Part:
    """One statistic of a claim, its interval, the rule applied and the outcome."""

    name: str
    point: float
    low: float
    high: float
    rule: str
    verdict: str
    n: str = ""
    n_units: float = float("nan")  # the n the interval came from (batches, seeds per group)
    n_needed: float | None = None  # about how many units deciding needs (80% power), if undecided
    role: str = "judged"  # judged | power (must be supported, else the claim stays inconclusive)
    unit: str = ""
    spec: Rule | None = None  # the rule applied (None: reported, not judged)
    experiment: str = ""  # where its evidence comes from

    @property
    def needs(self) -> str:
        if self.verdict != "inconclusive" or self.n_needed is None:
            return ""
        return f"undecided at n = {self.n_units:g} {self.unit}, deciding needs about n = {self.n_needed:g}"


def judge_part(name: str, rule: Rule, point: float, low: float, high: float, n_units: float = float("nan"),
               n: str = "", unit: str = "", role: str = "judged") -> Part:
    verdict = rule.judge(point, low, high)
    part = Part(name, point, low, high, rule.text, verdict, n, n_units, None, role, unit, rule)
    if verdict == "inconclusive":
        part.n_needed = needed_n(rule, point, low, high, n_units)
    return part


def combine(parts: list[Part]) -> str:
    """All judged parts supported: supported; any refuted: refuted; else inconclusive. A
    ``power`` part (e.g. a negative control the probe must detect) that is not supported makes
    an otherwise supported claim inconclusive: the data could not have shown the opposite."""
    judged = [p for p in parts if p.role == "judged"]
    if not judged:
        return "inconclusive"
    if any(p.verdict == "refuted" for p in judged):
        return "refuted"
    if all(p.verdict == "supported" for p in judged):
        if any(p.verdict != "supported" for p in parts if p.role == "power"):
            return "inconclusive"
        return "supported"
    return "inconclusive"
