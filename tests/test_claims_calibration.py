"""Error rates of the claims report's tests at every level it uses (analysis/claims/calibration.py),
the betting interval against a hand computation and a closed form, and n needed against a
simulation of the rule itself. The grid here is sized for CI; the full grid is
``python -m analysis.claims.calibration`` (its table in docs/claims_protocol.md)."""
import math

import numpy as np
import pytest
import scipy.stats

from analysis.claims import calibration as K
from analysis.claims.intervals import (
    TRUNCATION, _bets, _log_wealth, betting_interval, bounded_mean_estimate, n_needed, normal_estimate, rejects,
)
from analysis.claims.rules import Rule

LEVELS = K.protocol_levels()
HOLM = {k: LEVELS[k] for k in LEVELS if not k.startswith("look")}
EXTREMES = {k: v for k, v in HOLM.items() if k == "alpha" or v == min(HOLM.values())}


def _failing(rows):
    return [(r["data"], r["n"], r["case"], r["level"], r["side"], r["observed"], r["nominal"]) for r in rows
            if not r["ok"]]


def test_the_levels_are_the_reports_own():
    """Holm's levels run from alpha / m (m: every registered statistical claim) to alpha, and each
    registered design's first look sits far below both."""
    from analysis.claims import PROTOCOL, family
    m = len(family())
    assert min(HOLM.values()) == pytest.approx(PROTOCOL.alpha / m) and max(HOLM.values()) == PROTOCOL.alpha
    looks = [v for k, v in LEVELS.items() if k.startswith("look")]
    assert looks and all(v < PROTOCOL.alpha / m / 100 for v in looks)


def test_betting_capital_by_hand():
    """Three values 0.9, 1.0, 0.6 at alpha 0.1 (n = 3), worked by hand: the variances before each
    value are 1/4 (the prior), (1/4 + 0.2^2) / 2 = 0.145 and (0.29 + 0.2^2) / 3 = 0.11, so the
    untruncated bets sqrt(2 log 20 / (3 s^2)) are 2.83, 3.71, 4.26. Against m = 0.4 the truncation
    c / m = 1.25 binds: K+ = 1.625 * 1.75 * 1.25. Against m = 0.8 (c / m = 0.625) K+ peaks at the
    second value, 1.0625 * 1.125, and K- (c / (1 - m) = 2.5) at the first, 0.75."""
    z, alpha = np.array([0.9, 1.0, 0.6]), 0.1
    bets = _bets(z, alpha)
    assert bets == pytest.approx([math.sqrt(2 * math.log(20) / (3 * s)) for s in (0.25, 0.145, 0.11)])
    assert math.exp(_log_wealth(z, bets, 0.4, 1)) == pytest.approx(1.625 * 1.75 * 1.25)
    assert math.exp(_log_wealth(z, bets, 0.8, 1)) == pytest.approx(1.0625 * 1.125)
    assert math.exp(_log_wealth(z, bets, 0.8, -1)) == pytest.approx(0.75)
    # the hedged test rejects when K+ / 2 >= 1 / alpha: 3.5547 >= 2 / alpha from alpha = 0.5626 on (the
    # truncation binds at both levels below, so K+ is the same)
    assert rejects(z, 0.57, 0.4, 1) and not rejects(z, 0.55, 0.4, 1)


def test_ten_seeds_at_the_maximum_bound_the_mean_below_by_the_closed_form():
    """All n values at the top of the range: each factor is 1 + c (1 - m) / m once the truncation
    binds, so the lower end solves n log(1 + c (1 - m) / m) = log(2 / alpha); on CartPole's [0, 500]
    ten seeds at 500 show only mean > 152 at alpha / 51 (and the interval reaches 500)."""
    alpha, n = 0.05 / 51, 10
    f = math.exp(math.log(2 / alpha) / n)
    m = TRUNCATION / (f - 1 + TRUNCATION)
    lo, hi = bounded_mean_estimate(np.full(n, 500.0), 0.0, 500.0).interval_alpha(alpha)
    assert lo == pytest.approx(500 * m, rel=1e-9) and hi == 500.0 and 152 < lo < 153


def test_a_value_outside_the_registered_range_is_refused():
    with pytest.raises(ValueError, match="outside the registered range"):
        bounded_mean_estimate(np.array([0.2, 1.3]), 0.0, 1.0)


def test_exact_error_rates_at_ten_seeds_down_to_the_first_looks_boundary():
    """Every sequence of 10 values of a 0/1 and a fail / middle / ceiling distribution enumerated:
    each side's exact error rate within 1.5x nominal at Holm's levels from alpha / m to alpha and at
    the first look's boundary."""
    first = {k: v for k, v in LEVELS.items() if k.startswith("look")}
    lv = {**HOLM, next(iter(first)): next(iter(first.values()))}  # the looks' boundaries are one value
    rows = K.exact_rows(10, lv)
    assert len(rows) > 50 and not _failing(rows)


