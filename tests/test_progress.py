"""The progress bar's postfix: an iteration in which no episode ends shows no return of 0."""
from __future__ import annotations

from types import SimpleNamespace

from harness.config import member_configs
from harness.io import RunDir
from harness.train.control import RECENT_EPISODES, ControlSource
from harness.train.loop import Source
from tests.control_helpers import TINY, make_cfg


def rollout(*member_returns: list[float]) -> SimpleNamespace:
    return SimpleNamespace(episode_returns=list(member_returns))


def test_control_bar_keeps_the_last_episodes_mean_through_iterations_that_end_none(tmp_path):
    cfg = make_cfg(["task=cartpole", "estimator=ppo_gae", *TINY, "population=2", f"results_dir={tmp_path}"])
    source = ControlSource(cfg, [RunDir(m) for m in member_configs(cfg)])
    assert source.postfix(rollout([], []), []) == {"ret": "no episode ended yet"}
    assert source.postfix(rollout([10.0], [20.0, 30.0]), []) == {"ret": "20.0"}  # (10 + 20 + 30) / 3
    assert source.postfix(rollout([], []), []) == {"ret": "20.0"}  # none ended: still the last mean
    source.postfix(rollout([100.0] * RECENT_EPISODES, []), [])
    assert source.postfix(rollout([], []), []) == {"ret": "100.0"}  # the older three fell out of the window


def test_a_source_without_returns_this_iteration_says_so():
    assert Source.postfix(None, None, [{"episode_return": None}]) == {"ret": "no episode ended"}
    assert Source.postfix(None, None, [{"episode_return": 1.0}, {"episode_return": 2.0}]) == {"ret": "1.500"}
