"""Code states the present: the harness's, the analysis's, the benchmarks' and the scripts' sources
carry no issue numbers, calendar dates or commit hashes (history lives in git; a measured number lives in a generated
docs block with its command and date)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "analysis", "benchmarks", "scripts")

NARRATION = {
    # our tracker's numbers; an upstream one cited as ``owner/repo#N`` is a source a reader can reach
    # (a hex colour, "#000000", is six digits: not an issue)
    "issue number": re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w.-])#\d{2,5}\b", re.I),
    "calendar date": re.compile(r"\b(19|20)\d{2}-(0[1-9]|1[0-2])(-\d{2})?\b"),
    # a git object name: 7 to 40 hex digits with at least one letter and one digit
    "commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
}


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def narration(text: str) -> list[str]:
    """``kind: line`` for each line of ``text`` that names an issue, a date or a commit."""
    return [f"{kind} in line {i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
            for kind, pattern in NARRATION.items() if pattern.search(line)]


@pytest.mark.parametrize("line, kind", [
    ("# checked since issue 12", "issue number"), ("(see #457)", "issue number"),
    ("took 3 s (2026-12-06)", "calendar date"), ("verl b178a3c's loss", "commit hash"),
])
def test_each_kind_of_narration_is_found(line, kind):
    assert [f"{kind} in line 1: {line}"] == narration(line)


@pytest.mark.parametrize("line", ["DIGITS = tuple('0123456789')", "size = 1500000", "arXiv:2508.10751",
                                  "lr: 3e-4 over 2048 steps", "RAY_OBJECT_STORE = 78643200",
                                  "(volcengine/verl#2953)", 'COLORS = ("#000000", "#008b8b")'])
def test_numbers_that_are_not_narration_pass(line):
    assert narration(line) == []


def test_no_source_narrates():
    found = [f"{p.relative_to(ROOT)}: {hit}" for p in sources() for hit in narration(p.read_text())]
    assert not found, "\n".join(found)
