"""Ctrl-C (SIGINT) ends ``python -m harness`` and ``python -m analysis`` with one line on stderr,
:data:`INTERRUPTED`, and exit code 130 — every time.

:func:`exit_now` is how both end then. Returning 130 or raising ``SystemExit(130)`` is not
enough: CPython sets a process-wide flag when a KeyboardInterrupt leaves code run through
``PyRun_String`` (pybind11's ``exec``/``eval``, which compiled extensions call), even if the
interrupt is caught further up, and at exit it then replaces the exit status by death by SIGINT
(``Py_RunMain`` -> ``exit_sigint``): about one Ctrl-C in four ended with status -2 instead of 130
(tests/test_fuzz_signals.py). So the exit handlers the interpreter would run are run here, the
standard streams flushed, and the process ends with ``os._exit``.
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

INTERRUPTED = "interrupted; rerun the same command to resume"


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` after the exit handlers (``atexit``: logging, multiprocessing,
    Hydra's, ...) and a flush of stdout and stderr."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def exit_interrupted() -> NoReturn:
    """The one line, then exit code 130."""
    print(INTERRUPTED, file=sys.stderr)
    exit_now(130)


__all__ = ["INTERRUPTED", "exit_now", "exit_interrupted"]
