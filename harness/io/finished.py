"""When a run counts as *finished*: one definition for the harness and the analysis.

The harness (:func:`harness.io.rundir.check_finished`) skips a finished run and redoes any
other; ``python -m analysis report`` and ``python -m analysis claims`` score finished runs only
and name every other run with the reason :func:`check_run` gives. A run directory is finished
when all of these hold:

1. ``summary.json`` parses as a JSON object whose ``status`` is a string, ``completed`` or
   ``diverged`` (``failed`` and anything else: not finished);
2. its ``iterations`` is an int ``>= 0`` (not a bool), and when the run's config sets
   ``budget.iterations`` to an int, no more than that. The config is summary.json's ``config``
   (:func:`config_subset`, which the harness writes); for a run whose summary has
   none (an older run), ``config.yaml``, which must then parse when present;
3. ``metrics.parquet`` reads, and its ``iteration`` column is exactly ``1..n`` with ``n`` the
   summary's ``iterations``.

:func:`check_run` never raises: every failure becomes a :class:`RunCheck` with a one-line
``reason`` naming the file. Every file is read through :mod:`harness.io.files`, the one reader of
run files: regular files only (a symlink, FIFO or device is named, never followed or read),
within size and depth bounds, metric tables without a column twice and with the schema's types.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .files import RunFileError, read_json, read_table, read_yaml

__all__ = ["FINISHED", "SUMMARY_FILE", "METRICS_FILE", "CONFIG_FILE", "RunCheck", "check_run",
           "check_parts", "check_iterations", "config_subset", "read_config", "read_summary", "read_parquet",
           "budget_iterations", "unreadable_metrics", "RunFileError"]

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
    ``status``; ``(None, reason)`` otherwise (``reason`` None when the file does not exist). Read
    through :func:`harness.io.files.read_json`: a regular file, within the size and depth bounds."""
    try:
        summary = read_json(os.path.join(path, SUMMARY_FILE))
    except FileNotFoundError:
        return None, None
    except RunFileError as exc:
        return None, f"unreadable {SUMMARY_FILE} ({exc.reason})"
    if not isinstance(summary, dict):
        return None, f"{SUMMARY_FILE} is not a JSON object (a {type(summary).__name__})"
    status = summary.get("status")
    if not isinstance(status, str):
        return None, f"{SUMMARY_FILE} status {status!r} is not a string"
    return summary, None


def read_parquet(path: Path, columns: list[str] | None = None):
    """One metrics file as an Arrow table: :func:`harness.io.files.read_table` (a regular file
    within its size bound, read on one thread from memory, no column twice, registered columns
    of their types); raises :class:`~harness.io.files.RunFileError` naming the file."""
    return read_table(path, columns)


def config_subset(cfg) -> dict:
    """The part of a run's resolved config that analysis and this module read, with
    config.yaml's nesting: ``task`` (its ``name``/``env_id``/``id`` and ``worst_return``),
    ``estimator``, ``seed``, the variant settings (:data:`harness.io.schema.VARIANTS`) and
    ``budget.iterations``. The harness writes it into summary.json (``config``), so reading a
    results folder parses one small JSON file per run instead of a YAML file (a YAML parse,
    even with libyaml, costs many times a JSON one)."""
    from .schema import VARIANTS

    if not isinstance(cfg, dict):
        return {}
    out: dict = {}
    task = cfg.get("task")
    if isinstance(task, dict):
        out["task"] = {k: task[k] for k in ("name", "env_id", "id", "worst_return") if k in task}
    elif task is not None:
        out["task"] = task
    for key in ("estimator", "seed", *VARIANTS):
        if key in cfg:
            out[key] = cfg[key]
    if isinstance(out.get("estimator"), dict):
        out["estimator"] = {k: v for k, v in out["estimator"].items() if k == "name"}
    budget = cfg.get("budget")
    if isinstance(budget, dict) and "iterations" in budget:
        out["budget"] = {"iterations": budget["iterations"]}
    return out


