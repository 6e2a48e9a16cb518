"""Coverage of the claims report's interval methods, by simulation and by exact enumeration.

The report's intervals (:mod:`.intervals`) must cover their nominal level at the n it uses. This
module measures it: the share of simulated intervals that contain the true value, for

* per-unit means (one arm's per-seed values, per-seed paired differences of correlated or
  independent arms, per-seed log ratios) on normal, skewed and heavy-tailed data, at every
  number of seeds per arm the registered designs use (:data:`SEED_COUNTS`);
* ratios of batch means by the delta method (the probes' variance ratios), at the probes'
  batch counts (:data:`BATCH_COUNTS`), with skewed per-batch values;
* the difference of two proportions (Agresti-Caffo), computed exactly by enumerating every pair
  of binomial outcomes, over a grid of true proportions;

and, for comparison, the percentile bootstrap of a mean, which the report used before and which
undercovers at small n. ``tests/test_claims_coverage.py`` asserts the report's methods cover at
least :data:`FLOOR` of the time at 95% nominal; ``python -m analysis.claims.coverage --docs
docs/toy.md`` writes the table between its ``claims-coverage`` markers.
"""
from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.stats

from .intervals import delta_estimate, mean_interval

FLOOR = 0.93
LEVEL = 0.95
#: Seeds per arm the registered designs judge at (stage one and every look).
SEED_COUNTS = (10, 20, 40, 80, 120, 240)
#: Batches per probe the report's probe claims use.
BATCH_COUNTS = (1000, 4000)
#: Runs per arm of the proportion claim (C8's looks).
PROPORTION_COUNTS = (40, 80)

Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]

#: name -> (sampler, true mean). Skewed: lognormal(0, 0.5) (skewness 1.75) and exponential
#: (skewness 2); heavy-tailed: Student t with 3 degrees of freedom (infinite kurtosis).
DISTRIBUTIONS: dict[str, tuple[Sampler, float]] = {
    "normal": (lambda r, s: r.normal(0.0, 1.0, s), 0.0),
    "skewed: lognormal(0, 0.5)": (lambda r, s: r.lognormal(0.0, 0.5, s), math.exp(0.125)),
    "skewed: exponential": (lambda r, s: r.exponential(1.0, s), 1.0),
    "heavy-tailed: t(3)": (lambda r, s: r.standard_t(3, s), 0.0),
}


def _covered(lo, hi, truth) -> float:
    return float(np.mean((lo <= truth) & (truth <= hi)))


def mean_coverage(dist: str, n: int, design: str = "one arm", sims: int = 4000, seed: int = 0,
                  level: float = LEVEL) -> float:
    """Coverage of the t-and-Hall interval (:func:`.intervals.mean_interval`) for the mean of
    per-seed values: ``design`` ``one arm`` (the values themselves), ``paired`` (differences
    ``a - b`` of two arms sharing a seed effect: ``a = u + e1 + 1``, ``b = u + e2``, u, e1, e2
    from ``dist``), ``independent arms`` (differences of two independent draws of ``dist``)."""
    sampler, mu = DISTRIBUTIONS[dist]
    rng = np.random.default_rng(seed)
    if design == "one arm":
        x, truth = sampler(rng, (sims, n)), mu
    elif design == "paired":
        u, e1, e2 = (sampler(rng, (sims, n)) for _ in range(3))
        x, truth = (u + e1 + 1.0) - (u + e2), 1.0
    elif design == "independent arms":
        x, truth = sampler(rng, (sims, n)) + 0.5 - sampler(rng, (sims, n)), 0.5
    else:
        raise ValueError(f"design must be one arm, paired or independent arms, got {design!r}")
    lo, hi = mean_interval(x, 1 - level)
    return _covered(lo, hi, truth)


def log_ratio_coverage(n: int, sims: int = 4000, seed: int = 0, level: float = LEVEL) -> float:
    """Coverage of a ratio claim's interval (per-seed log ratios, the geometric mean ratio) for
    positive, skewed per-seed values: ``a = 1.5 g1 w``, ``b = g2 w`` with lognormal(0, 0.5) noise
    g and a shared seed effect w; the true geometric mean ratio is 1.5."""
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 0.3, (sims, n))
    a = 1.5 * rng.lognormal(0.0, 0.5, (sims, n)) * w
    b = rng.lognormal(0.0, 0.5, (sims, n)) * w
    lo, hi = mean_interval(np.log(a / b), 1 - level)
    return _covered(np.exp(lo), np.exp(hi), 1.5)


