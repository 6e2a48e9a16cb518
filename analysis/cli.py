"""``python -m analysis <command>``: ``report`` (reads results), ``rliable`` (reads results, writes
rliable's score matrices as an .npz: :mod:`analysis.interop`) and ``claims`` (reads results; with
``--run`` it first runs the claim experiments that are missing, through :mod:`harness.experiments`).

Exit codes: 0 success, 2 bad input: an argument outside its allowed values (one line naming
the argument and what is allowed, no usage dump, no traceback), a folder without runs, an
output folder that cannot be written (checked before anything is computed), or a confirmatory
``claims --run`` while the claims differ from their registration (``claims --register`` writes
it: :mod:`analysis.claims.registry`; one line per change, before anything runs); 130 interrupted
(Ctrl-C: one line, ``interrupted; rerun the same command to resume``); 1 a full disk (or quota)
while writing an output: one line naming the file, ``cannot write <file>: No space left on device``
(the file is left as it was: every output is written atomically).
Every run either command leaves out (not finished, a non-finite score, a symlink, an
unreadable file) is printed with its path and reason, and listed in report.md / claims.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

from harness.interrupt import INTERRUPTED

from .options import (DEFAULT_DIVERGED, DEFAULT_REPS, DEFAULT_SEED, DIVERGED_RULES, EXPECTED, RAGGED, REPS_MAX,
                      SEED_OFFSET_MAX)

# The arguments are checked before anything heavy is imported: scipy (analysis.stats), seaborn and
# matplotlib (analysis.report) are imported by the command that runs, after parsing succeeded.


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``python -m analysis report: error: argument --reps: ...``."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(low: int, what: str = "an integer", high: int | None = None):
    """An argparse type: an integer >= ``low`` (and <= ``high``, where given)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}; allowed: {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not allowed; allowed: {allowed}")
        return value
    parse.__name__ = allowed.removeprefix("an ")
    return parse


def _unwritable(command: str, argument: str, folder: Path) -> int | None:
    """Exit code 2 after one line when ``folder`` (an output folder, created if missing) cannot
    be created or written: checked before anything is computed, as the harness checks its
    results_dir (:func:`harness.config.path_problem`, the same check). None when it can."""
    from harness.config import path_problem

    problem = path_problem(str(folder), writable=True)
    if problem is None:
        return None
    print(f"python -m analysis {command}: error: argument {argument}: {folder} cannot be written ({problem}); "
          "allowed: a folder the analysis can create and write", file=sys.stderr)
    return 2


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
    """A folder; a missing one only with --run (checked in :func:`_run_claims`), which creates it."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; allowed: an existing folder holding the claim "
                                         "experiments' runs")
    return path


def _npz_file(text: str) -> Path:
    path = Path(text)
    if path.suffix != ".npz" or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not allowed; allowed: a file name ending in .npz "
                                         "(not an existing folder; created or replaced)")
    return path


def _readme_file(text: str) -> Path:
    from .claims.report import markers_in

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file; allowed: an existing markdown file with the "
                                         "<!-- claims-table:start/end -->, <!-- claims-summary:start/end --> or "
                                         "<!-- claims-time:start/end --> markers")
    if not markers_in(path.read_text(errors="replace")):
        raise argparse.ArgumentTypeError(f"{text} has no <!-- claims-table:start --> ... <!-- claims-table:end -->, "
                                         "<!-- claims-summary:start --> ... <!-- claims-summary:end --> nor "
                                         "<!-- claims-time:start --> ... <!-- claims-time:end --> markers; allowed: "
                                         "a markdown file with one of these pairs")
    return path


def _claim_ids(text: str) -> set[str]:
    from .claims import CLAIMS_BY_ID

    ids = {c.strip().upper() for c in text.split(",") if c.strip()}
    unknown = sorted(ids - set(CLAIMS_BY_ID), key=lambda c: (len(c), c))
    if not ids or unknown:
        what = f"unknown claim id(s) {', '.join(unknown)}" if unknown else f"{text!r} names no claim"
        ids_all = list(CLAIMS_BY_ID)
        raise argparse.ArgumentTypeError(f"{what}; allowed: comma-separated ids among {ids_all[0]}-{ids_all[-1]}")
    return ids


def _last_n_argument(p) -> None:
    """``--last-n``: how many last evaluations a run's final score averages (report, rliable)."""
    p.add_argument("--last-n", type=_int_at_least(1), default=5, metavar="N",
                   help="final score = mean of the last N evaluations, N >= 1 (default: 5)")


def _diverged_argument(p) -> None:
    """``--diverged``: how a diverged run is scored (report, rliable, claims: :data:`DIVERGED_RULES`)."""
    p.add_argument("--diverged", choices=DIVERGED_RULES, default=DEFAULT_DIVERGED,
                   help="how a diverged run is scored after it diverged: worst = its task's worst return "
                        "(task.worst_return, else the lowest observed score of its task) for the rest of the "
                        "budget; last = its last evaluations carried forward (default: "
                        f"{DEFAULT_DIVERGED})")


def _report_arguments(p) -> None:
    p.add_argument("results", metavar="RESULTS", type=_existing_folder, help=EXPECTED)
    p.add_argument("--x", choices=["env_steps", "wall_time_s"], default="env_steps",
                   help="x axis of learning curves and diagnostics (default: env_steps)")
    _last_n_argument(p)
    p.add_argument("--out", type=_out_folder, default=None, metavar="DIR",
                   help="output folder, not an existing file (default: RESULTS/report)")
    p.add_argument("--reps", type=_int_at_least(1, high=REPS_MAX), default=DEFAULT_REPS,
                   help=f"bootstrap replicates, 1 to {REPS_MAX} (default: {DEFAULT_REPS})")
    p.add_argument("--seed", type=_int_at_least(0), default=DEFAULT_SEED,
                   help=f"bootstrap random seed, >= 0 (default: {DEFAULT_SEED})")
    _diverged_argument(p)


def _print_left_out(left_out: list, file=None) -> None:
    from .report import format_left_out

    if left_out:
        print(f"{len(left_out)} run(s) left out (not scored):", file=file)
        for line in format_left_out(left_out):
            print(f"  left out: {line}", file=file)


@contextlib.contextmanager
def _warnings_after():
    """Warnings raised inside the block, printed when it ends (after its error line, if it returns
    one): an :class:`AnalysisWarning` as one ``warning: ...`` line (one per skipped file, without
    warnings' source line), any other as Python shows it."""
    from .load import AnalysisWarning

    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", AnalysisWarning)
            yield
    finally:
        for w in caught:
            if issubclass(w.category, AnalysisWarning):
                print(f"warning: {w.message}", file=sys.stderr)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _run_report(args) -> int:
    out = Path(args.out) if args.out is not None else Path(args.results) / "report"
    if _unwritable("report", "--out" if args.out is not None else "RESULTS (its report/ folder)", out):
        return 2
    from .report import NoRunsError, Options, build_report, diverged_rule_text

    with _warnings_after():
        try:
            opts = Options(x=args.x, last_n=args.last_n, reps=args.reps, seed=args.seed, diverged=args.diverged)
            t = build_report(args.results, args.out, opts, progress=print)
        except (NoRunsError, FileNotFoundError, NotADirectoryError) as err:
            _print_left_out(getattr(err, "left_out", []))
            print(f"error: {err}", file=sys.stderr)
            return 2
    from .load import KINDS

    for kind, dirs in t.other_kinds.items():
        print(f"not compared: {len(dirs)} {KINDS[kind]}")
    if t.groups:
        print(f"{len(t.groups)} comparison groups (runs differ in {', '.join(t.group_keys)}; never pooled):")
    for g in t.groups or [t]:
        if g.group:
            print(f"[{g.group}]")
        runs = g.runs
        st = runs["status"].value_counts()
        print(f"{len(runs)} runs scored, {runs['task'].nunique()} task(s), {runs['estimator'].nunique()} "
              f"estimator(s): " + ", ".join(f"{int(st.get(s, 0))} {s}" for s in ("completed", "diverged"))
              + f"; {len(g.left_out)} left out")
        print(diverged_rule_text(g, args.last_n))
        _print_left_out(g.left_out)
        for r in g.scores.itertuples():
            print(f"  {r.task:<16} {r.estimator:<14} IQM {r.iqm:10.3f}  "
                  f"[{r.iqm_low:.3f}, {r.iqm_high:.3f}]  n={r.n_scored}")
    print(f"report: {out / 'report.md'}")
    return 0


def _probes_arguments(p) -> None:
    p.add_argument("results", metavar="RESULTS", type=_existing_folder,
                   help="a results folder holding probe runs (mode=probe)")
    p.add_argument("--out", type=_out_folder, default=None, metavar="DIR",
                   help="output folder, not an existing file (default: RESULTS/probes)")


def _run_probes(args) -> int:
    out = Path(args.out) if args.out is not None else Path(args.results) / "probes"
    if _unwritable("probes", "--out" if args.out is not None else "RESULTS (its probes/ folder)", out):
        return 2
    from .probes import NoProbesError, write_probe_report

    try:
        page = write_probe_report(args.results, out)
    except NoProbesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"probes: {page}")
    return 0


