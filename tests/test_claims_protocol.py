"""The claims protocol's family and its refusal to decide on zero information: every registered
claim judged on estimates built from identical values is undecided, and a claim's Holm level is
the whole registered family's whatever else ran (``--only`` included)."""
import numpy as np
import pytest

from analysis import claims as C
from analysis.claims import kinds as K
from analysis.claims.evidence import NotRun
from analysis.claims.intervals import bounded_mean_estimate, normal_estimate
from analysis.claims.plan import looks_of
from tests.test_claims import _fake_data

STATISTICAL = [c for c in C.CLAIMS if not c.exact]
SEED_KINDS = ("run_metric", "frontier_gap")


def _favoured(rule, lo=-np.inf, hi=np.inf) -> float:
    """The value inside [lo, hi] that most favours "supported": far past a threshold, or a band's centre."""
    if rule.kind == "greater":
        return min(hi, rule.threshold + 1e3)
    if rule.kind == "less":
        return max(lo, rule.threshold - 1e3)
    return sum(rule.band) / 2


def _identical(part) -> object:
    """An estimate from ten identical seeds (seed kinds, on the part's registered range: a kind
    without one is undecidable, as :func:`analysis.claims.kinds.value_range` says) or from batches
    with no spread (standard error 0), at the value most favourable to the rule."""
    if part.stat in SEED_KINDS:
        args = part.args
        if part.stat == "run_metric" and args.get("op") == "ratio":
            raise K.Undecidable("ratio")
        if "range" not in args and args.get("method") != "proportion":
            raise K.Undecidable("no registered range")
        lo, hi = args.get("range", (0.0, 1.0))
        if part.stat == "frontier_gap" or "b" in args:
            lo, hi = lo - hi, hi - lo
        return bounded_mean_estimate(np.full(10, _favoured(part.rule, lo, hi)), lo, hi)
    return normal_estimate(_favoured(part.rule), 0.0, 4000)


def _judge_all(monkeypatch, primary_of, claims=STATISTICAL):
    """Every claim's primary from ``primary_of(claim)``, its checks passing (far inside their rules
    with a small standard error), judged together through Holm."""
    by_args = {}
    for c in claims:
        by_args[id(c.primary.args)] = lambda c=c: primary_of(c)
        for ch in c.checks:
            r = ch.rule
            pt = r.threshold + (1 if r.kind == "greater" else -1) * (abs(r.threshold) + 1) \
                if r.kind in ("greater", "less") else sum(r.band) / 2
            by_args[id(ch.args)] = lambda pt=pt: normal_estimate(pt, 1e-6, 4000)

    def compute(e, args):
        if id(args) in by_args:
            return by_args[id(args)]()
        raise NotRun("reported part: not in this test")

    monkeypatch.setattr(C, "KINDS", {k: compute for k in K.KINDS})
    verdicts = []
    for c in claims:
        last = {x: max(len(looks_of(x)) - 1, 0) for x in c.experiments}
        try:
            verdicts.append(C.evaluate_claim(c, _fake_data(c), {}, reached=last))
        except K.Undecidable as exc:
            verdicts.append(C.Verdict(c.id, "undecided", c.primary.name, deciding=f"undecided: {exc}"))
    C.apply_holm(verdicts)
    return verdicts


def test_a_report_from_identical_seeds_decides_nothing(monkeypatch):
    """Every registered statistical claim, its primary built from identical values at the value
    most favourable to its rule (ten seeds at the end of the registered range, or a probe statistic
    with standard error 0): every verdict undecided, none supported or refuted."""
    vs = _judge_all(monkeypatch, lambda c: _identical(c.primary))
    assert len(vs) == len(STATISTICAL)
    decided = [(v.claim, v.verdict, v.deciding) for v in vs if v.verdict != "undecided"]
    assert not decided
    # the reason is stated: zero information, no range, or an interval too wide at ten seeds
    assert all(v.deciding for v in vs)


def test_the_same_data_with_spread_decides(monkeypatch):
    """The identical-values test can fail: the same probe claims with a small, non-zero standard
    error are decided (so it is the zero information, not the data's place, that keeps them open)."""
    probes = [c for c in STATISTICAL if c.primary.stat not in SEED_KINDS]
    vs = _judge_all(monkeypatch, lambda c: normal_estimate(_favoured(c.primary.rule), 1e-6, 4000), probes)
    assert vs and all(v.verdict == "supported" for v in vs)


def test_a_claims_level_is_the_whole_familys(monkeypatch):
    """One claim tested alone gets alpha / m (m: every registered statistical claim), as it does
    beside others it outranks: untested claims count with p = 1."""
    m = len(C.family())
    assert m == len(STATISTICAL) == C.M_REGISTERED
    c = C.CLAIMS_BY_ID["C3"]
    alone = _judge_all(monkeypatch, lambda c: normal_estimate(0.5, 1e-6, 4000), [c])
    assert alone[0].verdict == "supported" and alone[0].level == pytest.approx(1 - C.PROTOCOL.alpha / m)
    assert alone[0].m == m


def test_only_reports_its_rows_at_the_full_familys_levels(monkeypatch, tmp_path):
    """``--only`` judges every claim (so Holm's order is the family's) and returns its rows only."""
    seen = []

    def evaluate(c, data, skipped, quick=False, reached=None):
        seen.append(c.id)
        raise NotRun("no runs in this test")

    monkeypatch.setattr(C, "evaluate_claim", evaluate)
    monkeypatch.setattr(C, "compose_all", lambda *a, **k: ({}, {}))
    verdicts, _, _ = C.evaluate_all(tmp_path, False, only={"C3"})
    assert [v.claim for v in verdicts] == ["C3"]
    assert set(seen) == {c.id for c in STATISTICAL}
