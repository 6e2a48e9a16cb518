"""Docs state the present: every docs page and the README, outside its generated blocks, fenced
code blocks and inline code spans, carries no calendar date, commit hash or issue number. A
measured number lives in a generated block that names the command and the date that wrote it
(:func:`harness.docs.write_block`); history lives in git."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_code_present import narration

ROOT = Path(__file__).resolve().parents[1]

# Pages this check leaves to other work, each with its reason. An entry that no longer narrates
# fails the test, so that it is dropped here once its page is rewritten.
ALLOWED: dict[str, str] = {}

# ``<!-- name:start -->`` ... ``<!-- name:end -->``: a block a script wrote, stamped with its date.
GENERATED = re.compile(r"<!--\s*([\w.-]+):start\s*-->.*?<!--\s*\1:end\s*-->", re.S)
# a fenced code block: three or more backticks or tildes, closed by the same fence
FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", re.S | re.M)
# an inline code span: a run of backticks closed by a run of the same length
INLINE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)


def prose(text: str) -> str:
    """``text`` less its generated blocks, fenced code blocks and inline code spans; each removed
    part keeps its newlines so that line numbers stay those of the page."""
    def blank(m: re.Match) -> str:
        return "\n" * m.group(0).count("\n")
    for pattern in (GENERATED, FENCED, INLINE):
        text = pattern.sub(blank, text)
    return text


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md")
                  if "claims_reports" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


def test_prose_drops_blocks_code_and_spans_but_keeps_line_numbers():
    page = ("a\n<!-- t:start -->\nWritten on 2026-12-01.\n<!-- t:end -->\n"
            "```\nseed0-1d47928fd8 2026-12-01\n```\nrun `abc1234f` now\n")
    assert prose(page) == "a" + "\n" * 7 + "run  now\n"
    assert narration(prose(page)) == []
    assert narration(prose(page.replace("`abc1234f` now", "abc1234f as of 2026-12"))) == [
        "calendar date in line 8: run abc1234f as of 2026-12",
        "commit hash in line 8: run abc1234f as of 2026-12"]


def test_an_unclosed_marker_leaves_its_text_checked():
    assert narration(prose("<!-- t:start -->\nsince issue 12\n")) == [
        "issue number in line 2: since issue 12"]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_narrates(page):
    name = str(page.relative_to(ROOT))
    found = narration(prose(page.read_text()))
    if name in ALLOWED:
        assert found, f"{name} no longer narrates: drop it from ALLOWED ({ALLOWED[name]})"
        return
    assert not found, f"{name}:\n" + "\n".join(found)