def read_config(path: Path, summary: dict | None = None) -> tuple[dict | None, str | None]:
    """``(cfg, None)``: the run's :func:`config_subset`, from summary.json's ``config`` when it
    records one, else parsed from config.yaml; ``(None, None)``
    when neither exists; ``(None, reason)`` when config.yaml must be read and does not parse;
    ``({}, None)`` when it parses to something other than a mapping."""
    if isinstance(summary, dict) and isinstance(summary.get("config"), dict):
        return summary["config"], None
    try:
        cfg = read_yaml(Path(path) / CONFIG_FILE)
    except FileNotFoundError:
        return None, None
    except RunFileError as exc:
        return None, f"unreadable {CONFIG_FILE} ({exc.reason})"
    return (config_subset(cfg), None) if isinstance(cfg, dict) else ({}, None)


def budget_iterations(cfg: dict | None) -> int | None:
    """``budget.iterations`` of a run's config when it is an int, else None."""
    budget = cfg.get("budget") if isinstance(cfg, dict) else None
    limit = budget.get("iterations") if isinstance(budget, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool):
        return limit
    return None


def _span(its: list) -> str:
    return f"[{its[0]}..{its[-1]}] ({len(its)} rows)" if its else "no rows"


def check_parts(summary: dict | None, summary_bad: str | None, cfg: dict | None,
                cfg_bad: str | None) -> RunCheck:
    """Rules 1 and 2 of the module docstring on a run's already-read summary.json
    (:func:`read_summary`) and config (:func:`read_config`). A failure is final; a pass
    returns ``RunCheck(True, status, iterations=n)``, which still needs rule 3
    (:func:`check_iterations`) before the run counts as finished."""
    if summary is None:
        if summary_bad is None:
            return RunCheck(False, reason=f"no {SUMMARY_FILE} (not run, still running or killed)", kind=MISSING)
        return RunCheck(False, reason=summary_bad, kind=CORRUPT, file=SUMMARY_FILE)
    status = summary["status"]
    if status not in FINISHED:
        why = summary.get("reason")
        return RunCheck(False, status, f"status {status!r}" + (f" ({why})" if why else ""), UNFINISHED,
                        file=SUMMARY_FILE)
    n = summary.get("iterations")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return RunCheck(False, status, f"{SUMMARY_FILE} iterations {n!r} is not an int >= 0", CORRUPT,
                        file=SUMMARY_FILE)
    if cfg_bad is not None:
        return RunCheck(False, status, cfg_bad, CORRUPT, n, CONFIG_FILE)
    limit = budget_iterations(cfg)
    if limit is not None and n > limit:
        where = "summary.json's config" if isinstance(summary.get("config"), dict) else CONFIG_FILE
        return RunCheck(False, status, f"{SUMMARY_FILE} says {n} iterations, over budget.iterations={limit} "
                                       f"in {where}", CORRUPT, n, SUMMARY_FILE)
    return RunCheck(True, status, iterations=n)


def check_iterations(parts: RunCheck, its: list) -> RunCheck:
    """Rule 3 on a run that passed :func:`check_parts`: its metrics.parquet ``iteration``
    column ``its`` must be exactly ``1..n``."""
    n = parts.iterations
    if len(its) != n or its != list(range(1, n + 1)):  # the length first: n may be 10**11
        return RunCheck(False, parts.status, f"{METRICS_FILE} holds iterations {_span(its)}, {SUMMARY_FILE} says {n}",
                        CORRUPT, n, METRICS_FILE)
    return parts


def unreadable_metrics(parts: RunCheck, exc: BaseException) -> RunCheck:
    """Rule 3 failed because metrics.parquet does not read (or is not a regular file, or breaks
    the schema checks of :func:`harness.io.files.read_table`)."""
    why = exc.reason if isinstance(exc, RunFileError) else _err(exc)
    return RunCheck(False, parts.status, f"unreadable {METRICS_FILE} ({why})", CORRUPT, parts.iterations,
                    METRICS_FILE)


def check_run(path: Path) -> RunCheck:
    """Is the run directory ``path`` finished? See the module docstring. Never raises."""
    path = Path(path)
    summary, bad = read_summary(path)
    cfg, cfg_bad = read_config(path, summary) if summary is not None else (None, None)
    parts = check_parts(summary, bad, cfg, cfg_bad)
    if not parts.finished:
        return parts
    try:
        its = read_parquet(path / METRICS_FILE, columns=["iteration"]).column("iteration").to_pylist()
    except (RunFileError, OSError) as exc:  # FileNotFoundError included
        return unreadable_metrics(parts, exc)
    return check_iterations(parts, its)
