"""Error rates of the claims report's tests on RL-shaped data, at every level the report uses.

A verdict is wrong when the truth sits where the rule says it should not have been decided that
way: on a threshold rule's boundary (supported and refuted are both wrong there), at the null of
a smallest-effect rule (``greater: {than: t, by: d}`` with the truth at ``t``: supported is
wrong), on an edge of an equivalence or between band (both wrong), or at its centre (refuted is
wrong). Each side's nominal rate is ``alpha / 2`` (the report reads a two-sided ``1 - alpha``
interval). This module measures each side's rate for every method, on the shapes RL results
take, at the levels the report uses:

* **levels**: Holm's levels from ``alpha / m`` (m, the registered family's size) to ``alpha``
  (also the checks' level), and each registered look's O'Brien-Fleming boundary
  (:func:`levels`);
* **betting intervals of bounded means** (per-seed values and paired differences,
  :func:`.intervals.betting_interval`) at the seed counts of the registered looks, on skewed,
  bimodal (some seeds fail), ceiling (many seeds exactly at the task's maximum), zero-inflated,
  clipped heavy-tailed (t with 2 degrees of freedom), 0/1 and paired-with-failures data
  (:data:`SHAPES`), by simulation; and **exactly**, by enumerating every sequence of n = 10
  values of a 0/1 and a three-point (fail / middle / ceiling) distribution, down to the first
  look's boundary, where simulation cannot reach;
* **the delta method** for ratios of batch means and variances (the probes' ``batch_ratio``) at
  the probes' batch counts, on skewed, heavy-tailed and bimodal per-batch values;
* **the bootstrap standard error** of the probes' relative squared bias and weight
  (:func:`harness.probes.stats.gradient_summary`), on Gaussian, skewed and mixture gradient noise.

A cell passes when its observed count of wrong verdicts is at most the ``1 - 1e-6`` quantile of
Binomial(sims, 1.5 x nominal): an error rate within 1.5x nominal passes but for Monte Carlo noise
of probability 1e-6, and exact cells compare the rate itself. ``tests/test_claims_calibration.py``
runs a grid sized for CI; ``python -m analysis.claims.calibration --docs docs/claims_protocol.md``
runs the full grid and writes its table.
"""
from __future__ import annotations

import argparse
import itertools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.optimize
import scipy.stats

from .intervals import betting_interval, delta_point_se, normal_ends, normal_estimate
from .kinds import SQUARED_NORMS, ratio_terms
from .rules import Rule

#: Error rates are allowed up to this multiple of nominal.
TOLERANCE = 1.5
#: A cell fails only when its count of misses has probability below this at TOLERANCE x nominal.
MC_ALLOWANCE = 1e-6
#: Seeds per arm the registered designs judge at (every look of every learning experiment).
SEED_COUNTS = (10, 20, 40)
#: Batches per probe the probe claims use.
BATCH_COUNTS = (1000, 4000)

Sampler = Callable[[np.random.Generator, tuple[int, ...], float], np.ndarray]


def _beta(rng, shape, mean, conc=4.0):
    mean = float(np.clip(mean, 1e-9, 1 - 1e-9))
    return rng.beta(mean * conc, (1 - mean) * conc, shape)


def _t2_centre(mean: float, scale: float = 0.05) -> float:
    """The centre c with E[clip(c + scale T_2, 0, 1)] = mean (t with 2 degrees of freedom, whose
    clipped mean has a closed form: F(t) = 1/2 + t / (2 sqrt(2 + t^2)), int t f = -1/sqrt(2 + t^2))."""
    def clipped_mean(c):
        a, b = -c / scale, (1 - c) / scale
        F = lambda t: 0.5 + t / (2 * math.sqrt(2 + t * t))  # noqa: E731
        G = lambda t: -1 / math.sqrt(2 + t * t)  # noqa: E731
        return (1 - F(b)) + c * (F(b) - F(a)) + scale * (G(b) - G(a))
    return float(scipy.optimize.brentq(lambda c: clipped_mean(c) - mean, -5, 6))


def _fails(rng, shape, mean):
    """Bimodal: 20% of seeds fail (uniform on [0, 0.05]), the rest Beta with the mean that makes ``mean``."""
    high = (mean - 0.2 * 0.025) / 0.8
    return np.where(rng.random(shape) < 0.2, rng.uniform(0, 0.05, shape), _beta(rng, shape, high, 20.0))


