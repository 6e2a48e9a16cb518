"""A user's own gymnasium environment (issue 12): by gymnasium's ``module:EnvId`` syntax
(``task.env_id=my_pkg.envs:MyEnv-v0``: the module's import registers ``MyEnv-v0``) and by an id
the user's code registered before calling the harness. Every estimator family trains on it:
step-based (a2c, ppo_gae: persistent vector envs) and whole-episode (reinforce, rloo).

This module is itself the "user package": importing it registers ``UserChain-v0`` (a short
chain: reward 1 a step, the episode ends after 4 steps) and ``UserBoom-v0`` (raises in
``step()``), so ``task.env_id=tests.test_user_env:UserChain-v0`` works with the repository on
PYTHONPATH. A run on ``UserBoom-v0`` fails, and ``python -m harness`` then exits non-zero
(a sweep finishes its other runs first).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import register

from harness.app import run

from .control_helpers import TINY, make_cfg

REPO = Path(__file__).resolve().parents[1]
MODULE = "tests.test_user_env"


class UserChainEnv(gym.Env):
    """Observation [t, 1]; any action; reward 1; terminated after ``length`` steps."""

    def __init__(self, length: int = 4):
        self.length = length
        self.observation_space = gym.spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, 1.0], dtype=np.float32), 1.0, self.t >= self.length, False, {}


class UserBoomEnv(UserChainEnv):
    """Resets fine (validation passes), raises on the first step: the run fails."""

    def step(self, action):
        raise RuntimeError("boom: the user's env broke in step()")


if "UserChain-v0" not in gym.envs.registry:
    register(id="UserChain-v0", entry_point=UserChainEnv, max_episode_steps=20)
    register(id="UserBoom-v0", entry_point=UserBoomEnv, max_episode_steps=20)

CLI_TINY = [o for o in TINY if not o.startswith("task.max_episode_steps")]
ESTIMATORS = ["a2c", "ppo_gae", "reinforce", "rloo"]  # two step-based, two whole-episode


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", *args], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _summaries(root: Path) -> dict[str, dict]:
    return {p.parent.parent.name: json.loads(p.read_text()) for p in root.glob("*/*/seed*/summary.json")}


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("env_id", [f"{MODULE}:UserChain-v0", "UserChain-v0"])
def test_user_env_trains_in_process(env_id, estimator, tmp_path):
    """Both spellings, every kind of collector; returns are the chain's length (4 steps x 1)."""
    cfg = make_cfg(["task=cartpole", f"estimator={estimator}", f"task.env_id={env_id}", "task.name=user",
                    f"results_dir={tmp_path}", *CLI_TINY])
    counts = run(cfg)
    assert counts.get("completed") == 1, counts
    (summary,) = _summaries(tmp_path).values()
    assert summary["status"] == "completed" and summary["iterations"] == 2
    assert summary["final"]["eval_return"] == pytest.approx(4.0)


def test_user_env_by_module_syntax_through_the_cli(tmp_path):
    """``python -m harness task.env_id=tests.test_user_env:UserChain-v0``: the CLI imports the
    module (nothing else registers the id in that process); a step-based and a whole-episode run."""
    res = tmp_path / "res"
    out = _cli(["-m", "estimator=a2c,reinforce", "task=cartpole", f"task.env_id={MODULE}:UserChain-v0",
                "task.name=user", f"results_dir={res}", *CLI_TINY], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    summaries = _summaries(res)
    assert sorted(summaries) == ["a2c", "reinforce"], out.stdout + out.stderr
    assert all(s["status"] == "completed" for s in summaries.values()), summaries


def test_a_failed_run_exits_non_zero(tmp_path):
    res = tmp_path / "res"
    out = _cli(["task=cartpole", "estimator=a2c", f"task.env_id={MODULE}:UserBoom-v0", "task.name=boom",
                f"results_dir={res}", *CLI_TINY], tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout, out.stdout
    (summary,) = _summaries(res).values()
    assert summary["status"] == "failed" and "boom" in summary["reason"]


def test_a_sweep_finishes_its_other_runs_then_exits_non_zero(tmp_path):
    """One job of three fails (the middle one): the third still runs; the sweep exits 1."""
    res = tmp_path / "res"
    out = _cli(["-m", f"task.env_id={MODULE}:UserChain-v0,{MODULE}:UserBoom-v0,CartPole-v1",
                "task=cartpole", "estimator=a2c", "task.name=mixed", f"results_dir={res}", *CLI_TINY], tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    statuses = sorted(json.loads(p.read_text())["status"] for p in res.glob("*/*/seed*/summary.json"))
    assert statuses == ["completed", "completed", "failed"], out.stdout + out.stderr
    assert "sweep done: 2 completed, 1 failed" in out.stdout, out.stdout


def test_a_sweep_without_failures_exits_zero(tmp_path):
    out = _cli(["-m", "seed=0,1", "task=cartpole", "estimator=a2c", f"task.env_id={MODULE}:UserChain-v0",
                "task.name=ok", f"results_dir={tmp_path / 'res'}", *CLI_TINY], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sweep done: 2 completed" in out.stdout


def test_an_unknown_module_or_id_is_refused_by_name(tmp_path):
    for env_id in ("no_such_pkg.envs:MyEnv-v0", f"{MODULE}:NoSuchEnv-v0"):
        cfg = make_cfg(["task=cartpole", "estimator=a2c", f"task.env_id={env_id}", f"results_dir={tmp_path}",
                        *CLI_TINY])
        with pytest.raises(ValueError, match=r"^task\.env_id"):
            run(cfg)
    assert list(tmp_path.iterdir()) == []
