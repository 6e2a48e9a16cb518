"""``hydra/launcher=slurm`` against a real Slurm controller (issue 17): a single-node cluster on
this machine (scripts/slurm_local.sh: slurmctld, slurmd, slurmdbd with MariaDB accounting, so
that submitit reads job states from sacct; docs/slurm.md).

- A two-job sweep submitted through Slurm lands in the same run directories as the basic
  launcher's, with identical metrics.parquet (wall clock aside).
- A job scancel'ed while it trains (after its first checkpoint) fails the sweep command; the
  same command again resumes the killed run from its checkpoint and ends with the runs of the
  uninterrupted basic sweep.

The cluster is a module fixture: reused when ``scripts/slurm_local.sh status`` finds it up
(left running), else started (as root; the apt packages installed first when slurmctld is
missing and apt-get exists) and stopped at the end. Skipped, naming what is missing, when it
cannot start: no hydra-submitit-launcher, not root, no apt-get, the install or a daemon failed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.io.checkpoint import CHECKPOINT_FILE
from harness.io.rundir import LOCK_FILE, WRITE_DELAY_ENV
from tests.test_checkpoint import assert_same_runs
from tests.test_faults import sweep_totals
from tests.test_launchers import REPO, harness_cli, has_plugin, run_dirs

SCRIPT = REPO / "scripts" / "slurm_local.sh"
# two jobs; 16 iterations with a checkpoint every 2, so that a job can be caught training
SWEEP = ["-m", "task=cartpole", "estimator=a2c,ppo_gae", "seed=0", "budget.iterations=16", "task.num_envs=2",
         "task.rollout_steps=16", "task.episodes_per_iter=2", "task.max_episode_steps=50", "eval_every=4",
         "eval_episodes=1", "progress=false", "task.hidden=[16]", "threads=1", "checkpoint_every=2"]
# one CPU and 1 GB per job: both jobs fit on a 2-core machine at once
SLURM = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
         "hydra.launcher.timeout_min=10"]
# Seconds inside each atomic write of the sweep that gets a job killed: after its first checkpoint
# (iteration 2) a run trains >= 14 s more (one or two writes an iteration), well past the window
# between scancel's SIGTERM (which submitit ignores) and SIGKILL: KillWait=2, but slurmd waits >= 5 s.
WRITE_DELAY = 0.5


def script(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)


def last_line(out: subprocess.CompletedProcess) -> str:
    lines = (out.stderr + out.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {out.returncode}"


def why_no_cluster() -> str | None:
    """Why this machine cannot have the cluster (packages installed here if they can be), or None."""
    if not has_plugin("hydra_submitit_launcher"):
        return "hydra-submitit-launcher not installed"
    if os.geteuid() != 0:
        return "starting the Slurm daemons needs root (munged runs as munge, mariadbd as mysql)"
    if shutil.which("slurmctld") is None:
        if shutil.which("apt-get") is None:
            return "slurmctld not installed and no apt-get to install slurm-wlm, munge, slurmdbd, mariadb-server"
        out = script("install", timeout=900)
        if out.returncode != 0:
            return f"scripts/slurm_local.sh install failed: {last_line(out)}"
    return None


@pytest.fixture(scope="module")
def slurm_cluster():
    """SLURM_CONF set in this process's environment (the sweeps' sbatch/sacct read it)."""
    problem = why_no_cluster()
    if problem:
        pytest.skip(problem)
    started = False
    if script("status").returncode != 0:
        out = script("start")
        if out.returncode != 0:
            script("stop")
            pytest.skip(f"the local Slurm cluster did not start: {last_line(out)}")
        started = True
    (conf,) = re.findall(r"^export SLURM_CONF=(.+)$", script("env").stdout, flags=re.M)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", conf)
            yield conf
    finally:
        if started:
            out = script("stop")
            assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The sweep with the basic launcher, uninterrupted."""
    cwd = tmp_path_factory.mktemp("basic")
    out = harness_cli([*SWEEP, "results_dir=res"], cwd)
    assert sweep_totals(out.stdout) == {"completed": 2}, out.stdout
    return cwd / "res"


