"""``python -m analysis <command>``: ``report`` and ``claims`` (both read results; neither runs anything).

Exit codes: 0 success, 2 bad input: an argument outside its allowed values (one line naming
the argument and what is allowed, no usage dump, no traceback), or a folder without runs.
Every run either command leaves out (not finished, a non-finite score, a symlink, an
unreadable file) is printed with its path and reason, and listed in report.md / claims.md.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from . import stats
from .load import AnalysisWarning
from .report import EXPECTED, NoRunsError, build_report, diverged_rule_text, format_left_out


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``python -m analysis report: error: argument --reps: ...``."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(low: int, what: str = "an integer"):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}; allowed: an integer >= {low}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is not allowed; allowed: an integer >= {low}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _existing_folder(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; allowed: an existing folder ({EXPECTED})")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; allowed: an existing folder ({EXPECTED})")
    return path


def _out_folder(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is an existing file; allowed: a folder (created if missing)")
    return path


def _claims_folder(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; allowed: an existing folder holding the claim "
                                         "experiments' runs (python -m harness.experiments claims DIR)")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; allowed: an existing folder holding the claim "
                                         "experiments' runs")
    return path


def _claim_ids(text: str) -> set[str]:
    from .claims import CLAIMS_BY_ID

    ids = {c.strip().upper() for c in text.split(",") if c.strip()}
    unknown = sorted(ids - set(CLAIMS_BY_ID), key=lambda c: (len(c), c))
    if not ids or unknown:
        what = f"unknown claim id(s) {', '.join(unknown)}" if unknown else f"{text!r} names no claim"
        raise argparse.ArgumentTypeError(f"{what}; allowed: comma-separated ids among C1-C22")
    return ids


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="figures and report.md for a results folder",
                       description="Load every run under RESULTS, compute rliable statistics, "
                                   "draw figures and write report.md (default RESULTS/report/).")
    p.add_argument("results", metavar="RESULTS", type=_existing_folder, help=EXPECTED)
    p.add_argument("--x", choices=["env_steps", "wall_time_s"], default="env_steps",
                   help="x axis of learning curves and diagnostics (default: env_steps)")
    p.add_argument("--last-n", type=_int_at_least(1), default=5, metavar="N",
                   help="final score = mean of the last N evaluations, N >= 1 (default: 5)")
    p.add_argument("--out", type=_out_folder, default=None, metavar="DIR",
                   help="output folder, not an existing file (default: RESULTS/report)")
    p.add_argument("--reps", type=_int_at_least(1), default=stats.DEFAULT_REPS,
                   help=f"bootstrap replicates, >= 1 (default: {stats.DEFAULT_REPS})")
    p.add_argument("--seed", type=_int_at_least(0), default=stats.DEFAULT_SEED,
                   help=f"bootstrap random seed, >= 0 (default: {stats.DEFAULT_SEED})")
    p.add_argument("--diverged", choices=stats.DIVERGED_RULES, default=stats.DEFAULT_DIVERGED,
                   help="how a diverged run is scored after it diverged: worst = its task's worst return "
                        "(task.worst_return, else the lowest observed score of its task) for the rest of the "
                        "budget; last = its last evaluations carried forward (default: "
                        f"{stats.DEFAULT_DIVERGED})")
    p.set_defaults(func=_run_report)


def _print_left_out(left_out: list, file=None) -> None:
    if left_out:
        print(f"{len(left_out)} run(s) left out (not scored):", file=file)
        for line in format_left_out(left_out):
            print(f"  left out: {line}", file=file)


def _run_report(args) -> int:
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AnalysisWarning)
            t = build_report(args.results, args.out, x=args.x, last_n=args.last_n,
                             reps=args.reps, seed=args.seed, diverged=args.diverged, progress=print)
    except (NoRunsError, FileNotFoundError, NotADirectoryError) as err:
        _print_left_out(getattr(err, "left_out", []))
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
    print(f"{len(runs)} runs scored, {runs['task'].nunique()} task(s), {runs['estimator'].nunique()} "
          f"estimator(s): " + ", ".join(f"{int(st.get(s, 0))} {s}" for s in ("completed", "diverged"))
          + f"; {len(t.left_out)} left out")
    print(diverged_rule_text(t, args.last_n))
    _print_left_out(t.left_out)
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
    p.add_argument("results", metavar="DIR", type=_claims_folder,
                   help="folder holding the claim experiments' runs")
    p.add_argument("--quick", action="store_true",
                   help="judge the quick variant of the experiments (smaller budgets, wider intervals, LM claims "
                        "skipped), as run by python -m harness.experiments claims DIR --quick")
    p.add_argument("--only", type=_claim_ids, default=None, metavar="IDS",
                   help="comma-separated claim ids among C1-C22, e.g. C3,C5,C6")
    p.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # moved to harness.experiments
    p.set_defaults(func=_run_claims)


def _run_claims(args) -> int:
    import time

    from . import claims

    only = args.only
    ids = ",".join(sorted(only, key=lambda c: int(c[1:]))) if only else ""
    command = (f"python -m harness.experiments claims {args.results}{' --quick' if args.quick else ''}"
               f"{' --only ' + ids if ids else ''}")
    if args.run:  # analysis only reads results; the harness runs the experiments
        print(f"analysis runs nothing; run the experiments with: {command}", file=sys.stderr)
        return 2
    t0 = time.time()
    res = claims.build_claims(args.results, quick=args.quick, only=only, progress=print)
    out, verdicts = res.out, res.verdicts
    print(claims.format_table(verdicts))
    counts = {v: sum(x.verdict == v and not x.not_run for x in verdicts) for v in claims.VERDICTS}
    not_run = sum(bool(x.not_run) for x in verdicts)
    print(f"{len(verdicts)} claims: " + ", ".join(f"{n} {k}" for k, n in counts.items())
          + f", {not_run} not run  ({time.time() - t0:.0f} s)")
    _print_left_out(res.left_out)
    if res.missing:
        print(f"{res.missing} run director{'y' if res.missing == 1 else 'ies'} not run yet ({command})")
    print(f"report: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m analysis",
                                     description="Analyse benchmark results folders.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_report(sub)
    _add_claims(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a bad argument (2, its one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    return args.func(args)
