"""Signals, killed parents and the smaller faults of issue 36 (items 12, 13, 14 and the analysis's
size options of item 7).

* Ctrl-C (SIGINT to the whole process group, as a terminal sends it) ends ``python -m harness``
  (one run, and a joblib sweep) and ``python -m analysis`` with one line,
  ``interrupted; rerun the same command to resume``, and exit code 130; the interrupted run is
  not recorded as anything (its rerun resumes it) and its lock is free.
* SIGKILL of a joblib sweep's process ends its worker processes within seconds
  (:func:`harness.callbacks.watch_parent`), and leaves no lock held.
* One line, the right exit code: an unresolvable interpolation (``${oc.env:UNSET}``),
  ``hydra.launcher.n_jobs=0``, a full disk (exit code 1, the file named), an analysis size
  option out of its range.
"""
from __future__ import annotations

import errno
import fcntl
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .analysis_fixtures import make_sweep
from .control_helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]
INTERRUPTED = "interrupted; rerun the same command to resume"
TINY = ["task=cartpole", "estimator=a2c", "budget.iterations=1", "task.num_envs=2", "task.rollout_steps=8",
        "eval_every=0", "progress=false", "task.hidden=[8]", "minibatches=1", "threads=1"]
LONG = [*TINY, "budget.iterations=1000000"]  # still training when the signal comes


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(module: str, args: list[str], cwd: Path) -> subprocess.Popen:
    """``python -m module args`` in a session of its own (its process group: what a terminal
    signals on Ctrl-C), with SIGINT's default action, as a shell's command has it: a test runner's
    worker process (pytest-xdist's) ignores SIGINT, and a child inherits that."""
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_sigint_default)