def _rliable_arguments(p) -> None:
    p.add_argument("results", metavar="RESULTS", type=_existing_folder, help=EXPECTED)
    p.add_argument("--out", type=_npz_file, default=None, metavar="FILE",
                   help="the .npz to write (default: RESULTS/rliable_scores.npz)")
    _last_n_argument(p)
    _diverged_argument(p)
    p.add_argument("--normalize", action="store_true",
                   help="min-max normalise each task's scores over all runs (the report's 'all tasks' scores)")
    p.add_argument("--ragged", choices=RAGGED, default="error",
                   help="an estimator with different numbers of scored runs per task: error (default) or "
                        "nan (short columns padded with NaN, which rliable does not skip)")


def _run_rliable(args) -> int:
    import numpy as np

    from .interop import score_matrices, write_rliable_npz
    from .load import load

    out = args.out if args.out is not None else Path(args.results) / "rliable_scores.npz"
    if _unwritable("rliable", "--out" if args.out is not None else "RESULTS", out.parent):
        return 2
    left_out: list = []
    with _warnings_after():
        try:
            df = load(args.results)
            left_out = df.attrs.get("left_out", [])
            scores, tasks = score_matrices(df, last_n=args.last_n, diverged=args.diverged,
                                           normalize=args.normalize, ragged=args.ragged)
        except (ValueError, FileNotFoundError, NotADirectoryError) as err:
            _print_left_out(left_out)
            print(f"error: {err}", file=sys.stderr)
            return 2
    write_rliable_npz(out, scores, tasks)
    _print_left_out(left_out)
    print(f"tasks (columns): {', '.join(tasks)}")
    for est, m in scores.items():
        nan = int(np.isnan(m).sum())
        print(f"  {est:<14} {m.shape[0]} runs x {m.shape[1]} tasks" + (f", {nan} NaN" if nan else ""))
    print(f"rliable scores: {out}")
    return 0


