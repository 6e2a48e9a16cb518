"""Claims report: ``python -m analysis claims DIR [--run] [--quick] [--seed-offset K]``.

Every claim of ``harness/conf/claims.yaml`` gets a row. A *statistical* claim is judged by one
registered primary test (:mod:`.spec`): its statistic (:mod:`.kinds`) with an interval method
whose coverage at the n used is tested (:mod:`.intervals`), read against its rule (:mod:`.rules`)
at the level Holm's procedure across all claims tested in the report assigns it
(:mod:`.protocol`). Verdicts: **supported**, **refuted**, **undecided** (the interval at that
level straddles the rule's boundary, a power check failed, or a learning claim has fewer than
``min_seeds`` seeds per arm) and **untestable here** (a premise check failed: what the claim
presupposes did not happen in these runs). Premise and power checks never refute. *Exact*
claims are identities checked by unit tests (``@pytest.mark.claim``), listed apart and not
counted among the statistical verdicts.

Evidence is only what the harness produced in ``DIR`` for exactly the configs of each experiment
(:mod:`.evidence`). ``--run`` first runs what is missing, then the group-sequential second stage
(:mod:`.plan`); without it nothing runs. ``--seed-offset K`` judges (and with ``--run`` runs)
every experiment on seeds shifted by K; each offset keeps its report and every report shows
the verdicts of all offsets judged in DIR side by side. ``--quick`` is a pilot: small budgets,
estimates and 95% intervals labelled "pilot", no verdict for any statistical claim.
"""
from __future__ import annotations

import json
import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from harness.experiments import EXPERIMENTS, FAMILY_ORDER, Point, lm_unavailable, run_command

from ..stats import DEFAULT_DIVERGED
from .evidence import ExpData, NotRun, compose_points, load_points, sweep_key
from .intervals import MAX_N, Estimate, decision_p, n_needed
from .kinds import KINDS, Undecidable
from .plan import extensions, looks_of, read_plan, write_plan
from .protocol import holm, nominal_level, sequential_p, spending_boundaries
from .rules import PILOT, VERDICTS, Part, Rule
from .spec import Claim, ClaimsFile, PartSpec, load_claims, load_claims_file

CLAIMS_FILE_DATA: ClaimsFile = load_claims_file()
CLAIMS: list[Claim] = CLAIMS_FILE_DATA.claims
CLAIMS_BY_ID = {c.id: c for c in CLAIMS}
PROTOCOL = CLAIMS_FILE_DATA.protocol
#: The number of registered statistical claims: the Bonferroni level alpha / m of the sequential
#: plan's stopping boundaries is fixed by it before any data.
M_REGISTERED = sum(not c.exact for c in CLAIMS)


@dataclass
class Verdict:
    claim: str
    verdict: str  # supported | refuted | undecided | untestable | pilot
    statistic: str = ""
    point: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    level: float = 0.95
    n: str = ""
    parts: list[Part] = field(default_factory=list)  # the primary first, then its checks
    reported: list[Part] = field(default_factory=list)
    note: str = ""
    not_run: str | None = None  # reason, when the evidence is missing
    figure: str | None = None
    deciding: str = ""  # what decided the verdict, in words
    p: float = float("nan")  # the primary's p-value (sequential, before Holm)
    p_adjusted: float = float("nan")  # Holm-adjusted
    rank: int = 0
    m: int = 0
    tested: bool = False  # in the Holm family
    pending: bool = False  # testable, but its experiment's sequential plan has a look to run before it is judged
    exact: bool = False
    estimate: Estimate | None = None

    @property
    def label(self) -> str:
        if self.not_run:
            return f"not run: {self.not_run}"
        return "untestable here" if self.verdict == "untestable" else self.verdict

    @property
    def primary(self) -> Part | None:
        return self.parts[0] if self.parts and self.parts[0].role == "primary" else None

    @property
    def needs(self) -> str:
        """For an undecided claim: "undecided at n = .., the registered effect needs about n = ..". """
        p = self.primary
        if self.verdict != "undecided" or self.not_run or p is None or self.estimate is None \
                or zero_information(self.estimate):
            return ""
        needs = f"about n = {p.n_needed:g}" if p.n_needed is not None else \
            f"more than {MAX_N} (or a truth the registered range cannot hold)"
        return (f"undecided at n = {p.n_units:g} {p.unit} per arm; detecting the registered effect "
                f"{p.effect:g} with {PROTOCOL.power:.0%} power at the level it was tested needs {needs}")


