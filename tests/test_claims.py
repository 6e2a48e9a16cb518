"""Claims report: rules and interval methods with hand-worked answers, Holm and the sequential plan,
every registered rule on synthetic data built to come out supported, refuted, undecided and
untestable, the claims-as-data table (its registry: tests/test_claims_registry.py), seed offsets and
stability, the exact claims' pytest marker, the pilot mode, and one claim end to end on the toy
task. No test asserts what an experiment concludes: verdicts are outputs."""
import json
import math
import os
import sys

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from analysis import claims as C
from analysis.claims import kinds as K
from analysis.claims.evidence import NotRun
from analysis.claims.intervals import (
    BETTING, bounded_mean_estimate, decision_p, delta_estimate, n_needed, normal_estimate,
)
from analysis.claims.plan import looks_of, next_looks
from analysis.claims.protocol import holm, nominal_level, sequential_p, spending_boundaries
from analysis.claims.report import (README_END, README_START, SUMMARY_END, SUMMARY_START, readme_table, update_pages,
                                    update_readme)
from analysis.claims.rules import Rule
from analysis.claims.spec import load_claims
from analysis.stats import HYPERPARAMETERS
from harness import experiments as X
from harness.experiments import run as XR

STATISTICAL = [c for c in C.CLAIMS if not c.exact]
M = len(STATISTICAL)


# ----------------------------------------------------------------------------- rules

@pytest.mark.parametrize("rule,interval,verdict", [
    ({"greater": 1}, (1.5, 2.5), "supported"), ({"greater": 1}, (0.2, 0.8), "refuted"),
    ({"greater": 1}, (0.8, 1.4), "undecided"), ({"less": 1}, (0.2, 0.8), "supported"),
    ({"less": 1}, (1.5, 2.5), "refuted"), ({"less": 1}, (0.9, 1.1), "undecided"),
    ({"equivalent": 0.1}, (-0.05, 0.08), "supported"), ({"equivalent": 0.1}, (0.12, 0.3), "refuted"),
    ({"equivalent": 0.1}, (-0.3, -0.11), "refuted"), ({"equivalent": 0.1}, (0.05, 0.2), "undecided"),
    ({"equivalent": {"to": 1.0, "tol": 0.05}}, (0.97, 1.04), "supported"),
    ({"equivalent": {"to": 1.0, "tol": 0.05}}, (0.5, 0.9), "refuted"),
    ({"between": [0, 0.1]}, (0.02, 0.03), "supported"), ({"between": [0, 0.1]}, (-0.01, 0.03), "undecided"),
    ({"between": [0, 0.1]}, (0.2, 0.5), "refuted"), ({"greater": 0}, (np.nan, np.nan), "undecided"),
])
def test_rules_read_the_interval(rule, interval, verdict):
    lo, hi = interval
    assert Rule.parse(rule).judge((lo + hi) / 2, lo, hi) == verdict


def test_bad_rules_are_refused():
    for bad in ({"bigger": 1}, {"between": [1, 0]}, {"greater": 1, "less": 2}, "greater", {"exact": 1e-9},
                {"greater": {"than": 0}}, {"greater": {"by": -1}}, {"less": {"by": 0.1, "to": 1}},
                {"equivalent": 0}, {"equivalent": {"to": 1}}):
        with pytest.raises(ValueError):
            Rule.parse(bad)


def test_the_smallest_effect_decides_a_null_effect_either_way():
    """Read at the smallest effect that counts, a null effect is refuted once the interval is
    narrow enough, where the zero threshold leaves it to chance; the mirror image for less."""
    zero, by = Rule.parse({"greater": 0}), Rule.parse({"greater": {"than": 0, "by": 0.01}})
    assert by.threshold == 0.01 and by.distance == 0.01 and by.text == "> 0 by 0.01"
    assert (zero.judge(-0.001, -0.002, 0.0005), by.judge(-0.001, -0.002, 0.0005)) == ("undecided", "refuted")
    assert (zero.judge(0.002, 0.001, 0.003), by.judge(0.002, 0.001, 0.003)) == ("supported", "refuted")
    assert by.judge(0.05, 0.02, 0.08) == "supported" and by.judge(0.02, 0.005, 0.035) == "undecided"
    less = Rule.parse({"less": {"than": 0, "by": 0.1}})
    assert less.threshold == -0.1 and less.judge(0.0, -0.05, 0.05) == "refuted"
    assert less.judge(-0.3, -0.4, -0.15) == "supported" and less.judge(-0.2, -0.3, -0.05) == "undecided"
    assert Rule.parse({"equivalent": {"to": 1, "tol": 0.2}}).distance == 0.2
    assert Rule.parse({"between": [0.001, 0.1]}).distance == pytest.approx(0.0495)


# ----------------------------------------------------------------------------- interval methods

def test_equal_values_never_decide_under_a_method_whose_interval_collapses(monkeypatch):
    """A probe statistic with standard error 0 (or ten seeds all equal under a normal method) has a
    zero-width interval at every level: no verdict and no p-value come from it; the claim reads
    undecided with the reason. A betting interval on a registered range stays valid on equal
    values: ten CartPole seeds at 500 bound the mean only above 152 at alpha / 51."""
    flat = normal_estimate(0.5, 0.0, 4000)
    assert C.zero_information(flat) == "no spread information (standard error 0 at value 0.5)"
    c = C.CLAIMS_BY_ID["C27"]  # greater 0.01: a point of 0.5 would be "supported" with p = 1e-300
    v = _judge_synthetic(monkeypatch, c, flat)
    assert v.verdict == "undecided" and not v.tested and "no spread information" in v.deciding
    seeds = bounded_mean_estimate(np.full(10, 500.0), 0.0, 500.0)
    assert C.zero_information(seeds) == "" and 152 < seeds.interval_alpha(0.05 / 51)[0] < 153


def test_a_ratio_of_per_seed_values_is_undecidable_with_the_reason():
    e = _train_data("x", [({"arm": "a"}, {"v": lambda s, it: 2.0 * (s + 1)}), ({"arm": "b"}, {"v": lambda s, it: s + 1.0})])
    with pytest.raises(K.Undecidable, match="ratio"):
        K.run_metric(e, {"metric": {"column": "v", "reduce": "mean"}, "a": {"arm": "a"}, "b": {"arm": "b"},
                         "op": "ratio"})
    with pytest.raises(K.Undecidable, match="no registered range"):
        K.run_metric(e, {"metric": {"column": "v", "reduce": "mean"}, "a": {"arm": "a"}, "b": {"arm": "b"}})


def test_delta_method_ratio_of_means_by_hand():
    rng = np.random.default_rng(0)
    a, b = rng.gamma(2.0, 1.0, 500), rng.gamma(3.0, 1.0, 400)
    est = delta_estimate({"a": a, "b": b}, lambda m: m["a"] / m["b"], paired=False)
    se_log = math.sqrt(a.var(ddof=1) / (a.size * a.mean() ** 2) + b.var(ddof=1) / (b.size * b.mean() ** 2))
    z = scipy.stats.norm.ppf(0.975)
    r = a.mean() / b.mean()
    assert est.point == pytest.approx(r)
    assert est.interval(0.95) == pytest.approx((r * math.exp(-z * se_log), r * math.exp(z * se_log)), rel=1e-5)
    # paired: the influence of each batch is a_i / mean a - b_i / mean b
    b2 = a * 0.5 + rng.gamma(1.0, 1.0, 500)
    paired = delta_estimate({"a": a, "b": b2}, lambda m: m["a"] / m["b"], paired=True)
    infl = a / a.mean() - b2 / b2.mean()
    se_p = infl.std(ddof=1) / math.sqrt(a.size)
    assert paired.interval(0.95)[1] == pytest.approx(a.mean() / b2.mean() * math.exp(z * se_p), rel=1e-5)


def test_decision_p_inverts_the_interval():
    """For a normal estimate and a greater rule, the interval-inversion p-value is the two-sided
    normal p-value of the distance to the rule's boundary."""
    est = normal_estimate(0.3, 0.1, 4000)
    rule = Rule.parse({"greater": {"than": 0, "by": 0.1}})  # boundary 0.1: z = 2
    assert decision_p(est, rule.judge) == pytest.approx(2 * scipy.stats.norm.sf(2.0), rel=1e-6)
    assert decision_p(est, Rule.parse({"less": 0.3}).judge) == 1.0  # on the boundary: never decided
    eq = Rule.parse({"equivalent": 0.5})  # inside the band: the nearer edge, 0.2 away
    assert decision_p(est, eq.judge) == pytest.approx(2 * scipy.stats.norm.sf(2.0), rel=1e-6)
    far = normal_estimate(100.0, 0.1, 4000)
    assert decision_p(far, rule.judge) < 1e-200  # tiny p-values stay representable


