"""pytest plugin (``pytest11`` entry point ``pg_harness``): ``--pg-plugins`` and ``--pg-searchpath``.

``--pg-plugins mypkg.estimators[,mypkg.more]`` imports those modules (and the installed
``pg_harness.plugins`` entry points, :func:`harness.plugins.load_plugins`) before collection, so
tests parametrised over a registry include their names. ``--pg-searchpath pkg://mypkg.conf``
adds the plugin's config folder to Hydra's search path for :func:`harness.testing.compose`.
Both can also come from ``PG_HARNESS_PLUGINS`` / ``PG_HARNESS_SEARCHPATH`` (comma-separated).
Nothing is imported unless one of them is given."""
from __future__ import annotations

import os


def _split(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def pytest_addoption(parser):
    group = parser.getgroup("pg-harness", "pg-advantage-harness plugins (harness.testing)")
    group.addoption("--pg-plugins", action="append", default=[], metavar="MODULE[,MODULE]",
                    help="modules to import before collection: their estimators, policy losses and envs "
                         "join the registries the tests enumerate (also: $PG_HARNESS_PLUGINS)")
    group.addoption("--pg-searchpath", action="append", default=[], metavar="pkg://MODULE|file:///PATH",
                    help="config folders added to Hydra's search path for harness.testing.compose "
                         "(also: $PG_HARNESS_SEARCHPATH)")


def pytest_configure(config):
    modules = _split(config.getoption("pg_plugins") + [os.environ.get("PG_HARNESS_PLUGINS", "")])
    searchpath = _split(config.getoption("pg_searchpath") + [os.environ.get("PG_HARNESS_SEARCHPATH", "")])
    if not modules and not searchpath:
        return
    import harness.testing as testing
    from harness.plugins import load_plugins

    testing.SEARCHPATH[:] = searchpath
    try:
        load_plugins(modules)
    except ValueError as exc:
        import pytest

        raise pytest.UsageError(str(exc)) from None
