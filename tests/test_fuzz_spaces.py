"""Users' gymnasium envs with unusual spaces or no time limit (issue 36, items 1 and 2).

A class of spaces per table row, never one example: every action the harness sends must be a
member of the env's action space (its own ``contains``: a Discrete ``start`` and dtype, a Box's
bounds and dtype), an env the harness cannot serve is refused by name before any work starts,
and an env registered without a time limit (``max_episode_steps=None``) needs
``task.max_episode_steps`` (else no whole-episode collection or evaluation would ever end).

This module is itself the "user package" (as tests/test_user_env.py): importing it registers
``Space-<kind>-v0`` (a :class:`StrictEnv` with that action space: reward 1 a step, terminated
after 4 steps, raising on any action outside its space) and ``Endless-v0`` (no time limit,
never terminates, reward 1 a step), so the CLI can name ``tests.test_fuzz_spaces:Endless-v0``.
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

from harness import app
from harness.app import run

from .control_helpers import TINY, make_cfg
from .test_checkpoint import Killed, assert_same_runs, kill_at

REPO = Path(__file__).resolve().parents[1]
MODULE = "tests.test_fuzz_spaces"


def _box(low, high, shape, dtype, nan_low=False):
    def make():
        space = gym.spaces.Box(low, high, shape=shape, dtype=dtype)
        if nan_low:  # gymnasium refuses a NaN bound when built, not when set afterwards
            space.low[0] = np.nan
        return space
    return make


SPACES = {
    # served: every action the policy can pick, mapped onto the space
    "discrete": lambda: gym.spaces.Discrete(2),  # the usual one (Endless-v0's)
    "discrete_start1": lambda: gym.spaces.Discrete(2, start=1),
    "discrete_start_neg": lambda: gym.spaces.Discrete(3, start=-2),
    "discrete_int8": lambda: gym.spaces.Discrete(2, dtype=np.int8),  # int64 actions fail its contains
    "box_float64": _box(-0.1, 0.1, (2,), np.float64),  # float32(0.1) > 0.1: a clip in float32 lands outside
    "box_float16": _box(-1.0, 1.0, (1,), np.float16),
    "box_unbounded": _box(-np.inf, np.inf, (1,), np.float32),
    "box_flat": _box(0.5, 0.5, (1,), np.float32),  # low == high: one action (tanh cannot squash onto it)
    # refused by name
    "box_int": _box(0, 5, (2,), np.int64),
    "box_empty": _box(-1.0, 1.0, (0,), np.float32),
    "box_nan_low": _box(-1.0, 1.0, (1,), np.float32, nan_low=True),
    "discrete_int8_overflow": lambda: gym.spaces.Discrete(2, start=127, dtype=np.int8),  # 128 does not fit
}
SEEN: dict[str, set[int]] = {}  # Discrete kind -> the actions its envs were sent (this process)


class StrictEnv(gym.Env):
    """Observation ``[t, 1]`` (``obs_dim`` 0: an empty Box); reward 1; terminated after 4 steps;
    raises on an action outside its action space, which is ``SPACES[kind]()``."""

    def __init__(self, kind: str, obs_dim: int = 2):
        self.kind = kind
        self.action_space = SPACES[kind]()
        self.observation_space = gym.spaces.Box(-100.0, 100.0, shape=(obs_dim,), dtype=np.float32)
        self.t = 0

    def _obs(self):
        return np.array([self.t, 1.0][:self.observation_space.shape[0]], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise RuntimeError(f"action {action!r} ({np.asarray(action).dtype}) outside {self.action_space}")
        if isinstance(self.action_space, gym.spaces.Discrete):
            SEEN.setdefault(self.kind, set()).add(int(action))
        self.t += 1
        return self._obs(), 1.0, self.t >= 4, False, {}


class EndlessEnv(StrictEnv):
    """Never terminates: only a time limit ends its episodes."""

    def __init__(self):
        super().__init__("discrete")

    def step(self, action):
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


if "Endless-v0" not in gym.envs.registry:
    for _kind in SPACES:
        register(id=f"Space-{_kind}-v0", entry_point=StrictEnv, kwargs={"kind": _kind}, max_episode_steps=20)
    register(id="Space-obs_empty-v0", entry_point=StrictEnv, kwargs={"kind": "discrete_start1", "obs_dim": 0},
             max_episode_steps=20)
    register(id="Endless-v0", entry_point=EndlessEnv, max_episode_steps=None)

NO_LIMIT = [o for o in TINY if not o.startswith("task.max_episode_steps")]  # the env's own limit applies
ESTIMATORS = ["a2c", "reinforce"]  # persistent envs (step-based) and whole episodes; both evaluate


def _summary(root: Path) -> dict:
    (path,) = root.glob("*/*/seed*/summary.json")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- spaces served
# kind -> every action of the space (Discrete: start..start+n-1, worked out by hand), None for a Box
SERVED = [
    ("discrete", {0, 1}),
    ("discrete_start1", {1, 2}),
    ("discrete_start_neg", {-2, -1, 0}),
    ("discrete_int8", {0, 1}),
    ("box_float64", None),
    ("box_float16", None),
    ("box_unbounded", None),
    ("box_flat", None),
]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("kind,actions", SERVED, ids=[k for k, _ in SERVED])
def test_every_action_sent_is_a_member_of_the_env_space(kind, actions, estimator, tmp_path):
    """The env raises on an action outside its space, so the run completes only if training and
    evaluation sent none; the Discrete ones were sent each of their actions, and nothing else;
    the evaluation return is the 4 steps x reward 1 of an episode."""
    SEEN.pop(kind, None)
    cfg = make_cfg(["task=cartpole", f"estimator={estimator}", f"task.env_id=Space-{kind}-v0", "task.name=spaces",
                    f"results_dir={tmp_path}", "threads=1", *NO_LIMIT])
    counts = run(cfg)
    summary = _summary(tmp_path)
    assert counts.get("completed") == 1, summary.get("reason")
    assert summary["iterations"] == 2 and summary["final"]["eval_return"] == pytest.approx(4.0)
    if actions is not None:
        assert SEEN[kind] == actions


@pytest.mark.parametrize("kind", ["discrete_start_neg", "box_float64"])
def test_a_killed_run_on_such_a_space_resumes_identically(kind, tmp_path, monkeypatch):
    """The persistent envs' action log (category indices, Box actions as sent) replays onto the
    same space: a run killed after its checkpoint resumes to the uninterrupted run's metrics."""
    args = ["task=cartpole", "estimator=a2c", f"task.env_id=Space-{kind}-v0", "task.name=spaces", "threads=1",
            *NO_LIMIT, "budget.iterations=5", "checkpoint_every=2"]
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    kill_at(monkeypatch, 4)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/killed"]))
    monkeypatch.undo()
    assert run(make_cfg(args + [f"results_dir={tmp_path}/killed"])).get("completed") == 1
    assert_same_runs(tmp_path / "ref", tmp_path / "killed")


