"""``python -m analysis.claims.register``: the claims' registration, checked, and the claims list
written from it.

Prints each statistical claim's registration (date and commit, from the registry,
:mod:`.registry`) and exits 1, with one line per change, when the registry is not this
checkout's (``python -m analysis claims --register`` writes it; ``tests/test_claims_registry.py``
checks the same). ``--docs FILE`` writes the claims list (every claim, its primary test,
registered effect, rationale, design and registration) between FILE's ``claims-list`` markers, so
docs/claims_list.md says what harness/conf/claims.yaml registers and nothing else.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.experiments import EXPERIMENTS

from . import registry
from .spec import Claim, load_claims

START, END = "<!-- claims-list:start -->", "<!-- claims-list:end -->"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _design(c: Claim) -> str:
    looks = EXPERIMENTS[c.primary.experiment].looks
    seq = f"; looks at {', '.join(map(str, looks))} seeds per arm" if len(looks) > 1 else ""
    return ", ".join(f"`{x}`" for x in c.experiments) + seq


def _registered(entry: dict | None) -> str:
    return f"{entry.get('registered')} ({entry.get('commit')})" if entry else "not registered"


def list_markdown() -> str:
    """The claims list: statistical claims (primary test, effect, rationale, design), then exact checks."""
    claims = load_claims()
    entries = (registry.load() or {}).get("claims") or {}
    lines = ["Written by `python -m analysis claims --register` from "
             "`harness/conf/claims.yaml` and its registry, `harness/conf/claims_registry.json` (registered: date "
             "and commit).", "",
             "| id | claim | source | primary test: rule (registered effect) | why that effect | design | registered |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in claims:
        if c.exact:
            continue
        p = c.primary
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(c.source)} | {_cell(p.name)}: {_cell(p.rule.text)} "
                     f"({p.effect:g}) | {_cell(p.rationale)} | {_design(c)} | {_registered(entries.get(c.id))} |")
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
                                     description="Check the claims registry against this checkout; write the "
                                                 "claims list.")
    parser.add_argument("--docs", type=Path, default=None, metavar="FILE",
                        help="write the claims list between FILE's claims-list markers (docs/claims_list.md)")
    args = parser.parse_args(argv)
    reg = registry.load()
    for c in load_claims():
        if not c.exact:
            print(f"{c.id:<4} {registry.registration(c.id, reg)}")
    changed = registry.check()
    for line in changed:
        print(f"CHANGED since the registration: {line}")
    if changed:
        print(f"register: {registry.REGISTER_COMMAND} (and commit {registry.REGISTRY_FILE.name})")
    if args.docs:
        write_list(args.docs)
        print(f"claims list: {args.docs}")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
