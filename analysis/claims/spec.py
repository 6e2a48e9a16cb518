"""The claims as data: ``conf/claims.yaml`` read into :class:`Claim` entries, checked once.

A malformed entry (an unknown statistic kind, rule or field) fails when the table is read, with
the claim id and the field named, never mid-report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.experiments import CLAIMS_FILE

from .kinds import KINDS
from .rules import Rule

PART_FIELDS = {"name", "stat", "rule", "role", "experiment", "optional", "primary", "for_each", "where", "num", "den",
               "a", "b", "column", "scope", "transform", "divide_by", "of", "paired", "metric", "op", "center",
               "extreme", "middle"}
CLAIM_FIELDS = {"text", "short", "source", "exact", "experiments", "parts", "reported"}


@dataclass(frozen=True)
class PartSpec:
    name: str
    stat: str
    rule: Rule | None  # None: reported, not judged
    experiment: str
    role: str = "judged"
    optional: bool = False
    primary: bool = False
    for_each: str | None = None
    args: dict = field(default_factory=dict)  # the kind's own fields


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    short: str
    source: str
    exact: bool = False
    experiments: tuple[str, ...] = ()
    parts: tuple[PartSpec, ...] = ()
    reported: tuple[PartSpec, ...] = ()

    @property
    def rule(self) -> str:
        """The claim's rule in words, generated from its parts' rules."""
        if self.exact:
            return "exact: every test marked @pytest.mark.claim(\"%s\") passes" % self.id
        bits = []
        for p in self.parts:
            each = f" (for each {p.for_each})" if p.for_each else ""
            role = " [must hold for a decision: power check]" if p.role == "power" else ""
            opt = " [optional: judged when its experiment ran]" if p.optional else ""
            name = p.name.replace("{value}", f"<{p.for_each}>") if p.for_each else p.name
            bits.append(f"{name}{each}: {p.rule.text}{role}{opt}")
        return "; ".join(bits)


def _part(cid: str, raw: dict, default_exp: str, judged: bool) -> PartSpec:
    where = f"conf/claims.yaml {cid} part {raw.get('name', '?')!r}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping")
    unknown = set(raw) - PART_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(PART_FIELDS)}")
    if raw.get("stat") not in KINDS:
        raise ValueError(f"{where}: stat must be one of {sorted(KINDS)}, got {raw.get('stat')!r}")
    if judged and "rule" not in raw:
        raise ValueError(f"{where}: a judged part needs a rule")
    rule = Rule.parse(raw["rule"]) if judged else None
    role = raw.get("role", "judged")
    if role not in ("judged", "power"):
        raise ValueError(f"{where}: role must be judged or power, got {role!r}")
    args = {k: v for k, v in raw.items() if k not in ("name", "stat", "rule", "role", "experiment", "optional",
                                                      "primary", "for_each")}
    return PartSpec(str(raw.get("name") or raw["stat"]), raw["stat"], rule, raw.get("experiment", default_exp),
                    role, bool(raw.get("optional", False)), bool(raw.get("primary", False)), raw.get("for_each"),
                    args)


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    raw = yaml.safe_load(Path(path).read_text())
    claims = []
    for cid, c in raw.items():
        unknown = set(c) - CLAIM_FIELDS
        if unknown:
            raise ValueError(f"conf/claims.yaml {cid}: unknown field(s) {sorted(unknown)}; allowed: "
                             f"{sorted(CLAIM_FIELDS)}")
        exps = tuple(c.get("experiments") or ())
        if not c.get("exact") and not exps:
            raise ValueError(f"conf/claims.yaml {cid}: needs experiments or exact: true")
        default = exps[0] if exps else ""
        parts = tuple(_part(cid, p, default, True) for p in c.get("parts") or ())
        for p in parts:
            if p.experiment not in exps:
                raise ValueError(f"conf/claims.yaml {cid} part {p.name!r}: experiment {p.experiment} is not among "
                                 f"the claim's experiments {list(exps)}")
        if not c.get("exact") and not parts:
            raise ValueError(f"conf/claims.yaml {cid}: needs parts")
        reported = tuple(_part(cid, p, default, False) for p in c.get("reported") or ())
        claims.append(Claim(str(cid), str(c["text"]), str(c.get("short") or c["text"]), str(c["source"]),
                            bool(c.get("exact", False)), exps, parts, reported))
    return claims