# ----------------------------------------------------------------------------- refused by name
REFUSED = [  # (overrides, the field the one line names)
    (["task.env_id=Space-box_int-v0"], "task.env_id"),  # integer Box: the Gaussian's actions are real
    (["task.env_id=Space-box_empty-v0"], "task.env_id"),  # no action dimension
    (["task.env_id=Space-obs_empty-v0"], "task.env_id"),  # no observation dimension
    (["task.env_id=Space-box_nan_low-v0"], "task.env_id"),  # a bound that is no number
    (["task.env_id=Space-discrete_int8_overflow-v0"], "task.env_id"),  # start + n - 1 beyond its dtype
    (["task.env_id=Space-box_flat-v0", "task.action_bound=tanh"], "task.action_bound"),  # low == high
    (["task.env_id=Space-box_unbounded-v0", "task.action_bound=tanh"], "task.action_bound"),  # infinite
    (["task.env_id=Endless-v0", "estimator=a2c"], "task.max_episode_steps"),  # no time limit: evaluation
    (["task.env_id=Endless-v0", "estimator=reinforce"], "task.max_episode_steps"),  # and collection
    (["task.env_id=Endless-v0", "estimator=reinforce", "mode=probe"], "task.max_episode_steps"),
]


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_an_env_the_harness_cannot_serve_is_refused_by_name(overrides, field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def no_training(cfg):
        pytest.fail(f"training started for {overrides}")

    monkeypatch.setattr(app, "get_worker", no_training)
    cfg = make_cfg(["task=cartpole", "estimator=a2c", "results_dir=res", *NO_LIMIT, *overrides])
    with pytest.raises(ValueError) as info:
        run(cfg)
    message = str(info.value)
    assert message.startswith(field) and "\n" not in message, message
    assert list(tmp_path.iterdir()) == [], "something was written before the refusal"


# ----------------------------------------------------------------------------- time limits
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_env_without_a_time_limit_runs_under_task_max_episode_steps(estimator, tmp_path):
    """``task.max_episode_steps=5`` bounds collection and evaluation: each evaluation episode is
    cut after 5 steps of reward 1, so its return is 5."""
    cfg = make_cfg(["task=cartpole", f"estimator={estimator}", "task.env_id=Endless-v0", "task.name=endless",
                    f"results_dir={tmp_path}", "threads=1", *NO_LIMIT, "task.max_episode_steps=5"])
    assert run(cfg).get("completed") == 1
    assert _summary(tmp_path)["final"]["eval_return"] == pytest.approx(5.0)


def test_an_env_without_a_time_limit_through_the_cli_is_one_line_exit_2(tmp_path):
    """Through ``python -m harness`` (the module syntax imports this file): exit 2, one line naming
    the field, no run folder; it used to collect forever (the timeout)."""
    res = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-m", "harness", "task=cartpole", "estimator=reinforce",
                          f"task.env_id={MODULE}:Endless-v0", "task.name=endless", f"results_dir={res}", *NO_LIMIT],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and lines[0].startswith("invalid config: task.max_episode_steps must be"), lines
    assert "Endless-v0 registers no time limit" in lines[0]
    assert not list(res.glob("*/*/seed*"))  # Hydra's own .hydra log is all it may write
