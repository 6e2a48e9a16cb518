"""``python -m analysis <command>``: ``report`` and ``claims`` (both read results; neither runs anything).

Exit codes: 0 success, 2 bad input (argparse errors, or a folder without runs).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from . import stats
from .load import AnalysisWarning
from .report import EXPECTED, NoRunsError, build_report


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="figures and report.md for a results folder",
                       description="Load every run under RESULTS, compute rliable statistics, "
                                   "draw figures and write report.md (default RESULTS/report/).")
    p.add_argument("results", metavar="RESULTS", help=EXPECTED)
    p.add_argument("--x", choices=["env_steps", "wall_time_s"], default="env_steps",
                   help="x axis of learning curves and diagnostics (default: env_steps)")
    p.add_argument("--last-n", type=int, default=5, metavar="N",
                   help="final score = mean of the last N evaluations (default: 5)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="output folder (default: RESULTS/report)")
    p.add_argument("--reps", type=int, default=stats.DEFAULT_REPS,
                   help=f"bootstrap replicates (default: {stats.DEFAULT_REPS})")
    p.add_argument("--seed", type=int, default=stats.DEFAULT_SEED,
                   help=f"bootstrap random seed (default: {stats.DEFAULT_SEED})")
    p.set_defaults(func=_run_report)


def _run_report(args) -> int:
    if args.last_n < 1:
        print("error: --last-n must be at least 1", file=sys.stderr)
        return 2
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AnalysisWarning)
            t = build_report(args.results, args.out, x=args.x, last_n=args.last_n,
                             reps=args.reps, seed=args.seed, progress=print)
    except (NoRunsError, FileNotFoundError, NotADirectoryError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        # Printed after the fact, one line per skipped file, without warnings' source line.
        for w in caught:
            if issubclass(w.category, AnalysisWarning):
                print(f"warning: {w.message}", file=sys.stderr)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    runs = t.runs
    st = runs["status"].value_counts()
    print(f"{len(runs)} runs, {runs['task'].nunique()} task(s), {runs['estimator'].nunique()} "
          f"estimator(s): " + ", ".join(f"{int(st.get(s, 0))} {s}" for s in
                                        ("completed", "diverged", "failed", "incomplete")))
    for r in t.scores.itertuples():
        print(f"  {r.task:<16} {r.estimator:<14} IQM {r.iqm:10.3f}  "
              f"[{r.iqm_low:.3f}, {r.iqm_high:.3f}]  n={r.n_scored}")
    out = Path(args.out) if args.out is not None else Path(args.results) / "report"
    print(f"report: {out / 'report.md'}")
    return 0


def _add_claims(sub) -> None:
    p = sub.add_parser("claims", help="verdicts for the claims from the runs in DIR (claims.md)",
                       description="Verdicts for claims C1-C22 (CLAIMS.md) from runs the harness produced in DIR: "
                                   "DIR/claims.md, DIR/claims.json and DIR/claims_figures/. Runs nothing: "
                                   "python -m harness.experiments claims DIR [--quick] runs the experiments.")
    p.add_argument("results", metavar="DIR", help="folder holding the claim experiments' runs")
    p.add_argument("--quick", action="store_true",
                   help="judge the quick variant of the experiments (smaller budgets, wider intervals, LM claims "
                        "skipped), as run by python -m harness.experiments claims DIR --quick")
    p.add_argument("--only", default=None, metavar="IDS", help="comma-separated claim ids, e.g. C3,C5,C6")
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # moved to harness.experiments
    p.set_defaults(func=_run_claims)


def _run_claims(args) -> int:
    import time

    from . import claims

    command = (f"python -m harness.experiments claims {args.results}{' --quick' if args.quick else ''}"
               f"{' --only ' + args.only if args.only else ''}")
    if args.run:  # analysis only reads results; the harness runs the experiments
        print(f"analysis runs nothing; run the experiments with: {command}", file=sys.stderr)
        return 2
    only = None
    if args.only:
        only = {c.strip().upper() for c in args.only.split(",") if c.strip()}
        unknown = sorted(only - set(claims.CLAIMS_BY_ID))
        if unknown:
            print(f"error: unknown claim id(s) {unknown}; valid: C1-C22", file=sys.stderr)
            return 2
    t0 = time.time()
    out, verdicts = claims.build_claims_report(args.results, quick=args.quick, only=only, progress=print)
    print(claims.format_table(verdicts))
    counts = {v: sum(x.verdict == v and not x.not_run for x in verdicts) for v in claims.VERDICTS}
    not_run = sum(bool(x.not_run) for x in verdicts)
    print(f"{len(verdicts)} claims: " + ", ".join(f"{n} {k}" for k, n in counts.items())
          + f", {not_run} not run  ({time.time() - t0:.0f} s)")
    print(f"report: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis",
                                     description="Analyse benchmark results folders.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_report(sub)
    _add_claims(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    args = build_parser().parse_args(argv)
    return args.func(args)
