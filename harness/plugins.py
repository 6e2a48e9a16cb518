"""Estimators, policy losses, envs (and anything else that registers itself) from a user's own package.

A plugin is a Python module that registers with the harness's own decorators when imported:
:func:`harness.estimators.register_estimator`, :func:`harness.losses.register_policy_loss`, gymnasium's
``register`` (or ``task.env_id=mod:EnvId``). The command line imports, before Hydra composes the
config with the run's schema (:func:`preload`: a loss's knobs join the schema when it registers):

* every module named by the config key ``plugins`` (``plugins=[mypkg.estimators]`` on the command
  line, or in a YAML of the user's own config folder: :func:`plugins_in_configs`), then
* every entry point of the group :data:`ENTRY_POINT_GROUP` that an installed package declares
  (``[project.entry-points."pg_harness.plugins"] mypkg = "mypkg.estimators"`` in its
  pyproject.toml): installing the package is enough.

The plugin's YAML (``estimator/<name>.yaml``, ``task/<name>.yaml``, ...) comes from its own
config folder added to Hydra's search path: ``hydra.searchpath=[pkg://mypkg.conf]``.
docs/extending.md has a worked example; ``python -m pytest --pyargs harness.testing
--pg-plugins mypkg.estimators --pg-searchpath pkg://mypkg.conf`` runs the registry's tests on it.

A module that cannot be imported, or whose import raises (e.g. it registers a name the harness
already has), is refused like any bad config value: one line naming ``plugins`` and the module,
exit 2, before any run starts. So is an estimator or policy loss that breaks its contract (returns a
list, another shape, dtype or device, or raises) when validation tries it once on synthetic inputs
(:func:`try_callables`): one line naming it and its module.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points
from importlib.resources import files
from itertools import product
from pathlib import Path

from .config import bad_field, error_line

ENTRY_POINT_GROUP = "pg_harness.plugins"
_loaded: set[str] = set()


def _entry_point_targets() -> list[tuple[str, object]]:
    return [(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP})", ep)
            for ep in entry_points(group=ENTRY_POINT_GROUP)]


def load_plugins(modules: Iterable[str] = ()) -> list[str]:
    """Import the modules ``modules`` names, then the installed entry points; each once per process.
    Returns what was imported now. Raises ``ValueError`` (``plugins must be ...``) naming the first
    one that fails."""
    modules = list(modules or [])
    if not all(isinstance(m, str) and m.strip() for m in modules):
        bad_field("plugins", "a list of importable module names, e.g. [mypkg.estimators]", modules)
    targets: list[tuple[str, object]] = [(m.strip(), m.strip()) for m in modules]
    targets += _entry_point_targets()
    done = []
    for label, target in targets:
        if label in _loaded:
            continue
        try:
            if isinstance(target, str):
                importlib.import_module(target)
            else:
                target.load()  # an EntryPoint: imports its module (and the attribute, if it names one)
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit must not end the command quietly;
            # (Ctrl-C is neither: it ends the command as everywhere else)
            if isinstance(exc, ModuleNotFoundError) and isinstance(target, str) and exc.name and \
                    target.startswith(exc.name):  # the named module itself, not one it imports
                bad_field("plugins", "importable module names (is the package installed, or its folder on "
                          f"PYTHONPATH? sys.path[0] = {sys.path[0]!r})", label)
            # the plugin's own code raised: named, no traceback
            bad_field("plugins", f"modules whose import succeeds; importing it raised {type(exc).__name__}: "
                      f"{error_line(exc)}", label)
        _loaded.add(label)
        done.append(label)
    return done


def try_callables(plan) -> None:
    """The run's estimator and policy loss (a :class:`harness.plan.RunPlan`'s), each called once on
    small synthetic inputs (:meth:`harness.estimators.EstimatorSpec.trial`,
    :meth:`harness.losses.PolicyLoss.trial`) with the run's knobs, their outputs checked against their
    contracts: a function that returns a list, a non-tensor, another shape, dtype or device, or raises,
    is refused in one line naming it and its module (a ``ValueError``: exit 2) before any run folder
    exists. A result that only a real batch breaks fails its run with the same line (the same check,
    on every call)."""
    from .estimators import EstimatorParams
    from .estimators.registry import ContractError

    cfg = plan.cfg
    try:
        plan.estimator.trial(EstimatorParams.from_cfg(cfg), cfg.group_size)
        plan.loss.trial(plan.loss_settings, cfg.loss_agg)
    except ContractError as exc:  # its shapes are the trial's, not the run's: said so
        raise ContractError(f"{exc}; found by a trial call on synthetic inputs, before the run") from exc.__cause__


def _parsed(overrides: Iterable[str]) -> list:
    """A command line's overrides in Hydra's own grammar; [] when it does not parse (Hydra then says why)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
    except Exception:  # noqa: BLE001 - a bad override is Hydra's to report, with its own message
        return []