def _claims_arguments(p) -> None:
    p.add_argument("results", metavar="DIR", type=_claims_folder, nargs="?", default=None,
                   help="folder holding the claim experiments' runs (not with --register)")
    p.add_argument("--register", action="store_true",
                   help="write harness/conf/claims_registry.json from this checkout (the hash of the protocol and "
                        "of what decides each claim, with the date and commit each was registered at) and print "
                        "what changed since the last registration; commit it before a confirmatory --run")
    p.add_argument("--run", action="store_true",
                   help="run the missing claim experiments and the exact claims' tests first (finished runs are "
                        "skipped)")
    p.add_argument("--quick", action="store_true",
                   help="the quick variant of the experiments (smaller budgets, wider intervals, LM claims skipped)")
    p.add_argument("--only", type=_claim_ids, default=None, metavar="IDS",
                   help="comma-separated claim ids, e.g. C3,C5,C6")
    p.add_argument("--seed-offset", type=_int_at_least(0, high=SEED_OFFSET_MAX), default=0, metavar="K",
                   help="run/judge every experiment on seeds shifted by K (1000: disjoint from the default seeds); "
                        "each offset keeps its own report and every report shows all offsets side by side")
    _diverged_argument(p)
    p.add_argument("--readme", type=_readme_file, action="append", default=None, metavar="FILE",
                   help="also rewrite the claims blocks of the markdown file FILE (README.md, docs/claims.md, any "
                        "page) from the reports of every offset in DIR: the table between its claims-table markers, "
                        "the verdict counts between its claims-summary markers, where each offset's --run spent its "
                        "time between its claims-time markers; may be given more than once")
    p.add_argument("--publish", type=_out_folder, default=None, metavar="FOLDER",
                   help="also copy every offset's whole report and its figures from DIR into FOLDER (e.g. "
                        "docs/claims_reports), each page headed by the command, date and commit")