def batch_ratio_coverage(n: int, paired: bool = True, sims: int = 2000, seed: int = 0,
                         level: float = LEVEL) -> float:
    """Coverage of the delta-method ratio of batch means (:func:`.intervals.delta_estimate`) with
    skewed per-batch values (squared norms: chi-square with 3 degrees of freedom, scaled), paired
    through a shared component or independent; the true ratio of means is 2/3."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        shared = rng.chisquare(3, n) if paired else 0.0
        a = 2.0 * (rng.chisquare(3, n) + shared)
        b = 3.0 * (rng.chisquare(3, n) + shared)
        est = delta_estimate({"a": a, "b": b}, lambda m: m["a"] / m["b"], paired=paired)
        lo, hi = est.interval(level)
        hits += lo <= 2 / 3 <= hi
    return hits / sims


def percentile_bootstrap_coverage(dist: str, n: int, sims: int = 2000, reps: int = 1000, seed: int = 0,
                                  level: float = LEVEL) -> float:
    """Coverage of the percentile bootstrap of a mean (what the report used before): for
    comparison; it undercovers at small n (about 0.80 at n = 4 on normal data)."""
    sampler, mu = DISTRIBUTIONS[dist]
    rng = np.random.default_rng(seed)
    x = sampler(rng, (sims, n))
    idx = rng.integers(0, n, (sims, reps, n))
    means = np.take_along_axis(np.broadcast_to(x[:, None, :], (sims, reps, n)), idx, axis=2).mean(axis=2)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail], axis=1)
    return _covered(lo, hi, mu)


def proportion_coverage(n: int, grid: np.ndarray | None = None, level: float = LEVEL) -> tuple[float, float]:
    """Exact (minimum, mean) coverage of the Agresti-Caffo interval for the difference of two
    proportions with ``n`` runs per arm, over a grid of true proportions (both arms 0.02..0.98):
    every pair of binomial outcomes is enumerated and weighted by its probability."""
    grid = np.linspace(0.02, 0.98, 25) if grid is None else np.asarray(grid, float)
    z = float(scipy.stats.norm.isf((1 - level) / 2))
    xa = np.arange(n + 1)[:, None]
    xb = np.arange(n + 1)[None, :]
    qa, qb = (xa + 1) / (n + 2), (xb + 1) / (n + 2)
    d = qa - qb
    se = np.sqrt(qa * (1 - qa) / (n + 2) + qb * (1 - qb) / (n + 2))
    covs = []
    for pa in grid:
        for pb in grid:
            inside = (d - z * se <= pa - pb) & (pa - pb <= d + z * se)
            w = scipy.stats.binom.pmf(xa, n, pa) * scipy.stats.binom.pmf(xb, n, pb)
            covs.append(float((w * inside).sum()))
    return min(covs), float(np.mean(covs))


def table(sims: int = 4000) -> list[dict]:
    """Every method at every n the report uses: rows of method, data, n, coverage."""
    rows = []
    for design in ("one arm", "paired", "independent arms"):
        for dist in DISTRIBUTIONS:
            for n in SEED_COUNTS:
                rows.append({"method": f"mean, t and Hall ({design})", "data": dist, "n": n,
                             "coverage": mean_coverage(dist, n, design, sims)})
    for n in SEED_COUNTS:
        rows.append({"method": "geometric mean ratio, t and Hall on log ratios", "data": "lognormal, paired",
                     "n": n, "coverage": log_ratio_coverage(n, sims)})
    for n in BATCH_COUNTS:
        for paired in (True, False):
            rows.append({"method": f"ratio of batch means, delta method ({'paired' if paired else 'unpaired'})",
                         "data": "chi-square(3)", "n": n, "coverage": batch_ratio_coverage(n, paired, sims // 4)})
    for n in PROPORTION_COUNTS:
        lo, mean = proportion_coverage(n)
        rows.append({"method": "difference of proportions, Agresti-Caffo (exact; minimum over the grid)",
                     "data": "p in 0.02..0.98 each arm", "n": n, "coverage": lo, "mean": mean})
    for n in (4, 10):
        rows.append({"method": "percentile bootstrap of a mean (not used; shown for comparison)", "data": "normal",
                     "n": n, "coverage": percentile_bootstrap_coverage("normal", n, sims // 2)})
    return rows


START, END = "<!-- claims-coverage:start -->", "<!-- claims-coverage:end -->"


def markdown(rows: list[dict], command: str) -> str:
    """The coverage table: one row per method and data, one column per n."""
    lines = [f"Written by `{command}` on {time.strftime('%Y-%m-%d')}: the share of nominal-95% intervals that "
             f"contain the true value (the test asserts >= {FLOOR:.0%} for every method the report uses).", ""]
    groups: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["data"]), {})[r["n"]] = r["coverage"]
    ns = sorted({r["n"] for r in rows})
    lines += ["| method | data | " + " | ".join(f"n = {n}" for n in ns) + " |",
              "| --- | --- | " + " | ".join("---" for _ in ns) + " |"]
    for (method, data), cov in groups.items():
        lines.append(f"| {method} | {data} | " + " | ".join(f"{cov[n]:.3f}" if n in cov else "" for n in ns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims.coverage",
                                     description="Coverage of the claims report's interval methods.")
    parser.add_argument("--sims", type=int, default=4000, help="simulated samples per cell (default 4000)")
    parser.add_argument("--docs", type=Path, default=None, metavar="FILE",
                        help="write the table between the claims-coverage markers of FILE (docs/toy.md)")
    args = parser.parse_args(argv)
    rows = table(args.sims)
    command = "python -m analysis.claims.coverage" + (f" --sims {args.sims}" if args.sims != 4000 else "") \
        + (f" --docs {args.docs}" if args.docs else "")
    text = markdown(rows, command)
    print(text)
    if args.docs:
        page = args.docs.read_text()
        if START not in page or END not in page:
            print(f"error: {args.docs} has no {START} ... {END} markers")
            return 2
        args.docs.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{text}\n{END}",
                                    page, flags=re.S))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
