"""README's first command, run as a user runs it, and its figure: the quickstart sweep
(``harness/conf/experiment/quickstart.yaml``) into a fresh folder, then its report.

Prints the wall time of each step and the report's score lines. With ``--docs`` it copies the
report's learning curves to ``docs/figures/quickstart_learning_curves.png`` (the README's figure)
and writes the README's ``quickstart`` block: the wall times and the final scores the report
printed, highest first, with this command and the date.

Usage::

    python benchmarks/quickstart.py [--out DIR] [--docs]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from suite_time import timed  # a sibling script: run from benchmarks/, its folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "docs" / "figures" / "quickstart_learning_curves.png"


def score_lines(report_output: str) -> list[str]:
    """The report's per-estimator lines (``task estimator IQM x [lo, hi] n=k``), in its order."""
    return [line.strip() for line in report_output.splitlines() if " IQM " in line]


def scores_text(lines: list[str]) -> str:
    """``estimator x [lo, hi]`` of each score line, highest IQM first, on one line."""
    parsed = []
    for line in lines:
        words = line.split()
        est, iqm = words[1], float(words[3])
        low, high = float(words[4].strip("[,")), float(words[5].strip("]"))
        parsed.append((-iqm, est, f"`{est}` {iqm:.1f} [{low:.1f}, {high:.1f}]"))
    return "; ".join(text for _, _, text in sorted(parsed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="results folder (default: a fresh temporary one)")
    parser.add_argument("--docs", action="store_true", help="write README's figure and quickstart block")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="quickstart-")) / "quickstart"
    train_s, _ = timed([sys.executable, "-m", "harness", "-m", "experiment=quickstart", f"results_dir={out}"])
    report_s, report = timed([sys.executable, "-m", "analysis", "report", str(out)])
    scores = score_lines(report)
    print(f"train: {train_s:.0f} s, report: {report_s:.0f} s")
    print("\n".join(scores))
    if args.docs:
        from harness.docs import write_block

        shutil.copyfile(out / "report" / "learning_curves.png", FIGURE)
        write_block(ROOT / "README.md", "quickstart", f"The sweep took {train_s / 60:.1f} min and the report "
                    f"{report_s:.0f} s; final scores, IQM over 3 seeds [95% interval]: {scores_text(scores)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