def expand(ps: PartSpec, e: ExpData) -> list[PartSpec]:
    """A ``for_each`` part, once per value of its swept key (in the experiment's sweep order)."""
    if not ps.for_each:
        return [ps]
    if e.sweep.empty or ps.for_each not in e.sweep.columns:
        raise NotRun(f"{e.name}: {ps.for_each} is not swept")
    out = []
    for v in dict.fromkeys(e.sweep[ps.for_each].tolist()):
        args = dict(ps.args)
        for sel in ("where", "a", "b", "num", "den"):
            if sel in args or sel == "where":
                args[sel] = {**(args.get(sel) or {}), ps.for_each: v}
        name = ps.name.format(value="none" if v is None else f"{v:g}" if isinstance(v, float) else v)
        out.append(PartSpec(name, ps.stat, ps.rule, ps.experiment, ps.role, ps.optional, None, args, ps.effect,
                            ps.rationale))
    return out


def zero_information(est: Estimate) -> str:
    """Why an estimate carries no information to decide on ("" when it does): every unit's value
    equal, or a standard error of 0, under a method whose interval would then have zero width.
    A betting interval on a registered range stays valid (and wide) on equal values."""
    if est.bounded or not est.flat:
        return ""
    if est.unit == "seeds":
        return f"all seeds equal (value {est.point:g})"
    return f"no spread information (standard error 0 at value {est.point:g})"


def _part(ps: PartSpec, est: Estimate, level: float, look: int = 0) -> Part:
    lo, hi = est.interval(level)
    if ps.rule is None:
        verdict = "reported"
    elif zero_information(est):
        verdict = "undecided"
    else:
        verdict = ps.rule.judge(est.point, lo, hi)
    return Part(ps.name, est.point, lo, hi, ps.rule.text if ps.rule else "", verdict, est.n_text, est.n, est.unit,
                ps.role, ps.rule, ps.experiment, level, method=est.method, effect=ps.effect, look=look)


def _data_at(e: ExpData, n: int | None) -> ExpData:
    return e if n is None else e.first_members(n)


@dataclass
class _Primary:
    """The primary test at the last look it reached: its estimate, nominal p-value, the look (an
    index into ``looks``, ``at_n`` seeds per arm), whether it is the plan's final judgement, and
    ``incomplete = (seeds, runs missing)`` where the next look is short of runs."""

    est: Estimate | None
    p_nom: float
    look: int
    at_n: int | None
    looks: list[int]
    alpha_stop: float
    final: bool
    incomplete: tuple[int, int] | None


def evaluate_claim(c: Claim, data: dict[str, ExpData], skipped: dict[str, str], quick: bool = False,
                   reached: dict[str, int] | None = None) -> Verdict:
    """The claim's primary test (at every look its experiment reached, stopping at the first
    whose boundary it crosses), its checks and reported parts at that look. Holm's level is
    applied afterwards (:func:`apply_holm`); until then the primary is shown at 95%."""
    pr = c.primary
    t = _primary_at_looks(pr, data, skipped, reached)
    est, look, looks, at_n = t.est, t.look, t.looks, t.at_n
    primary = _part(pr, est, PROTOCOL.check_level, look)
    v = Verdict(c.id, PILOT if quick else "undecided", pr.name, primary.point, primary.low, primary.high,
                PROTOCOL.check_level, est.n_text, [primary], estimate=est)
    notes = []
    if at_n is not None and len(looks) > 1:
        notes.append(f"Judged at look {look + 1} of {len(looks)} ({at_n} seeds per arm; looks at "
                     f"{', '.join(map(str, looks))}).")
    failed = _checks(c, v, data, skipped, t)
    _reported(c, v, data, skipped, t, notes)
    v.note = " ".join(notes)
    return _decide(v, t, failed, quick)


