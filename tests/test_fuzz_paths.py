"""Paths and output folders nothing can be written to (issue 36, items 8, 9 and 10).

One table per class of path, each row a kind of path worked out by hand:

* ``RESULTS_DIR_CASES``: a results_dir Hydra cannot create (a folder name longer than the file
  system takes, a whole path longer than ``PATH_MAX``, a symlink loop, a dangling symlink, a
  path through either). :func:`harness.validation.validate` refuses each by name, and so does
  the command line, before Hydra makes its job folder (one line, exit code 2, nothing created).
* ``JOB_DIR_CASES``: results_dir itself fine, but the job folder Hydra makes inside it is not
  (``results_dir/.hydra`` a regular file, or under a dangling symlink); or ``hydra.run.dir``
  set elsewhere to such a path (:func:`harness.callbacks.refuse_unusable_results_dir`).
* ``OUTPUT_CASES``: the output folders of ``python -m analysis`` (``report --out``, the default
  ``RESULTS/report``, ``rliable --out``, ``claims DIR``): one line naming the argument, exit code
  2, before anything is computed. Root ignores chmod, so "read-only" is what the check meets when
  it tries to make a folder there (``tempfile.mkdtemp`` raising ``EROFS``, as the harness's own
  test of a read-only results_dir does), and, through the real command line, ``/proc``.
* ``analysis claims`` on a folder without runs: exit code 2 and nothing written into it.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.app import run
from harness.callbacks import refuse_unusable_results_dir

from .analysis_fixtures import make_sweep, run_analysis_cli
from .control_helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]
TINY = ["task=cartpole", "estimator=a2c", "budget.iterations=1", "task.num_envs=2", "task.rollout_steps=8",
        "eval_every=0", "progress=false", "task.hidden=[8]", "minibatches=1", "threads=1"]
LONG = "a" * 300  # one folder name: ext4, tmpfs, xfs take 255 bytes


def _loop(tmp: Path) -> Path:
    (tmp / "loop1").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop1")
    return tmp / "loop1"


def _dangling(tmp: Path) -> Path:
    (tmp / "dangling").symlink_to(tmp / "nowhere" / "x")
    return tmp / "dangling"


def _fits_alone(t: Path) -> Path:
    """A results_dir of 4046 bytes: under PATH_MAX (4096) itself, but a run folder in it
    (``/cartpole/a2c/seed0-<10 hex>``, 30 bytes) with its checkpoint's temp file
    (``/.checkpoint.safetensors.<8 random>.tmp``, 37) is over: 4046 + 30 + 37 = 4113."""
    path = str(t)
    while len(path) < 4046 - 251:
        path += "/" + "e" * 250
    path += "/" + "f" * (4046 - len(path) - 1)
    assert len(path) == 4046
    return Path(path)


# kind -> (make it under tmp: returns results_dir, what the one line must contain)
RESULTS_DIR_CASES = {
    "folder_name_too_long": (lambda t: t / LONG, "is 300 bytes long (at most 255)"),
    "folder_name_too_long_deeper": (lambda t: t / "ok" / LONG / "x", "is 300 bytes long (at most 255)"),
    "path_too_long": (lambda t: Path(t, *["b" * 250] * 17), "bytes long (at most 4095)"),  # 17 x 251 > 4096
    "run_folders_too_long": (_fits_alone, "xxxxxxxx.tmp is 4113 bytes long (at most 4095)"),
    "symlink_loop": (lambda t: _loop(t), "loop1 is a symlink loop"),
    "under_a_symlink_loop": (lambda t: _loop(t) / "res", "loop1 is a symlink loop"),
    "dangling_symlink": (lambda t: _dangling(t), f"dangling is a dangling symlink (to {{t}}{os.sep}nowhere"),
    "under_a_dangling_symlink": (lambda t: _dangling(t) / "res", "dangling is a dangling symlink"),
}


def _expected(text: str, tmp: Path) -> str:
    return text.replace("{t}", str(tmp))


@pytest.mark.parametrize("kind", list(RESULTS_DIR_CASES))
def test_results_dir_hydra_cannot_create_is_refused_by_validate(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make, expected = RESULTS_DIR_CASES[kind]
    results_dir = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError) as info:
        run(make_cfg([*TINY, f"results_dir={results_dir}"]))
    message = str(info.value)
    assert message.startswith("results_dir must be a folder the harness can create and write"), message
    assert _expected(expected, tmp_path) in message, message
    assert "\n" not in message
    assert sorted(os.listdir(tmp_path)) == before  # nothing created


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("kind", ["folder_name_too_long", "symlink_loop", "dangling_symlink"])
def test_results_dir_hydra_cannot_create_through_the_cli(kind, tmp_path):
    """Before the fix Hydra's own mkdir ended these in a traceback (exit code 1)."""
    make, expected = RESULTS_DIR_CASES[kind]
    results_dir = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    out = _cli([*TINY, f"results_dir={results_dir}"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.splitlines() == [out.stdout.strip()] and out.stdout.startswith(
        "invalid config: results_dir must be a folder the harness can create and write ("), out.stdout
    assert _expected(expected, tmp_path) in out.stdout, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    assert sorted(os.listdir(tmp_path)) == before


def _hydra_file(tmp: Path) -> tuple[Path, str]:
    res = tmp / "res"
    res.mkdir()
    (res / ".hydra").write_text("a file where Hydra makes its job folders")
    return res, f"{res / '.hydra'} exists and is not a directory"


def _hydra_dangling(tmp: Path) -> tuple[Path, str]:
    res = tmp / "res"
    res.mkdir()
    (res / ".hydra").symlink_to(tmp / "gone")
    return res, f"{res / '.hydra'} is a dangling symlink (to {tmp / 'gone'})"


# kind -> (make it: (results_dir, expected text), the job folder under results_dir or None for Hydra's own)
JOB_DIR_CASES = {
    "dot_hydra_a_file": (_hydra_file, None),
    "dot_hydra_a_dangling_symlink": (_hydra_dangling, None),
    "job_folder_name_too_long": (lambda t: (t / "res", "is 256 bytes long (at most 255)"), "d" * 256),
}


@pytest.mark.parametrize("kind", list(JOB_DIR_CASES))
def test_job_folder_hydra_cannot_create_is_one_line(kind, tmp_path, capsys):
    make, job = JOB_DIR_CASES[kind]
    res, expected = make(tmp_path)
    before = sorted(os.listdir(tmp_path))
    job_dir = str(res / (job or ".hydra/runs/2026-01-01_00-00-00-000000"))
    with pytest.raises(SystemExit) as info:
        refuse_unusable_results_dir(OmegaConf.create({"results_dir": str(res), "hydra": {"run": {"dir": job_dir}}}),
                                    "hydra.run.dir")
    assert info.value.code == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("invalid config: results_dir must be"), lines
    assert expected in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == before


def test_hydra_run_dir_outside_results_dir_is_named_as_itself(tmp_path, capsys):
    _dangling(tmp_path)
    job = tmp_path / "dangling" / "job"
    with pytest.raises(SystemExit) as info:
        refuse_unusable_results_dir(OmegaConf.create({"results_dir": str(tmp_path / "res"),
                                                      "hydra": {"run": {"dir": str(job)}}}), "hydra.run.dir")
    assert info.value.code == 2
    out = capsys.readouterr().out.strip()
    assert out == (f"invalid config: hydra.run.dir must be a folder the harness can create and write "
                   f"({tmp_path / 'dangling'} is a dangling symlink (to {tmp_path / 'nowhere' / 'x'})), got '{job}'")


def test_dot_hydra_a_file_through_the_cli(tmp_path):
    res, expected = _hydra_file(tmp_path)
    out = _cli([*TINY, f"results_dir={res}"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.strip() == (f"invalid config: results_dir must be a folder the harness can create and "
                                  f"write ({expected}), got '{res}'"), out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    assert (res / ".hydra").read_text() == "a file where Hydra makes its job folders"
    assert sorted(os.listdir(res)) == [".hydra"]


# ---------------------------------------------------------------- output folders of the analysis
REPORT = "python -m analysis report: error: argument"


def _read_only(monkeypatch, where: Path) -> None:
    """Making a folder in ``where`` fails as on a read-only file system (root ignores chmod)."""
    real = tempfile.mkdtemp

    def mkdtemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == where:
            raise OSError(errno.EROFS, "Read-only file system", str(where))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)


# case -> (arguments after the command given results folder R and a read-only folder RO, the argument
# named, the folder the line names)
OUTPUT_CASES = {
    "report_out": (lambda r, ro: ["report", str(r), "--out", str(ro / "rep")], "report", "--out", "rep"),
    "report_default_out": (lambda r, ro: ["report", str(r)], "report", "RESULTS (its report/ folder)", "report"),
    "rliable_out": (lambda r, ro: ["rliable", str(r), "--out", str(ro / "s.npz")], "rliable", "--out", ""),
    "rliable_default_out": (lambda r, ro: ["rliable", str(r)], "rliable", "RESULTS", ""),
    "claims_dir": (lambda r, ro: ["claims", str(r), "--only", "C3"], "claims", "DIR", ""),
}


@pytest.mark.parametrize("case", list(OUTPUT_CASES))
def test_output_folder_that_cannot_be_written_is_refused_first(case, tmp_path, monkeypatch, capsys):
    import analysis.claims as claims
    import analysis.interop as interop
    import analysis.report as report
    from analysis.cli import main

    results = make_sweep(tmp_path / "res", estimators=("rloo",), tasks=("CartPole-v1",), seeds=(0, 1))
    ro = tmp_path / "ro"
    ro.mkdir()
    args, command, argument, sub = OUTPUT_CASES[case]
    args = args(results, ro)
    read_only = results if "default" in case or command == "claims" else ro
    _read_only(monkeypatch, read_only)
    computed = []
    for module, name in ((report, "build_report"), (interop, "score_matrices"), (claims, "build_claims"),
                         (claims, "evaluate_all")):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: computed.append(_n))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    folder = read_only / sub if sub else read_only
    assert err == [f"python -m analysis {command}: error: argument {argument}: {folder} cannot be written "
                   f"(cannot create folders in {read_only} (Read-only file system)); allowed: a folder the "
                   "analysis can create and write"], err
    assert computed == []
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_output_folder_root_cannot_make_through_the_cli(tmp_path):
    """/proc takes no new folder, even from root: before the fix report computed every table and
    figure, then ended in an OSError traceback."""
    results = make_sweep(tmp_path / "res", estimators=("rloo",), tasks=("CartPole-v1",), seeds=(0, 1))
    out = run_analysis_cli("report", str(results), "--out", "/proc/harness-test-report")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [
        f"{REPORT} --out: /proc/harness-test-report cannot be written (cannot create folders in /proc "
        f"(No such file or directory)); allowed: a folder the analysis can create and write"], out.stderr
    assert out.stdout == ""


def test_claims_on_a_folder_without_runs_exits_2_and_writes_nothing(tmp_path, capsys):
    from analysis.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a run")
    assert main(["claims", str(empty)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"python -m analysis claims: error: argument DIR: {empty} holds no runs (no run directory with "
                   "metrics.parquet or summary.json, no exact_tests.json); allowed: a folder holding the claim "
                   "experiments' runs (or --run, which runs them there)"], err
    assert sorted(os.listdir(empty)) == ["notes.txt"]


def test_dot_hydra_a_symlink_outside_is_refused_through_the_cli(tmp_path):
    """``results_dir/.hydra`` a symlink to a folder outside results_dir: Hydra would write its job
    folder there (issue 36 item 4). One line naming it, exit 2, nothing written outside."""
    res, outside = tmp_path / "res", tmp_path / "outside"
    res.mkdir()
    outside.mkdir()
    (res / ".hydra").symlink_to(outside, target_is_directory=True)
    out = _cli([*TINY, f"results_dir={res}"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.strip() == (f"invalid config: results_dir must be a folder the harness can create and "
                                  f"write ({res / '.hydra'} is a symlink (to {outside}): Hydra's job folder would "
                                  f"be written outside {res}), got '{res}'"), out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    assert os.listdir(outside) == [] and sorted(os.listdir(res)) == [".hydra"]
