"""Bad arguments to `python -m analysis report|claims`: one line naming the argument and the
allowed values, exit code 2, no traceback (the real CLI in a subprocess)."""

from pathlib import Path

import pytest

from analysis.cli import main
from harness.experiments import CLAIM_IDS

from tests.analysis_fixtures import make_sweep, run_analysis_cli

FOLDER = "an existing folder (a folder containing run directories with metrics.parquet)"
CLAIMS_FOLDER = "an existing folder holding the claim experiments' runs"


def _cli(*args):
    return run_analysis_cli(*args, timeout=120)


def _cases(tmp: Path):
    f = tmp / "a.txt"
    f.write_text("x")
    ok = str(tmp)
    report = "python -m analysis report: error: argument"
    claims = "python -m analysis claims: error: argument"
    return [
        (["report", ok, "--reps", "0"], f"{report} --reps: 0 is not allowed; allowed: an integer in "
                                             "[1, 100000]"),
        (["report", ok, "--reps", "-5"], f"{report} --reps: -5 is not allowed; allowed: an integer in "
                                             "[1, 100000]"),
        (["report", ok, "--reps", "many"], f"{report} --reps: 'many' is not an integer; allowed: an integer in "
                                                "[1, 100000]"),
        (["report", ok, "--seed", "-1"], f"{report} --seed: -1 is not allowed; allowed: an integer >= 0"),
        (["report", ok, "--last-n", "0"], f"{report} --last-n: 0 is not allowed; allowed: an integer >= 1"),
        (["report", ok, "--out", str(f)], f"{report} --out: {f} is an existing file; allowed: a folder "
                                          "(created if missing)"),
        (["report", str(tmp / "missing")], f"{report} RESULTS: {tmp / 'missing'} does not exist; allowed: {FOLDER}"),
        (["report", str(f)], f"{report} RESULTS: {f} is a file; allowed: {FOLDER}"),
        (["report", ok, "--x", "tokens"], f"{report} --x: invalid choice: 'tokens' (choose from 'env_steps', "
                                          "'wall_time_s')"),
        (["report", ok, "--diverged", "best"], f"{report} --diverged: invalid choice: 'best' (choose from "
                                               "'worst', 'last')"),
        (["claims", str(tmp / "missing")], f"{claims} DIR: {tmp / 'missing'} does not exist; allowed: "
                                           f"{CLAIMS_FOLDER} (or --run, which runs them there)"),
        (["claims", str(f)], f"{claims} DIR: {f} is a file; allowed: {CLAIMS_FOLDER}"),
        (["claims", ok, "--only", "C3,C99,X"], f"{claims} --only: unknown claim id(s) X, C99; allowed: "
                                               f"comma-separated ids among C1-{CLAIM_IDS[-1]}"),
        (["claims", ok, "--only", ","], f"{claims} --only: ',' names no claim; allowed: comma-separated ids "
                                        f"among C1-{CLAIM_IDS[-1]}"),
    ]


#: The cases run through the real CLI too (each a whole interpreter start): one of each kind of
#: refusal (argparse's type and choice errors, the checks after parsing, both commands); every
#: case runs through ``main`` in-process below.
SUBPROCESS_CASES = [2, 5, 6, 9, 12]


def test_bad_arguments_are_one_line_exit_2_in_a_subprocess(tmp_path):
    cases = _cases(tmp_path)
    for args, line in (cases[i] for i in SUBPROCESS_CASES):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.splitlines() == [line], args
        assert r.stdout == "" and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]   # nothing written anywhere


@pytest.mark.parametrize("i", range(14))
def test_main_returns_2_for_the_same_arguments(i, tmp_path, capsys):
    args, line = _cases(tmp_path)[i]
    assert main(args) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]   # nothing written anywhere


#: Imported by a command once its arguments are good, never to refuse one.
HEAVY = ("scipy", "seaborn", "matplotlib.pyplot")


