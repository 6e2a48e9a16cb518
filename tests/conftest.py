import os

os.environ.setdefault("MPLBACKEND", "Agg")

# exact claims: @pytest.mark.claim("C7") (harness/experiments/pytest_claims.py)
from harness.experiments.pytest_claims import pytest_collection_modifyitems as _claims_items  # noqa: E402
from harness.experiments.pytest_claims import pytest_configure  # noqa: E402,F401


def _slow_tests() -> frozenset[str]:
    """The tests ``benchmarks/suite_time.py --docs`` measured as slow (tests/slow_tests.txt)."""
    from pathlib import Path

    listed = Path(__file__).with_name("slow_tests.txt")
    lines = listed.read_text().splitlines() if listed.is_file() else []
    return frozenset(x.strip() for x in lines if x.strip() and not x.startswith("#"))


def _mark_slow(items) -> None:
    """Mark ``slow`` each test measured slow (every case of it), so ``-m "not slow"`` is the fast subset."""
    import pytest

    slow = _slow_tests()
    for item in items:
        if item.nodeid.split("[", 1)[0] in slow:
            item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(items):  # noqa: F811 - the claims' hook, then the slow marks
    _claims_items(items)
    _mark_slow(items)