def _ceiling(rng, shape, mean):
    """Ties at the task's maximum: a share 0.8 mean of seeds exactly at 1, the rest Beta."""
    q = 0.8 * mean
    return np.where(rng.random(shape) < q, 1.0, _beta(rng, shape, (mean - q) / (1 - q)))


def _zeros(rng, shape, mean):
    """Zero-inflated: a share 0.8 (1 - mean) exactly at 0, the rest Beta."""
    q = 0.8 * (1 - mean)
    return np.where(rng.random(shape) < q, 0.0, _beta(rng, shape, mean / (1 - q)))


def _t2(rng, shape, mean):
    return np.clip(_t2_centre(mean) + 0.05 * rng.standard_t(2, shape), 0.0, 1.0)


def _paired_failures(rng, shape, mean):
    """Per-seed differences a - b on [-1, 1] mapped to [0, 1]: arm a fails (0) on 10% of seeds, else
    Beta; arm b steady Beta(mean 0.5); the difference's mean is ``2 mean - 1`` on [-1, 1]."""
    d = 2 * mean - 1
    b = _beta(rng, shape, 0.5, 20.0)
    r = (d + 0.5) / 0.9
    a = np.where(rng.random(shape) < 0.1, 0.0, _beta(rng, shape, r, 20.0))
    return (a - b + 1) / 2


#: name -> (sampler on [0, 1] with the given mean, lowest and highest mean it can take)
SHAPES: dict[str, tuple[Sampler, float, float]] = {
    "skewed: Beta(4)": (_beta, 0.0, 1.0),
    "bimodal: 20% of seeds fail": (_fails, 0.01, 0.8),
    "ceiling: many seeds at the maximum": (_ceiling, 0.0, 1.0),
    "zero-inflated": (_zeros, 0.0, 1.0),
    "heavy-tailed: t(2), clipped": (_t2, 0.0, 1.0),
    "0/1 outcomes": (lambda rng, shape, m: (rng.random(shape) < m).astype(float), 0.0, 1.0),
    "paired differences, 10% of seeds fail": (_paired_failures, 0.3, 0.92),
}


@dataclass(frozen=True)
class Case:
    """A rule (on the unit scale) with the truth placed at ``truth``, and which verdicts are wrong there."""

    rule: Rule
    truth: float
    where: str  # "boundary" | "null" | "centre"
    wrong: tuple[str, ...]  # of "supported", "refuted"

    @property
    def name(self) -> str:
        return f"{self.rule.text} at {self.where} {self.truth:g}"


def cases(centre: float = 0.5, width: float = 0.1) -> list[Case]:
    """One case per rule kind and truth position, on a unit scale around ``centre``."""
    c, w = centre, width
    g = Rule.parse({"greater": {"than": c - w, "by": w}})
    le = Rule.parse({"less": {"than": c + w, "by": w}})
    eq = Rule.parse({"equivalent": {"to": c, "tol": w}})
    bt = Rule.parse({"between": [c - w, c + w]})
    both = ("supported", "refuted")
    return [Case(g, c, "boundary", both), Case(g, c - w, "null", ("supported",)),
            Case(le, c, "boundary", both), Case(le, c + w, "null", ("supported",)),
            Case(eq, c + w, "boundary", both), Case(eq, c, "centre", ("refuted",)),
            Case(bt, c - w, "boundary", both), Case(bt, c, "centre", ("refuted",))]