def _wait_for(pattern: str, n: int, proc: subprocess.Popen, timeout: float = 150.0) -> list[str]:
    t0 = time.time()
    while len(found := glob.glob(pattern)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, f"no {pattern} after {timeout} s"
        time.sleep(0.1)
    return found


def _lock_is_free(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _session(pgid: int) -> list[str]:
    """The live (not zombie) processes of process group ``pgid``."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")]


def _ctrl_c_once(proc: subprocess.Popen, pattern: str, n: int, delay: float) -> list[str]:
    """Once ``n`` paths match ``pattern`` (and ``delay`` s more), one SIGINT to ``proc``'s process
    group, as a terminal's Ctrl-C: the command ends with exit code 130, the one line
    :data:`INTERRUPTED` on stderr and no traceback. Returns the matched paths."""
    try:
        found = _wait_for(pattern, n, proc)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    assert err.splitlines() == [INTERRUPTED], err
    assert "Traceback" not in out, out
    return found


# ---------------------------------------------------------------- Ctrl-C (item 12)
# case -> (harness arguments given results_dir R, run folders to wait for before the signal)
CTRL_C_CASES = {
    "one_run": (lambda r: [*LONG, f"results_dir={r}"], 1),
    "joblib_sweep": (lambda r: ["-m", *LONG, f"results_dir={r}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                "seed=0,1"], 2),
}


@pytest.mark.parametrize("case", list(CTRL_C_CASES))
def test_ctrl_c_is_one_line_exit_130_and_loses_nothing(case, tmp_path):
    args, n = CTRL_C_CASES[case]
    res = tmp_path / "res"
    proc = _start("harness", args(res), tmp_path)
    runs = _ctrl_c_once(proc, str(res / "cartpole" / "a2c" / "*" / "config.yaml"), n, 1.0)  # training has begun
    t0 = time.time()
    while _session(proc.pid) and time.time() - t0 < 30:  # the sweep's workers end with it
        time.sleep(0.2)
    for run in (Path(r).parent for r in runs):
        assert not (run / "summary.json").exists()  # not recorded as failed: the rerun resumes it
        assert _lock_is_free(run / ".lock")


def test_ctrl_c_in_the_analysis_is_one_line_exit_130(tmp_path):
    """Interrupted while computing (its output folder made, the bootstrap running)."""
    res = make_sweep(tmp_path / "res", estimators=("rloo", "reinforce"), tasks=("CartPole-v1",), seeds=(0, 1, 2))
    proc = _start("analysis", ["report", str(res), "--reps", "100000"], tmp_path)
    _ctrl_c_once(proc, str(res / "report"), 1, 0.3)


@pytest.mark.parametrize("command", ["report", "rliable", "claims"])
def test_ctrl_c_in_any_analysis_command(command, tmp_path, monkeypatch, capsys):
    import analysis.claims as claims
    import analysis.interop as interop
    import analysis.report as report
    from analysis.cli import main

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for module, name in ((report, "build_report"), (interop, "score_matrices"), (claims, "build_claims")):
        monkeypatch.setattr(module, name, interrupt)
    res = make_sweep(tmp_path / "res", estimators=("rloo",), tasks=("CartPole-v1",), seeds=(0,))
    try:
        code = main([command, str(res)])
    except KeyboardInterrupt:  # would end this whole pytest session
        pytest.fail("KeyboardInterrupt escaped analysis.cli.main")
    assert code == 130
    assert capsys.readouterr().err.splitlines() == [INTERRUPTED]


# ---------------------------------------------------------------- killed parents (item 13)
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())])
print(child.pid, flush=True)
time.sleep(300)
"""
_CHILD = """
import sys, time
from harness.callbacks import watch_parent
assert watch_parent(int(sys.argv[1]), poll_s=0.05)
print("watching", flush=True)
time.sleep(300)
"""
_NOT_A_WORKER = """
import os, sys
from harness.callbacks import watch_parent
print(watch_parent(os.getpid()), watch_parent(int(sys.argv[1])))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_watching_its_parent_ends_when_the_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], env=_env(), stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        t0 = time.time()
        while not _alive(child) and time.time() - t0 < 5:
            time.sleep(0.05)
        time.sleep(3)  # the child imports harness.callbacks and starts watching
        assert _alive(child)
        parent.kill()
        parent.wait()
        t0 = time.time()
        while _alive(child) and time.time() - t0 < 10:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its parent by 10 s"
    finally:
        os.killpg(parent.pid, signal.SIGKILL)


def test_watch_parent_does_nothing_outside_a_worker():
    """In the sweep's own process, and where the named process is alive but not the parent (a
    process a worker started): False, and the process goes on."""
    out = subprocess.run([sys.executable, "-c", _NOT_A_WORKER, str(os.getppid())], env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_killing_a_joblib_sweep_ends_its_workers_and_leaves_no_lock(tmp_path):
    """Before the fix the two loky workers trained on for minutes after the SIGKILL."""
    res = tmp_path / "res"
    proc = _start("harness", ["-m", *LONG, f"results_dir={res}", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                              "seed=0,1"], tmp_path)
    try:
        runs = _wait_for(str(res / "cartpole" / "a2c" / "*" / "config.yaml"), 2, proc)
        time.sleep(1.0)
        assert len([p for p in _session(proc.pid) if "LokyProcess" in p]) == 2
        proc.kill()
        proc.communicate(timeout=30)
        t0 = time.time()
        while _session(proc.pid) and time.time() - t0 < 15:
            time.sleep(0.1)
        left = _session(proc.pid)
    finally:
        for line in _session(proc.pid):  # what a failed assertion would leave behind
            os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], left
    for run in (Path(r).parent for r in runs):
        assert _lock_is_free(run / ".lock")  # what a rerun's claim takes (harness.io.RunDir.claim)


# ---------------------------------------------------------------- one line, the right exit code (item 14)
def test_unresolvable_interpolation_is_one_line(tmp_path, monkeypatch, capsys):
    from harness.app import main_entry

    monkeypatch.delenv("HARNESS_TEST_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg([*TINY, f"results_dir={tmp_path / 'res'}", "task.name=${oc.env:HARNESS_TEST_UNSET}"])
    with pytest.raises(SystemExit) as info:
        main_entry(cfg)
    assert info.value.code == 2
    assert capsys.readouterr().out.splitlines() == [
        "invalid config: task.name: KeyError raised while resolving interpolation: \"Environment variable "
        "'HARNESS_TEST_UNSET' not found\""]
    assert os.listdir(tmp_path) == []


def _harness(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = _env()
    env.pop("HARNESS_TEST_UNSET", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)


# case -> (arguments, the one line)
CLI_LINE_CASES = {
    "results_dir_interpolation": (["results_dir=${oc.env:HARNESS_TEST_UNSET}"],
                                  "invalid config: results_dir: KeyError raised while resolving interpolation: "
                                  "\"Environment variable 'HARNESS_TEST_UNSET' not found\""),
    "n_jobs_0": (["-m", "results_dir=res", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "seed=0,1"],
                 "invalid config: hydra.launcher.n_jobs must be a non-zero integer (n parallel jobs; -1 every core, "
                 "-2 all but one, ...) or null, got 0"),
}


@pytest.mark.parametrize("case", list(CLI_LINE_CASES))
def test_one_line_exit_2_through_the_cli(case, tmp_path):
    args, line = CLI_LINE_CASES[case]
    multirun = [a for a in args if a == "-m"]  # before the overrides
    out = _harness([*multirun, *TINY, *(a for a in args if a != "-m")], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.splitlines() == [line], out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    assert os.listdir(tmp_path) == []  # not even Hydra's job folder


@pytest.mark.parametrize("n_jobs,refused", [(0, True), (1.5, True), ("two", True), (True, True),
                                            (1, False), (2, False), (-1, False), (None, False)])
def test_launcher_n_jobs(n_jobs, refused, capsys):
    from harness.callbacks import refuse_bad_launcher

    config = OmegaConf.create({"hydra": {"launcher": {"n_jobs": n_jobs}}})
    if refused:
        with pytest.raises(SystemExit) as info:
            refuse_bad_launcher(config)
        assert info.value.code == 2
        assert capsys.readouterr().out.splitlines() == [
            "invalid config: hydra.launcher.n_jobs must be a non-zero integer (n parallel jobs; -1 every core, "
            f"-2 all but one, ...) or null, got {n_jobs!r}"]
    else:
        refuse_bad_launcher(config)
        assert capsys.readouterr().out == ""


def test_disk_full_names_the_file_and_exits_1(tmp_path, monkeypatch, capsys):
    """Every write after the run's config.yaml fails as on a full disk (``fsync`` with
    ``ENOSPC``, naming no file): the run's end writes metrics.parquet (then summary.json), which
    fails; recording it failed (:meth:`RunDir.finish`) writes metrics.parquet first again, which
    fails again and ends the command. Before the fix: ``cannot write results: ?: No space left on
    device`` and exit code 2."""
    from harness.app import main_entry

    real = os.fsync

    def fsync(fd):
        if not os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[1].startswith(".config.yaml."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.chdir(tmp_path)
    cfg = make_cfg([*TINY, f"results_dir={tmp_path / 'res'}"])
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SystemExit) as info:
        main_entry(cfg)
    assert info.value.code == 1
    (run,) = (tmp_path / "res" / "cartpole" / "a2c").iterdir()
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"cannot write results: {run / 'metrics.parquet'}: No space left on device")
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml"]  # no temp file left


# ---------------------------------------------------------------- the analysis's size options (item 7)
# arguments after RESULTS -> the one line's tail
SIZE_CASES = {
    "reps_10**12": (["report", "--reps", "1000000000000"], "report: error: argument --reps: 1000000000000 is not "
                                                            "allowed; allowed: an integer in [1, 100000]"),
    "reps_max+1": (["report", "--reps", "100001"], "report: error: argument --reps: 100001 is not allowed; "
                                                  "allowed: an integer in [1, 100000]"),
    "seed_offset_2**31": (["claims", "--seed-offset", "2147483648"], "claims: error: argument --seed-offset: "
                          "2147483648 is not allowed; allowed: an integer in [0, 2147483647]"),
}


@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_analysis_size_options_are_bounded(case, tmp_path, capsys):
    from analysis.cli import main

    (command, *args), tail = SIZE_CASES[case]
    assert main([command, str(tmp_path), *args]) == 2
    assert capsys.readouterr().err.splitlines() == [f"python -m analysis {tail}"]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("reps", ["100000", "1"])
def test_analysis_reps_at_its_bounds_is_accepted(reps):
    from analysis.cli import build_parser

    assert build_parser().parse_args(["report", ".", "--reps", reps]).reps == int(reps)