def test_n_needed_by_hand():
    """From the rule's boundary: the truth the registered effect past it (one end: z_power), or at
    an equivalence band's centre (both ends: z_{(1 + power) / 2})."""
    est = normal_estimate(0.0, 0.05, 100)  # per-unit sd 0.5
    za = scipy.stats.norm.isf(0.005 / 2)
    greater = Rule.parse({"greater": {"than": 1, "by": 0.1}})  # boundary 1.1, truth 1.2: 0.1 from it
    assert n_needed(est, greater, 0.1, 0.005, 0.8) == math.ceil(((za + scipy.stats.norm.ppf(0.8)) * 0.5 / 0.1) ** 2)
    eq = Rule.parse({"equivalent": 0.1})
    assert n_needed(est, eq, 0.1, 0.005, 0.8) == math.ceil(((za + scipy.stats.norm.ppf(0.9)) * 0.5 / 0.1) ** 2)
    assert n_needed(normal_estimate(0.0, 0.0, 100), eq, 0.1, 0.005) is None  # no spread information


# ----------------------------------------------------------------------------- error control

def test_holm_by_hand():
    res = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}, 0.05)
    # sorted: d .005 (<= .0125), a .01 (<= .0167), c .03 (> .025): stop; b is never tested
    assert [res[k].decided for k in "dacb"] == [True, True, False, False]
    assert [res[k].rank for k in "dacb"] == [1, 2, 3, 4]
    assert res["d"].level == pytest.approx(0.05 / 4) and res["a"].level == pytest.approx(0.05 / 3)
    assert res["c"].level == pytest.approx(0.05 / 2) and res["b"].level == pytest.approx(0.05 / 2)
    assert res["c"].p_adjusted == pytest.approx(0.06) and res["b"].p_adjusted == pytest.approx(0.06)
    assert all(r.decided for r in holm({"x": 0.001, "y": 0.002}, 0.05).values())


def test_spending_boundaries_spend_alpha_as_obrien_fleming_by_simulation():
    """One look: the plain two-sided z. Two and three looks: simulated Brownian paths cross the
    boundaries with the alpha the Lan-DeMets O'Brien-Fleming spending function assigns."""
    assert spending_boundaries([10], 0.05) == pytest.approx([scipy.stats.norm.isf(0.025)])
    rng = np.random.default_rng(0)
    for looks in ([40, 80], [10, 20, 40]):
        c = spending_boundaries(looks, 0.05)
        t = np.array(looks) / looks[-1]
        incr = rng.normal(size=(400_000, len(looks))) * np.sqrt(np.diff(np.concatenate([[0], t])))
        z = np.cumsum(incr, axis=1) / np.sqrt(t)
        crossed = np.abs(z) >= np.array(c)
        first = crossed[:, 0].mean()
        spent0 = 2 - 2 * scipy.stats.norm.cdf(scipy.stats.norm.isf(0.025) / np.sqrt(t[0]))
        assert first == pytest.approx(spent0, abs=4e-4)
        assert crossed.any(axis=1).mean() == pytest.approx(0.05, abs=1.5e-3)
    assert nominal_level(1.959964) == pytest.approx(0.05, rel=1e-5)
    assert sequential_p(0.01, 0, [40, 80], 0.001) == 0.01
    assert sequential_p(0.01, 1, [40, 80], 0.001) > 0.01


# ----------------------------------------------------------------------------- the registered rules

def test_every_statistical_claim_is_registered_with_one_primary_test():
    for c in STATISTICAL:
        p = c.primary
        assert p is not None and p.rule is not None and p.effect > 0 and p.rationale, c.id
        assert all(ch.role in ("premise", "power") for ch in c.checks), c.id


def _synthetic(c, where: str) -> "object":
    """An estimate of claim ``c``'s primary placed ``where`` (supported | refuted | undecided)
    relative to its rule, in the units its kind reports: 2000 seeds with a small spread inside the
    claim's registered range (the betting interval), or 4000 batches."""
    rule, e = c.primary.rule, c.primary.effect
    if rule.kind in ("greater", "less"):
        b = rule.threshold
        sign = 1 if rule.kind == "greater" else -1
        point = {"supported": b + sign * 5 * e, "refuted": b - sign * 5 * e, "undecided": b}[where]
    else:
        lo, hi = rule.band
        point = {"supported": (lo + hi) / 2, "refuted": hi + 5 * e, "undecided": hi}[where]
    spread = e / 20 if where != "undecided" else e
    if c.primary.stat in ("run_metric", "frontier_gap"):
        lo, hi = _seed_range(c)
        noise = np.random.default_rng(1).normal(0, 1, 2000)
        return bounded_mean_estimate(np.clip(point + spread * noise, lo, hi), lo, hi)
    return normal_estimate(point, spread / 4, 4000)


def _seed_range(c) -> tuple[float, float]:
    """The range of the primary's per-seed values as its kind forms them (differences: both ways)."""
    args = c.primary.args
    lo, hi = args.get("range", (0.0, 1.0))
    paired = c.primary.stat == "frontier_gap" or args.get("op", "diff" if "b" in args else "mean") == "diff"
    return (lo - hi, hi - lo) if paired else (lo, hi)


def _checks_pass(c):
    """An estimate far inside each check's rule: the checks pass."""
    out = {}
    for ch in c.checks:
        r = ch.rule
        if r.kind in ("greater", "less"):
            pt = r.threshold + (1 if r.kind == "greater" else -1) * (abs(r.threshold) + 1)
        else:
            pt = sum(r.band) / 2
        out[ch.name] = normal_estimate(pt, 1e-6, 4000) if r.kind != "less" or pt > 0 or True else None
    return out


def _fake_data(c):
    runs = pd.DataFrame([{"run_dir": "r", "status": "completed", "reason": None, "point": ""}])
    return {x: C.ExpData(x, runs, pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame()) for x in c.experiments}


def _judge_synthetic(monkeypatch, c, primary, checks=None):
    checks = checks if checks is not None else _checks_pass(c)

    def kind(stat):
        def compute(e, args):
            for ch in c.checks:
                if args is ch.args:
                    return checks[ch.name]
            if args is c.primary.args:
                return primary
            raise NotRun("reported part: not in this test")
        return compute

    monkeypatch.setattr(C, "KINDS", {k: kind(k) for k in K.KINDS})
    last = {x: max(len(looks_of(x)) - 1, 0) for x in c.experiments}  # every look of the plan run
    v = C.evaluate_claim(c, _fake_data(c), {}, reached=last)
    C.apply_holm([v], {c.id: c})
    return v


def _has_method(c) -> bool:
    """A seed-level primary without a registered range (or a ratio) is undecidable by design
    (tests/test_claims_protocol.py); every other primary has an interval method."""
    a = c.primary.args
    return c.primary.stat not in ("run_metric", "frontier_gap") or (
        a.get("op") != "ratio" and ("range" in a or a.get("method") == "proportion"))


DECIDABLE = [c for c in STATISTICAL if _has_method(c)]


@pytest.mark.parametrize("claim", DECIDABLE, ids=[c.id for c in DECIDABLE])
def test_each_registered_rule_comes_out_each_way_on_data_built_to(monkeypatch, claim):
    for where in ("supported", "refuted", "undecided"):
        v = _judge_synthetic(monkeypatch, claim, _synthetic(claim, where))
        assert v.verdict == where, (claim.id, where, v.point, v.low, v.high, v.deciding)
        assert v.tested and v.level == pytest.approx(1 - 0.05 / M)  # alone in the family: rank 1 of m
    for ch in claim.checks:  # a failed premise makes it untestable, a failed power check undecided
        failing = dict(_checks_pass(claim))
        r = ch.rule
        b = r.threshold if r.kind in ("greater", "less") else r.band[1] + 1
        failing[ch.name] = normal_estimate(b - (1 if r.kind == "greater" else -1) * (abs(b) + 1), 1e-6, 4000)
        v = _judge_synthetic(monkeypatch, claim, _synthetic(claim, "supported"), failing)
        assert v.verdict == ("untestable" if ch.role == "premise" else "undecided") and not v.tested, claim.id


def test_a_learning_claim_is_not_decided_below_ten_seeds(monkeypatch):
    c = C.CLAIMS_BY_ID["C9"]
    nine = bounded_mean_estimate(np.full(9, 400.0), -500.0, 500.0)  # far beyond 25, but 9 seeds
    v = _judge_synthetic(monkeypatch, c, nine)
    assert v.verdict == "undecided" and not v.tested and "n = 9 < 10 seeds per arm" in v.deciding
    assert v.primary.verdict == "not tested"