def levels(alpha: float, m: int, looks: list[tuple[int, ...]] | None = None) -> dict[str, float]:
    """The two-sided levels (alphas) the report uses: Holm's from ``alpha / m`` to ``alpha``
    (a few between), and each registered design's first-look O'Brien-Fleming boundary."""
    from .protocol import nominal_level, spending_boundaries
    out = {f"alpha/{m}": alpha / m, f"alpha/{max(m // 4, 1)}": alpha / max(m // 4, 1), "alpha/4": alpha / 4,
           "alpha": alpha}
    for lk in looks or []:
        out[f"look 1 of {lk}"] = nominal_level(spending_boundaries(lk, alpha / m)[0])
    return out


def allowed(sims: int, nominal: float) -> int:
    """The most misses a cell of ``sims`` may show at an error rate of TOLERANCE x nominal."""
    return int(scipy.stats.binom.ppf(1 - MC_ALLOWANCE, sims, min(1.0, TOLERANCE * nominal)))


def _row(cell: tuple[str, str, int], case: Case, level: tuple[str, float], side: str, misses: float,
         sims: int | None) -> dict:
    """One cell's result: ``cell`` (method, data, n), the level (name, alpha), the wrong verdict
    ``side`` and its count of ``misses`` out of ``sims`` (None: ``misses`` is an exact probability)."""
    (method, data, n), (level_name, alpha) = cell, level
    nominal = alpha / 2
    exact = sims is None
    rate = misses if exact else misses / sims
    ok = rate <= TOLERANCE * nominal if exact else misses <= allowed(sims, nominal)
    return {"method": method, "data": data, "n": n, "case": case.name, "level": level_name, "side": side,
            "observed": rate, "nominal": nominal, "sims": "exact" if exact else sims, "ok": bool(ok)}


def _read(case: Case, lo, hi, weights=None) -> dict[str, float]:
    sup, ref = case.rule.decide(lo, hi)
    w = np.ones_like(lo) if weights is None else weights
    return {side: float((w * x).sum()) for side, x in (("supported", sup), ("refuted", ref)) if side in case.wrong}


# ============================================================================ betting, simulated

def betting_rows(ns=SEED_COUNTS, sims: int = 2000, level_map: dict[str, float] | None = None,
                 shapes: list[str] | None = None, seed: int = 0) -> list[dict]:
    """Each shape x case x n x level: the betting interval's wrong verdicts out of ``sims``."""
    rows = []
    rng = np.random.default_rng(seed)
    for shape in shapes or SHAPES:
        sampler, lo_m, hi_m = SHAPES[shape]
        for case in cases():
            if not lo_m <= case.truth <= hi_m:
                continue
            for n in ns:
                z = sampler(rng, (sims, n), case.truth)
                for name, alpha in (level_map or {}).items():
                    lo, hi = betting_interval(z, alpha)
                    for side, k in _read(case, lo, hi).items():
                        rows.append(_row(("betting, bounded mean", shape, n), case, (name, alpha), side, int(k), sims))
    return rows


# ============================================================================ betting, exact

def _support_pmf(shape: str, mean: float) -> tuple[np.ndarray, np.ndarray] | None:
    """A discrete distribution on [0, 1] with the given mean: 0/1, or fail (0) / middle (0.5) /
    ceiling (1) with 15% failures; None where the mean is out of its reach."""
    if shape == "0/1 outcomes":
        return np.array([0.0, 1.0]), np.array([1 - mean, mean])
    p1 = 2 * (mean - 0.425)  # 0.5 (0.85 - p1) + p1 = mean
    if not 0 <= p1 <= 0.85:
        return None
    return np.array([0.0, 0.5, 1.0]), np.array([0.15, 0.85 - p1, p1])


EXACT_SHAPES = ("0/1 outcomes", "fail / middle / ceiling (15% fail)")


def exact_rows(n: int = 10, level_map: dict[str, float] | None = None) -> list[dict]:
    """Every sequence of ``n`` values of each discrete shape enumerated: the exact probability of
    each wrong verdict (the bets depend on the order, so sequences, not counts)."""
    rows = []
    for shape in EXACT_SHAPES:
        support = np.array([0.0, 1.0]) if shape == "0/1 outcomes" else np.array([0.0, 0.5, 1.0])
        idx = np.array(list(itertools.product(range(support.size), repeat=n)))
        z = support[idx]
        intervals = {name: betting_interval(z, alpha) for name, alpha in (level_map or {}).items()}
        for case in cases():
            pmf = _support_pmf(shape, case.truth)
            if pmf is None:
                continue
            w = np.prod(pmf[1][idx], axis=1)
            for name, alpha in (level_map or {}).items():
                for side, p in _read(case, *intervals[name], weights=w).items():
                    rows.append(_row(("betting, bounded mean", shape, n), case, (name, alpha), side, p, None))
    return rows


# ============================================================================ delta method

def _batch_values(rng, shape, size):
    """Per-batch values of one of :data:`BATCH_SHAPES` (the truth is set by scaling them)."""
    if shape == "chi-square(3)":
        return rng.chisquare(3, size)
    if shape == "lognormal(0, 1)":
        return rng.lognormal(0, 1, size)
    big = rng.random(size) < 0.05  # bimodal: 5% of batches 20 times larger (rare large gradients)
    return rng.exponential(1.0, size) * np.where(big, 20.0, 1.0)


BATCH_SHAPES = ("chi-square(3)", "lognormal(0, 1)", "bimodal: 5% of batches 20x")


def delta_rows(ns=BATCH_COUNTS, sims: int = 2000, level_map: dict[str, float] | None = None, seed: int = 0,
               chunk: int = 250) -> list[dict]:
    """Ratios of batch means (``of: mean``) and variances (``of: var``), paired through a shared
    component, with the truth on each ratio rule's boundary or centre (on the ratio scale)."""
    rows = []
    rng = np.random.default_rng(seed)
    rules = [Case(Rule.parse({"less": {"than": 1, "by": 0.1}}), 0.9, "boundary", ("supported", "refuted")),
             Case(Rule.parse({"less": {"than": 1, "by": 0.1}}), 1.0, "null", ("supported",)),
             Case(Rule.parse({"greater": {"than": 1, "by": 0.1}}), 1.1, "boundary", ("supported", "refuted")),
             Case(Rule.parse({"equivalent": {"to": 1, "tol": 0.1}}), 1.1, "boundary", ("supported", "refuted"))]
    for shape, of, case, n in itertools.product(BATCH_SHAPES, ("mean", "var"), rules, ns):
        counts: dict[tuple[str, str], int] = {}
        for start in range(0, sims, chunk):
            k = min(chunk, sims - start)
            x1, x2, s = (_batch_values(rng, shape, (k, n)) for _ in range(3))
            # a = c (x1 + s), b = x2 + s: mean ratio c, variance ratio c^2
            c = case.truth if of == "mean" else math.sqrt(case.truth)
            point, se, _ = delta_point_se(*ratio_terms(c * (x1 + s), x2 + s, of), paired=True, log=True)
            for name, alpha in (level_map or {}).items():
                for side, cnt in _read(case, *normal_ends(point, se, alpha, log=True)).items():
                    counts[(name, side)] = counts.get((name, side), 0) + int(cnt)
        for (name, side), cnt in counts.items():
            rows.append(_row((f"delta method, ratio of batch {of}s", shape, n), case, (name, level_map[name]), side,
                             cnt, sims))
    return rows


# ============================================================================ probe bootstrap se

def _noise(rng, shape, size):
    if shape == "Gaussian":
        return rng.normal(0, 1, size)
    if shape == "skewed: centred exponential":
        return rng.exponential(1.0, size) - 1.0
    big = rng.random(size) < 0.05  # mixture: 5% of batches with 10 times the noise
    return rng.normal(0, 1, size) * np.where(big, 10.0, 1.0) / math.sqrt(0.95 + 0.05 * 100)


NOISE_SHAPES = ("Gaussian", "skewed: centred exponential", "mixture: 5% of batches 10x")


def probe_rows(ns=(1000,), sims: int = 400, level_map: dict[str, float] | None = None, seed: int = 0,
               dim: int = 8, reps: int | None = None) -> list[dict]:
    """The probes' relative squared bias (rules ``equivalent 0.01`` and ``greater 0.01``) and
    weight (``equivalent 1 +- 0.05``) with their bootstrap standard errors (as many replicates as
    the probes draw), by
    :func:`harness.probes.stats.gradient_summary` on simulated batches of gradient estimates
    (truth of unit length; the noise's scale sets a per-batch signal to noise of about 1/dim)."""
    from harness.config import ProbeSettings
    from harness.probes.stats import gradient_summary, resample_weights

    reps = reps or ProbeSettings.reps  # the probes' own bootstrap replicates
    rng = np.random.default_rng(seed)
    truth = np.ones(dim) / math.sqrt(dim)
    bias_dir = np.r_[1.0, -1.0, np.zeros(dim - 2)] / math.sqrt(2)
    plans = [("rel_bias_sq", Case(Rule.parse({"equivalent": 0.01}), 0.01, "boundary", ("supported", "refuted"))),
             ("rel_bias_sq", Case(Rule.parse({"equivalent": 0.01}), 0.0, "centre", ("refuted",))),
             ("rel_bias_sq", Case(Rule.parse({"greater": 0.01}), 0.01, "boundary", ("supported", "refuted"))),
             ("weight", Case(Rule.parse({"equivalent": {"to": 1, "tol": 0.05}}), 1.05, "boundary",
                             ("supported", "refuted")))]
    rows = []
    for shape, (col, case), n in itertools.product(NOISE_SHAPES, plans, ns):
        W = resample_weights(n, reps, seed=1)
        mean = truth * case.truth if col == "weight" else truth + math.sqrt(case.truth) * bias_dir
        counts: dict[tuple[str, str], int] = {}
        for _ in range(sims):
            G = mean + _noise(rng, shape, (n, dim))
            out = gradient_summary(G, truth, W)
            est = normal_estimate(out[col], out[f"{col}_se"], n, squared=col in SQUARED_NORMS)
            for name, alpha in (level_map or {}).items():
                for side, cnt in _read(case, *(np.array(v) for v in est.interval_alpha(alpha))).items():
                    counts[(name, side)] = counts.get((name, side), 0) + int(cnt)
        for (name, side), cnt in counts.items():
            rows.append(_row((f"{est.method}, probe {col}", shape, n), case, (name, level_map[name]), side, cnt, sims))
    return rows


# ============================================================================ the grid and its table

def protocol_levels() -> dict[str, float]:
    """:func:`levels` at the registered protocol: alpha, the family's size, the registered looks."""
    from harness.experiments import EXPERIMENTS

    from . import PROTOCOL, family
    looks = sorted({tuple(e.looks) for e in EXPERIMENTS.values() if len(e.looks) > 1})
    return levels(PROTOCOL.alpha, len(family()), looks)


def grid(sims: int = 20000, batch_sims: int = 4000, probe_sims: int = 2000) -> list[dict]:
    """The full grid: every method, shape, case, n and level (first looks: exact cells only)."""
    lv = protocol_levels()
    holm = {k: v for k, v in lv.items() if not k.startswith("look")}
    return (exact_rows(10, lv) + betting_rows(SEED_COUNTS, sims, holm)
            + delta_rows(BATCH_COUNTS, batch_sims, holm) + probe_rows((1000, 4000), probe_sims, holm))


def worst(rows: list[dict], k: int = 10) -> list[dict]:
    """The ``k`` cells with the largest observed / nominal."""
    return sorted(rows, key=lambda r: -r["observed"] / r["nominal"])[:k]


START, END = "<!-- claims-calibration:start -->", "<!-- claims-calibration:end -->"


def markdown(rows: list[dict], command: str, seconds: float) -> str:
    """A summary per method and level (cells, worst observed / nominal, failures), then the worst cells."""
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')} ({seconds:.0f} s): {len(rows)} cells, "
             f"{sum(not r['ok'] for r in rows)} outside {TOLERANCE}x nominal (with the Monte Carlo allowance).", "",
             "| method | level | cells | worst observed / nominal | failing |", "| --- | --- | --- | --- | --- |"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["level"]), []).append(r)
    for (method, level), rs in groups.items():
        w = max(r["observed"] / r["nominal"] for r in rs)
        lines.append(f"| {method} | {level} | {len(rs)} | {w:.2f} | {sum(not r['ok'] for r in rs)} |")
    lines += ["", "Worst cells:", "", "| method | data | n | case | level | side | observed | nominal | sims |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in worst(rows):
        lines.append(f"| {r['method']} | {r['data']} | {r['n']} | {r['case']} | {r['level']} | {r['side']} | "
                     f"{r['observed']:.3g} | {r['nominal']:.3g} | {r['sims']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims.calibration",
                                     description="Error rates of the claims report's tests at the levels it uses.")
    parser.add_argument("--sims", type=int, default=20000, help="simulated samples per seed-level cell (default 20000)")
    parser.add_argument("--docs", type=Path, default=None, metavar="FILE",
                        help="write the table between FILE's claims-calibration markers")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = grid(args.sims, args.sims, max(args.sims // 10, 200))  # a probe cell costs a bootstrap a sample
    command = "python -m analysis.claims.calibration" + (f" --sims {args.sims}" if args.sims != 20000 else "") \
        + (f" --docs {args.docs}" if args.docs else "")
    text = markdown(rows, command, time.perf_counter() - t0)
    print(text)
    if args.docs:
        page = args.docs.read_text()
        if START not in page or END not in page:
            print(f"error: {args.docs} has no {START} ... {END} markers")
            return 2
        args.docs.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{text}\n{END}",
                                    page, flags=re.S))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