def _primary_at_looks(pr: PartSpec, data: dict[str, ExpData], skipped: dict[str, str],
                      reached: dict[str, int] | None) -> _Primary:
    """The primary's estimate at each look its experiment reached, stopping at the first whose
    alpha-spending boundary it crosses, or at the first look short of runs."""
    if pr.experiment not in data:
        raise NotRun(skipped.get(pr.experiment, f"{pr.experiment} not composed"))
    e = data[pr.experiment]
    e.require(1)
    looks = looks_of(pr.experiment)
    upto = (reached or {}).get(pr.experiment, 0)
    used = looks[: upto + 1] if looks else [None]
    alpha_stop = PROTOCOL.alpha / max(M_REGISTERED, 1)
    bounds = spending_boundaries(looks, alpha_stop) if len(looks) > 1 else []
    est, p_nom, look, stopped, incomplete = None, 1.0, 0, False, None
    for k, n in enumerate(used):
        sub = _data_at(e, n)
        absent = sub.missing() if k > 0 else 0
        if absent:  # a look the plan reached whose runs are not all there (a stopped --run)
            incomplete = (n, absent)
            break
        est = KINDS[pr.stat](sub, pr.args)
        p_nom = 1.0 if zero_information(est) else decision_p(est, pr.rule.judge)
        look = k
        if bounds and k < len(looks) - 1 and p_nom <= nominal_level(bounds[k]):
            stopped = True  # crossed the stopping boundary at this look: judged here
            break
    final = incomplete is None and (stopped or len(looks) < 2 or look == len(looks) - 1)
    return _Primary(est, p_nom, look, used[look], looks, alpha_stop, final, incomplete)


def _checks(c: Claim, v: Verdict, data: dict[str, ExpData], skipped: dict[str, str],
            t: _Primary) -> tuple[str, str] | None:
    """Append the claim's checks at the primary's look to ``v.parts``; return the first failed
    one as ``(role, why)`` (a failed power check gives way to a later failure of another role)."""
    failed = None
    for ps in c.checks:
        if ps.experiment not in data:
            why = skipped.get(ps.experiment, f"{ps.experiment} not composed")
            v.parts.append(Part(ps.name, math.nan, math.nan, math.nan, ps.rule.text, "undecided", "not run",
                                role=ps.role, spec=ps.rule, experiment=ps.experiment))
            failed = failed or (ps.role, f"{ps.role} check {ps.name!r} not run ({why})")
            continue
        try:
            for one in expand(ps, data[ps.experiment]):
                part = _part(one, KINDS[one.stat](_data_at(data[one.experiment], t.at_n), one.args),
                             PROTOCOL.check_level, t.look)
                v.parts.append(part)
                if part.verdict != "supported" and (failed is None or failed[0] == "power"):
                    failed = (ps.role, f"{ps.role} check {one.name!r} not supported ({part.verdict} at "
                                       f"{PROTOCOL.check_level:.0%})")
        except (NotRun, Undecidable) as exc:
            v.parts.append(Part(ps.name, math.nan, math.nan, math.nan, ps.rule.text, "undecided", "not run",
                                role=ps.role, spec=ps.rule, experiment=ps.experiment))
            failed = failed or (ps.role, f"{ps.role} check {ps.name!r} not run ({exc})")
    return failed


def _reported(c: Claim, v: Verdict, data: dict[str, ExpData], skipped: dict[str, str], t: _Primary,
              notes: list[str]) -> None:
    """Append the claim's reported parts at the primary's look to ``v.reported``; what could not
    be computed goes to ``notes``."""
    for ps in c.reported:
        if ps.experiment not in data:
            if not ps.optional:
                notes.append(f"{ps.name}: not run ({skipped.get(ps.experiment, 'not composed')}).")
            continue
        try:
            for one in expand(ps, data[ps.experiment]):
                v.reported.append(_part(one, KINDS[one.stat](_data_at(data[one.experiment], t.at_n), one.args),
                                        PROTOCOL.check_level, t.look))
        except (NotRun, Undecidable) as exc:
            notes.append(f"{ps.name}: {exc}")