def test_holm_levels_reach_the_report(monkeypatch):
    """Three claims tested together: each interval is shown at the level Holm tested it at."""
    vs = []
    for cid, where in (("C3", "supported"), ("C5", "supported"), ("C13", "undecided")):
        vs.append(_judge_synthetic(monkeypatch, C.CLAIMS_BY_ID[cid], _synthetic(C.CLAIMS_BY_ID[cid], where)))
    for v in vs:
        v.tested, v.verdict = True, "undecided"
    C.apply_holm(vs, {v.claim: C.CLAIMS_BY_ID[v.claim] for v in vs})
    levels = sorted(round(1 - v.level, 9) for v in vs)  # ranks 1-3 of the whole family of m
    assert levels == [round(0.05 / M, 9), round(0.05 / (M - 1), 9), round(0.05 / (M - 2), 9)]
    assert [v.verdict for v in vs] == ["supported", "supported", "undecided"]


# ----------------------------------------------------------------------------- statistic kinds

def _train_data(name: str, groups: list[tuple[dict, dict]], seeds=range(6), iters: int = 12) -> C.ExpData:
    """Training runs: one run directory per (config, seed); ``groups``: (sweep values, column -> f(seed, it))."""
    rows, runs, sweep = [], [], []
    for gi, (swept, cols) in enumerate(groups):
        for seed in seeds:
            rd = f"{name}/g{gi}/seed{seed}"
            runs.append({"run_dir": rd, "status": "completed", "reason": None, "point": str(swept)})
            sweep.append({"run_dir": rd, **swept})
            for it in range(1, iters + 1):
                row = {"run_dir": rd, "seed": seed, "iteration": it, "task": "t", "estimator": "ppo_gae",
                       "status": "completed", "env_steps": 100 * it, "episode_return": np.nan,
                       **{hp: np.nan for hp in HYPERPARAMETERS}}
                row.update({c: f(seed, it) for c, f in cols.items()})
                rows.append(row)
    return C.ExpData(name, pd.DataFrame(runs), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(rows), pd.DataFrame(sweep))


def test_run_metric_pairs_arms_by_seed():
    """Per-seed a - b: seed effects cancel, so the interval is that of the differences alone."""
    seed_effect = [0.0, 50.0, -30.0, 10.0, 90.0, -60.0]
    diff = [1.0, 2.0, 3.0, 1.5, 2.5, 2.0]
    e = _train_data("x", [({"arm": "a"}, {"v": lambda s, it: seed_effect[s] + diff[s]}),
                          ({"arm": "b"}, {"v": lambda s, it: seed_effect[s]})])
    est = K.run_metric(e, {"metric": {"column": "v", "reduce": "mean"}, "a": {"arm": "a"}, "b": {"arm": "b"},
                           "range": [-100, 100]})
    assert est.point == pytest.approx(np.mean(diff)) and est.n == 6 and est.n_text == "6 seed pairs"
    assert est.interval(0.95) == pytest.approx(bounded_mean_estimate(np.array(diff), -200, 200).interval(0.95))


def test_collapse_frequency_is_a_difference_of_proportions():
    """A run collapses when it falls below half its best evaluation after reaching it
    (analysis.stats.is_collapsed): 3 of 6 unclipped runs do, none clipped."""
    def ret(clip):
        return lambda s, it: (400.0 if it < 8 else (100.0 if (not clip and s < 3) else 420.0))

    e = _train_data("claim_c8", [({"clip_eps": c, "epochs": 10}, {"eval_return": ret(c)}) for c in (None, 0.2)])
    est = K.run_metric(e, {"metric": {"column": "eval_return", "reduce": "collapsed"},
                           "a": {"clip_eps": None, "epochs": 10}, "b": {"clip_eps": 0.2, "epochs": 10},
                           "method": "proportion"})
    assert est.point == pytest.approx(0.5) and est.method == BETTING  # per-seed 0/1 differences on [-1, 1]
    assert est.interval(0.95) == pytest.approx(bounded_mean_estimate(np.r_[np.ones(3), np.zeros(3)], -1, 1)
                                               .interval(0.95))


def test_probe_values_use_their_bootstrap_standard_error():
    probe = pd.DataFrame([{"run_dir": "p0", "scope": "all", "seed": 0, "batches": 4000, "cos_exp": 0.97,
                           "cos_exp_se": 0.01, "rel_bias_sq": 0.3, "rel_bias_sq_se": 0.02, "value_true": 2.0,
                           "value_bias": 0.1, "value_bias_se": 0.05, "weight": 1.1},
                          {"run_dir": "p1", "scope": "all", "seed": 0, "batches": 4000, "rel_bias_sq": 0.1,
                           "rel_bias_sq_se": 0.015}])
    runs = pd.DataFrame({"run_dir": ["p0", "p1"], "status": "completed", "reason": None, "point": ""})
    e = C.ExpData("x", runs, probe, pd.DataFrame(), pd.DataFrame(), pd.DataFrame({"run_dir": ["p0", "p1"], "k": [1, 2]}))
    z = scipy.stats.norm.ppf(0.975)
    one_minus = K.probe_value(e, {"where": {"k": 1}, "column": "cos_exp", "transform": "one_minus"})
    assert one_minus.point == pytest.approx(0.03) and one_minus.interval(0.95) == pytest.approx((0.03 - z * 0.01,
                                                                                                  0.03 + z * 0.01))
    rel = K.probe_value(e, {"where": {"k": 1}, "column": "value_bias", "divide_by": "value_true"})
    assert rel.point == pytest.approx(0.05) and rel.interval(0.95)[1] == pytest.approx(0.05 + z * 0.025)
    diff = K.probe_diff(e, {"column": "rel_bias_sq", "a": {"k": 1}, "b": {"k": 2}})
    assert diff.point == pytest.approx(0.2) and diff.interval(0.95)[1] == pytest.approx(0.2 + z * 0.025)
    # a squared norm: the union with the square-root scale's interval, (sqrt(0.3) +- z 0.02 / (2 sqrt(0.3)))^2
    sq = K.probe_value(e, {"where": {"k": 1}, "column": "rel_bias_sq"})
    r, rs = math.sqrt(0.3), 0.02 / (2 * math.sqrt(0.3))
    assert sq.interval(0.95) == pytest.approx((min(0.3 - z * 0.02, (r - z * rs) ** 2), (r + z * rs) ** 2))
    assert sq.interval(0.95)[1] > 0.3 + z * 0.02  # the upper end is the square-root scale's
    with pytest.raises(NotRun, match="weight_se missing"):  # a probe written before the _se columns
        K.probe_value(e, {"where": {"k": 1}, "column": "weight"})


def test_frontier_gap_compares_each_seed_with_its_own_unpenalised_run():
    """gold = sqrt(KL) on the beta=0 curve (measured every third iteration: kl_ref is null in
    between), and the penalised runs sit 0.1 below it: the gap is -0.1 gold per seed, exactly."""
    def kl_sparse(s, it):
        return it / 12 if it % 3 == 1 else np.nan

    groups = [({"kl.beta": 0.0}, {"kl_ref": kl_sparse, "gold_reward": lambda s, it: np.sqrt(it / 12)}),
              ({"kl.beta": 0.05}, {"kl_ref": lambda s, it: it / 24,
                                   "gold_reward": lambda s, it: np.sqrt(it / 24) - 0.1 - 0.01 * s})]
    e = _train_data("claim_c10", groups, seeds=range(4))
    est = K.frontier_gap(e, {"a": {"kl.beta": 0.05}, "b": {"kl.beta": 0.0}, "range": [0, 1]})
    gaps = np.array([-0.1 - 0.01 * s for s in range(4)])
    # the interpolation between measured points of sqrt(KL) is linear in sqrt(KL): exact for gold = sqrt(KL)
    assert est.values["gap"] == pytest.approx(gaps, abs=1e-9) and est.point == pytest.approx(gaps.mean())


def test_a_list_in_a_selection_means_any_of_its_values():
    e = _train_data("claim_c10", [({"kl.beta": b}, {"kl_ref": lambda s, it, b=b: b}) for b in (0.0, 0.05, 0.5)],
                    seeds=range(2))
    rows = e.select(e.metrics, {"kl.beta": [0.05, 0.5]}, "metrics")
    assert sorted(set(rows.kl_ref)) == [0.05, 0.5]


