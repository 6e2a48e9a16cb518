"""docs/compare.md followed literally: its files written into a fresh folder, its two commands run
there as a user would, and the report has the user's estimator beside the two built-ins."""
from __future__ import annotations

import re
from pathlib import Path

from tests.test_extend import FENCE, run

PAGE = Path(__file__).resolve().parents[1] / "docs" / "compare.md"


def test_the_page_gets_the_users_estimator_beside_two_builtins_in_the_report(tmp_path):
    blocks = FENCE.findall(PAGE.read_text())
    for _, title, body in blocks:
        if title:
            (tmp_path / title).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / title).write_text(body)
    commands = [line for lang, _, body in blocks if lang == "bash" for line in body.splitlines() if line.strip()]
    assert len(commands) == 2  # train, then report
    for line in commands:
        r = run(line, tmp_path)
        assert r.returncode == 0, line + "\n" + r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "report: results/compare/report/report.md"
    report = (tmp_path / "results/compare/report/report.md").read_text()
    rows = re.findall(r"^\| toy \| (\w+) \| (\d+)/(\d+) \|", report, re.M)  # the final-scores table
    assert sorted(rows) == [("grpo", "5", "5"), ("midrange", "5", "5"), ("rloo", "5", "5")]