def squeue() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, check=True).stdout.split()


def wait_until_queue_empty(timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while squeue():
        assert time.monotonic() < end, f"jobs still queued after {timeout}s: {squeue()}"
        time.sleep(0.2)


def sacct_state(job_id: str) -> str:
    """The job's state as accounting recorded it (it lags the job's end by a moment)."""
    for _ in range(50):
        state = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id], capture_output=True,
                               text=True, check=True).stdout.strip()
        if state and state not in ("PENDING", "RUNNING"):
            return state
        time.sleep(0.2)
    return state


def slurm_job_of(pid: int) -> str:
    """``<array job>_<task>`` of a process that a Slurm array task runs (this machine is the node);
    scancel refuses an array task's own SLURM_JOB_ID."""
    env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    return f"{env[b'SLURM_ARRAY_JOB_ID'].decode()}_{env[b'SLURM_ARRAY_TASK_ID'].decode()}"


def training_run(root: Path) -> Path | None:
    """A run that has a checkpoint and is not finished: being trained (the sweep is running)."""
    for d in sorted(root.glob("cartpole/*/seed*")):
        if (d / CHECKPOINT_FILE).exists() and not (d / "summary.json").exists():
            return d
    return None


def test_a_sweep_through_slurm_lands_like_the_basic_launcher(slurm_cluster, reference, tmp_path):
    out = harness_cli([*SWEEP, "results_dir=res", *SLURM], tmp_path)
    assert "Submitit 'slurm' sweep output dir" in out.stdout + out.stderr
    assert sweep_totals(out.stdout) == {"completed": 2}, out.stdout
    assert run_dirs(tmp_path / "res") == run_dirs(reference)  # same directories, statuses, row counts
    assert_same_runs(reference, tmp_path / "res")  # metrics equal bit for bit, wall clock aside
    wait_until_queue_empty()


def test_a_job_killed_by_scancel_is_resumed_by_the_same_command(slurm_cluster, reference, tmp_path):
    args = [*SWEEP, "results_dir=res", *SLURM]
    root = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           WRITE_DELAY_ENV: str(WRITE_DELAY)}  # slow writes: the jobs train for seconds (sbatch exports env)
    with open(tmp_path / "killed.txt", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 180
            while (run := training_run(root)) is None:
                assert proc.poll() is None and time.monotonic() < end, "no run was caught training"
                time.sleep(0.05)
            pid = int(re.search(r'"pid": (\d+)', (run / LOCK_FILE).read_text()).group(1))
            job = slurm_job_of(pid)
            cancel = subprocess.run(["scancel", job], capture_output=True, text=True, check=False)
            assert cancel.returncode == 0 and not cancel.stderr, cancel.stderr
            assert proc.wait(timeout=180) != 0  # submitit: the job ended without a result
        finally:
            if proc.poll() is None:
                proc.kill()
    text = (tmp_path / "killed.txt").read_text()
    assert "CANCELLED" in text, text[-3000:]
    wait_until_queue_empty()  # the other job of the sweep finishes on its own
    assert sacct_state(job).startswith("CANCELLED"), sacct_state(job)
    assert not (run / "summary.json").exists() and (run / CHECKPOINT_FILE).exists()  # killed mid-run

    again = harness_cli(args, tmp_path)  # the same command: the killed run resumes, the other is skipped
    assert sweep_totals(again.stdout) == {"completed": 1, "skipped": 1}, again.stdout
    sweeps = sorted((root / ".hydra" / "sweeps").iterdir())
    assert len(sweeps) == 2
    logs = "".join(p.read_text(errors="replace") for p in sweeps[-1].rglob("*") if p.is_file() and p.suffix in
                   (".log", ".out", ".err"))
    assert re.search(rf"resume {re.escape(str(run.relative_to(root)))} from .* at iteration [1-9]", logs), logs[-3000:]
    wait_until_queue_empty()
    assert run_dirs(root) == run_dirs(reference)
    assert_same_runs(reference, root)