def test_a_diverged_run_scores_the_worst_return_unless_asked_otherwise():
    """C8's reported final return with one unclipped run diverging after iteration 6 at return
    200: by default it scores the task's worst return (0) from there, with --diverged last it keeps 200."""
    e = _train_data("claim_c8", [({"clip_eps": c, "epochs": 10}, {"eval_return": lambda s, it, c=c: 100.0 if c else 200.0,
                                                                  "worst_return": lambda s, it: 0.0})
                                 for c in (0.2, None)], seeds=range(4))
    m = e.metrics
    gone = (m.run_dir == "claim_c8/g1/seed0")
    e.metrics = m[~gone | (m.iteration <= 6)].copy()
    e.metrics.loc[e.metrics.run_dir == "claim_c8/g1/seed0", "status"] = "diverged"
    part = {"metric": {"column": "eval_return", "reduce": "score"}, "a": {"clip_eps": 0.2, "epochs": 10},
            "b": {"clip_eps": None, "epochs": 10}, "range": [0, 500]}
    assert K.run_metric(e, part).point == pytest.approx(100.0 - (3 * 200.0 + 0.0) / 4)
    e.diverged = "last"
    assert K.run_metric(e, part).point == pytest.approx(100.0 - 200.0)


# ----------------------------------------------------------------------------- the table as data

def test_claims_table_is_consistent_with_the_experiments():
    ids = [c.id for c in C.CLAIMS]
    assert ids == X.CLAIM_IDS and len(set(ids)) == len(ids)
    for c in C.CLAIMS:
        assert c.rule and c.text and c.source
        assert c.exact == (c.id in X.EXACT_CLAIMS)
        for x in c.experiments:
            assert x in X.EXPERIMENTS, (c.id, x)
    for name, ex in X.EXPERIMENTS.items():
        if ex.family == "lm" and X.lm_unavailable():
            continue
        for quick in (False, True):
            assert len(X.sweep_overrides(X.sweep_params(name, quick))) >= 1


def test_a_malformed_claim_entry_is_named(tmp_path):
    f = tmp_path / "claims.yaml"
    head = "claims:\n  C1:\n    text: t\n    source: s\n    experiments: [claim_c4]\n"
    f.write_text(head + "    primary: {name: p, stat: no_such_kind, rule: {greater: 0}}\n")
    with pytest.raises(ValueError, match="C1 primary part 'p': stat must be one of"):
        load_claims(f)
    f.write_text(head + "    primary: {name: p, stat: probe_value, column: x, rule: {greater: 0}, colour: red}\n")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['colour'\]"):
        load_claims(f)
    f.write_text(head + "    primary: {name: p, stat: probe_value, column: x, rule: {greater: 0}, rationale: r}\n")
    with pytest.raises(ValueError, match="needs a registered effect"):
        load_claims(f)
    f.write_text(head + "    primary: {name: p, stat: probe_value, column: x, rule: {greater: {than: 0, by: 1}}}\n")
    with pytest.raises(ValueError, match="needs a rationale"):
        load_claims(f)
    f.write_text(head + "    registered: 2026-12-02\n" +
                 "    primary: {name: p, stat: probe_value, column: x, rule: {greater: {than: 0, by: 1}}, "
                 "rationale: r}\n")
    with pytest.raises(ValueError, match=r"C1: unknown field\(s\) \['registered'\]"):  # the registry's, not here
        load_claims(f)


def test_sweep_expansion_is_hydras_cartesian_product():
    combos = X.sweep_overrides({"estimator": "a,b", "++probe.batches": "4", "clip_eps": "0.2,null"})
    assert len(combos) == 4 and ["estimator=a", "++probe.batches=4", "clip_eps=null"] in combos


def test_seed_offset_moves_every_run_to_disjoint_seeds(tmp_path):
    base = X.compose_points("claim_c18", tmp_path, quick=True)
    moved = X.compose_points("claim_c18", tmp_path, quick=True, seed_offset=1000)
    assert [p.sweep for p in base] == [p.sweep for p in moved]
    assert {int(p.cfg.seed) for p in moved} == {int(p.cfg.seed) + 1000 for p in base}
    assert not {d for p in base for d in p.run_dirs} & {d for p in moved for d in p.run_dirs}


@pytest.mark.parametrize("name, extend", [("claim_c26", {"population": 40}), ("claim_c53", {}),
                                          ("claim_c10", {"population": 20}), ("claim_c8_grid", {}),
                                          ("claim_c23", {"batches": 8})])
def test_a_shifted_or_extended_point_is_its_config_composed_with_those_overrides(tmp_path, name, extend):
    """compose_points sets a seed offset's seed and a second stage's population on the composed
    config: the config must be Hydra's own for the point's final overrides (every value, resolved),
    and its run directories the same."""
    from omegaconf import OmegaConf

    if X.EXPERIMENTS[name].family == "lm" and X.lm_unavailable():
        pytest.skip("no LM task")
    points = X.compose_points(name, tmp_path, False, seed_offset=1000, extend=extend)
    X._COMPOSED.clear()
    with X.initialize_config_dir(config_dir=str(X.CONF_DIR), version_base="1.3"):
        for p in points:
            assert any(o.startswith("seed=") for o in p.overrides), p.overrides
            again = X._compose(p.overrides)
            assert OmegaConf.to_container(p.cfg, resolve=True) == OmegaConf.to_container(again, resolve=True)
            assert p.run_dirs == [X.run_dir_for(m) for m in X.member_configs(again)]
    X.GlobalHydra.instance().clear()


@pytest.mark.parametrize("name", [n for n, e in X.EXPERIMENTS.items() if e.looks])
def test_every_look_of_the_sequential_plan_composes_and_validates(tmp_path, name):
    """The first look is the experiment's YAML's population; every later look composes, keeps the
    earlier looks' runs as its first members and passes validation (a look is runs, never a probe
    batch count that validation would refuse)."""
    from harness.validation import validate

    if X.EXPERIMENTS[name].family == "lm" and X.lm_unavailable():
        pytest.skip("no LM task")
    looks = looks_of(name)
    first = X.compose_points(name, tmp_path, False)
    assert {p.cfg.population for p in first if p.cfg.mode == "train"} == {looks[0]}
    for n in looks[1:]:
        ext = X.compose_points(name, tmp_path, False, extend={"population": n})
        for a, b in zip(first, ext):
            assert b.cfg.population == n and b.run_dirs[:looks[0]] == a.run_dirs
            validate(b.cfg)


@pytest.mark.parametrize("quick", [True, False])
def test_every_claim_experiment_composes_and_validates(tmp_path, quick):
    from harness.validation import validate

    bad = []
    for name in X.EXPERIMENTS:
        for p in X.compose_points(name, tmp_path, quick):
            try:
                assert p.error is None, p.error
                assert p.cfg.task.family == X.EXPERIMENTS[name].family  # its block's family is its task's
                validate(p.cfg)
            except Exception as exc:  # collect all, report together
                bad.append(f"{name} {' '.join(p.overrides[3:])}: {exc}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- the sequential plan

class _V:
    def __init__(self, claim, look, tested=True):
        self.claim, self.pending = claim, tested
        self.primary = C.Part("p", 0, 0, 0, "", "undecided", look=look)


def test_next_looks_extends_an_experiment_while_a_tested_claim_has_not_stopped():
    claims = C.CLAIMS_BY_ID  # C29's primary is claim_c29, looks (40, 80)
    assert looks_of("claim_c29") == (40, 80)
    plan = next_looks([_V("C29", look=0)], claims, {"experiments": {}})
    assert plan["experiments"]["claim_c29"]["reached"] == 1
    # at its last look already, stopped at an earlier look, or not tested: nothing more
    done = {"experiments": {"claim_c29": {"looks": [40, 80], "reached": 1}}}
    assert next_looks([_V("C29", look=1)], claims, done) == done
    assert next_looks([_V("C29", look=0)], claims, done) == done
    assert next_looks([_V("C29", look=0, tested=False)], claims, {"experiments": {}}) == {"experiments": {}}
    # an experiment without looks is never extended (a probe, or the opt-in Hopper experiment)
    assert next_looks([_V("C3", look=0), _V("C36", look=0)], claims, {"experiments": {}}) == {"experiments": {}}


def test_a_claim_stops_at_the_first_look_whose_boundary_it_crosses(monkeypatch):
    """Evidence at two looks: a huge effect crosses the first look's boundary and is judged there
    (its p-value is the first look's); a small one goes on to the second (the alpha spent at the
    first is added)."""
    c = C.CLAIMS_BY_ID["C29"]
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 1, 80)

    def run(effect):
        calls = []

        def compute(e, args):
            n = e.n_members
            if args is c.primary.args:
                calls.append(n)
                return bounded_mean_estimate(np.clip(effect + 0.05 * noise[:n], -4.159, 4.159), -4.159, 4.159)
            raise NotRun("reported: not in this test")

        class E(C.ExpData):
            def first_members(self, n):
                out = _fake_data(c)["claim_c29"]
                out.__class__ = E
                out.n_members = n
                return out

            def missing(self):
                return absent if self.n_members == 80 else 0

        data = _fake_data(c)
        data["claim_c29"].__class__ = E
        monkeypatch.setattr(C, "KINDS", {**K.KINDS, "run_metric": compute})
        v = C.evaluate_claim(c, data, {}, reached={"claim_c29": reached})
        return v, calls

    absent = 0
    reached = 0  # only the first look run: a claim that does not cross waits for the next (no peek)
    waiting, calls = run(0.13)
    assert calls == [40] and waiting.pending and not waiting.tested and "next look (80 seeds)" in waiting.deciding
    reached = 1

    big, calls = run(4.0)
    assert calls == [40] and big.primary.look == 0 and big.tested and not big.pending
    small, calls = run(0.13)  # 0.03 beyond the boundary at 0.1: not past the first look's strict boundary
    assert calls == [40, 80] and small.primary.look == 1
    assert small.tested and not small.pending
    p_nominal = decision_p(bounded_mean_estimate(0.13 + 0.05 * noise[:80], -4.159, 4.159), c.primary.rule.judge)
    assert small.p == pytest.approx(sequential_p(p_nominal, 1, [40, 80], 0.05 / C.M_REGISTERED))
    absent = 7  # the plan reached the second look but a stopped --run left 7 of its runs undone: not judged
    cut, calls = run(0.13)
    assert calls == [40] and cut.pending and not cut.tested and "7 run(s) not run yet" in cut.deciding


