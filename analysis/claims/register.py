"""``python -m analysis.claims.register``: each statistical claim's registration, checked, and the
claims list written from it.

Prints every statistical claim's version, its registered ``rule_hash`` and the hash of its rule
and design in this checkout (:func:`.spec.rule_hash`), and exits 1 when any differs: a changed
rule or design needs a new version, a changelog entry and the new hash in ``harness/conf/claims.yaml``
(``tests/test_claims.py`` checks the same). ``--docs FILE`` writes the claims list (every claim,
its primary test, registered effect, rationale and design) between FILE's ``claims-list``
markers, so docs/claims_list.md says what harness/conf/claims.yaml registers and nothing else.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.experiments import EXPERIMENTS

from .spec import Claim, load_claims

START, END = "<!-- claims-list:start -->", "<!-- claims-list:end -->"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _design(c: Claim) -> str:
    looks = EXPERIMENTS[c.primary.experiment].looks
    seq = f"; looks at {', '.join(map(str, looks))} seeds per arm" if len(looks) > 1 else ""
    return ", ".join(f"`{x}`" for x in c.experiments) + seq


def list_markdown() -> str:
    """The claims list: statistical claims (primary test, effect, rationale, design), then exact checks."""
    claims = load_claims()
    lines = ["Written by `python -m analysis.claims.register --docs docs/claims_list.md` from `harness/conf/claims.yaml`.", "",
             "| id | claim | source | primary test: rule (registered effect) | why that effect | design | registered |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in claims:
        if c.exact:
            continue
        p = c.primary
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(c.source)} | {_cell(p.name)}: {_cell(p.rule.text)} "
                     f"({p.effect:g}) | {_cell(p.rationale)} | {_design(c)} | {c.registered}, v{c.version} |")
    lines += ["", "Exact checks (identities, unit tests marked `@pytest.mark.claim`):", "",
              "| id | claim | source | tests |", "| --- | --- | --- | --- |"]
    lines += [f"| {c.id} | {_cell(c.text)} | {_cell(c.source)} | {_cell(c.tests)} |" for c in claims if c.exact]
    return "\n".join(lines)


def write_list(page: Path) -> None:
    text = page.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{page}: no {START} ... {END} markers")
    page.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{list_markdown()}\n{END}",
                           text, flags=re.S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims.register",
                                     description="Check every claim's registered rule hash; write the claims list.")
    parser.add_argument("--docs", type=Path, default=None, metavar="FILE",
                        help="write the claims list between FILE's claims-list markers (docs/claims_list.md)")
    args = parser.parse_args(argv)
    stale = 0
    for c in load_claims():
        if c.exact:
            continue
        stale += not c.hash_ok
        print(f"{c.id:<4} version {c.version}  registered {c.rule_hash}  now {c.computed_hash}"
              + ("" if c.hash_ok else "  CHANGED: new version, changelog entry, new hash"))
    if args.docs:
        write_list(args.docs)
        print(f"claims list: {args.docs}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
