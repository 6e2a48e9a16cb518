"""Verdict rules: a statistic's interval read against a threshold or a band.

Each rule is registered with its claim in ``harness/conf/claims.yaml`` (with its smallest effect or
margin, a rationale and a date, before the data it judges exist) and writes its own text for the
report, so the text cannot drift from what is applied. With the interval ``[lo, hi]`` of a
statistic ``s`` at the level the multiplicity control assigns (:mod:`.protocol`):

* ``greater: {than: t, by: d}`` (an effect of at least ``d``, the smallest effect that counts):
  supported if ``lo > t + d``, refuted if ``hi < t + d``, else undecided. A null effect is then
  refuted, not left to chance (the region of practical equivalence, Kruschke 2018).
  ``greater: t`` is ``by: 0``: the threshold ``t`` is itself the claim's number (C19's "under 5%
  of tokens", a non-inferiority margin); its registered ``effect`` then sizes the design.
* ``less: t`` and ``less: {than: t, by: d}``: the mirror image (supported if ``hi < t - d``).
* ``equivalent: {tol, to}`` (``s = to`` within ``+-tol``; ``to`` defaults to 0): the two
  one-sided tests read on the same interval (TOST, Schuirmann 1987): supported if the interval
  lies inside ``[to - tol, to + tol]``, refuted if wholly outside it, else undecided.
* ``between: [a, b]`` (an effect that is present but small): supported if the interval lies
  inside ``(a, b)``, refuted if wholly outside it.

:attr:`Rule.distance` is the registered effect the design is powered at: ``d`` for a threshold
rule with one, ``tol`` for an equivalence, half the band for ``between``; the n a claim needs is
computed at it (:func:`.intervals.n_needed`), never at the observed effect.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: A statistical claim's verdicts (exact claims are supported or refuted by their tests).
VERDICTS = ("supported", "refuted", "undecided", "untestable")
PILOT = "pilot"


def _finite(*xs) -> bool:
    return all(x is not None and np.isfinite(x) for x in xs)


@dataclass(frozen=True)
class Rule:
    """One of the rules above: ``kind`` in greater | less | equivalent | between."""

    kind: str
    a: float = 0.0  # threshold, centre (equivalent), lower end (between)
    b: float = 0.0  # tolerance (equivalent), upper end (between), smallest effect (greater, less)

    @classmethod
    def parse(cls, spec) -> "Rule":
        """From a claims.yaml entry: ``{greater: 1}``, ``{less: {than: 0, by: 0.1}}``,
        ``{equivalent: 0.1}``, ``{equivalent: {tol: 0.05, to: 1}}``, ``{between: [0, 0.1]}``."""
        if not isinstance(spec, dict) or len(spec) != 1:
            raise ValueError(f"rule must be one of greater|less|equivalent|between, got {spec!r}")
        (kind, v), = spec.items()
        if kind in ("greater", "less") and isinstance(v, dict):
            if set(v) - {"than", "by"} or "by" not in v:
                raise ValueError(f"rule {kind}: needs {{than: t, by: d}} (than defaults to 0), got {v!r}")
            by = float(v["by"])
            if not by >= 0:
                raise ValueError(f"rule {kind}: by (the smallest effect that counts) must be >= 0, got {v['by']!r}")
            return cls(kind, float(v.get("than", 0.0)), by)
        if kind in ("greater", "less"):
            return cls(kind, float(v))
        if kind == "equivalent":
            if isinstance(v, dict):
                if set(v) - {"to", "tol"} or "tol" not in v:
                    raise ValueError(f"rule equivalent: needs {{tol: m, to: c}} (to defaults to 0), got {v!r}")
                tol = float(v["tol"])
                to = float(v.get("to", 0.0))
            else:
                tol, to = float(v), 0.0
            if not tol > 0:
                raise ValueError(f"rule equivalent: the margin tol must be > 0, got {tol!r}")
            return cls(kind, to, tol)
        if kind == "between":
            lo, hi = (float(x) for x in v)
            if not lo < hi:
                raise ValueError(f"rule between: needs a < b, got {v!r}")
            return cls(kind, lo, hi)
        raise ValueError(f"unknown rule {kind!r}; allowed: greater, less, equivalent, between")

    @property
    def threshold(self) -> float:
        """Where a ``greater``/``less`` rule reads the interval: ``than`` moved by the smallest effect."""
        return self.a + self.b if self.kind == "greater" else self.a - self.b

    @property
    def distance(self) -> float:
        """The registered effect the rule carries (0: none, the claim's ``effect`` must give it)."""
        if self.kind in ("greater", "less"):
            return self.b
        if self.kind == "equivalent":
            return self.b
        return (self.b - self.a) / 2

    @property
    def boundaries(self) -> tuple[float, ...]:
        if self.kind in ("greater", "less"):
            return (self.threshold,)
        return self.band

    @property
    def text(self) -> str:
        if self.kind in ("greater", "less"):
            sign = ">" if self.kind == "greater" else "<"
            return f"{sign} {self.a:g}" + (f" by {self.b:g}" if self.b else "")
        if self.kind == "equivalent":
            return f"= {self.a:g} (+-{self.b:g})"
        return f"in ({self.a:g}, {self.b:g})"

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
        return f"supported if the interval lies inside ({self.a:g}, {self.b:g}), refuted if wholly outside"

    def decide(self, low, high) -> tuple[np.ndarray, np.ndarray]:
        """``(supported, refuted)`` for intervals ``[low, high]`` (arrays: one verdict per interval,
        as the calibration simulation reads them); a non-finite end decides nothing."""
        low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        ok = np.isfinite(low) & np.isfinite(high)
        if self.kind in ("greater", "less"):
            t = self.threshold
            above, below = low > t, high < t
            sup, ref = (above, below) if self.kind == "greater" else (below, above)
        else:
            lo_b, hi_b = self.band
            inside = (low >= lo_b) & (high <= hi_b) if self.kind == "equivalent" else (low > lo_b) & (high < hi_b)
            sup, ref = inside, (high < lo_b) | (low > hi_b)
        return sup & ok, ref & ok

    def judge(self, point: float, low: float, high: float) -> str:
        sup, ref = self.decide(low, high)
        return "supported" if sup else "refuted" if ref else "undecided"

    @property
    def band(self) -> tuple[float, float]:
        if self.kind == "equivalent":
            return self.a - self.b, self.a + self.b
        return self.a, self.b


@dataclass
class Part:
    """One statistic of a claim (its primary test, a premise or power check, or a reported
    quantity): the estimate, its interval at ``level``, the rule and the outcome."""

    name: str
    point: float
    low: float
    high: float
    rule: str
    verdict: str  # supported | refuted | undecided | reported | pilot
    n: str = ""
    n_units: float = float("nan")  # units per arm (seeds, batches)
    unit: str = ""
    role: str = "primary"  # primary | premise | power | reported
    spec: Rule | None = None
    experiment: str = ""
    level: float = 0.95  # the confidence level of [low, high]
    p: float = float("nan")  # the interval-inversion p-value at the rule's boundary (primary)
    method: str = ""
    n_needed: float | None = None  # units per arm for the registered power at the registered effect
    effect: float = float("nan")  # the registered smallest effect or margin (primary)
    look: int = 0  # 0-based look of the sequential plan it was judged at

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "spec"}


__all__ = ["PILOT", "Part", "Rule", "VERDICTS"]
