"""Claims report: ``python -m analysis claims DIR [--run] [--quick] [--seed-offset K]``.

Every claim of ``conf/claims.yaml`` (the claims as data: source, experiments, parts, each part a
statistic kind with its selection and a rule) gets a row: statistic, 95% interval, n, verdict -
**supported**, **refuted** or **inconclusive** - and, when undecided, about how much data would
decide it. The rules (:mod:`.rules`) are fixed before any data is read and write their own text;
the statistics (:mod:`.kinds`) compute their own intervals; the figures are chosen by statistic
kind (:mod:`.figures`). Evidence is only what the harness produced in ``DIR`` for exactly the
configs of each experiment (:mod:`.evidence`). Exact claims quote the tests marked
``@pytest.mark.claim`` and their outcomes (``DIR/exact_tests.json``).

``--run`` first runs what is missing (:func:`harness.experiments.run.run_claims`); without it
nothing runs. ``--seed-offset K`` judges (and with ``--run`` runs) every experiment on seeds
shifted by K; each offset's verdicts are kept (``claims.json``, ``claims_seed<K>.json``) and every
report shows the verdicts of all offsets judged in DIR side by side: a decided verdict that
differs between offsets is reported as **unstable**.
"""
from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.experiments import EXPERIMENTS, FAMILY_ORDER, Point, lm_unavailable

from ..stats import DEFAULT_DIVERGED

from .evidence import ExpData, NotRun, compose_points, load_points, sweep_key
from .kinds import KINDS, group_bootstrap, paired_bootstrap
from .plan import extensions, make_plan, read_plan, write_plan
from .rules import VERDICTS, Part, Rule, combine, judge_part
from .spec import Claim, PartSpec, load_claims

CLAIMS: list[Claim] = load_claims()
CLAIMS_BY_ID = {c.id: c for c in CLAIMS}


@dataclass
class Verdict:
    claim: str
    verdict: str
    statistic: str = ""
    point: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    n: str = ""
    parts: list[Part] = field(default_factory=list)
    reported: list[Part] = field(default_factory=list)
    note: str = ""
    not_run: str | None = None  # reason, when the evidence is missing
    figure: str | None = None

    @property
    def label(self) -> str:
        if self.not_run:
            return f"inconclusive — not run: {self.not_run}"
        return self.verdict

    @property
    def needs(self) -> str:
        """For an undecided claim: the undecided parts' "undecided at n = .., needs about n = ..". """
        if self.verdict != "inconclusive" or self.not_run:
            return ""
        return "; ".join(f"{p.name}: {p.needs}" for p in self.parts if p.needs)


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
        out.append(PartSpec(name, ps.stat, ps.rule, ps.experiment, ps.role, ps.optional, ps.primary, None, args))
    return out


def _compute(ps: PartSpec, data: dict[str, ExpData]) -> Part:
    e = data[ps.experiment]
    e.require(1)
    st = KINDS[ps.stat](e, ps.args)
    if ps.rule is None:
        return Part(ps.name, st.point, st.low, st.high, "reported", "", st.n, st.n_units, None, "reported", st.unit,
                    experiment=ps.experiment)
    part = judge_part(ps.name, ps.rule, st.point, st.low, st.high, st.n_units, st.n, st.unit, ps.role)
    part.experiment = ps.experiment
    return part


def evaluate_claim(c: Claim, data: dict[str, ExpData], skipped: dict[str, str]) -> Verdict:
    """The claim's parts on the evidence; NotRun when a required part cannot be computed."""
    parts, primary, notes = [], 0, []
    for ps in c.parts:
        if ps.experiment not in data:
            why = skipped.get(ps.experiment, f"{ps.experiment} not composed")
            if ps.optional:
                notes.append(f"{ps.name}: not run ({why})")
                continue
            raise NotRun(why)
        try:
            for one in expand(ps, data[ps.experiment]):
                if ps.primary:
                    primary = len(parts)
                parts.append(_compute(one, data))
        except NotRun as exc:
            if ps.role == "power":  # a missing power check leaves the claim undecidable, not unjudged
                parts.append(Part(ps.name, float("nan"), float("nan"), float("nan"), ps.rule.text, "inconclusive",
                                  "not run", role="power", spec=ps.rule))
                notes.append(f"Power check {ps.name!r} not run ({exc}): the claim cannot be supported without it.")
            elif ps.optional:
                notes.append(f"{ps.name}: not run ({exc})")
            else:
                raise
    reported = []
    for ps in c.reported:
        try:
            if ps.experiment in data:
                reported += [_compute(one, data) for one in expand(ps, data[ps.experiment])]
        except NotRun as exc:
            notes.append(f"{ps.name}: {exc}")
    p = parts[primary]
    return Verdict(c.id, combine(parts), p.name, p.point, p.low, p.high, p.n, parts, reported, " ".join(notes))


