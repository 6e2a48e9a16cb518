"""Run directories: path from the resolved config, atomic files, completion marker.

Layout (docs/design.md, "Outputs")::

    <results_dir>/<task.name>/<estimator>/seed<seed>-<hash>/
        config.yaml        resolved config, written first
        metrics.parquet    one row per iteration (rewritten atomically as the run goes)
        tb/                the same rows as TensorBoard events (``logger=tensorboard``; harness.io.trackers)
        wandb/             the same rows as an offline wandb run (``logger=wandb``; ``logger=mlflow``
                           writes <results_dir>/mlflow.db instead)
        checkpoint.safetensors  the latest checkpoint (``checkpoint_every``; every training run)
        summary.json       written last: its presence marks the run finished
        .lock              flock'd by the process running the run (pid, host, start time)

``hash`` covers the resolved config except ``seed`` (in the name), ``results_dir``,
``population``, ``population_workers``, ``progress``, ``threads``, ``checkpoint_every``, ``deterministic``,
``logger``, ``plugins`` and ``recipe`` (the recipe's name; the settings it chose are hashed):
a population member and a lone run of the same seed share a directory, a rerun of the same sweep
finds finished runs and skips them, and switching checkpoints or deterministic kernels on
(neither changes CPU results: resume is exact) or TensorBoard logging (a copy of the metric rows,
``tb/``) keeps the directory and the hashes of older runs.

Fault tolerance: a run counts as finished only when ``summary.json`` parses, its
status is ``completed`` or ``diverged`` and ``metrics.parquet`` reads back with iterations
``1..n`` (``n`` = the summary's count); otherwise it is redone, with a log line naming the bad
file. A run is claimed with ``fcntl.flock`` on ``.lock`` for as long as its process works on
it, so two sweeps on one results folder never write the same run (the kernel drops the lock
when the process dies, SIGKILL included: no stale locks).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig, OmegaConf

from ..config import CONTROL_ONLY, LOSS_KNOBS, results_path
from . import schema
from .finished import config_subset

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: runs are not claimed
    fcntl = None

log = logging.getLogger("harness")

FINISHED = ("completed", "diverged")
# checkpoint_every, deterministic: added after runs existed; neither changes CPU results; logger
# only copies the metric rows elsewhere (harness.io.trackers); plugins only makes names importable (the
# estimator's or loss's name is hashed); recipe names the framework recipe the settings came from
# (harness.app.record_recipe), every one of which is hashed itself: runs recorded before it keep their folders
_NOT_HASHED = ("seed", "results_dir", "population", "progress", "threads", "checkpoint_every", "deterministic",
               "logger", "population_workers", "plugins", "recipe")
LOCK_FILE = ".lock"
CHECKPOINT_NAME = "checkpoint.safetensors"  # harness.io.checkpoint.CHECKPOINT_FILE
# Test-only hook (tests/test_faults.py): seconds to sleep in the middle of every atomic write,
# so that a SIGKILL at a random moment often lands inside a write. Unset in normal use.
WRITE_DELAY_ENV = "HARNESS_TEST_WRITE_DELAY"
# where a cache lives, the bound analysis scores diverged runs with, and how often a kl.beta=0 LM run
# measures its kl_ref column (the reference pass draws no random numbers) do not change the run
_NOT_HASHED_NESTED = (("lm", "cache_dir"), ("task", "worst_return"), ("lm", "kl_ref_every"))
# Keys added after runs were recorded (the sampling options): left out of the hash at these
# defaults, so the runs of older sweeps keep their directories; any other value is hashed. The
# knobs of one policy loss (delta, clip_ratio_c, sapo_tau_pos, ...: harness.config.LOSS_KNOBS) likewise.
_HASHED_UNLESS_DEFAULT = {"dynamic_sampling": False, "dynamic_sampling_max_draws": 10, "mask_truncated": False,
                          "overlong_cache": None, "group_std_eps": 1e-6,
                          "reference": None}
# nested keys added later (the frameworks' KL guards and verl's ReMax baseline), likewise
_NESTED_HASHED_UNLESS_DEFAULT = {("kl", "log_ratio_clamp"): None, ("kl", "value_clamp"): None,
                                 ("kl", "greedy_penalty"): True}
# task.* keys added later (normalisation and the continuous-control switches), likewise
_TASK_HASHED_UNLESS_DEFAULT = CONTROL_ONLY

# Columns every metrics.parquet carries (nulls where a value does not apply): harness.io.schema.
METRIC_COLUMNS = schema.METRIC_COLUMNS


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder and ``os.replace``: a
    reader sees the old file or the new one. An ``OSError`` that names no file (a full disk
    fails ``write`` or ``fsync``) or the temp file (a full disk refuses to create it) is raised
    with ``path`` as its ``filename``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        exc.filename = str(path)  # not the temp file's random name, which never existed
        raise
    delay = float(os.environ.get(WRITE_DELAY_ENV) or 0)
    try:
        with os.fdopen(fd, "wb") as f:
            if delay > 0:  # half the bytes, a pause, the rest: a half-written temp file
                f.write(data[:len(data) // 2])
                f.flush()
                time.sleep(delay)
                f.write(data[len(data) // 2:])
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a failed write() or fsync() (disk full)
            exc.filename = str(path)  # names no file: the one being written is named
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _hashed_part(cfg: DictConfig) -> dict:
    d = OmegaConf.to_container(cfg, resolve=True)
    for key in _NOT_HASHED:
        d.pop(key, None)
    for key in ("toy", "probe"):  # task-specific nodes added later: keep older hashes valid
        if d.get(key) is None:
            d.pop(key, None)
    knob_defaults = {k: default for k, (_, default) in LOSS_KNOBS.items()}
    for key, default in {**knob_defaults, **_HASHED_UNLESS_DEFAULT}.items():
        if key in d and d[key] == default:
            d.pop(key)
    task = d.get("task")
    if isinstance(task, dict):
        for key, default in _TASK_HASHED_UNLESS_DEFAULT.items():
            if key in task and task[key] == default:
                task.pop(key)
    for parent, key in _NOT_HASHED_NESTED:
        if isinstance(d.get(parent), dict):
            d[parent].pop(key, None)
    for (parent, key), default in _NESTED_HASHED_UNLESS_DEFAULT.items():
        if isinstance(d.get(parent), dict) and key in d[parent] and d[parent][key] == default:
            d[parent].pop(key)
    d.pop("hydra", None)
    return d


def config_hash(cfg: DictConfig) -> str:
    blob = json.dumps(_hashed_part(cfg), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def run_dir_for(cfg: DictConfig) -> Path:
    return Path(results_path(cfg)) / str(cfg.task.name) / str(cfg.estimator) / f"seed{cfg.seed}-{config_hash(cfg)}"


def run_status(path: Path) -> str | None:
    """The outcome a run recorded, by the one definition (:mod:`harness.io.finished`):
    ``completed``/``diverged`` only for a *finished* run (:func:`check_finished`: a summary whose
    metrics do not back it counts as not run, so whoever asks reruns it), any other status a
    well-formed summary.json records (``failed``) as it is, None otherwise (no summary.json, or
    one that does not parse as a JSON object with a string status). Quiet; never raises."""
    from .finished import check_run

    check = check_run(path)
    return check.status if check.finished or check.kind == "unfinished" else None


@functools.cache
def versions() -> dict[str, str]:
    """Installed versions, read from package metadata (importing transformers would cost seconds);
    read once a process (the modules it runs are the ones loaded then; 3.6 ms a call, at every run's
    end: a claims report ends thousands of runs). Callers get a copy."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("torch", "gymnasium", "transformers", "hydra-core", "pyarrow", "numpy"):
        try:
            out[dist.replace("-core", "")] = version(dist)
        except PackageNotFoundError:  # pragma: no cover - optional
            pass
    return out


