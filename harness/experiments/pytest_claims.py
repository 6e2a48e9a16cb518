"""pytest plugin: a test marked ``@pytest.mark.claim("C7")`` checks exact claim C7.

The claim id goes into the test's ``user_properties``, which pytest's JUnit XML writes as
``<property name="claim" value="C7"/>``: :func:`harness.experiments.run.run_exact_tests` reads
the outcomes per claim from there, so renaming or moving a test never changes which claim it
checks. Loaded by ``tests/conftest.py`` and by the exact-tests run (``-p``).
"""
from __future__ import annotations

MARKER = "claim"


def pytest_configure(config):
    config.addinivalue_line("markers", "claim(id): the test checks exact claim <id> of harness/conf/claims.yaml")


def pytest_collection_modifyitems(items):
    for item in items:
        for mark in item.iter_markers(MARKER):
            for cid in mark.args:
                prop = (MARKER, str(cid))
                if prop not in item.user_properties:
                    item.user_properties.append(prop)