def test_a_bad_argument_is_refused_before_scipy_seaborn_or_pyplot_is_imported(tmp_path):
    """Each of report's, rliable's and claims' refusals in a fresh interpreter: the one line and exit
    code 2 come before any of :data:`HEAVY` is imported (together over a second of imports)."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    code = ("import json, sys; from analysis.cli import main; rc = main(json.loads(sys.argv[1])); "
            f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))")
    for args in (["report", str(tmp_path / "missing")], ["rliable", str(tmp_path), "--out", "scores.txt"],
                 ["claims", str(tmp_path), "--diverged", "best"]):
        r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=repo, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(repo)}, timeout=120)
        assert json.loads(r.stdout.splitlines()[-1]) == [2, []], (args, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "error: argument" in r.stderr, (args, r.stderr)


def test_the_package_names_resolve_on_first_use_to_the_submodules_objects():
    """``analysis.<name>`` of every name in ``analysis.__all__`` is the object its submodule defines,
    imported on first use; ``analysis.load`` stays the function once the submodule of that name is
    imported (as stats and interop import it)."""
    import importlib

    import analysis

    stats, interop, load = (importlib.import_module(f"analysis.{m}") for m in ("stats", "interop", "load"))
    assert analysis.load is load.load and callable(analysis.load)
    assert analysis.stats is stats
    for name in analysis.__all__:  # each defined in the first of load, stats, interop that has it
        want = stats if name == "stats" else next(vars(m)[name] for m in (load, stats, interop) if name in vars(m))
        assert getattr(analysis, name) is want, name
    assert set(analysis.__all__) <= set(dir(analysis))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        analysis.nope  # noqa: B018


def test_good_arguments_still_parse(tmp_path):
    from analysis.cli import build_parser

    a = build_parser().parse_args(["report", str(tmp_path), "--reps", "1", "--seed", "0", "--last-n", "1",
                                   "--out", str(tmp_path / "new")])
    assert (a.reps, a.seed, a.last_n, a.out, a.results) == (1, 0, 1, tmp_path / "new", tmp_path)
    assert a.diverged == "worst"                           # the conservative rule by default
    for rule in ("worst", "last"):
        assert build_parser().parse_args(["report", str(tmp_path), "--diverged", rule]).diverged == rule
    a = build_parser().parse_args(["claims", str(tmp_path), "--only", "c3, C5"])
    assert a.only == {"C3", "C5"}
    assert main(["report", "--help"]) == 0


def test_a_finished_command_ends_without_the_teardown_its_output_whole(tmp_path):
    """``python -m analysis`` ends a finished command through
    :func:`harness.interrupt.exit_without_teardown` (the interpreter's teardown was about 1 s of a
    4.4 s report): the command's exit code, its output whole (stdout block-buffered in a pipe), and
    an object's finalizer, which only the teardown would run, not run."""
    import os
    import subprocess
    import sys

    sweep = make_sweep(tmp_path / "sweep", estimators=("ppo_gae",), tasks=("CartPole-v1",), seeds=(0, 1))
    repo = Path(__file__).resolve().parents[1]
    code = ("import os, sys\n"
            "class Teardown:\n"
            "    def __del__(self, write=os.write):\n"
            "        write(1, b'teardown\\n')\n"
            "keep = Teardown()\n"
            f"sys.argv = ['analysis', 'rliable', {str(sweep)!r}, '--out', {str(tmp_path / 's.npz')!r}]\n"
            "from analysis.__main__ import cli\n"
            "cli()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "s.npz").exists() and r.stdout.strip() and "teardown" not in r.stdout, r.stdout


def test_readme_blocks_with_only_need_a_full_report_first(tmp_path, capsys):
    """``--readme`` writes its blocks from the full report; ``--only`` writes claims_only.json, so with
    no full report in DIR the command is refused before any work: one line, exit 2, nothing written."""
    page = tmp_path / "page.md"
    text = "a\n<!-- claims-table:start -->\n<!-- claims-table:end -->\n"
    page.write_text(text)
    root = tmp_path / "claims"
    root.mkdir()
    (root / "exact_tests.json").write_text("{}")  # a claims folder, with no report yet
    assert main(["claims", str(root), "--only", "C3", "--readme", str(page)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "argument --readme: no full claims report in" in err[0], err
    assert page.read_text() == text and sorted(p.name for p in root.iterdir()) == ["exact_tests.json"]