def test_the_cli_runs_looks_by_runs_not_by_time(tmp_path, monkeypatch):
    """The second stage goes on while the plan asks for a look, whatever the clock: the same
    judgements give the same runs (no budget enters)."""
    from analysis import cli

    calls, judged, resumed = [], [], []

    def run_claims(root, stage=None, **kw):
        calls.append(stage.extensions)
        resumed.append(stage.reached)
        return {}

    def evaluate(root, quick, only, offset, diverged="worst"):
        judged.append(1)
        reached = 0 if len(judged) == 1 else 1
        return [_V("C29", look=0)], {}, {"plan": {"experiments": {} if reached == 0 else
                                                  {"claim_c29": {"looks": [40, 80], "reached": 1}}}}

    monkeypatch.setattr(XR, "run_claims", run_claims)
    monkeypatch.setattr(C, "evaluate_all", evaluate)
    monkeypatch.setattr(C, "build_claims", lambda *a, **k: C.ClaimsResult(tmp_path / "claims.md", [], [], 0))
    assert cli.main(["claims", str(tmp_path), "--run", "--only", "C29"]) == 0
    assert calls == [None, {"claim_c29": {"population": 80}}] and len(judged) == 2
    plan = json.loads((tmp_path / "plan_claims.json").read_text())
    assert plan["experiments"]["claim_c29"]["reached"] == 1
    # run again (say the first was stopped during its second look): stage one runs to the look reached
    calls.clear(), judged.clear(), resumed.clear()
    judged.append(1)  # the plan is already at its second look
    assert cli.main(["claims", str(tmp_path), "--run", "--only", "C29"]) == 0
    assert resumed[0] == {"claim_c29": {"population": 80}} and calls == [None]


# ----------------------------------------------------------------------------- reports

def _report(root, offset, verdicts, mode="full"):
    (root / (f"claims_seed{offset}.json" if offset else "claims.json")).write_text(json.dumps(
        {"mode": mode, "seed_offset": offset, "verdicts": [
            {"claim": c, "verdict": v, "label": "untestable here" if v == "untestable" else v, "point": 1.0,
             "low": 0.5, "high": 1.5, "not_run": None} for c, v in verdicts.items()]}))


def test_stability_flags_a_verdict_that_flips(tmp_path):
    _report(tmp_path, 0, {"C3": "supported", "C18": "supported", "C8": "undecided", "C15": "undecided",
                          "C10": "supported", "C1": "supported"})
    _report(tmp_path, 1000, {"C3": "supported", "C18": "refuted", "C8": "supported", "C15": "undecided",
                             "C10": "untestable", "C1": "refuted"})
    st = C.stability(tmp_path, quick=False)
    status = {r["claim"]: r["status"] for r in st["rows"]}
    # C1 is an exact check: not a seed-stable verdict, not counted
    assert st["offsets"] == [0, 1000] and status == {"C3": "stable", "C8": "not reproduced", "C18": "unstable",
                                                     "C15": "undecided", "C10": "not reproduced"}
    assert "2 not reproduced" in st["summary"] and "1 decided at no offset" in st["summary"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_START}\nold\n{README_END}\noutro\n")
    update_readme(readme, readme_table(tmp_path, False, "cmd"))
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "| C18 |" in text and "**unstable**" in text and "**not reproduced**" in text and "seeds +1000" in text
    assert "| C1 |" not in text and "Exact checks" in text


def test_a_claim_judged_at_one_offset_is_neither_undecided_nor_unreproduced(tmp_path):
    _report(tmp_path, 0, {"C3": "supported", "C10": "supported", "C34": "undecided", "C36": "undecided"})
    _report(tmp_path, 1000, {"C3": "supported", "C10": "undecided", "C36": "undecided"})
    for name, i in (("claims_seed1000.json", 1), ("claims_seed1000.json", 2), ("claims.json", 3)):
        rep = json.loads((tmp_path / name).read_text())
        rep["verdicts"][i]["not_run"] = "not run here"
        (tmp_path / name).write_text(json.dumps(rep))
    st = C.stability(tmp_path, quick=False)
    assert {r["claim"]: r["status"] for r in st["rows"]} == {"C3": "stable", "C10": "one offset only",
                                                             "C34": "one offset only", "C36": "not run"}
    assert st["summary"].endswith(" 2 judged at one offset only. 1 run at no offset.")


def test_the_claims_blocks_go_into_any_page_with_their_markers(tmp_path, capsys):
    from analysis.cli import build_parser

    _report(tmp_path, 0, {"C3": "supported", "C18": "supported", "C8": "undecided", "C15": "refuted"})
    _report(tmp_path, 1000, {"C3": "supported", "C18": "refuted", "C8": "supported", "C15": "refuted"})
    (tmp_path / "claims_run.json").write_text(json.dumps({"wall_s": 3600.0}))
    page = tmp_path / "docs" / "claims.md"
    page.parent.mkdir()
    page.write_text(f"# Claims\n\n{README_START}\nold\n{README_END}\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{SUMMARY_START}\nold\n{SUMMARY_END}\noutro\n")
    assert update_pages([readme, page], tmp_path, False, "cmd") == [f"{readme}: claims-summary",
                                                                     f"{page}: claims-table"]
    table, summary = page.read_text(), readme.read_text()
    assert "\nold\n" not in table and "| C18 |" in table and "**unstable**" in table and "offset 0: 60.0 min" in table
    assert "4 statistical claims" in summary and "judged at seed offsets 0, 1000" in summary
    assert "- seeds +0: 2 supported, 1 refuted, 1 undecided, 0 untestable here (its last `--run`: 60 min)" \
        in summary
    assert "- seeds +1000: 2 supported, 2 refuted, 0 undecided, 0 untestable here" in summary
    args = build_parser().parse_args(["claims", str(tmp_path), "--readme", str(readme), "--readme", str(page)])
    assert args.readme == [readme, page]
    plain = tmp_path / "plain.md"
    plain.write_text("no markers here\n")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["claims", str(tmp_path), "--readme", str(plain)])
    assert "claims-summary:start" in capsys.readouterr().err


