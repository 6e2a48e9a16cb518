"""Sweeps that survive faults (issue 7): SIGKILL at random moments, two sweeps on one folder,
runs held by another process.

The kill test runs the real command line (``python -m harness -m ...``) as a process group,
kills it with SIGKILL at moments drawn from a seeded RNG, checks the results folder's
invariants after every kill, reruns the same command, and at the end compares everything with
an uninterrupted sweep of the same command. ``HARNESS_TEST_WRITE_DELAY`` (harness/io/rundir.py)
makes every atomic write pause half-way, so that some kills land inside a write.
"""
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from harness.app import run
from harness.io import check_finished
from harness.io import checkpoint as ckpt
from harness.io.rundir import FINISHED, LOCK_FILE, WRITE_DELAY_ENV
from tests.control_helpers import TINY, make_cfg

# 4 jobs (one population of 2 seeds each) = 8 runs; whole-episode estimators stop their
# members at different iterations. Each population splits into two worker processes (one member
# each, killed with the sweep), so a restart skips the worker of a member that finished; the
# shadows of finished members are tested in-process (tests/test_checkpoint.py, rloo).
SWEEP = ["task=cartpole", "estimator=a2c,ppo_gae,rloo,remax", "seed=0", "population=2",
         "budget.env_steps=960", "task.num_envs=4", "task.rollout_steps=16", "task.episodes_per_iter=4",
         "group_size=2", "task.max_episode_steps=50", "task.hidden=[16]", "epochs=4", "minibatches=2",
         "eval_every=5", "eval_episodes=2", "checkpoint_every=2", "threads=1", "population_workers=2", "progress=false"]
N_RUNS = 8
REPO = Path(__file__).resolve().parents[1]
KILLS = 22
WRITE_DELAY = 0.01  # seconds inside each atomic write while killing (fsync adds ~5-10 ms)


def sweep_cmd(root: Path, estimators: str | None = None) -> list[str]:
    sweep = [f"estimator={estimators}" if estimators and a.startswith("estimator=") else a for a in SWEEP]
    return [sys.executable, "-m", "harness", "-m", *sweep, f"results_dir={root}"]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("cartpole/*/*") if p.is_dir())


def env_with(delay: float = 0.0) -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0")  # this checkout's harness, installed or not
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop(WRITE_DELAY_ENV, None)
    if delay:
        env[WRITE_DELAY_ENV] = str(delay)
    return env


def run_sweep(root: Path, log: Path, delay: float = 0.0) -> str:
    with open(log, "w") as out:
        proc = subprocess.run(sweep_cmd(root), stdout=out, stderr=subprocess.STDOUT, env=env_with(delay),
                              cwd=REPO, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def sweep_totals(text: str) -> dict[str, int]:
    """Counts from the ``[harness] sweep done: ...`` line."""
    (line,) = re.findall(r"\[harness\] sweep done: ([^(]*)", text)
    return {k: int(v) for v, k in re.findall(r"(\d+) (\w+)", line)}


def metrics(root: Path) -> dict[str, pd.DataFrame]:
    return {d.name: pq.read_table(d / "metrics.parquet").to_pandas().drop(columns=["wall_time_s"])
            for d in run_dirs(root) if (d / "metrics.parquet").exists()}


def summaries(root: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text())
            for d in run_dirs(root) if (d / "summary.json").exists()}


def assert_matches_reference(root: Path, ref: Path, n_runs: int = N_RUNS) -> None:
    """Every run of ``root`` finished with the reference's metrics (wall clock aside) and status."""
    got, want = metrics(root), metrics(ref)
    want = {k: v for k, v in want.items() if k in got} if n_runs < N_RUNS else want
    assert sorted(got) == sorted(want) and len(want) == n_runs
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True, obj=name)
    s_got, s_want = summaries(root), summaries(ref)
    assert sorted(s_got) == sorted(want)
    for name in s_got:
        got_s, want_s = s_got[name], s_want[name]
        assert (got_s["status"], got_s["iterations"]) == (want_s["status"], want_s["iterations"]), name


