"""Scale-out on existing engines (issue 7): Hydra launchers and the Optuna sweeper.

- ``hydra/launcher=submitit_local`` (CI's stand-in for Slurm) runs a tiny two-run sweep for
  real; its run directories equal those of the basic launcher, and rerunning the sweep with
  the basic launcher skips them (resume across launchers).
- ``hydra/launcher=slurm`` (harness/conf/hydra/launcher/slurm.yaml) composes, and the sbatch script
  submitit would submit is rendered, without submitting anything.
- ``hydra/launcher=joblib`` runs the sweep in two worker processes.
- ``hydra/launcher=ray`` (hydra-ray-launcher, the ``ray`` extra) and ``hydra/sweeper=optuna``
  (``tune``) run for real when their plugins are installed (the ``test`` extra installs both),
  and are skipped otherwise.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from .control_helpers import CONF, TINY, make_cfg

REPO = Path(__file__).resolve().parents[1]
TINY_CLI = ["task=cartpole", "seed=0", "budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8",
            "task.episodes_per_iter=2", "task.max_episode_steps=30", "eval_every=1", "eval_episodes=1",
            "progress=false", "task.hidden=[8]"]


def compose_with_hydra(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def has_plugin(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"hydra_plugins.{name}") is not None
    except ImportError:
        return False


def harness_cli(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in ``cwd``, importing this checkout's ``harness``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-m", "harness", *args], check=False, cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"exit code {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def sweep(results_dir: str, *extra: str) -> list[str]:
    """Two runs (reinforce, a2c) at tiny budgets; results_dir is relative to the working dir."""
    return ["-m", "estimator=reinforce,a2c", *TINY_CLI, f"results_dir={results_dir}", *extra]


def run_dirs(results: Path) -> dict[str, tuple[str, int]]:
    """``<task>/<estimator>/seed<seed>-<hash>`` -> (status in summary.json, rows in metrics.parquet)."""
    out = {}
    for d in sorted(results.glob("*/*/seed*")):
        status = json.loads((d / "summary.json").read_text())["status"]
        out[str(d.relative_to(results))] = (status, pq.read_metadata(d / "metrics.parquet").num_rows)
    return out


def summary_mtimes(results: Path) -> dict[str, int]:
    return {str(p.relative_to(results)): p.stat().st_mtime_ns for p in results.glob("*/*/seed*/summary.json")}


# ------------------------------------------------------------------ submitit (local)
@pytest.mark.skipif(not has_plugin("hydra_submitit_launcher"), reason="hydra-submitit-launcher not installed")
def test_submitit_local_lands_like_the_basic_launcher_and_resume_works_across_launchers(tmp_path):
    basic = harness_cli(sweep("basic"), tmp_path)
    assert "sweep done: 2 completed" in basic.stdout, basic.stdout
    expected = run_dirs(tmp_path / "basic")
    assert len(expected) == 2 and all(v == ("completed", 2) for v in expected.values()), expected

    sub = harness_cli(sweep("sub", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"), tmp_path)
    assert "Submitit 'local' sweep output dir" in sub.stdout + sub.stderr
    assert "sweep done: 2 completed" in sub.stdout, sub.stdout
    # the same run-directory names (same config hashes), each completed with its 2 iterations
    assert run_dirs(tmp_path / "sub") == expected
    assert not list(tmp_path.glob("sub/*/*/seed*/*.tmp")) and not (REPO / "sub").exists()

    before = summary_mtimes(tmp_path / "sub")
    again = harness_cli(sweep("sub"), tmp_path)  # the same command with the basic launcher
    assert "sweep done: 2 skipped" in again.stdout, again.stdout
    assert summary_mtimes(tmp_path / "sub") == before  # nothing was redone
    assert run_dirs(tmp_path / "sub") == expected


# ------------------------------------------------------------------ Slurm (compose, no submission)
class _Submitted(Exception):
    pass


@pytest.mark.skipif(not has_plugin("hydra_submitit_launcher"), reason="hydra-submitit-launcher not installed")
def test_slurm_launcher_composes_and_renders_the_sbatch_script(tmp_path, monkeypatch):
    from hydra.utils import instantiate
    from submitit.slurm import slurm

    cfg = compose_with_hydra(["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30",
                              "hydra.launcher.gpus_per_node=1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                              f"results_dir={tmp_path / 'res'}", "task=cartpole", "estimator=rloo"])
    launcher_cfg = cfg.hydra.launcher
    assert launcher_cfg._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    for key, value in {"partition": "gpu", "timeout_min": 30, "cpus_per_task": 2, "gpus_per_node": 1,
                       "mem_gb": 8, "array_parallelism": 64}.items():
        assert launcher_cfg[key] == value, key

    # What submitit would hand to sbatch for a 2-job sweep: rendered, never submitted.
    captured = {}

    def no_submission(self, command):
        captured["sbatch"] = self._make_submission_file_text(command, "uid")
        raise _Submitted

    monkeypatch.setattr(slurm.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "srun exists"
    monkeypatch.setattr(slurm.SlurmExecutor, "_submit_command", no_submission)
    launcher = instantiate(launcher_cfg)
    launcher.setup(hydra_context=None, task_function=lambda c: None, config=cfg)
    with pytest.raises(_Submitted):
        launcher.launch([["seed=0"], ["seed=1"]], initial_job_idx=0)
    text = captured["sbatch"]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=30", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --gpus-per-node=1", "#SBATCH --mem=8GB",
                 "#SBATCH --array=0-1%2"):  # array_parallelism 64, capped by submitit at the 2 jobs
        assert line in text, f"{line!r} missing from:\n{text}"
    assert not (tmp_path / "res").exists()  # nothing ran


# ------------------------------------------------------------------ joblib
@pytest.mark.skipif(not has_plugin("hydra_joblib_launcher"), reason="hydra-joblib-launcher not installed")
def test_joblib_launcher_runs_the_sweep_in_two_processes(tmp_path):
    # joblib is pinned below 1.6 (constraints.txt) for the Ray launcher's cloudpickle<3: the
    # launcher must still run jobs in its loky worker processes
    out = harness_cli(sweep("jl", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"), tmp_path)
    assert "Joblib.Parallel(n_jobs=2" in out.stdout + out.stderr, out.stdout + out.stderr
    assert "sweep done: 2 completed" in out.stdout, out.stdout
    runs = run_dirs(tmp_path / "jl")
    assert len(runs) == 2 and all(v == ("completed", 2) for v in runs.values()), runs


# ------------------------------------------------------------------ Ray (ray extra; in the test extra)
@pytest.mark.skipif(not has_plugin("hydra_ray_launcher"), reason="hydra-ray-launcher not installed (ray extra)")
def test_ray_launcher_on_a_local_ray_instance(tmp_path):
    ray = harness_cli(sweep("ray", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
                            "+hydra.launcher.ray.init.include_dashboard=false"), tmp_path, timeout=400)
    assert "sweep done: 2 completed" in ray.stdout, ray.stdout + ray.stderr
    runs = run_dirs(tmp_path / "ray")
    assert len(runs) == 2 and all(v == ("completed", 2) for v in runs.values()), runs
    again = harness_cli(sweep("ray"), tmp_path)  # the basic launcher finds them finished
    assert "sweep done: 2 skipped" in again.stdout, again.stdout


# ------------------------------------------------------------------ Optuna (tuning)
def test_objective_is_the_reports_final_score_of_the_jobs_runs(tmp_path):
    from analysis import load
    from analysis.stats import final_scores
    from harness.app import run
    from harness.tune import LAST_N, objective, wants_objective

    cfg = make_cfg(["task=cartpole", "estimator=reinforce", f"results_dir={tmp_path}", *TINY, "population=2",
                    "budget.iterations=3"])
    assert math.isnan(objective(cfg))  # nothing trained yet
    run(cfg)
    expected = final_scores(load(tmp_path), last_n=LAST_N)["score"].mean()
    assert objective(cfg) == pytest.approx(expected)
    assert not wants_objective()  # outside an Optuna sweep the task function returns nothing


@pytest.mark.skipif(not has_plugin("hydra_optuna_sweeper"), reason="hydra-optuna-sweeper not installed (tune extra)")
def test_optuna_sweeper_runs_a_fixed_trial_budget_and_resumes(tmp_path):
    args = ["-m", "experiment=tune_ppo_cartpole", "hydra.sweeper.n_trials=2", "population=1",
            "budget.env_steps=null", "eval_every_steps=null", *TINY_CLI, "results_dir=res"]
    out = harness_cli(args, tmp_path)
    assert "sweep done: 2 completed" in out.stdout, out.stdout
    runs = sorted((tmp_path / "res" / "cartpole" / "ppo_gae").glob("seed0-*"))
    assert len(runs) == 2  # two trials, two distinct configs
    for d in runs:
        c = yaml.safe_load((d / "config.yaml").read_text())
        assert 1e-4 <= c["lr"] <= 3e-3 and 0.1 <= c["clip_eps"] <= 0.3 and 0.8 <= c["gae_lambda"] <= 1.0, c
        assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    (result,) = (tmp_path / "res" / ".hydra" / "sweeps").glob("*/optimization_results.yaml")
    best = yaml.safe_load(result.read_text())
    assert set(best["best_params"]) == {"lr", "clip_eps", "gae_lambda"}
    values = [float(v) for v in
              [line.rsplit("=", 1)[1] for line in out.stdout.splitlines() if line.startswith("[harness] objective")]]
    assert len(values) == 2 and best["best_value"] == pytest.approx(max(values), rel=1e-3)

    again = harness_cli(args, tmp_path)  # the seeded sampler proposes the same trials: all skipped
    assert "sweep done: 2 skipped" in again.stdout, again.stdout