def _holds_runs(root: Path) -> bool:
    """Whether ``root`` holds anything ``claims`` judges: a run directory, or the exact claims'
    test record (``exact_tests.json``). Without either, nothing is written into it."""
    from .load import find_run_dirs

    return (root / "exact_tests.json").is_file() or bool(find_run_dirs(root))


def _register_claims(args) -> int:
    """``claims --register``: write the registry and print what changed since the last one."""
    given = [flag for flag, on in (("DIR", args.results is not None), ("--run", args.run), ("--quick", args.quick),
                                   ("--only", args.only), ("--seed-offset", args.seed_offset),
                                   ("--readme", args.readme), ("--publish", args.publish)) if on]
    if given:
        print(f"python -m analysis claims: error: argument --register: not with {', '.join(given)}; allowed: "
              "--register alone (it reads the checkout, not a results folder)", file=sys.stderr)
        return 2
    from .claims import registry

    try:
        changed = registry.register()
    except ValueError as exc:  # a malformed claims file or registry: one line naming it
        print(f"python -m analysis claims: error: argument --register: {exc}", file=sys.stderr)
        return 2
    reg = registry.load()
    page = registry.REPO / "docs" / "claims_list.md"  # the claims list shows each claim's registration
    if page.is_file():
        from .claims.register import write_list

        write_list(page)
        print(f"claims list written: {page.relative_to(registry.REPO)}")
    where = (f"{registry.REGISTRY_FILE.relative_to(registry.REPO)}: {len(reg['claims'])} statistical claims, "
             f"registered {reg['registered']} at commit {reg['commit']}")
    if not changed:
        print(f"claims registry: nothing changed since the last registration ({where})")
        return 0
    print(f"claims registry written ({where}); changed since the last registration:")
    for line in changed:
        print(f"  {line}")
    print("commit the registry with the change it registers")
    return 0


def _has_full_report(root: Path, quick: bool) -> bool:
    """Whether DIR holds a full claims report (any seed offset) for the README blocks to read."""
    from .claims.report import stability

    return bool(stability(root.resolve(), quick)["offsets"]) if root.is_dir() else False


def _refused_before_any_work(args) -> bool:
    """One line per reason on stderr, before any folder is made or anything runs: no DIR; README
    blocks asked of an ``--only`` command with no full report in DIR to write them from; or a
    confirmatory ``--run`` (not the ``--quick`` pilot) while the checkout differs from the claims
    registry (one line per change: a confirmatory run decides only registered claims)."""
    if args.results is None:
        print("python -m analysis claims: error: argument DIR: missing; allowed: a folder holding the claim "
              "experiments' runs (or --register alone)", file=sys.stderr)
        return True
    if args.readme and args.only is not None and not _has_full_report(Path(args.results), args.quick):
        print(f"python -m analysis claims: error: argument --readme: no full {'quick ' if args.quick else ''}claims "
              f"report in {args.results} to write the blocks from (--only writes claims_only.json, not the full "
              f"report); allowed: --readme after `python -m analysis claims {args.results}` has written one",
              file=sys.stderr)
        return True
    if not args.run or args.quick:
        return False
    from .claims import registry

    try:
        changed = registry.check()
    except ValueError as exc:
        changed = [str(exc)]
    for line in changed:
        print(f"python -m analysis claims: error: --run: not registered: {line}; first run "
              f"`{registry.REGISTER_COMMAND}` and commit {registry.REGISTRY_FILE.name}", file=sys.stderr)
    return bool(changed)


def _run_claims(args) -> int:
    import time

    if args.register:
        return _register_claims(args)
    if _refused_before_any_work(args) or _claims_folders_refused(args):
        return 2
    from . import claims

    t0 = time.time()
    command = "python -m analysis claims " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else \
        f"python -m analysis claims {args.results}"
    judged = _run_claim_looks(args, command) if args.run else None
    settings = claims.ReportSettings(quick=args.quick, only=args.only, seed_offset=args.seed_offset,
                                     diverged=args.diverged, command=command)
    res = claims.build_claims(args.results, settings, progress=print, judged=judged)
    _print_claims_summary(args, res, time.time() - t0)
    if args.readme:
        from .claims.report import update_pages

        cmd = (f"python -m analysis claims {args.results}{' --quick' if args.quick else ''} "
               + " ".join(f"--readme {f}" for f in args.readme))
        for written in update_pages(args.readme, Path(args.results).resolve(), args.quick, cmd):
            print(f"claims block: {written}")
    if args.publish:
        from .claims.report import publish

        for page in publish(Path(args.results).resolve(), args.quick, args.publish, command):
            print(f"published: {page}")
    print(f"report: {res.out}")
    return 0


