"""The claims as data: ``harness/conf/claims.yaml`` read into :class:`Claim` entries, checked once.

The file has two blocks: ``protocol`` (the error control, :class:`.protocol.Protocol`) and
``claims``. A statistical claim has exactly one ``primary`` test (a statistic kind, its selection
of the experiment's configs, a rule with its registered smallest effect or margin and a one-line
``rationale``), optional ``checks`` (``role: premise``: not met makes the claim *untestable here*;
``role: power``: not met leaves it *undecided*; neither ever refutes) and ``reported`` quantities
(shown, not judged). Its registration (a hash of everything that decides it, with the date and
commit it was fixed at) is not in this file but in the generated registry, :mod:`.registry`.

A malformed entry (an unknown statistic kind, rule or field) fails when the table is read, with
the claim id and the field named, never mid-report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.experiments import BLOCK_HEAD, CLAIMS_FILE, EXPERIMENTS

from .kinds import KINDS
from .protocol import Protocol
from .rules import Rule

PART_FIELDS = {"name", "stat", "rule", "role", "experiment", "optional", "for_each", "where", "num", "den", "range",
               "a", "b", "column", "scope", "transform", "divide_by", "of", "metric", "op", "method", "paired",
               "extreme", "middle", "effect", "rationale"}
CLAIM_FIELDS = {"text", "short", "source", "exact", "experiments", "primary", "checks", "reported", "tests"}
ROLES = ("premise", "power")


@dataclass(frozen=True)
class PartSpec:
    name: str
    stat: str
    rule: Rule | None  # None: reported, not judged
    experiment: str
    role: str = "primary"  # primary | premise | power | reported
    optional: bool = False
    for_each: str | None = None
    args: dict = field(default_factory=dict)  # the kind's own fields
    effect: float = float("nan")  # primary: the registered smallest effect or margin
    rationale: str = ""


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    short: str
    source: str
    exact: bool = False
    experiments: tuple[str, ...] = ()
    primary: PartSpec | None = None
    checks: tuple[PartSpec, ...] = ()
    reported: tuple[PartSpec, ...] = ()
    tests: str = ""  # exact claims: what the tests check

    @property
    def parts(self) -> tuple[PartSpec, ...]:
        """The judged parts: the primary test, then its checks."""
        return ((self.primary,) if self.primary else ()) + self.checks

    @property
    def rule(self) -> str:
        """The claim's rule in words, generated from its parts' rules."""
        if self.exact:
            return "exact: every test marked @pytest.mark.claim(\"%s\") passes" % self.id
        p = self.primary
        bits = [f"primary: {p.name}: {p.rule.text} (registered effect {p.effect:g})"]
        for c in self.checks:
            each = f" (for each {c.for_each})" if c.for_each else ""
            name = c.name.replace("{value}", f"<{c.for_each}>") if c.for_each else c.name
            bits.append(f"{c.role} check: {name}{each}: {c.rule.text}")
        return "; ".join(bits)


def _part(cid: str, raw: dict, default_exp: str, role: str) -> PartSpec:
    where = f"harness/conf/claims.yaml {cid} {role} part {raw.get('name', '?') if isinstance(raw, dict) else '?'!r}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping")
    unknown = set(raw) - PART_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(PART_FIELDS)}")
    if raw.get("stat") not in KINDS:
        raise ValueError(f"{where}: stat must be one of {sorted(KINDS)}, got {raw.get('stat')!r}")
    judged = role != "reported"
    if judged and "rule" not in raw:
        raise ValueError(f"{where}: a judged part needs a rule")
    if not judged and "rule" in raw:
        raise ValueError(f"{where}: a reported part has no rule")
    rule = Rule.parse(raw["rule"]) if judged else None
    if role == "check":
        role = raw.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {list(ROLES)}, got {raw.get('role')!r}")
    elif "role" in raw:
        raise ValueError(f"{where}: role is for checks only")
    effect = float("nan")
    if role == "primary":
        if raw.get("for_each"):
            raise ValueError(f"{where}: a primary test is one test (no for_each)")
        effect = float(raw.get("effect", rule.distance))
        if not effect > 0:
            raise ValueError(f"{where}: needs a registered effect: a rule with a smallest effect (by), a margin "
                             "(equivalent, between) or an explicit effect: d > 0")
        if not str(raw.get("rationale", "")).strip():
            raise ValueError(f"{where}: needs a rationale (why this smallest effect or margin)")
    args = {k: v for k, v in raw.items() if k not in ("name", "stat", "rule", "role", "experiment", "optional",
                                                      "for_each", "effect", "rationale")}
    return PartSpec(str(raw.get("name") or raw["stat"]), raw["stat"], rule, raw.get("experiment", default_exp),
                    role, bool(raw.get("optional", False)), raw.get("for_each"), args, effect,
                    str(raw.get("rationale", "")).strip())


def _claim(cid: str, c: dict) -> Claim:
    if not isinstance(c, dict):
        raise ValueError(f"harness/conf/claims.yaml {cid}: must be a mapping")
    unknown = set(c) - CLAIM_FIELDS
    if unknown:
        raise ValueError(f"harness/conf/claims.yaml {cid}: unknown field(s) {sorted(unknown)}; allowed: {sorted(CLAIM_FIELDS)}")
    exact = bool(c.get("exact", False))
    exps = tuple(c.get("experiments") or ())
    base = dict(id=str(cid), text=str(c["text"]), short=str(c.get("short") or c["text"]), source=str(c["source"]),
                exact=exact)
    if exact:
        if c.get("primary") or c.get("checks") or exps:
            raise ValueError(f"harness/conf/claims.yaml {cid}: an exact claim is judged by its tests (no primary, checks "
                             "or experiments)")
        return Claim(**base, tests=str(c.get("tests", "")))
    if not exps:
        raise ValueError(f"harness/conf/claims.yaml {cid}: needs experiments or exact: true")
    for name in exps:
        if name not in EXPERIMENTS:
            raise ValueError(f"harness/conf/claims.yaml {cid}: unknown experiment {name!r} (no harness/conf/experiment/"
                             f"{name}.yaml with a '{BLOCK_HEAD}' block)")
    if not isinstance(c.get("primary"), dict):
        raise ValueError(f"harness/conf/claims.yaml {cid}: a statistical claim needs one primary test (a mapping)")
    primary = _part(cid, c["primary"], exps[0], "primary")
    checks = tuple(_part(cid, p, exps[0], "check") for p in c.get("checks") or ())
    reported = tuple(_part(cid, p, exps[0], "reported") for p in c.get("reported") or ())
    for p in (primary, *checks, *reported):
        if p.experiment not in exps:
            raise ValueError(f"harness/conf/claims.yaml {cid} part {p.name!r}: experiment {p.experiment} is not among "
                             f"the claim's experiments {list(exps)}")
    return Claim(**base, experiments=exps, primary=primary, checks=checks, reported=reported)


@dataclass(frozen=True)
class ClaimsFile:
    protocol: Protocol
    claims: list[Claim]


def load_claims_file(path: Path = CLAIMS_FILE) -> ClaimsFile:
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), dict):
        raise ValueError(f"{path}: needs a 'claims' mapping (and optional 'protocol')")
    unknown = set(raw) - {"protocol", "claims"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {sorted(unknown)}; allowed: protocol, claims")
    return ClaimsFile(Protocol.from_dict(raw.get("protocol")), [_claim(cid, c) for cid, c in raw["claims"].items()])


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    return load_claims_file(path).claims

