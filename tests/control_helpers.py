"""Compose configs the way ``python -m harness`` does, with tiny budgets."""
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from harness.config import register_configs

CONF = str(Path(__file__).resolve().parents[1] / "harness" / "conf")
TINY = [
    "budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8", "task.episodes_per_iter=4",
    "task.max_episode_steps=30", "group_size=2", "eval_episodes=2", "eval_every=1", "progress=false",
    "task.hidden=[16]",
]


def make_cfg(overrides: list[str]):
    """``overrides`` composed; a population trains in this process (``population_workers=1``) unless
    they say otherwise: the tests that patch the loop (kills, update counts) and read its log need
    it there. The worker processes have their own tests (tests/test_control.py, tests/test_faults.py)."""
    register_configs()
    GlobalHydra.instance().clear()
    if not any(o.split("=")[0].lstrip("+~") == "population_workers" for o in overrides):
        overrides = [*overrides, "population_workers=1"]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)
