"""How long the test suite takes here, whole and its fast subset, and which tests are slow.

Runs README's test command twice, one after the other (the whole suite with every test's
duration, then the fast subset), and prints both wall times. With ``--docs`` it writes

* ``tests/slow_tests.txt``: every test whose setup, call and teardown took more than ``--slow``
  seconds in the whole run (node ids without parameters: all cases of a slow test are slow),
  which ``tests/conftest.py`` marks ``slow``; so ``-m "not slow"`` is the fast subset (written
  before the fast subset is timed, so the time is that of the list written);
* the ``suite-time`` block of docs/tests.md: both times, the machine's cores, the date.

Usage::

    python benchmarks/suite_time.py [--slow 2.0] [--docs]

The times are of this machine in whatever state it is in (other work slows both runs alike).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = [sys.executable, "-m", "pytest", "-q", "-n", "auto", "--dist", "worksteal", "-p", "no:cacheprovider"]
FAST = [*FULL, "-m", "not slow"]
SLOW_FILE = ROOT / "tests" / "slow_tests.txt"
DURATION = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")


def timed(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds of ``cmd`` run in the repository, and its output; exits when it fails, with
    the ends of its output and error output."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[1:])} failed (exit {out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-2000:]}")
    return seconds, out.stdout


def slow_tests(output: str, threshold: float) -> list[str]:
    """Node ids (parameters dropped) whose setup, call and teardown together took over ``threshold`` s."""
    per = Counter()
    for line in output.splitlines():
        m = DURATION.match(line)
        if m:
            per[m.group(2)] += float(m.group(1))
    return sorted({node.split("[", 1)[0] for node, s in per.items() if s > threshold})


def summary_line(output: str) -> str:
    """pytest's last line: ``N passed, M skipped in ...``."""
    return output.strip().splitlines()[-1].strip("= ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=float, default=2.0, help="seconds past which a test is slow (default 2)")
    parser.add_argument("--docs", action="store_true", help="write tests/slow_tests.txt and docs/tests.md's block")
    args = parser.parse_args(argv)
    full_s, full_out = timed([*FULL, "--durations=0"])
    slow = slow_tests(full_out, args.slow)
    print(f"whole suite: {full_s / 60:.1f} min ({summary_line(full_out)}); {len(slow)} tests over {args.slow:g} s")
    if args.docs:  # the list first: the fast subset timed below is the one it makes
        SLOW_FILE.write_text(f"# Written by `python benchmarks/suite_time.py --docs`: tests over {args.slow:g} s.\n"
                             + "".join(f"{node}\n" for node in slow))
    fast_s, fast_out = timed(FAST)
    print(f"fast subset: {fast_s / 60:.1f} min ({summary_line(fast_out)})")
    if args.docs:
        from harness.docs import write_block

        write_block(ROOT / "docs" / "tests.md", "suite-time", "\n".join([
            f"| command | wall time on {os.cpu_count()} cores | tests |", "| --- | --- | --- |",
            f"| `python -m pytest -q -n auto --dist worksteal -m \"not slow\"` | {fast_s / 60:.1f} min | "
            f"{summary_line(fast_out)} |",
            f"| `python -m pytest -q -n auto --dist worksteal` | {full_s / 60:.1f} min | {summary_line(full_out)} |"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