def test_the_time_block_shows_each_offsets_minutes_per_experiment_largest_first(tmp_path):
    from analysis.claims.report import TIME_END, TIME_START, update_pages

    _report(tmp_path, 0, {"C3": "supported"})
    _report(tmp_path, 1000, {"C3": "supported"})
    (tmp_path / "claims_run.json").write_text(json.dumps(
        {"wall_s": 600.0, "seconds": {"claim_c3": 60.0, "claim_c8": 240.0, "judging": 6.0}, "finished": "then",
         "commit": "abc1234"}))
    (tmp_path / "claims_run_seed1000.json").write_text(json.dumps(
        {"wall_s": 900.0, "seconds": {"claim_c3": 30.0, "claim_c8": 480.0}, "finished": "later"}))
    page = tmp_path / "toy.md"
    page.write_text(f"a\n{TIME_START}\nold\n{TIME_END}\nb\n")
    assert update_pages([page], tmp_path, False, "cmd") == [f"{page}: claims-time"]
    rows = [ln for ln in page.read_text().splitlines() if ln.startswith("| ")]
    # claim_c8: 4 + 8 = 12 minutes, claim_c3: 1 + 0.5, judging 0.1 (offset 0 only)
    assert rows[0] == "| experiment | seeds +0 | seeds +1000 |"
    assert rows[2:5] == ["| claim_c8 | 4.0 | 8.0 |", "| claim_c3 | 1.0 | 0.5 |", "| judging | 0.1 |  |"]
    assert rows[5] == "| **wall time** | **10.0** | **15.0** |" and rows[6] == "| finished | then | later |"
    assert rows[7] == "| started at commit | abc1234 | not recorded |"  # a record from before the field


def test_the_commit_is_read_from_a_clone_and_from_a_linked_worktree(tmp_path):
    """commit() reads the short hash from ``.git`` without starting git; git itself says what it
    should read: a clone on a branch (loose ref, then packed), a linked worktree (``.git`` a
    ``gitdir:`` file) on its own branch and detached at another commit; "?" outside a checkout."""
    import shutil
    import subprocess

    from analysis.claims.report import commit

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    git = lambda *a, cwd=tmp_path / "clone": subprocess.run(  # noqa: E731
        ["git", *a], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "clone").mkdir()
    git("init", "-q", "-b", "main")
    for i in range(2):
        (tmp_path / "clone" / "f").write_text(str(i))
        git("add", "f")
        git("commit", "-q", "-m", str(i))
    first, second = git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")
    assert commit(tmp_path / "clone") == second[:7]
    git("worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"), "HEAD")
    git("worktree", "add", "-q", "--detach", str(tmp_path / "old"), first)
    git("pack-refs", "--all")  # the branches now only in packed-refs, in the shared folder
    assert (tmp_path / "wt" / ".git").is_file()
    assert commit(tmp_path / "clone") == second[:7]
    assert commit(tmp_path / "wt") == git("rev-parse", "HEAD", cwd=tmp_path / "wt")[:7] == second[:7]
    assert commit(tmp_path / "old") == first[:7]
    assert commit(tmp_path / "nothing") == "?"


def test_a_whole_run_records_the_commit_it_started_at(tmp_path, monkeypatch):
    """claims_run.json names the checkout's commit when the run began, not the one that is checked
    out when it ends (a commit made during a run of an hour is not what the run ran)."""
    from analysis import cli
    from analysis.claims import report

    commits = iter(["1111111", "2222222", "3333333"])
    monkeypatch.setattr(report, "commit", lambda: next(commits))
    monkeypatch.setattr(XR, "run_claims", lambda root, **kw: {})
    monkeypatch.setattr(C, "evaluate_all", lambda *a, **k: ([], {}, {"plan": {"experiments": {}}}))
    monkeypatch.setattr(C, "build_claims", lambda *a, **k: C.ClaimsResult(tmp_path / "claims.md", [], [], 0))
    assert cli.main(["claims", str(tmp_path), "--run"]) == 0
    assert json.loads((tmp_path / "claims_run.json").read_text())["commit"] == "1111111"


def test_a_report_compares_its_own_offset_with_the_others_and_prints_the_protocol(tmp_path, monkeypatch):
    def not_composed(name, *args, **kwargs):
        raise NotRun(f"{name}: not composed in this test")

    monkeypatch.setattr(C, "compose_points", not_composed)
    _report(tmp_path, 0, {"C3": "supported"})
    out, _ = C.build_claims_report(tmp_path, quick=False, seed_offset=1000, progress=lambda s: None)
    text = out.read_text()
    assert "## Stability across seed offsets" in text and "| offset 0 | offset 1000 |" in text
    for needle in ("Registered before the data", "Holm", "O'Brien-Fleming", "untestable here", "calibration",
                   "## Registration", "claims_registry.json", "## Exact checks"):
        assert needle in text, needle


def test_missing_runs_are_not_run(tmp_path):
    out, verdicts = C.build_claims_report(tmp_path, quick=False, only={"C1", "C3", "C10"}, progress=lambda s: None)
    by = {v.claim: v for v in verdicts}
    assert all(v.not_run for v in verdicts)
    assert "python -m analysis claims DIR --run" in by["C3"].not_run
    assert by["C1"].not_run.startswith("tests not run")
    assert "not run:" in out.read_text()
    assert json.loads((tmp_path / "claims_only.json").read_text())["verdicts"][0]["claim"] == "C1"
    assert not (tmp_path / "claims.json").exists()  # a report of some claims never replaces the whole one


def test_lm_claims_say_why_they_were_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "lm_unavailable", lambda: "the LM task (harness/train/lm.py) is not present")
    _, verdicts = C.build_claims_report(tmp_path, quick=False, only={"C10", "C21"}, progress=lambda s: None)
    for v in verdicts:
        assert v.label == "not run: the LM task (harness/train/lm.py) is not present"
    _, quick = C.build_claims_report(tmp_path, quick=True, only={"C15"}, progress=lambda s: None)
    assert quick[0].not_run.startswith("--quick skips the LM task")


def test_exact_claims_are_found_by_marker_not_by_name(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.claim('C16')\ndef test_renamed_freely():\n    assert 1 + 1 == 2\n\n"
        "@pytest.mark.claim('C7')\ndef test_anything():\n    assert 1 + 1 == 3\n\n"
        "def test_c16_named_like_a_claim_but_unmarked():\n    assert False\n")
    rec = XR.run_exact_tests(["C16", "C7", "C12"], tmp_path / "exact_tests.json", progress=lambda s: None,
                             repo=tmp_path)
    assert json.loads((tmp_path / "exact_tests.json").read_text()) == rec
    assert rec["claims"]["C16"] == {"nodes": ["tests/test_fake.py::test_renamed_freely"], "outcomes": ["passed"]}
    assert C.eval_exact(C.CLAIMS_BY_ID["C16"], rec).verdict == "supported"
    assert C.eval_exact(C.CLAIMS_BY_ID["C7"], rec).verdict == "refuted"
    assert C.eval_exact(C.CLAIMS_BY_ID["C12"], rec).not_run == "no test marked claim('C12') was collected"


def test_without_a_tests_folder_the_exact_claims_say_why_they_did_not_run(tmp_path):
    """An installed wheel has no tests/ (the exact claims' tests are the clone's): the record
    and each exact claim's row say so, instead of "no test ... was collected"."""
    rec = XR.run_exact_tests(["C16", "C7"], tmp_path / "exact_tests.json", progress=lambda s: None, repo=tmp_path)
    assert rec["claims"] == {"C16": {"nodes": [], "outcomes": []}, "C7": {"nodes": [], "outcomes": []}}
    why = C.eval_exact(C.CLAIMS_BY_ID["C16"], rec).not_run
    assert why.startswith("the exact claims' tests are in a clone's tests/ folder") and str(tmp_path / "tests") in why
    assert not (tmp_path / "exact_tests.xml").exists()  # no pytest was started


def test_every_exact_claim_has_marked_tests():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "claim", "tests"],
                         capture_output=True, text=True, cwd=X.REPO)
    collected = [ln for ln in out.stdout.splitlines() if "::" in ln]
    files = {ln.split("::")[0] for ln in collected}
    assert {"tests/test_returns.py", "tests/test_losses.py", "tests/test_group_kl.py"} <= files
    assert len(collected) >= 12