@functools.cache
def git_commit() -> str | None:
    """The checkout's HEAD (``git rev-parse``), once a process: the code a process runs is the code
    it imported (a commit made while a sweep runs is not in it); None outside a git checkout."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def check_finished(path: Path, quiet: bool = False) -> str | None:
    """The status of a *finished* run (``completed`` or ``diverged``), else None.

    Finished is defined once, in :mod:`harness.io.finished` (shared with ``python -m analysis``):
    ``summary.json`` is a JSON object with a string status ``completed``/``diverged`` and an int
    ``iterations`` >= 0 (within ``budget.iterations`` of config.yaml), and ``metrics.parquet``
    reads with iterations exactly ``1..n``. A corrupt or truncated file, or files that disagree,
    mean the run is redone; a log line names the file and why (unless ``quiet``). Never raises.
    """
    from .finished import CORRUPT, check_run

    check = check_run(path)
    if check.finished:
        return check.status
    if check.kind == CORRUPT and not quiet:
        log.warning("rerun %s: %s [%s]", path, check.reason, Path(path) / check.file)
    return None


def last_values(rows: list[dict]) -> tuple[dict, dict]:
    """summary.json's ``final`` and ``final_iteration``: each numeric column's last value that is
    neither null nor NaN, and the iteration it comes from (the last row alone leaves
    ``episode_return`` null for a run whose last iteration ended no episode)."""
    final, at = {}, {}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v)):
                final[k], at[k] = v, row.get("iteration")
    return final, at


class RunDir:
    """One run's directory: config first, metrics as they come, summary last.

    ``writable`` is False for the control trainer's shadow members (``harness.train.control``),
    which are trained for their neighbours' sake but write nothing.
    """

    writable = True

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.path = run_dir_for(cfg)
        self.run_id = f"{cfg.task.name}/{cfg.estimator}/{self.path.name}"
        self.rows: list[dict] = []
        self._written: tuple[list[dict], int, dict, pa.Table] | None = None  # :meth:`flush`'s converted rows
        self._lock_fd: int | None = None
        self.holder: str | None = None  # who holds the claim, after a failed :meth:`claim`

    def status(self) -> str | None:
        return run_status(self.path)

    def blocker(self) -> str | None:
        """Why this run cannot be done here, or None: a folder between results_dir and the run
        (``<task>``, ``<estimator>``, the run's own) is a symlink, which would put the run outside
        results_dir (the analysis does not follow such links either, so the run could
        never be analysed); its directory exists but is not a directory; or one of its own files
        (config.yaml, metrics.parquet, the checkpoint, summary.json, .lock) is not a regular file
        (a directory, a symlink, a FIFO...). The harness neither reads, follows nor removes such
        an entry; it names it."""
        try:
            root = Path(results_path(self.cfg))
            for sub in (self.path.parent.parent, self.path.parent, self.path):
                if sub.is_symlink():
                    return (f"{sub} is a symlink (to {os.readlink(sub)}); the folders of a run under results_dir "
                            f"must be real folders: a run is never written outside {root}, and the analysis does "
                            "not follow links")
            if self.path.exists() and not self.path.is_dir():
                return f"{self.path} is not a directory"
            if not self.path.exists():
                return None
            for name in ("config.yaml", "metrics.parquet", CHECKPOINT_NAME, "summary.json", LOCK_FILE):
                f = self.path / name
                try:
                    mode = f.lstat().st_mode
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(mode):
                    kind = ("a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode)
                            else "not a regular file")
                    return f"{f} is {kind}"
        except OSError as exc:
            return f"{self.path}: {exc.strerror or exc}"
        return None

    def finished(self, quiet: bool = False) -> str | None:
        """See :func:`check_finished`."""
        return check_finished(self.path, quiet)

    # ------------------------------------------------------------------ claim
    def claim(self) -> bool:
        """Take the run's lock (``flock`` on ``.lock``, not blocking); False if another
        process holds it (its pid/host/start time in :attr:`holder`). Kept until
        :meth:`release` or the process's death."""
        if fcntl is None or self._lock_fd is not None:
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a crafted .lock symlink must not make us truncate its target
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: held elsewhere
            try:
                self.holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            return False
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode())
        except OSError as exc:  # a full disk: named by the lock's path, the lock let go
            os.close(fd)
            if exc.filename is None:
                exc.filename = str(self.path / LOCK_FILE)
            raise
        self._lock_fd = fd
        return True

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock; the file stays (removing it would race)
            self._lock_fd = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, keep_checkpoint: bool = False) -> None:
        """Clear whatever an interrupted attempt left (summary, temp files of killed writes;
        metrics and checkpoint too unless ``keep_checkpoint``: the trainer then resumes or
        calls :meth:`discard_progress`), then write config.yaml."""
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "summary.json").unlink(missing_ok=True)
        for tmp in self.path.glob(".*.tmp"):
            if not tmp.is_dir() or tmp.is_symlink():  # a crafted folder is left alone
                tmp.unlink(missing_ok=True)
        if not keep_checkpoint:
            self.discard_progress()
        atomic_write_text(self.path / "config.yaml", OmegaConf.to_yaml(self.cfg, resolve=True))

    def discard_progress(self) -> None:
        """Start from zero: no metrics, no checkpoint."""
        self.rows = []
        for name in ("metrics.parquet", CHECKPOINT_NAME):
            (self.path / name).unlink(missing_ok=True)

    def resume_rows(self, rows: list[dict]) -> None:
        """Continue from a checkpoint's rows: metrics.parquet is rewritten (atomically) with
        exactly them, so rows logged after the checkpoint by the killed attempt are dropped."""
        self.rows = list(rows)
        self.flush()

    def remove_checkpoint(self) -> None:
        (self.path / CHECKPOINT_NAME).unlink(missing_ok=True)

    def log(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        """Rewrite metrics.parquet (atomically) with every row logged so far. Rows are only appended
        between :meth:`discard_progress` and :meth:`resume_rows` (which replace the list), so the
        rows an earlier flush converted to Arrow are kept and only the new ones are converted: a
        flush costs the file's write, not a conversion of the whole run again (a 2,500-iteration
        run flushed every 10 iterations spent most of its flushing converting old rows; the
        SB3 reference flushed at every row). The table is the same as one built at once
        (:func:`schema.rows_table` of all the rows; tests/test_schema.py)."""
        table = self._table()
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        atomic_write_bytes(self.path / "metrics.parquet", sink.getvalue().to_pybytes())

    def _table(self) -> pa.Table:
        rows, kept = self.rows, self._written
        if kept is not None and kept[0] is rows and kept[1] <= len(rows):
            _, done, columns, table = kept
            new = rows[done:]
            if schema.columns_for(new, columns) == columns:  # else a new extra column: all again
                if new:
                    table = pa.concat_tables([table, schema.rows_table(new, columns)]).combine_chunks()
                self._written = (rows, len(rows), columns, table)
                return table
        columns = schema.columns_for(rows)
        table = schema.rows_table(rows, columns)
        self._written = (rows, len(rows), columns, table)
        return table

    def finish(self, status: str, reason: str | None, wall_time_s: float, extra: dict | None = None) -> None:
        self.flush()
        final, final_iteration = last_values(self.rows)
        summary = {
            "run_id": self.run_id, "status": status, "reason": reason, "final": final,
            "final_iteration": final_iteration,
            "wall_time_s": wall_time_s, "iterations": len(self.rows), "versions": dict(versions()),
            "git_commit": git_commit(),
            # what analysis reads of config.yaml, so loading a folder needs no YAML parse
            "config": config_subset(OmegaConf.to_container(self.cfg, resolve=True)), **(extra or {}),
        }
        atomic_write_json(self.path / "summary.json", summary)
