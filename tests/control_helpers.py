"""Compose configs the way ``python -m harness`` does, with tiny budgets."""
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from harness.config import register_configs

CONF = str(Path(__file__).resolve().parents[1] / "conf")
TINY = [
    "budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8", "task.episodes_per_iter=4",
    "task.max_episode_steps=30", "group_size=2", "eval_episodes=2", "eval_every=1", "progress=false",
    "task.hidden=[16]",
]


def make_cfg(overrides: list[str]):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)