def check_invariants(root: Path) -> None:
    """What must hold at *any* moment, e.g. right after a SIGKILL."""
    for d in run_dirs(root):
        if (d / "metrics.parquet").exists():  # atomic writes: never a half-written file
            its = pq.read_table(d / "metrics.parquet").column("iteration").to_pylist()
            assert its == list(range(1, len(its) + 1)), (d, its)  # no duplicated or missing iterations
        if (d / "summary.json").exists():  # written last: complete metrics behind it
            status = json.loads((d / "summary.json").read_text())["status"]
            assert status in FINISHED and check_finished(d) == status, d
        if (d / ckpt.CHECKPOINT_FILE).exists():
            ckpt.load(d / ckpt.CHECKPOINT_FILE)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted sweep (no write delay)."""
    root = tmp_path_factory.mktemp("reference") / "results"
    text = run_sweep(root, root.parent / "log.txt")
    assert sweep_totals(text) == {"completed": N_RUNS}
    return root


def kill_once(cmd, root: Path, rng: random.Random, log: Path) -> str:
    """Start the sweep; SIGKILL its process group at a random moment. Returns where the kill
    landed: ``write`` (a temp file of an atomic write left behind), ``training`` (the process
    held a run), ``startup``, or ``finished`` (the sweep ended first)."""
    n_writes = rng.randint(0, 5)  # kill when this many writes have begun (0: at a random time)...
    # ...at once (inside that write: it pauses WRITE_DELAY half-way), or a while later, between writes
    extra = 0.0 if rng.random() < 0.5 else rng.uniform(0.03, 0.3)
    at = rng.uniform(0.5, 3.5)
    seen: set[str] = set()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env_with(WRITE_DELAY),
                                cwd=REPO, start_new_session=True)
        t0 = time.monotonic()
        while proc.poll() is None:
            if n_writes == 0:
                if time.monotonic() - t0 >= at:
                    break
            else:
                seen.update(p.name for p in root.glob("cartpole/*/*/.*.tmp"))
                if len(seen) >= n_writes:
                    if extra:  # then at a moment between writes (during training)
                        time.sleep(extra)
                        deadline = time.monotonic() + 2.0
                        while list(root.glob("cartpole/*/*/.*.tmp")) and time.monotonic() < deadline:
                            time.sleep(0.001)
                    break
            time.sleep(0.003)
            if time.monotonic() - t0 > 300:
                break
        if proc.poll() is not None:
            return "finished"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if list(root.glob("cartpole/*/*/.*.tmp")):
        return "write"
    holders = [(d / LOCK_FILE).read_text() for d in run_dirs(root) if (d / LOCK_FILE).exists()]
    if seen or any(f'"pid": {proc.pid},' in h for h in holders):
        return "training"
    return "startup"


def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_results(reference, tmp_path):
    root = tmp_path / "results"
    root.mkdir()
    cmd = sweep_cmd(root)
    rng = random.Random(20261130)
    landed: dict[str, int] = {}
    for i in range(KILLS):
        where = kill_once(cmd, root, rng, tmp_path / f"attempt{i}.txt")
        landed[where] = landed.get(where, 0) + 1
        check_invariants(root)
        if where == "finished":
            break
    print(f"kills: {KILLS - landed.get('finished', 0)} ({landed})")
    # then the same command, uninterrupted, finishes the sweep
    text = run_sweep(root, tmp_path / "final.txt")
    check_invariants(root)
    totals = sweep_totals(text)
    assert totals.get("failed", 0) == 0 and sum(totals.values()) == N_RUNS, totals
    assert_matches_reference(root, reference)
    assert not list(root.glob("cartpole/*/*/.*.tmp"))  # killed writes' temp files were cleared
    assert landed.get("finished", 0) == 0, f"the sweep ended before {KILLS} kills: {landed}"
    assert landed.get("write", 0) >= 3 and landed.get("training", 0) >= 3, landed


def test_two_sweeps_on_one_folder_complete_each_run_once(reference, tmp_path):
    """The same command twice at once (two of the reference's jobs, 4 runs): each run is
    trained to the end by exactly one of them, the other skips it (held, or finished)."""
    root = tmp_path / "results"
    root.mkdir()
    logs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    outs = [open(p, "w") for p in logs]
    try:
        procs = [subprocess.Popen(sweep_cmd(root, "a2c,rloo"), stdout=o, stderr=subprocess.STDOUT,
                                  env=env_with(0.005), cwd=REPO) for o in outs]
        for p in procs:
            assert p.wait(timeout=600) == 0
    finally:
        for o in outs:
            o.close()
    totals = [sweep_totals(p.read_text()) for p in logs]
    assert sum(t.get("completed", 0) for t in totals) == 4, totals  # exactly once each
    assert all(t.get("failed", 0) == 0 and sum(t.values()) == 4 for t in totals), totals
    assert sum(t.get("held", 0) for t in totals) >= 1, totals  # they did meet
    sweeps = list(root.glob(".hydra/sweeps/*"))
    assert len(sweeps) == 2  # separate Hydra job folders (outcome.json, logs) too
    check_invariants(root)
    assert_matches_reference(root, reference, n_runs=4)


def hold(path: Path) -> int:
    """Hold a run's lock as another process would (flock is per open file)."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b'{"pid": 1, "host": "elsewhere"}')
    return fd


def test_run_held_by_another_process_is_skipped_not_failed(tmp_path, caplog):
    import logging

    from harness.io import run_dir_for

    caplog.set_level(logging.INFO, logger="harness")
    cfg = make_cfg(["task=cartpole", "estimator=a2c", *TINY, f"results_dir={tmp_path}"])
    fd = hold(run_dir_for(cfg))
    try:
        assert run(cfg) == {"skipped": 0, "held": 1}
    finally:
        os.close(fd)
    assert any("held by another sweep" in r.message and "elsewhere" in r.message for r in caplog.records)
    assert not list(tmp_path.rglob("summary.json"))
    assert run(cfg) == {"skipped": 0, "completed": 1}


def test_population_member_held_elsewhere_is_trained_as_a_shadow(tmp_path):
    """The held member is trained but not written, so its neighbour's metrics equal those of
    the whole population run bit for bit."""
    from harness.config import member_configs
    from harness.io import run_dir_for

    args = ["task=cartpole", "estimator=rloo", *TINY, "budget.iterations=4", "population=2", "threads=1"]
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    cfg = make_cfg(args + [f"results_dir={tmp_path}/held"])
    fd = hold(run_dir_for(member_configs(cfg)[1]))
    try:
        assert run(cfg) == {"skipped": 0, "held": 1, "completed": 1}
    finally:
        os.close(fd)
    (a,) = (tmp_path / "ref").rglob("seed0-*/metrics.parquet")
    (b,) = (tmp_path / "held").rglob("seed0-*/metrics.parquet")
    pd.testing.assert_frame_equal(pq.read_table(a).to_pandas().drop(columns=["wall_time_s"]),
                                  pq.read_table(b).to_pandas().drop(columns=["wall_time_s"]), check_exact=True)
    assert not list((tmp_path / "held").rglob("seed1-*/metrics.parquet"))  # the shadow wrote nothing
