"""When a run counts as *finished*: one definition for the harness and the analysis.

The harness (:func:`harness.io.rundir.check_finished`) skips a finished run and redoes any
other; ``python -m analysis report`` and ``python -m analysis claims`` score finished runs only
and name every other run with the reason :func:`check_run` gives. A run directory is finished
when all of these hold:

1. ``summary.json`` parses as a JSON object whose ``status`` is a string, ``completed`` or
   ``diverged`` (``failed`` and anything else: not finished);
2. its ``iterations`` is an int ``>= 0`` (not a bool), and when ``config.yaml`` sets
   ``budget.iterations`` to an int, no more than that (``config.yaml``, when present, must parse);
3. ``metrics.parquet`` reads, and its ``iteration`` column is exactly ``1..n`` with ``n`` the
   summary's ``iterations``.

:func:`check_run` never raises: every failure becomes a :class:`RunCheck` with a one-line
``reason`` naming the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

__all__ = ["FINISHED", "SUMMARY_FILE", "METRICS_FILE", "CONFIG_FILE", "RunCheck", "check_run",
           "read_summary"]

FINISHED = ("completed", "diverged")
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.parquet"
CONFIG_FILE = "config.yaml"

# RunCheck.kind
MISSING = "missing"        # no summary.json: never ran, still running or killed
UNFINISHED = "unfinished"  # a valid summary whose status is not completed/diverged (failed, ...)
CORRUPT = "corrupt"        # a file is unreadable or the files disagree


@dataclass(frozen=True)
class RunCheck:
    """The outcome of :func:`check_run`.

    ``status``: the status a well-formed summary.json records (a string), else None.
    ``finished``: the run meets every rule of the module docstring (then ``status`` is
    ``completed`` or ``diverged`` and ``reason`` is None). ``kind``: None when finished, else
    ``missing`` | ``unfinished`` | ``corrupt``. ``iterations``: the summary's count, when valid; ``file``: the name of the file
    at fault, when one is.
    """

    finished: bool
    status: str | None = None
    reason: str | None = None
    kind: str | None = None
    iterations: int | None = None
    file: str | None = None  # the file at fault (summary.json, config.yaml or metrics.parquet)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def read_summary(path: Path) -> tuple[dict | None, str | None]:
    """``(summary, None)`` for a summary.json that parses as a JSON object with a string
    ``status``; ``(None, reason)`` otherwise (``reason`` None when the file does not exist)."""
    summary_path = Path(path) / SUMMARY_FILE
    if not summary_path.exists():
        return None, None
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        return None, f"unreadable {SUMMARY_FILE} ({_err(exc)})"
    if not isinstance(summary, dict):
        return None, f"{SUMMARY_FILE} is not a JSON object (a {type(summary).__name__})"
    status = summary.get("status")
    if not isinstance(status, str):
        return None, f"{SUMMARY_FILE} status {status!r} is not a string"
    return summary, None


def read_parquet(path: Path, columns: list[str] | None = None):
    """One parquet file as an Arrow table: ``ParquetFile.read`` on one thread (about 5x less
    overhead per file than ``pq.read_table``, which sets up a dataset scan and a thread pool;
    analysis reads thousands of small files)."""
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns, use_threads=False)


def safe_load_yaml(text: str):
    """``yaml.safe_load`` with libyaml's C parser where PyYAML was built with it (the same safe
    subset, about 10x faster: analysis reads one config.yaml per run of a results folder)."""
    import yaml  # PyYAML, shipped with omegaconf

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _budget_iterations(path: Path) -> tuple[int | None, str | None]:
    """``budget.iterations`` of config.yaml when it is an int; ``(None, reason)`` if the file
    exists but does not parse."""
    cfg_path = Path(path) / CONFIG_FILE
    if not cfg_path.exists():
        return None, None
    try:
        cfg = safe_load_yaml(cfg_path.read_text(encoding="utf-8"))
    except Exception as exc:  # noqa: BLE001 - any parse failure means unreadable
        return None, f"unreadable {CONFIG_FILE} ({_err(exc)})"
    budget = cfg.get("budget") if isinstance(cfg, dict) else None
    limit = budget.get("iterations") if isinstance(budget, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool):
        return limit, None
    return None, None


def _span(its: list) -> str:
    return f"[{its[0]}..{its[-1]}] ({len(its)} rows)" if its else "no rows"


def check_run(path: Path) -> RunCheck:
    """Is the run directory ``path`` finished? See the module docstring. Never raises."""
    path = Path(path)
    summary, bad = read_summary(path)
    if summary is None:
        if bad is None:
            return RunCheck(False, reason=f"no {SUMMARY_FILE} (not run, still running or killed)", kind=MISSING)
        return RunCheck(False, reason=bad, kind=CORRUPT, file=SUMMARY_FILE)
    status = summary["status"]
    if status not in FINISHED:
        why = summary.get("reason")
        return RunCheck(False, status, f"status {status!r}" + (f" ({why})" if why else ""), UNFINISHED,
                        file=SUMMARY_FILE)
    n = summary.get("iterations")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return RunCheck(False, status, f"{SUMMARY_FILE} iterations {n!r} is not an int >= 0", CORRUPT,
                        file=SUMMARY_FILE)
    limit, bad = _budget_iterations(path)
    if bad is not None:
        return RunCheck(False, status, bad, CORRUPT, n, CONFIG_FILE)
    if limit is not None and n > limit:
        return RunCheck(False, status, f"{SUMMARY_FILE} says {n} iterations, over budget.iterations={limit} "
                                       f"in {CONFIG_FILE}", CORRUPT, n, SUMMARY_FILE)
    try:
        its = read_parquet(path / METRICS_FILE, columns=["iteration"]).column("iteration").to_pylist()
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError, KeyError...: any means corrupt
        return RunCheck(False, status, f"unreadable {METRICS_FILE} ({_err(exc)})", CORRUPT, n, METRICS_FILE)
    if its != list(range(1, n + 1)):
        return RunCheck(False, status, f"{METRICS_FILE} holds iterations {_span(its)}, {SUMMARY_FILE} says {n}",
                        CORRUPT, n, METRICS_FILE)
    return RunCheck(True, status, iterations=n)