def _decide(v: Verdict, t: _Primary, failed: tuple[str, str] | None, quick: bool) -> Verdict:
    """Whether the claim is tested at this look, and what decides it where it is not."""
    est, look, looks, at_n, incomplete = t.est, t.look, t.looks, t.at_n, t.incomplete
    if quick:
        v.deciding = "pilot (--quick): estimate and 95% interval only, no verdict"
        for part in v.parts:
            part.verdict = PILOT
        return v
    if failed is not None and failed[0] == "premise":
        v.verdict, v.deciding = "untestable", f"{failed[1]}: the claim's premise did not hold in these runs"
        return v
    if failed is not None:
        v.deciding = f"{failed[1]}: the design could not have detected the effect"
        return v
    if zero_information(est):
        v.deciding = f"undecided: {zero_information(est)}; a zero-width interval decides nothing"
        return v
    if est.unit == "seeds" and est.n < PROTOCOL.min_seeds:
        v.deciding = f"n = {est.n} < {PROTOCOL.min_seeds} seeds per arm: a learning claim is not decided below that"
        return v
    if not t.final:  # the plan goes on: judging here would be a peek the alpha spending does not pay for
        v.pending = True
        nxt = (f"({incomplete[0]} seeds) has {incomplete[1]} run(s) not run yet (--run runs them)" if incomplete
               else f"({looks[look + 1]} seeds) is not run yet (--run runs it)")
        v.deciding = f"sequential plan: not past its stopping boundary at {at_n} seeds per arm; its next look {nxt}"
        return v
    v.tested = True
    v.p = sequential_p(t.p_nom, look, looks, t.alpha_stop) if len(looks) > 1 else t.p_nom
    return v


def family(claims: dict[str, Claim] | None = None) -> list[str]:
    """Holm's family: every statistical claim of ``harness/conf/claims.yaml`` (the registered
    family, whatever ran or was asked for), and any other claim in ``claims`` (one judged from
    another file)."""
    return list(dict.fromkeys(cid for cid, c in {**CLAIMS_BY_ID, **(claims or {})}.items() if not c.exact))


def apply_holm(verdicts: list[Verdict], claims: dict[str, Claim] | None = None) -> None:
    """Holm's procedure over the whole family (:func:`family`): a claim not tested (not run, its
    premise failed, zero information, pending) counts with p = 1, so it is undecided and the
    levels of the others are the same whatever else ran. Sets each claim's level, interval,
    verdict and, when undecided, the n its registered effect needs."""
    claims = claims or CLAIMS_BY_ID
    tested = {v.claim: v.p for v in verdicts if v.tested}
    res = holm({cid: tested.get(cid, 1.0) for cid in family(claims)}, PROTOCOL.alpha)
    for v in verdicts:
        if v.not_run or v.exact or v.verdict == PILOT or v.estimate is None:
            continue
        pr = claims[v.claim].primary
        part = v.parts[0]
        alpha = res[v.claim].level
        level = 1 - alpha
        lo, hi = v.estimate.interval_alpha(alpha)
        part.low, part.high, part.level = lo, hi, level
        part.p = v.p
        v.low, v.high, v.level = lo, hi, level
        if not v.tested:
            part.verdict = "not tested"
            part.n_needed = _n_needed(v.estimate, pr, alpha)
            continue
        h = res[v.claim]
        v.rank, v.m, v.p_adjusted = h.rank, h.m, h.p_adjusted
        verdict = pr.rule.judge(v.point, lo, hi)
        part.verdict = verdict
        v.verdict = verdict if verdict in ("supported", "refuted") else "undecided"
        if v.verdict == "undecided":
            part.n_needed = _n_needed(v.estimate, pr, alpha)
            v.deciding = (f"primary undecided: its {level:.4%} interval (Holm rank {h.rank} of {h.m}) straddles "
                          f"{pr.rule.text}")
        else:
            v.deciding = f"primary {v.verdict}: {level:.4%} interval (Holm rank {h.rank} of {h.m}) vs {pr.rule.text}"


def _n_needed(est: Estimate, pr: PartSpec, alpha: float) -> float | None:
    return n_needed(est, pr.rule, pr.effect, alpha, PROTOCOL.power)


def eval_exact(claim: Claim, record: dict | None) -> Verdict:
    where = f'tests marked `@pytest.mark.claim("{claim.id}")`'
    if record is None:
        return Verdict(claim.id, "undecided", where, exact=True,
                       not_run="tests not run here (python -m analysis claims DIR --run runs them)")
    r = record.get("claims", {}).get(claim.id, {"nodes": [], "outcomes": []})
    nodes, outcomes = r["nodes"], r["outcomes"]
    if not nodes:
        why = record.get("unavailable")  # harness.experiments.run.run_exact_tests: no tests/ folder (a wheel)
        return Verdict(claim.id, "undecided", where, exact=True,
                       not_run=str(why) if isinstance(why, str) else f"no test marked claim({claim.id!r}) was collected")
    n_pass = sum(o == "passed" for o in outcomes)
    n_fail = sum(o == "failed" for o in outcomes)
    verdict = "refuted" if n_fail else "supported" if n_pass == len(outcomes) else "undecided"
    return Verdict(claim.id, verdict, "tests passed", float(n_pass), float(n_pass), float(n_pass), 1.0,
                   f"{len(nodes)} tests", exact=True,
                   note="tests: " + ", ".join(f"`{n}` ({o})" for n, o in zip(nodes, outcomes)))