def eval_exact(claim: Claim, record: dict | None) -> Verdict:
    where = f'tests marked `@pytest.mark.claim("{claim.id}")`'
    if record is None:
        return Verdict(claim.id, "inconclusive", where,
                       not_run="tests not run here (python -m analysis claims DIR --run runs them)")
    r = record.get("claims", {}).get(claim.id, {"nodes": [], "outcomes": []})
    nodes, outcomes = r["nodes"], r["outcomes"]
    if not nodes:
        return Verdict(claim.id, "inconclusive", where, not_run=f"no test marked claim({claim.id!r}) was collected")
    n_pass = sum(o == "passed" for o in outcomes)
    n_fail = sum(o == "failed" for o in outcomes)
    verdict = "refuted" if n_fail else "supported" if n_pass == len(outcomes) else "inconclusive"
    return Verdict(claim.id, verdict, "tests passed", float(n_pass), float(n_pass), float(n_pass),
                   f"{len(nodes)} tests", note="tests: " + ", ".join(f"`{n}` ({o})" for n, o in zip(nodes, outcomes)))


def evaluate_all(root: Path, quick: bool, only: set[str] | None = None, seed_offset: int = 0,
                 claims: list[Claim] | None = None, diverged: str = DEFAULT_DIVERGED,
                 ) -> tuple[list[Verdict], dict[str, ExpData], dict]:
    """Verdicts from what lies in ``root`` (runs nothing); ``diverged``: how a diverged run's
    score and AUC count after it diverged (:data:`analysis.stats.DIVERGED_RULES`)."""
    import json

    claims = [c for c in (claims or CLAIMS) if only is None or c.id in only]
    names = sorted({x for c in claims for x in c.experiments}, key=lambda x: (FAMILY_ORDER[EXPERIMENTS[x].family], x))
    skipped: dict[str, str] = {}
    points: dict[str, list[Point]] = {}
    plan = read_plan(root, quick, seed_offset)
    extended = extensions(plan)
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
        try:
            points[name] = compose_points(name, root, quick, seed_offset, extended.get(name))
        except NotRun as exc:
            skipped[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported as the claim's reason
            skipped[name] = f"cannot compose {name}: {type(exc).__name__}: {exc}".splitlines()[0]
    data = {name: load_points(name, pts) for name, pts in points.items()}
    for e in data.values():
        e.diverged = diverged
    tests_json = root / "exact_tests.json"
    record = json.loads(tests_json.read_text()) if tests_json.is_file() else None
    verdicts = []
    for c in claims:
        if c.exact:
            verdicts.append(eval_exact(c, record))
            continue
        try:
            verdicts.append(evaluate_claim(c, data, skipped))
        except NotRun as exc:
            verdicts.append(Verdict(c.id, "inconclusive", not_run=str(exc)))
        except Exception as exc:  # an analysis error is reported, never turned into a verdict
            traceback.print_exc(file=sys.stderr)
            verdicts.append(Verdict(c.id, "inconclusive", not_run=f"analysis error: {type(exc).__name__}: {exc}"))
    return verdicts, data, {"skipped": skipped, "tests": record, "plan": plan, "diverged": diverged}


from .report import (  # noqa: E402 - the report needs the names above
    ClaimsResult, build_claims, build_claims_report, format_table, readme_table, stability,
)

__all__ = ["CLAIMS", "CLAIMS_BY_ID", "VERDICTS", "Claim", "ClaimsResult", "ExpData", "NotRun", "Part", "Rule",
           "Verdict", "build_claims", "build_claims_report", "combine", "evaluate_all", "evaluate_claim",
           "format_table", "group_bootstrap", "judge_part", "load_claims", "make_plan", "paired_bootstrap", "readme_table",
           "stability", "sweep_key"]