def test_the_pilot_runs_end_to_end_and_prints_no_verdict(tmp_path, monkeypatch, capsys):
    """--quick --run on a tiny C3 (toy probe) and C18 (toy training): estimates with intervals and a
    figure, labelled pilot; no statistical verdict anywhere in the printout or the report; the exact
    checks are still judged; a second run reuses every run; fresh seeds reuse none."""
    from analysis.cli import main

    small = {"++probe.batches": "200", "++probe.negative_control": "false"}
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c3", X.Experiment("claim_c3", "toy", small))
    tiny = {"++probe.batches": "6", "++probe.reference_batches": "8", "++probe.critic_episodes": "8",
            "task.episodes_per_iter": "4", "group_size": "2", "task.hidden": "[16]"}
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c3_control", X.Experiment("claim_c3_control", "control", tiny))
    both = {**_TINY_TOY, "loss_agg": "seq_mean_token_mean,seq_mean_token_sum_norm"}
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c18", X.Experiment("claim_c18", "toy", both))
    assert main(["claims", str(tmp_path), "--run", "--quick", "--only", "C3,C18,C16"]) == 0
    out = capsys.readouterr().out
    statistical = [ln for ln in out.splitlines() if ln.startswith("  C3 ") or ln.startswith("  C18 ")]
    assert len(statistical) == 2 and all("pilot (no verdict)" in ln for ln in statistical)
    assert "C16  exact check: passed" in out and "pilot estimates only, no verdict" in out
    text = (tmp_path / "claims_quick_only.md").read_text()
    table = text.split("## Statistical claims")[1].split("## Exact checks")[0]
    assert "supported" not in table and "refuted" not in table and "| pilot |" in table
    assert (tmp_path / "claims_figures_quick_only" / "c3.png").is_file()
    lines = []
    XR.run_claims(tmp_path, quick=True, only={"C3"}, progress=lines.append)
    assert sum("done already" in line for line in lines) == 4
    lines.clear()
    XR.run_claims(tmp_path, quick=True, only={"C3"}, seed_offset=1000, progress=lines.append)
    assert sum("done already" in line for line in lines) == 0


def test_run_creates_the_folder_a_fresh_clone_lacks(tmp_path, capsys):
    from analysis.cli import main

    new = tmp_path / "results" / "claims"
    assert main(["claims", str(new), "--quick", "--only", "C16"]) == 2  # judging needs the folder
    assert not new.exists()
    assert main(["claims", str(new), "--run", "--quick", "--only", "C16"]) == 0
    out = capsys.readouterr().out
    assert "C16  exact check: passed" in out and (new / "claims_quick_only.md").is_file()


def test_only_one_exact_claim_still_records_every_exact_claim(tmp_path, monkeypatch):
    import harness.experiments.run as R

    seen = {}
    monkeypatch.setattr(R, "run_exact_tests", lambda claims, out, progress=print: seen.setdefault("c", list(claims)))
    R.run_claims(tmp_path, only={"C32"}, progress=lambda s: None)
    assert seen["c"] == X.EXACT_CLAIMS and {"C1", "C7", "C32"} <= set(seen["c"])


def test_published_reports_carry_their_command_and_figures(tmp_path, monkeypatch):
    from analysis.claims.report import publish
    from tests.claims_helpers import report_without_runs

    report_without_runs(tmp_path, monkeypatch)
    pages = publish(tmp_path, False, tmp_path / "docs" / "reports", "python -m analysis claims R --publish P")
    assert [p.name for p in pages] == ["claims.md"]
    text = pages[0].read_text()
    assert text.startswith("# Claims report, seed offset 0\nGenerated: copied from `claims.md` by `python -m "
                           "analysis claims R --publish P`")
    assert (tmp_path / "docs" / "reports" / "claims_figures" / "c3.png").read_bytes() == b"png"


# ----------------------------------------------------------------------------- designs and isolated points

def test_points_composed_again_are_equal_copies(tmp_path):
    from omegaconf import OmegaConf

    X._COMPOSED.clear()
    first = X.compose_points("claim_c30", tmp_path, quick=True, seed_offset=1000)
    again = X.compose_points("claim_c30", tmp_path, quick=True, seed_offset=1000)
    X._COMPOSED.clear()
    fresh = X.compose_points("claim_c30", tmp_path, quick=True, seed_offset=1000)
    for a, b, c in zip(first, again, fresh):
        assert OmegaConf.to_container(b.cfg) == OmegaConf.to_container(c.cfg) and b.run_dirs == c.run_dirs
        assert b.cfg is not a.cfg and b.cfg.seed == 1000
        a.cfg.seed = -1  # a caller's change stays its own
        assert b.cfg.seed == 1000 and X.compose_points("claim_c30", tmp_path, True, 1000)[0].cfg.seed == 1000


_TINY_TOY = {"loss_agg": "token_mean", "population": "2", "task.episodes_per_iter": "8", "budget.env_steps": "48"}


def _parquet_rows(root):
    out = {}
    for f in sorted(root.rglob("metrics.parquet")):
        out[str(f.parent.relative_to(root))] = pd.read_parquet(f).drop(columns=["wall_time_s"])
    return out


def test_isolated_points_give_the_in_process_results(tmp_path, monkeypatch):
    results = {}
    for isolate in (False, True):
        monkeypatch.setitem(X.EXPERIMENTS, "claim_c18", X.Experiment("claim_c18", "toy", _TINY_TOY, isolate=isolate))
        root = tmp_path / ("own" if isolate else "shared")
        lines = []
        XR.run_claims(root, quick=True, only={"C18"}, progress=lines.append)
        results[isolate] = (_parquet_rows(root), lines)
        runs = sorted(p.parent.name for p in root.rglob("summary.json"))
        assert [r.split("-")[0] for r in runs] == ["seed0", "seed1"]
        pids = {json.loads(p.read_text())["pid"] for p in root.rglob(".lock")}
        assert (os.getpid() in pids) is (not isolate) and len(pids) == 1
    (shared, lines_shared), (own, lines_own) = results[False], results[True]
    assert shared.keys() == own.keys() and len(shared) == 2
    for key in shared:
        pd.testing.assert_frame_equal(shared[key], own[key])
    exp_lines = [ln for ln in lines_own if "claim_c18" in ln]
    assert exp_lines[0] == "[claims] experiment claim_c18: 1 config(s), each in its own process"
    assert "2 completed" in exp_lines[1] and "2 completed" in [ln for ln in lines_shared if "claim_c18" in ln][1]


def _what_the_point_sees(cfg):
    import importlib.util
    return {"parent_mark": int(getattr(sys, "_pg_harness_parent_mark", 0)),
            "preloaded": sum(m in sys.modules for m in XR._SERVER_PRELOAD),
            "importable": sum(importlib.util.find_spec(m) is not None for m in XR._SERVER_PRELOAD)}


def test_an_isolated_point_starts_from_the_servers_imports_not_from_this_process(monkeypatch):
    # what this process holds (here a mark; in a claims run, earlier points' memory) never reaches
    # the point (a plain fork would carry it), and the point starts with the server's imports
    # loaded (a spawned process would not have them)
    monkeypatch.setattr(sys, "_pg_harness_parent_mark", 1, raising=False)
    seen = XR.run_isolated(None, target=_what_the_point_sees)
    assert seen["parent_mark"] == 0
    assert seen["preloaded"] == seen["importable"] >= 3


def _die(cfg):
    os._exit(3)


def _raise(cfg):
    raise ValueError("bad point")


def test_an_isolated_point_whose_process_dies_is_recorded_failed(tmp_path, monkeypatch):
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c18", X.Experiment("claim_c18", "toy", _TINY_TOY, isolate=True))
    (p,) = X.compose_points("claim_c18", tmp_path, quick=True)
    with pytest.raises(XR.WorkerDied):
        XR.run_isolated(p.cfg, target=_die)
    summaries = [json.loads((d / "summary.json").read_text()) for d in p.run_dirs]
    assert [s["status"] for s in summaries] == ["failed", "failed"]
    with pytest.raises(ValueError, match="bad point"):
        XR.run_isolated(p.cfg, target=_raise)
    lines = []
    fresh = X.compose_points("claim_c18", tmp_path / "again", quick=True)
    monkeypatch.setattr(XR, "run_isolated", lambda cfg: (_ for _ in ()).throw(XR.WorkerDied("it died")))
    assert XR.run_points(fresh, lines.append, isolate=True) == {"error": 1}
    assert "error: WorkerDied: it died" in lines[0]


def _flat(cfg) -> dict:
    from omegaconf import OmegaConf

    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return {k: v for k, v in out.items() if k not in ("results_dir", "lm.cache_dir")}