def _claims_folders_refused(args) -> bool:
    """The results folder (unless --run makes it) holds runs, and every folder written to is
    writable; else one line on stderr and True."""
    if not args.run and not Path(args.results).exists():
        print(f"python -m analysis claims: error: argument DIR: {args.results} does not exist; allowed: an existing "
              "folder holding the claim experiments' runs (or --run, which runs them there)", file=sys.stderr)
        return True
    if not args.run and not _holds_runs(Path(args.results)):
        print(f"python -m analysis claims: error: argument DIR: {args.results} holds no runs (no run directory with "
              "metrics.parquet or summary.json, no exact_tests.json); allowed: a folder holding the claim "
              "experiments' runs (or --run, which runs them there)", file=sys.stderr)
        return True
    outputs = [("DIR", Path(args.results))] + [("--readme", f.parent) for f in args.readme or []]
    if args.publish:
        outputs.append(("--publish", Path(args.publish)))
    return any(_unwritable("claims", argument, folder) for argument, folder in outputs)


def _run_claim_looks(args, command: str) -> tuple:
    """``--run``: stage one (and every look an earlier --run of this offset reached), then each
    next look the sequential plans ask for, judging after each; the last judgement
    ``(verdicts, data, meta)``, which asks for nothing more."""
    import time

    from harness.experiments.run import ClaimStage, describe, run_claims  # the one named exception (.importlinter)
    from harness.io import atomic_write_json

    from . import claims
    from .claims.plan import extensions, next_looks, read_plan, variant, write_plan
    from .claims.report import commit

    t0 = time.time()
    started_at = commit()  # what the run ran (a later commit may write the docs block)
    root, only = Path(args.results).resolve(), args.only
    timings: dict[str, float] = {}
    stage = ClaimStage(reached=extensions(read_plan(root, args.quick, args.seed_offset)), timings=timings)
    totals = run_claims(root, quick=args.quick, only=only, seed_offset=args.seed_offset, progress=print, stage=stage)
    print(f"[claims] stage one: {describe(totals) or 'nothing to run'} ({time.time() - t0:.0f} s)")
    looks_run = 0
    while True:
        t_judge = time.time()
        verdicts, data, meta = claims.evaluate_all(root, args.quick, only, args.seed_offset, diverged=args.diverged)
        timings["judging"] = timings.get("judging", 0.0) + time.time() - t_judge
        plan = meta["plan"] if args.quick else next_looks(verdicts, claims.CLAIMS_BY_ID, meta["plan"])
        fresh = {name: {"population": e["looks"][e["reached"]]} for name, e in plan["experiments"].items()
                 if e.get("reached", 0) != meta["plan"].get("experiments", {}).get(name, {}).get("reached", 0)}
        if not fresh:
            break
        write_plan(root, args.quick, args.seed_offset, plan)
        looks_run += 1
        for name, e in fresh.items():
            print(f"[claims] next look: {name} to {e['population']} seeds per arm - "
                  + "; ".join(plan["experiments"][name].get("why", []))[:200])
        t1 = time.time()
        totals = run_claims(root, quick=args.quick, only=only, seed_offset=args.seed_offset, progress=print,
                            stage=ClaimStage(extensions=fresh, timings=timings))
        print(f"[claims] look {looks_run + 1}: {describe(totals) or 'nothing to run'} ({time.time() - t1:.0f} s)")
    if not only:  # the wall time of a whole run, for the docs blocks
        atomic_write_json(root / f"claims_run{variant(args.quick, args.seed_offset)}.json",
                          {"wall_s": time.time() - t0, "seconds": timings, "command": command,
                           "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": started_at})
    return verdicts, data, meta