def compose_all(root: Path, quick: bool, names: list[str], seed_offset: int, extended: dict) -> tuple[dict, dict]:
    skipped: dict[str, str] = {}
    points: dict[str, list[Point]] = {}
    for name in names:
        ex = EXPERIMENTS[name]
        if quick and ex.quick_skip:
            skipped[name] = ex.quick_skip
            continue
        if ex.family == "lm":
            reason = lm_unavailable()
            if reason:
                skipped[name] = reason
                continue
        if not (root / name).is_dir():  # nothing of it ran here: no need to compose its configs
            skipped[name] = f"{name}: no runs in DIR (run them: {run_command(name)})"
            continue
        try:
            points[name] = compose_points(name, root, quick, seed_offset, extended.get(name))
        except NotRun as exc:
            skipped[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported as the claim's reason
            skipped[name] = f"cannot compose {name}: {type(exc).__name__}: {exc}".splitlines()[0]
    return points, skipped


def evaluate_all(root: Path, quick: bool, only: set[str] | None = None, seed_offset: int = 0,
                 claims: list[Claim] | None = None, diverged: str = DEFAULT_DIVERGED,
                 ) -> tuple[list[Verdict], dict[str, ExpData], dict]:
    """Verdicts from what lies in ``root`` (runs nothing); ``diverged``: how a diverged run's
    score and AUC count after it diverged (:data:`analysis.stats.DIVERGED_RULES`)."""
    # every claim is judged (Holm's levels are the whole family's, --only or not); a pilot has no levels
    claims = [c for c in (claims or CLAIMS) if not quick or only is None or c.id in only]
    names = sorted({x for c in claims for x in c.experiments}, key=lambda x: (FAMILY_ORDER[EXPERIMENTS[x].family], x))
    plan = read_plan(root, quick, seed_offset)
    points, skipped = compose_all(root, quick, names, seed_offset, extensions(plan))
    data = {name: load_points(name, pts) for name, pts in points.items()}
    for e in data.values():
        e.diverged = diverged
    tests_json = root / "exact_tests.json"
    record = json.loads(tests_json.read_text()) if tests_json.is_file() else None
    reached = {name: int(e.get("reached", 0)) for name, e in plan.get("experiments", {}).items()}
    verdicts = []
    for c in claims:
        if c.exact:
            verdicts.append(eval_exact(c, record))
            continue
        try:
            verdicts.append(evaluate_claim(c, data, skipped, quick, reached))
        except NotRun as exc:
            verdicts.append(Verdict(c.id, "undecided", c.primary.name, not_run=str(exc)))
        except Undecidable as exc:
            verdicts.append(Verdict(c.id, "undecided", c.primary.name, deciding=f"undecided: {exc}"))
        except Exception as exc:  # an analysis error is reported, never turned into a verdict
            traceback.print_exc(file=sys.stderr)
            verdicts.append(Verdict(c.id, "undecided", c.primary.name,
                                    not_run=f"analysis error: {type(exc).__name__}: {exc}"))
    if not quick:
        apply_holm(verdicts, {c.id: c for c in claims})
    if only is not None:
        verdicts = [v for v in verdicts if v.claim in only]
    return verdicts, data, {"skipped": skipped, "tests": record, "plan": plan, "diverged": diverged}


from .report import (  # noqa: E402 - the report needs the names above
    ClaimsResult, ReportSettings, build_claims, build_claims_report, format_table, readme_table, stability,
)

__all__ = ["CLAIMS", "CLAIMS_BY_ID", "M_REGISTERED", "PROTOCOL", "VERDICTS", "Claim", "ClaimsResult", "ExpData",
           "NotRun", "Part", "ReportSettings", "Rule", "Verdict", "apply_holm", "build_claims", "build_claims_report",
           "evaluate_all", "evaluate_claim", "format_table", "load_claims", "readme_table", "stability", "sweep_key",
           "write_plan"]