def plugins_in(overrides: Iterable[str]) -> list[str]:
    """The modules a command line's ``plugins=[...]`` override names; [] when there is none."""
    for o in _parsed(overrides):
        if o.key_or_group == "plugins" and not o.is_delete():
            value = o.value()
            return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return []


def config_folders(searchpath: Iterable[str]) -> list[tuple[str, Path]]:
    """(entry, folder) of the harness's own configs, then of each search path entry
    (``pkg://a.b`` -> the folder of package ``a.b``; ``file://p`` -> ``p``), as Hydra reads them."""
    out = [("pkg://harness.conf", Path(str(files("harness.conf"))))]
    for entry in searchpath:
        if entry.startswith("pkg://"):
            out.append((entry, Path(str(files(entry[len("pkg://"):].replace("/", "."))))))
        elif entry.startswith("file://"):
            out.append((entry, Path(entry[len("file://"):])))
        else:
            out.append((entry, Path(entry)))
    return out


def _group_choices(parsed: list, folders: list[Path]) -> list[tuple[str, ...]]:
    """Each distinct choice of config groups (``experiment=mine``, ``policy_loss=a``) the overrides
    ``parsed`` make, a sweep's values one by one; plain values (``lr=0.1``) are left out."""
    groups = [o for o in parsed if not o.key_or_group.startswith("hydra") and not o.is_delete()
              and any((folder / o.key_or_group).is_dir() for folder in folders)]
    values = [o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()] for o in groups]
    return list(dict.fromkeys(product(*[[f"{o.get_key_element()}={v}" for v in vs] for o, vs in zip(groups, values)])))


def plugins_in_configs(overrides: Iterable[str]) -> list[str]:
    """The modules the ``plugins`` key names in the configs a command line composes with a config
    folder of the user's own (``hydra.searchpath``): an experiment file there may name the module
    whose policy loss adds the knobs its YAML sets. Composed without the run's schema, which lacks
    those knobs until the module is imported, once per choice of config groups (about 0.2 s each);
    [] without a search path (the harness's own configs name no plugins). A config that does not
    compose is left for Hydra to report."""
    from hydra import compose, initialize_config_module
    from hydra.core.config_store import ConfigStore

    parsed = _parsed(overrides)
    searchpath = [o for o in parsed if o.key_or_group == "hydra.searchpath"]
    if not searchpath:
        return []
    try:
        folders = [folder for _, folder in config_folders([str(e) for e in searchpath[-1].value()])]
    except Exception:  # noqa: BLE001 - a search path entry Hydra cannot read either: Hydra reports it
        return []
    store = ConfigStore.instance()
    schema = store.repo.get("base_config.yaml")
    store.store(name="base_config", node={})  # any key: a plugin's knobs are not registered yet
    found: list[str] = []
    try:
        with initialize_config_module("harness.conf", version_base="1.3"):
            for combo in _group_choices(parsed, folders):
                try:
                    named = compose(config_name="config", overrides=[searchpath[-1].input_line, *combo]).get("plugins")
                except Exception:  # noqa: BLE001 - composed again by Hydra, which reports it
                    continue
                found += [str(m) for m in named] if isinstance(named, Sequence) and not isinstance(named, str) else \
                    [str(named)] if named else []
    finally:
        if schema is None:
            del store.repo["base_config.yaml"]
        else:
            store.repo["base_config.yaml"] = schema
    return list(dict.fromkeys(found))


def preload(argv: Iterable[str]) -> None:
    """Import the plugins of the command line ``argv`` (its ``plugins=``, else the ``plugins`` key of
    the configs it composes from the user's config folder: :func:`plugins_in_configs`) and the entry
    points *before* Hydra composes the config with the run's schema: a plugin's policy loss adds its
    knobs to the schema (:func:`harness.config.register_configs`), which its YAML sets. A plugin
    that fails to import is left for :func:`load_plugins` in the run itself to report (one line,
    exit 2)."""
    argv = list(argv)
    try:
        load_plugins(plugins_in(argv) or plugins_in_configs(argv))
    except ValueError:
        pass


__all__ = ["ENTRY_POINT_GROUP", "config_folders", "load_plugins", "plugins_in", "plugins_in_configs", "preload",
           "try_callables"]