@pytest.mark.parametrize("shape", list(K.SHAPES))
def test_betting_error_rates_by_simulation(shape):
    rows = K.betting_rows((10, 20), 1000, EXTREMES, shapes=[shape], seed=1)
    assert rows and not _failing(rows)


def test_delta_method_error_rates_at_the_probes_batch_counts():
    rows = K.delta_rows((1000,), 1000, EXTREMES, seed=2)
    assert len(rows) > 40 and not _failing(rows)


def test_probe_bootstrap_se_error_rates():
    rows = K.probe_rows((1000,), 150, EXTREMES, seed=3)
    assert len(rows) > 20 and not _failing(rows)


def test_the_grid_catches_an_interval_that_misses():
    """Student's t interval (the report's seed-level method before the betting interval) on the
    grid's "20% of seeds fail" data at 10 seeds: its error at alpha / m is far above nominal, so
    the same cells fail."""
    sampler = K.SHAPES["bimodal: 20% of seeds fail"][0]
    rng = np.random.default_rng(0)
    case = K.cases()[0]  # > 0.4 by 0.1 with the truth on the boundary
    z = sampler(rng, (20000, 10), case.truth)
    alpha = min(HOLM.values())
    q = scipy.stats.t.isf(alpha / 2, 9)
    se = z.std(axis=1, ddof=1) / math.sqrt(10)
    lo, hi = z.mean(1) - q * se, z.mean(1) + q * se
    rows = [K._row(("t", "bimodal", 10), case, ("alpha/m", alpha), side, int(k), 20000)
            for side, k in K._read(case, lo, hi).items()]
    assert any(not r["ok"] for r in rows)
    lo, hi = betting_interval(z, alpha)
    assert all(r["ok"] for r in [K._row(("betting", "bimodal", 10), case, ("alpha/m", alpha), side, int(k), 20000)
                                 for side, k in K._read(case, lo, hi).items()])


# ----------------------------------------------------------------------------- n needed

def _normal_power(rule, truth, sd, n, alpha, sims, rng):
    """The rule applied to ``sims`` samples of n normal values: each one's mean with its own
    standard error (normal_estimate), interval at alpha, verdict."""
    x = rng.normal(truth, sd, (sims, n))
    hits = 0
    for row in x:
        est = normal_estimate(float(row.mean()), float(row.std(ddof=1) / math.sqrt(n)), n)
        hits += rule.judge(est.point, *est.interval_alpha(alpha)) == "supported"
    return hits / sims


@pytest.mark.parametrize("spec,effect,truth", [
    ({"greater": {"than": 0, "by": 0.1}}, 0.1, 0.2),  # the truth the effect past the boundary 0.1
    ({"equivalent": 0.1}, 0.1, 0.0),  # TOST: the truth at the centre, both ends to clear
])
def test_n_needed_for_a_normal_method_matches_a_simulation_of_the_rule(spec, effect, truth):
    rule, alpha, sd = Rule.parse(spec), 0.05 / 51, 0.5
    n = int(n_needed(normal_estimate(0.0, sd / math.sqrt(4000), 4000), rule, effect, alpha, 0.8))
    rng = np.random.default_rng(0)
    sims = 1500
    power = _normal_power(rule, truth, sd, n, alpha, sims, rng)
    mc = 3 * math.sqrt(0.8 * 0.2 / sims)
    assert 0.8 - mc <= power <= 0.8 + mc + 0.02, (n, power)
    assert _normal_power(rule, truth, sd, int(n * 0.75), alpha, sims, rng) < 0.8 - mc


def test_n_needed_for_the_betting_interval_matches_a_simulation_of_the_rule():
    """n needed for a bounded mean is found by simulating the betting rule on the observed values
    moved to the registered effect; an independent simulation through the report's own interval
    at that n reaches 80% power within Monte Carlo error, and at 3/4 of it falls short."""
    rng = np.random.default_rng(4)
    observed = rng.beta(2, 5, 12) * 500  # CartPole-like returns on [0, 500]
    rule, alpha, effect = Rule.parse({"greater": {"than": 100, "by": 25}}), 0.05 / 51, 25.0
    n = int(n_needed(bounded_mean_estimate(observed, 0, 500), rule, effect, alpha))
    shifted = np.clip(observed - observed.mean() + 150.0, 0, 500)
    shifted = np.clip(shifted - shifted.mean() + 150.0, 0, 500)

    def power(k, sims=300):
        hits = 0
        for _ in range(sims):
            est = bounded_mean_estimate(rng.choice(shifted, k), 0, 500)
            hits += rule.judge(est.point, *est.interval_alpha(alpha)) == "supported"
        return hits / sims
    mc = 3 * math.sqrt(0.8 * 0.2 / 300)
    assert power(n) >= 0.8 - mc - 0.01, n
    assert power(int(n * 0.75)) < 0.8 + mc, n