def _differences(a, b) -> dict:
    fa, fb = _flat(a), _flat(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def test_c9_compares_epochs_and_nothing_else(tmp_path):
    for quick in (False, True):
        one, ten = X.compose_points("claim_c9", tmp_path, quick)
        assert _differences(one.cfg, ten.cfg) == {"epochs": (1, 10)}
        assert (one.cfg.estimator, one.cfg.minibatches) == ("ppo_gae", 1)


@pytest.mark.skipif(X.lm_unavailable() is not None, reason="no LM task")
def test_c10_puts_the_kl_penalty_in_the_reward_and_its_reported_twin_in_the_loss(tmp_path):
    for p in X.compose_points("claim_c10", tmp_path, False):
        assert (p.cfg.kl.in_reward, p.cfg.kl.estimator, p.cfg.population) == (True, "k1", 10)
    loss = X.compose_points("claim_c10_loss", tmp_path, False)
    assert {p.cfg.kl.beta for p in loss} == {0.05, 0.5}
    assert all((p.cfg.kl.in_reward, p.cfg.kl.estimator) == (False, "k3") for p in loss)


@pytest.mark.skipif(X.lm_unavailable() is not None, reason="no LM task")
def test_c19_clipping_can_act_in_every_setting_and_pairs_by_seed(tmp_path):
    points = {(p.cfg.epochs, p.cfg.clip_eps): p for p in X.compose_points("claim_c19", tmp_path, False)}
    assert sorted(points, key=str) == sorted([(1, 0.2), (1, None), (2, 0.2), (2, None)], key=str)
    for epochs in (1, 2):
        clipped, free = points[(epochs, 0.2)], points[(epochs, None)]
        assert clipped.cfg.minibatches > 1
        assert _differences(clipped.cfg, free.cfg) == {"clip_eps": (0.2, None)}
        assert [d.name.split("-")[0] for d in clipped.run_dirs] == [d.name.split("-")[0] for d in free.run_dirs]


@pytest.mark.skipif(X.lm_unavailable() is not None, reason="no LM task")
def test_c15_measures_each_run_alone_in_its_process(tmp_path):
    assert X.EXPERIMENTS["claim_c15"].isolate
    points = X.compose_points("claim_c15", tmp_path, False)
    assert all(len(p.run_dirs) == 1 for p in points)
    seeds = {p.cfg.estimator: set() for p in points}
    for p in points:
        seeds[p.cfg.estimator].add(p.cfg.seed)
    assert seeds == {e: set(range(10)) for e in ("ppo_gae", "rloo", "remax")}


def test_c37_compares_initial_std_half_with_one(tmp_path):
    pts = {dict(o.lstrip("+").split("=") for o in p.sweep)["ablation"]: p
           for p in X.compose_points("claim_c34", tmp_path, False)}
    assert pts["std_05"].cfg.task.init_log_std == pytest.approx(math.log(0.5))
    assert pts["std_1"].cfg.task.init_log_std == 0.0
    assert set(_differences(pts["std_05"].cfg, pts["std_1"].cfg)) <= {"ablation", "task.init_log_std"}


def test_a_part_panel_title_keeps_its_rule_and_verdict_however_long_the_name():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.claims.figures import _interval_axis
    rule = Rule.parse({"less": 0.25})
    part = C.Part("gold gap of beta>0 runs to the beta=0 frontier at equal sqrt(KL) (gold std units) " * 2,
                  -0.221, -0.325, -0.0701, rule.text, "supported", spec=rule, level=0.99)
    fig, ax = plt.subplots()
    _interval_axis(ax, part)
    title = ax.get_title(loc="left")
    plt.close(fig)
    assert title.endswith(" [< 0.25, 99%]: supported") and title.startswith("gold gap of beta>0") and len(title) <= 95


# ----------------------------------------------------------------------------- opt-in experiments

MUJOCO_CLAIMS = "C34,C35,C36,C37,C38"


def test_a_plain_run_leaves_the_opt_in_experiment_out_and_says_how_to_run_it(tmp_path, monkeypatch):
    composed = []

    def compose(name, root, quick, seed_offset=0, extend=None):
        composed.append(name)
        return []

    monkeypatch.setattr(XR, "run_exact_tests", lambda claims, out, progress=print: None)
    monkeypatch.setattr(XR, "compose_points", compose)
    monkeypatch.setattr(XR, "run_points", lambda points, progress=print, isolate=False: {})
    for only, runs in ((None, False), ({"C9"}, False), ({"C36"}, True), ({"C9", "C38"}, True)):
        composed.clear()
        lines = []
        XR.run_claims(tmp_path, only=only, progress=lines.append)
        assert ("claim_c34" in composed) == runs, only
        said = [s for s in lines if "claim_c34: skipped" in s]
        if only is None:
            assert said == [f"[claims] experiment claim_c34: skipped ({X.EXPERIMENTS['claim_c34'].opt_in}: "
                            f"python -m analysis claims DIR --run --only {MUJOCO_CLAIMS})"]
            assert {"claim_c9", "claim_c3", "claim_c10"} <= set(composed)
        if only == {"C9"}:
            assert composed == ["claim_c9"] and said == []


@pytest.mark.parametrize("only, prepared", [({"C3", "C10"}, ["claim_c10", "claim_c10_loss"]), ({"C10"}, None),
                                             ({"C3"}, None)])
@pytest.mark.parametrize("fails", [False, True])
def test_the_lm_pipelines_are_prepared_beside_the_experiments_before_them(tmp_path, monkeypatch, only, prepared,
                                                                          fails):
    """run_claims hands every LM experiment's points to prepare_pipelines before its first
    experiment runs, when that one is not LM (else its first point would only wait for the build);
    the build is waited for at the end, and stopped if the run stops."""
    events = []

    class Build:
        def join(self):
            events.append("join")

        def terminate(self):
            events.append("terminate")

    def compose(name, root, quick, seed_offset=0, extend=None):
        return [X.Point(name, [])]

    def prepare(points):
        events.append(("prepare", sorted({p.experiment for p in points})))
        return Build()

    def run_points(points, progress=print, isolate=False):
        events.append(("run", points[0].experiment))
        if fails and points[0].experiment == "claim_c10":
            raise KeyboardInterrupt
        return {}

    monkeypatch.setattr(XR, "run_exact_tests", lambda claims, out, progress=print: None)
    monkeypatch.setattr(XR, "compose_points", compose)
    monkeypatch.setattr(XR, "prepare_pipelines", prepare)
    monkeypatch.setattr(XR, "run_points", run_points)
    monkeypatch.setattr(XR, "lm_unavailable", lambda: None)
    runs = [("run", n) for n in X.experiments_for(only)]  # toy first (C3's), then LM (C10's two)
    if fails and "C10" in only:
        runs = runs[:runs.index(("run", "claim_c10")) + 1]
        with pytest.raises(KeyboardInterrupt):
            XR.run_claims(tmp_path, only=only, progress=lambda s: None)
    else:
        XR.run_claims(tmp_path, only=only, progress=lambda s: None)
    if prepared is None:
        assert events == runs
    else:
        assert events == [("prepare", prepared), *runs, *(["terminate"] if fails else []), "join"]


def test_a_missing_opt_in_experiment_names_the_command_that_runs_it(tmp_path):
    verdicts, _, _ = C.evaluate_all(tmp_path, False, only={"C34", "C38"})
    assert [v.claim for v in verdicts] == ["C34", "C38"]
    for v in verdicts:
        want = f"(run them: python -m analysis claims DIR --run --only {MUJOCO_CLAIMS})"
        assert v.not_run and v.not_run.endswith(want), v.not_run


def test_the_claims_list_page_is_written_from_the_registry():
    """docs/claims_list.md's table is generated from harness/conf/claims.yaml (python -m analysis.claims.register
    --docs docs/claims_list.md): it says what is registered, no hand copy to drift."""
    from analysis.claims.register import END, START, list_markdown

    page = (X.REPO / "docs" / "claims_list.md").read_text()
    assert page.split(START)[1].split(END)[0].strip() == list_markdown().strip()


def test_the_curve_panel_averages_the_kth_evaluation_of_every_seed_whatever_its_step():
    """Seeds evaluate at slightly different env_steps (episodes end at different steps): each
    point of the mean curve is the k-th evaluation of all 6 seeds, at their median step."""
    import types

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.claims.figures import _curve_panel
    e = _train_data("x", [({"arm": "a"}, {"v": lambda s, it: 10.0 * it + s})], iters=4)
    e.metrics["env_steps"] = e.metrics["env_steps"] + e.metrics["seed"] * 7  # 100*it + 0, 7, ..., 35
    ps = types.SimpleNamespace(stat="run_metric", experiment="x", args={"metric": {"column": "v"}, "a": {"arm": "a"}})
    fig, ax = plt.subplots()
    assert _curve_panel(ax, types.SimpleNamespace(primary=ps), {"x": e})
    line = ax.lines[0]
    xs, ys = line.get_xdata(), line.get_ydata()
    plt.close(fig)
    # by hand: seeds 0..5 add 0..5 to 10*it (mean 2.5) and 0..35 to the step (median 17.5)
    assert list(xs) == pytest.approx([117.5, 217.5, 317.5, 417.5])
    assert list(ys) == pytest.approx([12.5, 22.5, 32.5, 42.5])
    assert "(n=6 seeds)" in line.get_label()
