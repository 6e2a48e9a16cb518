"""Ctrl-C (SIGINT) ends ``python -m harness`` and ``python -m analysis`` with one line on stderr,
:data:`INTERRUPTED`, and exit code 130 — every time.

:func:`exit_now` is how both end then. Returning 130 or raising ``SystemExit(130)`` is not
enough: CPython sets a process-wide flag when a KeyboardInterrupt leaves code run through
``PyRun_String`` (pybind11's ``exec``/``eval``, which compiled extensions call), even if the
interrupt is caught further up, and at exit it then replaces the exit status by death by SIGINT
(``Py_RunMain`` -> ``exit_sigint``): about one Ctrl-C in four ended with status -2 instead of 130
(tests/test_fuzz_signals.py). So the exit handlers the interpreter would run are run here, the
standard streams flushed, and the process ends with ``os._exit``.

:func:`exit_without_teardown` is how both end when their command is done: the same, less the
interpreter's teardown, unless a thread that is not a daemon still runs.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
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


def exit_without_teardown(code: int = 0) -> None:
    """End the process with ``code`` as a normal exit would, less the interpreter's teardown.

    A normal exit waits for the threads that are not daemons, runs the ``atexit`` handlers
    (``logging.shutdown``, the pools of joblib's and multiprocessing's workers, temporary
    folders' finalizers), flushes ``sys.stdout`` and ``sys.stderr``, and then tears the
    interpreter down: every module's objects freed one by one (~300,000 in a control run, from
    torch, Hydra and the rest) and the libraries' C++ destructors. Nothing a command writes is
    written there (every file is written and closed before), and it took 0.13-0.14 s of a zoo
    CartPole process (1.5% of its 9 s) and 0.95-1.0 s of a 4.4 s ``python -m analysis report``.
    When no such thread runs, the handlers and the flush are :func:`exit_now`'s and the process
    ends with ``code``; otherwise this returns and the caller's normal exit follows
    (``tests/test_cli_startup.py::test_a_command_ends_as_a_normal_exit_would_less_the_teardown``)."""
    if not any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        exit_now(code)


def exit_interrupted() -> NoReturn:
    """The one line, then exit code 130."""
    print(INTERRUPTED, file=sys.stderr)
    exit_now(130)


__all__ = ["INTERRUPTED", "exit_now", "exit_interrupted", "exit_without_teardown"]
