"""Estimators, policy losses, envs (and anything else that registers itself) from a user's own package.

A plugin is a Python module that registers with the harness's own decorators when imported:
:func:`harness.estimators.register_estimator`, :func:`harness.losses.register_policy_loss`, gymnasium's
``register`` (or ``task.env_id=mod:EnvId``). The harness imports, before it validates a config:

* every module named by the config key ``plugins`` (``plugins=[mypkg.estimators]`` on the command
  line, or in a YAML of the user's own config folder), then
* every entry point of the group :data:`ENTRY_POINT_GROUP` that an installed package declares
  (``[project.entry-points."pg_harness.plugins"] mypkg = "mypkg.estimators"`` in its
  pyproject.toml): installing the package is enough.

The plugin's YAML (``estimator/<name>.yaml``, ``task/<name>.yaml``, ...) comes from its own
config folder added to Hydra's search path: ``hydra.searchpath=[pkg://mypkg.conf]``.
docs/extending.md has a worked example; ``python -m pytest --pyargs harness.testing
--pg-plugins mypkg.estimators --pg-searchpath pkg://mypkg.conf`` runs the registry's tests on it.

A module that cannot be imported, or whose import raises (e.g. it registers a name the harness
already has), is refused like any bad config value: one line naming ``plugins`` and the module,
exit 2, before any run starts.
"""
from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from typing import Iterable

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


def plugins_in(overrides: Iterable[str]) -> list[str]:
    """The modules a command line's ``plugins=[...]`` override names (Hydra's own override grammar);
    [] when there is none or the command line does not parse (Hydra then says why)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
    except Exception:  # noqa: BLE001 - a bad override is Hydra's to report, with its own message
        return []
    for o in parsed:
        if o.key_or_group == "plugins" and not o.is_delete():
            value = o.value()
            return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return []


def preload(argv: Iterable[str]) -> None:
    """Import the plugins of the command line ``argv`` (and the entry points) *before* Hydra composes
    the config: a plugin's policy loss may add knobs to the schema (:func:`harness.config.register_configs`),
    which its YAML sets. A plugin that fails to import is left for :func:`load_plugins` in the run
    itself to report (one line, exit 2)."""
    try:
        load_plugins(plugins_in(argv))
    except ValueError:
        pass


__all__ = ["ENTRY_POINT_GROUP", "load_plugins", "plugins_in", "preload"]
