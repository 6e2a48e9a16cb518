"""The registry's contract tests, shipped with the package so that a user's own estimators, policy
losses and tasks (:mod:`harness.plugins`) are checked the way the harness's own are.

Run them on an installed harness plus a plugin package (docs/extending.md)::

    python -m pytest --pyargs harness.testing --pg-plugins mypkg.estimators --pg-searchpath pkg://mypkg.conf

``--pg-plugins`` and ``--pg-searchpath`` come from the pytest plugin :mod:`harness.testing.plugin`
(registered as a ``pytest11`` entry point, so any pytest run where the harness is installed has
them): the plugin modules are imported before tests are collected, so every test that enumerates
a registry (these and, in a clone, those of ``tests/``) includes the user's additions, and
:func:`compose` finds the user's YAML. In the harness's own CI these tests run on its own registry
(``testpaths`` in pyproject.toml).
"""
from __future__ import annotations

from pathlib import Path

# Hydra search path entries added by --pg-searchpath (pkg://module or file:///path), set by the
# pytest plugin before collection.
SEARCHPATH: list[str] = []
TINY = [
    "budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8", "task.episodes_per_iter=4",
    "task.max_episode_steps=30", "group_size=2", "eval_episodes=2", "eval_every=1", "progress=false",
    "task.hidden=[16]",
]


def compose(overrides: list[str]):
    """The config ``python -m harness <overrides>`` runs, with the search path entries of
    :data:`SEARCHPATH` (unless ``overrides`` set ``hydra.searchpath`` themselves). A population
    trains in this process (``population_workers=1``) unless ``overrides`` say otherwise: tests that
    patch the loop and read its log need it there."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    import harness.losses  # noqa: F401  (the built-in losses: their knobs are in the schema)
    from harness.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    keys = {o.split("=")[0].lstrip("+~") for o in overrides}
    if "population_workers" not in keys:
        overrides = [*overrides, "population_workers=1"]
    if SEARCHPATH and "hydra.searchpath" not in keys:
        overrides = [f"hydra.searchpath=[{','.join(SEARCHPATH)}]", *overrides]
    with initialize_config_module("harness.conf", version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def config_folders(searchpath: list[str] | None = None) -> list[tuple[str, Path]]:
    """(entry, folder) of the harness's own configs, then of each search path entry (default
    :data:`SEARCHPATH`): :func:`harness.plugins.config_folders`."""
    from harness.plugins import config_folders as folders

    return folders(SEARCHPATH if searchpath is None else searchpath)


def group_options(group: str, searchpath: list[str] | None = None) -> dict[str, str]:
    """Option name -> the search path entry whose ``<group>/<name>.yaml`` provides it."""
    out: dict[str, str] = {}
    for entry, folder in config_folders(searchpath):
        for path in sorted((folder / group).glob("*.yaml")):
            out.setdefault(path.stem, entry)
    return out


__all__ = ["SEARCHPATH", "TINY", "compose", "config_folders", "group_options"]
