"""The fast subset: ``benchmarks/suite_time.py`` reads the slow tests off pytest's durations, and
the list it writes names tests that exist."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def suite_time():
    spec = importlib.util.spec_from_file_location("suite_time", ROOT / "benchmarks" / "suite_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_test_is_slow_by_its_setup_call_and_teardown_together_all_its_cases_alike():
    output = "\n".join([
        "============ slowest durations ============",
        "1.50s call     tests/test_a.py::test_one[x]",   # 1.5 + 0.8 setup = 2.3 > 2: slow, as every case of it
        "0.80s setup    tests/test_a.py::test_one[x]",
        "1.90s call     tests/test_a.py::test_one[y]",
        "1.99s call     tests/test_b.py::test_two",       # under 2 s
        "3.00s teardown tests/test_b.py::test_three",
        "12 passed in 9.1s",
    ])
    assert suite_time().slow_tests(output, 2.0) == ["tests/test_a.py::test_one", "tests/test_b.py::test_three"]


def test_each_listed_slow_test_is_a_test_of_the_suite():
    from tests.conftest import _slow_tests

    listed = _slow_tests()
    assert listed  # the fast subset leaves something out
    missing = []
    for node in listed:
        path, _, name = node.partition("::")
        if not (ROOT / path).is_file() or f"def {name.split('::')[-1]}(" not in (ROOT / path).read_text():
            missing.append(node)
    assert not missing, f"tests/slow_tests.txt names tests that no longer exist: {missing}"