def _print_claims_summary(args, res, seconds: float) -> None:
    """The verdicts' table and counts, the stability across seed offsets, the runs left out and
    those not run yet."""
    from . import claims

    verdicts, only = res.verdicts, args.only
    print(claims.format_table(verdicts))
    stat = [x for x in verdicts if not x.exact]
    exact = f"{sum(x.exact and x.verdict == 'supported' for x in verdicts)} of {sum(x.exact for x in verdicts)}"
    if args.quick:
        print(f"{len(stat)} statistical claims: pilot estimates only, no verdict; "
              f"{exact} exact checks passed  ({seconds:.0f} s)")
    else:
        counts = {v: sum(x.verdict == v and not x.not_run for x in stat) for v in claims.VERDICTS}
        not_run = sum(bool(x.not_run) for x in stat)
        print(f"{len(stat)} statistical claims: " + ", ".join(f"{n} {k}" for k, n in counts.items())
              + f", {not_run} not run; {exact} exact checks passed  ({seconds:.0f} s)")
    stab = claims.stability(Path(args.results).resolve(), args.quick)
    if len(stab["offsets"]) > 1:
        print(f"seed offsets {stab['offsets']}: {stab['summary']}")
    _print_left_out(res.left_out)
    if res.missing:
        ids = ",".join(sorted(only, key=lambda c: int(c[1:]))) if only else ""
        print(f"{res.missing} run director{'y' if res.missing == 1 else 'ies'} not run yet (python -m analysis "
              f"claims {args.results} --run{' --quick' if args.quick else ''}"
              f"{f' --seed-offset {args.seed_offset}' if args.seed_offset else ''}{' --only ' + ids if ids else ''})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m analysis",
                                     description="Analyse benchmark results folders.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add_arguments, run, text in _COMMANDS:
        p = sub.add_parser(name, **text)
        add_arguments(p)
        p.set_defaults(func=run)
    return parser


# the commands: name, its arguments, what runs it, its line in the command list (help) and its --help (description)
_COMMANDS = (
    ("report", _report_arguments, _run_report, {
        "help": "figures and report.md for a results folder",
        "description": "Load every run under RESULTS, compute rliable statistics, draw figures and write report.md "
                       "(default RESULTS/report/)."}),
    ("rliable", _rliable_arguments, _run_rliable, {
        "help": "the final scores as rliable's score matrices (.npz)",
        "description": "Final scores of every run under RESULTS (as in report.md) as rliable's "
                       "{estimator: scores[runs x tasks]}, written to an .npz: one array per estimator, the task "
                       "(column) names under _tasks (analysis.interop)."}),
    ("probes", _probes_arguments, _run_probes, {
        "help": "bias and variance tables and a figure for the probe runs (mode=probe) in RESULTS",
        "description": "Read every finished probe run (probe.parquet) under RESULTS and write probes.md and "
                       "probes.png (default RESULTS/probes/): per probe setting, each estimator's relative squared "
                       "bias, relative variance, SNR and cosines with their bootstrap intervals."}),
    ("claims", _claims_arguments, _run_claims, {
        "help": "verdicts for the claims from the runs in DIR (claims.md)",
        "description": "Verdicts for the claims of harness/conf/claims.yaml (docs/claims_list.md) from runs the "
                       "harness produced in DIR: DIR/claims.md, DIR/claims.json and DIR/claims_figures/. With --run, "
                       "first runs what is missing (every claim experiment's sweep and the exact claims' tests); "
                       "a --run without --quick refuses to start while the claims differ from their registration "
                       "(harness/conf/claims_registry.json), which --register writes."}),
)


def main(argv: list[str] | None = None) -> int:
    """Run the command; its exit code (the module docstring). Ctrl-C: one line on stderr,
    :data:`INTERRUPTED`, and 130 (the results it reads are not changed; rerunning the command
    writes its outputs again; ``claims --run`` skips the runs already finished)."""
    args = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help (0) or a bad argument (2, its one line already printed)
            return exc.code if isinstance(exc.code, int) else 2
        return args.func(args)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    except OSError as exc:  # a full disk under any output (each is written through harness.io's atomic writes)
        from harness.config import DISK_FULL, os_problem

        if exc.errno not in DISK_FULL:
            raise
        command = f" {args.command}" if args is not None else ""
        print(f"python -m analysis{command}: error: cannot write {os_problem(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # a malformed claim experiment file (read when the claims are): one line, exit 2
        from harness.experiments import BadExperimentFile

        if not isinstance(exc, BadExperimentFile):
            raise
        print(f"python -m analysis: error: {exc}", file=sys.stderr)
        return 2
