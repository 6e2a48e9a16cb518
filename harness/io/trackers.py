"""``logger=tensorboard | wandb | mlflow``: each run's metric rows also in a tracker, live.

``metrics.parquet`` stays the record (analysis reads only it); a tracker holds a copy for watching
a sweep as it trains. One interface for all of them (:class:`TrackerLog`; the registry
:data:`TRACKERS` maps a ``logger`` value to its class; :func:`make_logger` picks it):

* **what**: per row the training loop appends (:meth:`harness.train.loop.Loop.run` calls
  :meth:`TrackerLog.write` right after ``RunDir.log``; rows are never built here), one value per
  numeric column of the row (:func:`scalars`: int or float, not bool; null columns left out, so
  ``eval_return`` appears at the evaluated rows only), named after the column;
* **step**: the row's ``env_steps`` (:data:`STEP`): the budget's unit, the x axis analysis uses
  (environment steps of control tasks, sampled tokens of the LM task, sampled sequences of the
  toy task); it grows every iteration. ``iteration`` is one of the values;
* **which runs**: one tracker run per harness run (each member of a population its own);
  population members that are shadows (``writable`` false) write nothing;
* **resume** (:meth:`TrackerLog.__init__`): a backend opens the tracker run of a harness run,
  told the step of the last row the run starts with (none from zero; from a checkpoint, the rows
  metrics.parquet is truncated to), and says which step its tracker run holds last
  (:meth:`TrackerLog.open`); the rows the run starts with are written again, each step the
  tracker holds already skipped. A resumed run recomputes the rows a killed attempt logged after
  its checkpoint bit-identically except their ``wall_time_s``: where the tracker run holds such
  steps already (MLflow, wandb online), it keeps the killed attempt's values for them (the wall
  times at which those steps were first computed); every other value equals metrics.parquet,
  each step once;
* **before the runs** (:func:`check_tracker`, the last check of :func:`harness.validation.validate`):
  each backend's :meth:`TrackerLog.check` refuses, before any run folder exists, a package that
  fails on import and settings the tracker would fail on once the runs started (its environment
  variables, its store, its server: see :meth:`MlflowLog.check`, :meth:`WandbLog.check`);
* **a full disk**: a write that fails names its path (:func:`written`), and the command ends in
  one line (:func:`harness.app.run`).

Backends:

* :class:`TensorBoardLog` (``<run dir>/tb/``): the folder is removed at open, so it holds no
  step (the rows the run starts with are written again). TensorBoard stores 32-bit floats.
* :class:`WandbLog` (``<run dir>/wandb/``): ``WANDB_MODE=offline`` unless the environment sets
  ``WANDB_MODE``; the wandb run id is derived from the run directory (:func:`tracker_run_id`), the
  group is the configuration (:func:`group_name`: its seeds, and a population's members,
  together). Offline, the run's ``wandb/`` folder is removed at open like ``tb/``: one offline
  run per harness run, with that id, for ``wandb sync``. Online (``WANDB_MODE=online``) the id
  resumes the server's run and the steps up to its summary's ``env_steps`` are skipped (a
  killed attempt's steps past its checkpoint keep that attempt's ``wall_time_s``; untested here:
  no network).
* :class:`MlflowLog`: MLflow's usage telemetry off and its HTTP retries short (:data:`MLFLOW_ENV`,
  unless the environment sets them); ``MLFLOW_TRACKING_URI`` if set, else a SQLite store
  ``<results_dir>/mlflow.db`` (MLflow's file store is in maintenance mode); one experiment per
  results_dir (named by its absolute path; ``MLFLOW_EXPERIMENT_NAME`` overrides), one run per
  harness run, named ``task/estimator/seed<seed>-<hash>`` and found again by its tag
  ``harness.run_id``, the group in the tag ``group``, the flattened config as parameters. Resumed,
  the same MLflow run continues (MLflow deletes no metric values: the steps it holds are skipped).

A run that is skipped (finished before) is not touched: a sweep rerun with a logger writes nothing
for runs finished without it.
"""
from __future__ import annotations

import errno
import hashlib
import importlib
import logging
import os
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the store is opened unlocked
    fcntl = None

from ..config import bad_field, connect_problem, path_problem, results_path
from .rundir import config_hash

TB_DIR = "tb"
TB_WRITER_MODULE = "tensorboard.summary.writer.event_file_writer"  # where TensorBoard's writer thread class is
WANDB_DIR = "wandb"
MLFLOW_DB = "mlflow.db"  # the default MLflow store, in results_dir
MLFLOW_ARTIFACTS = "mlartifacts"  # the default experiment's artifact root (nothing is logged there)
RUN_TAG = "harness.run_id"  # MLflow tag naming the harness run (task/estimator/seed<seed>-<hash>)
GROUP_TAG = "group"  # MLflow tag: the group, as wandb's group
WANDB_PROJECT = "pg-harness"  # unless WANDB_PROJECT is set
STEP = "env_steps"  # the row column used as every tracker's step
FLUSH_SECS = 10  # TensorBoard's own flush interval: a live view lags by at most this much
CONNECT_TIMEOUT_S = 5  # how long the check before a run waits for a tracker's server to answer
LOCK_WAIT_S = 5  # how long the check waits for a SQLite store another process holds locked (SQLite's own default)
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database (sqlite.org/fileformat.html)
# MLflow's own knobs, set unless the environment sets them (read by mlflow when it is imported or at each request):
# usage telemetry off (it reports to its vendor and writes ~/.config/mlflow/telemetry.json); a tracking server
# that stops answering during a run fails a request after at most 3 tries of 10 s (MLflow's defaults: 8 tries
# of 120 s, with backoff, minutes per request)
MLFLOW_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}  # tables of every MLflow SQL store (its schema)
MLFLOW_DATABASES = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}  # database stores MLflow takes: default ports
MLFLOW_STORES = ("unset (the SQLite store <results_dir>/mlflow.db), sqlite:///<file>, http(s)://<tracking server> "
                 f"or {'|'.join(MLFLOW_DATABASES)}://<database>")
WANDB_ONLINE = ("online", "run", "shared")  # the WANDB_MODE values that reach a W&B server


def scalars(row: dict) -> dict[str, float]:
    """The numeric columns of a metric row (name -> value; bools, strings and nulls left out)."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat_config(cfg: Any) -> dict[str, Any]:
    """The run's resolved config as ``{"task.name": ..., "lr": ...}`` (the tracker's parameters);
    empty sections leave no key."""
    import pandas as pd

    return pd.json_normalize(OmegaConf.to_container(cfg, resolve=True), sep=".").to_dict("records")[0]


def group_name(run: Any) -> str:
    """``<task>/<estimator>/<config hash>``: the runs of one configuration (the seeds of a sweep
    point, and the members of a population) share it."""
    return f"{run.cfg.task.name}/{run.cfg.estimator}/{config_hash(run.cfg)}"


def tracker_run_id(run: Any) -> str:
    """A tracker run id derived from the run directory (absolute path): the same harness run,
    resumed, opens the same tracker run; runs of other results_dirs get other ids."""
    return hashlib.sha1(str(Path(run.path).resolve()).encode()).hexdigest()[:16]


def _clear(path: Path) -> None:
    """Remove ``path`` (a run's ``tb/`` or ``wandb/``): a folder with what is in it, or a file or
    symlink itself (a symlink's target is never touched)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def shown(value: str, keep: int = 60) -> str:
    """``value`` for a one-line message: at most ``keep`` characters, the length said when cut."""
    return value if len(value) <= keep else f"{value[:keep]}... ({len(value)} characters)"


def chain(exc: BaseException):
    """``exc`` and what it was raised from or during (``__cause__``, else ``__context__``), outermost first."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def cause(exc: BaseException) -> str:
    """The innermost cause of ``exc`` (:func:`chain`) as one short line."""
    *_, inner = chain(exc)
    return shown(" ".join(str(inner).split()) or type(inner).__name__, 200)


def import_tracker(logger: str, module: str, package: str | None = None):
    """``module`` (of ``package``, by default its top-level name), imported for ``logger=<logger>``;
    a package that is installed but fails on import is refused in one line naming it and its error
    (:func:`harness.config.check_logger` has checked that it is installed)."""
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever a broken package raises
        bad_field("logger", f"'none' here: logger={logger} needs a working {package or module.split('.')[0]} package "
                  f"(import {module} failed: {type(exc).__name__}: {cause(exc)})", logger)


def check_tracker(cfg: Any) -> None:
    """The tracker ``cfg.logger`` names can be used, checked before any run folder exists: its
    package imports, and its settings from the environment and its store or server answer
    (:meth:`TrackerLog.check` of the backend). Raises ``ValueError`` naming the field or variable
    and what it allows. ``mode=probe`` runs no training loop: no tracker, nothing checked."""
    cls = TRACKERS.get(cfg.get("logger", "none"))
    if cls is not None and cfg.get("mode", "train") == "train":
        cls.check(cfg)


@contextmanager
def written(path: Path | str):
    """A tracker's writes to ``path``: an ``OSError`` that names no file (a full disk fails a
    ``write``) is raised naming ``path``, and a SQLite store's ``database or disk is full`` as
    ``OSError(ENOSPC)`` on it, so the command ends in one line naming it (:func:`harness.app.main_entry`)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise
    except Exception as exc:  # MLflow's MlflowException from SQLAlchemy's OperationalError from sqlite3's
        if any(getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL for e in chain(exc)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise


class TrackerLog:
    """One tracker run per writable harness run. A backend defines :meth:`open`, :meth:`log`
    and :meth:`end`; the row -> (step, values) mapping and the resume rule live here only."""

    def __init__(self, runs: Sequence[Any]):
        self.handles: list[Any] = []
        self.last: list[int] = []  # per member: the last step its tracker run holds
        for r in runs:
            if not getattr(r, "writable", True):
                self.handles.append(None)
                self.last.append(0)
                continue
            handle, last = self.open(r, int(r.rows[-1][STEP]) if r.rows else None)
            self.handles.append(handle)
            self.last.append(-1 if last is None else int(last))
            for row in r.rows:  # resumed from a checkpoint: its rows, where the tracker lacks them
                self.write(len(self.handles) - 1, row)
            self.flush(handle)

    # ---- what a backend defines
    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse (:func:`harness.config.bad_field`) what would fail this backend once the runs started."""
        raise NotImplementedError

    def open(self, run: Any, start: int | None) -> tuple[Any, int | None]:
        """The tracker run of ``run`` and the last step it holds (None: none); ``start`` is the
        step of the last row the run starts with (None: it starts from zero)."""
        raise NotImplementedError

    def log(self, handle: Any, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def flush(self, handle: Any) -> None:
        pass

    def end(self, handle: Any, finished: bool) -> None:
        """Close ``handle``: its run finished (True) or stopped unfinished (an exception; False)."""
        raise NotImplementedError

    # ---- what the training loop calls
    def write(self, p: int, row: dict) -> None:
        """Member ``p``'s new row (skipped at a step its tracker run holds already)."""
        if self.handles[p] is None:
            return
        step = int(row[STEP])
        if step > self.last[p]:
            self.log(self.handles[p], step, scalars(row))
            self.last[p] = step

    def close_member(self, p: int, finished: bool = True) -> None:
        """Member ``p`` finished: its values reach the tracker now."""
        if self.handles[p] is not None:
            handle, self.handles[p] = self.handles[p], None
            self.end(handle, finished)

    def close(self) -> None:
        """The loop ends: the members still open stopped without finishing."""
        for p in range(len(self.handles)):
            self.close_member(p, finished=False)


class TensorBoardLog(TrackerLog):
    """``logger=tensorboard``: one ``SummaryWriter`` per run, in ``<run dir>/tb/``."""

    @classmethod
    def check(cls, cfg):
        import_tracker("tensorboard", "torch.utils.tensorboard", "tensorboard")

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._writer = SummaryWriter
        self._hook = threading.excepthook
        threading.excepthook = self._thread_error
        try:
            super().__init__(runs)
        except BaseException:
            threading.excepthook = self._hook
            raise

    def _thread_error(self, args) -> None:
        """A writer's thread ends with its failed write, which the writer's next call raises again
        (named by :func:`written`): not printed from the thread as well; other threads' errors are."""
        if type(args.thread).__module__ != TB_WRITER_MODULE:
            self._hook(args)

    def close(self):
        try:
            super().close()
        finally:
            threading.excepthook = self._hook

    def open(self, run, start):
        path = Path(run.path) / TB_DIR
        with written(path):
            _clear(path)
            return self._writer(log_dir=str(path), flush_secs=FLUSH_SECS), None

    def log(self, w, step, values):
        with written(Path(w.get_logdir())):  # the writer's thread raises a failed write at the next call
            for tag, value in values.items():
                w.add_scalar(tag, value, global_step=step)

    def flush(self, w):
        with written(Path(w.get_logdir())):
            w.flush()

    def end(self, w, finished):
        with written(Path(w.get_logdir())):
            w.close()


def wandb_mode() -> str:
    """The wandb mode runs use: ``WANDB_MODE``, else ``offline`` (synced later with ``wandb sync``)."""
    return os.environ.get("WANDB_MODE") or "offline"


class WandbLog(TrackerLog):
    """``logger=wandb``: one wandb run per run, its files in ``<run dir>/wandb/``."""

    @classmethod
    def check(cls, cfg):
        """wandb imports; each ``WANDB_*`` variable is one wandb's settings take (wandb's own checks:
        ``WANDB_MODE`` one of its modes, ``WANDB_PROJECT`` a project name, ...); an online mode has an
        API key and its server (``WANDB_BASE_URL``) answers within :data:`CONNECT_TIMEOUT_S`."""
        wandb = import_tracker("wandb", "wandb")
        for key, value in sorted(os.environ.items()):
            if key.startswith("WANDB_"):
                try:
                    wandb.Settings().update_from_env_vars({key: value})
                except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, wandb's UsageError
                    detail = exc.errors()[0]["msg"] if hasattr(exc, "errors") else cause(exc)
                    bad_field(key, f"a value wandb takes ({detail})", shown(value))
        mode = wandb_mode()
        if mode not in WANDB_ONLINE:
            return
        settings = wandb.Settings()
        settings.update_from_env_vars(dict(os.environ))
        from wandb.sdk.lib.wbauth import check_api_key, read_netrc_auth

        key = os.environ.get("WANDB_API_KEY")
        try:
            has_key = bool(key or os.environ.get("WANDB_IDENTITY_TOKEN_FILE")
                           or read_netrc_auth(host=settings.base_url))
        except Exception as exc:  # noqa: BLE001 - a .netrc that cannot be read
            bad_field("WANDB_MODE", f"offline with an unreadable .netrc ({cause(exc)})", mode)
        if not has_key:
            bad_field("WANDB_MODE", "offline (the default) or disabled without a W&B API key; online needs one "
                      "(WANDB_API_KEY, or `wandb login`)", mode)
        invalid = check_api_key(key) if key else None  # why wandb refuses the key; the key itself is not shown
        if invalid:
            bad_field("WANDB_API_KEY", f"a W&B API key ({invalid})", f"<{len(key)} characters>")
        import requests

        try:
            requests.get(settings.base_url, timeout=CONNECT_TIMEOUT_S)
        except requests.RequestException as exc:
            bad_field("WANDB_BASE_URL", f"a W&B server that answers within {CONNECT_TIMEOUT_S} s with "
                      f"WANDB_MODE={mode} ({cause(exc)}), or WANDB_MODE=offline", settings.base_url)

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        import wandb  # needs the wandb package

        self._wandb = wandb
        self.mode = wandb_mode()
        self.offline = self.mode in ("offline", "dryrun")
        super().__init__(runs)

    def open(self, run, start):
        wandb = self._wandb
        if self.offline:
            _clear(Path(run.path) / WANDB_DIR)  # its rows are written again: one offline run
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  disable_git=True, save_code=False, silent=True)
        handle = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), id=tracker_run_id(run),
                            name=run.run_id, group=group_name(run), job_type="train", dir=str(run.path), mode=self.mode,
                            config=OmegaConf.to_container(run.cfg, resolve=True),
                            resume=None if self.offline else "allow", reinit="create_new", settings=settings)
        last = None if self.offline else handle.summary.get(STEP)
        return handle, last

    def log(self, handle, step, values):
        handle.log(values, step=step)

    def end(self, handle, finished):
        handle.finish(exit_code=0 if finished else 1)


def mlflow_environment() -> None:
    """MLflow's knobs :data:`MLFLOW_ENV`, where the environment does not set them; before mlflow is
    imported. Its SQL store's logger is kept to critical messages: the database errors it logs with
    a traceback are raised to the harness, which names the store in one line (:func:`written`)."""
    for key, value in MLFLOW_ENV.items():
        os.environ.setdefault(key, value)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def mlflow_store(cfg: Any) -> tuple[str | None, Path]:
    """``MLFLOW_TRACKING_URI`` (None: unset) and results_dir (absolute): the store runs write to is
    the URI, else the SQLite file ``<results_dir>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None, Path(results_path(cfg)).resolve()


def experiment_name(cfg: Any) -> str:
    """The MLflow experiment of results_dir: ``MLFLOW_EXPERIMENT_NAME``, else results_dir's absolute path."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or str(mlflow_store(cfg)[1])


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///<file>`` URI, absolute (a relative one is below the working
    directory, as SQLAlchemy opens it); None for an in-memory database."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    return None if database in (None, "", ":memory:") else Path(os.path.abspath(database))


def sqlite_problem(path: Path, absent_ok: bool) -> str | None:
    """Why the SQLite store ``path`` cannot be written, or None. An existing one must be a regular
    file holding an SQLite database (or empty) with MLflow's tables or none (MLflow would add its
    tables to another program's database), that opens for writing within :data:`LOCK_WAIT_S` (a
    transaction begun and rolled back: nothing is changed); an absent one is created in its folder,
    which must take new files unless ``absent_ok`` (checked already: results_dir)."""
    if not os.path.lexists(path):
        problem = None if absent_ok else path_problem(str(path.parent), writable=True)
        return None if problem is None else f"{path}: its folder {problem}"
    if path.is_dir():
        return f"{path} is a folder, not an SQLite file"
    if not path.is_file():
        return f"{path} is not a regular file"
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if head and head != SQLITE_HEADER:
        return f"{path} is not an SQLite database"
    try:
        con = sqlite3.connect(f"{path.as_uri()}?mode=rw", uri=True, timeout=LOCK_WAIT_S)
        try:
            con.execute("BEGIN IMMEDIATE")  # the write lock MLflow's writes take
            tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            con.rollback()
        finally:
            con.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY:
            return f"{path} is locked by another process (waited {LOCK_WAIT_S} s)"
        return f"{path}: {exc}"
    if tables and not MLFLOW_TABLES <= tables:
        return f"{path} holds another program's tables ({', '.join(sorted(tables)[:3])}), not MLflow's"
    return None


def server_problem(uri: str, experiment: str) -> str | None:
    """Why the MLflow tracking server ``uri`` cannot be used, or None: it must answer MLflow's
    ``experiments/get-by-name`` within :data:`CONNECT_TIMEOUT_S`, tried once (MLflow's own request
    function with its credentials from the environment), with the experiment or ``RESOURCE_DOES_NOT_EXIST``."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        resp = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/get-by-name", "GET",
                            max_retries=0, timeout=CONNECT_TIMEOUT_S, raise_on_status=False,
                            params={"experiment_name": experiment})
    except Exception as exc:  # noqa: BLE001 - refused, unresolvable, timed out, an invalid URL
        return f"no answer within {CONNECT_TIMEOUT_S} s: {cause(exc)}"
    if resp.status_code in (401, 403):
        return (f"it refused the credentials (HTTP {resp.status_code}; MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN)")
    try:
        code = resp.json().get("error_code") if resp.status_code == 404 else None
    except ValueError:
        code = None
    if resp.status_code != 200 and code != "RESOURCE_DOES_NOT_EXIST":
        return f"it answered HTTP {resp.status_code}, not as an MLflow tracking server"
    return None


def database_problem(uri: str) -> str | None:
    """Why the database store ``uri`` cannot be used, or None: SQLAlchemy takes the URI, its
    driver imports, and its host takes a TCP connection within :data:`CONNECT_TIMEOUT_S`."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except Exception as exc:  # noqa: BLE001 - an unparsable URI, an unknown dialect, a missing driver
        return f"{type(exc).__name__}: {cause(exc)}"
    if url.host:
        return connect_problem(url.host, url.port or MLFLOW_DATABASES[url.get_backend_name()], CONNECT_TIMEOUT_S)
    return None


class MlflowLog(TrackerLog):
    """``logger=mlflow``: one MLflow run per run, in one experiment per results_dir."""

    @classmethod
    def check(cls, cfg):
        """mlflow (and SQLAlchemy, alembic) import; the experiment name is one MLflow takes; the store
        is one MLflow writes new runs to (its file store does not) and answers: a SQLite file
        (:func:`sqlite_problem`), a tracking server (:func:`server_problem`) or a database
        (:func:`database_problem`)."""
        mlflow_environment()
        for module in ("mlflow.tracking", "sqlalchemy", "alembic"):
            import_tracker("mlflow", module)
        from mlflow.exceptions import MlflowException
        from mlflow.utils.validation import _validate_experiment_name

        uri, root = mlflow_store(cfg)
        name = experiment_name(cfg)
        try:
            _validate_experiment_name(name)
        except MlflowException as exc:
            field, value = (("MLFLOW_EXPERIMENT_NAME", name) if os.environ.get("MLFLOW_EXPERIMENT_NAME")
                            else ("results_dir", cfg.results_dir))
            bad_field(field, f"a name MLflow takes for the experiment ({exc.message}) with logger=mlflow", shown(value))
        if uri is None:
            problem = sqlite_problem(root / MLFLOW_DB, absent_ok=True)
            if problem:
                bad_field("results_dir", f"a folder whose {MLFLOW_DB} is an SQLite store the harness can write, "
                          f"or absent, with logger=mlflow ({problem})", cfg.results_dir)
            return
        scheme = uri.partition(":")[0].lower() if "://" in uri else ""
        backend = scheme.partition("+")[0]
        if backend == "sqlite":
            try:
                database = sqlite_file(uri)
            except Exception as exc:  # noqa: BLE001 - SQLAlchemy's ArgumentError: not a URI it parses
                problem = cause(exc)
            else:
                problem = ("a file (an in-memory database keeps nothing)" if database is None
                           else sqlite_problem(database, absent_ok=False))
        elif scheme in ("http", "https"):
            problem = server_problem(uri, name)
        elif backend in MLFLOW_DATABASES:
            problem = database_problem(uri)
        elif scheme in ("", "file"):
            problem = "MLflow's file store takes no new runs"
        else:
            problem = f"not a store the harness writes to: {scheme}://"
        if problem:
            bad_field("MLFLOW_TRACKING_URI", f"{MLFLOW_STORES} ({problem})", shown(uri))

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        mlflow_environment()
        from mlflow.tracking import MlflowClient  # needs mlflow(-skinny), and SQLAlchemy for the SQLite store

        uri, root = mlflow_store(cfg)
        # named by an error writing to it: the SQLite file, or the URI of a server or database
        self.store = root / MLFLOW_DB if uri is None else (uri.lower().startswith("sqlite") and sqlite_file(uri)) or uri
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY)
        try:  # the jobs of a sweep, one at a time: the first creates the SQLite tables (two at once fail:
            if fcntl is not None:  # "table spans already exists") and the experiment
                fcntl.flock(fd, fcntl.LOCK_EX)
            with written(self.store):
                self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{root / MLFLOW_DB}")
                self.experiment_id = self._experiment(experiment_name(cfg),
                                                      None if uri else (root / MLFLOW_ARTIFACTS).as_uri())
        finally:
            os.close(fd)  # releases the lock
        super().__init__(runs)

    def _experiment(self, name: str, artifacts: str | None) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:  # another process created it first (a tracking server is not locked above)
            return self.client.get_experiment_by_name(name).experiment_id

    def _find(self, run_id: str) -> list:
        """The MLflow runs tagged ``run_id``. MLflow's filter grammar has no escape for a quote inside
        a string, so the value is quoted with the quote it lacks (a task.name may hold either); one
        holding both is matched here among the experiment's runs."""
        for q in ("'", '"'):
            if q not in run_id:
                return self.client.search_runs([self.experiment_id], filter_string=f"tags.`{RUN_TAG}` = {q}{run_id}{q}")
        return [r for r in self.client.search_runs([self.experiment_id], max_results=50000)
                if r.data.tags.get(RUN_TAG) == run_id]

    def open(self, run, start):
        with written(self.store):
            return self._open(run)

    def _open(self, run):
        from mlflow.entities import Param

        found = self._find(run.run_id)
        if found:  # resumed (or rerun after a failure): the same MLflow run continues
            old = found[0]
            self.client.update_run(old.info.run_id, status="RUNNING")
            return old.info.run_id, old.data.metrics.get(STEP)
        created = self.client.create_run(self.experiment_id, run_name=run.run_id,
                                         tags={RUN_TAG: run.run_id, GROUP_TAG: group_name(run)})
        params = [Param(k, str(v)) for k, v in flat_config(run.cfg).items()]
        self.client.log_batch(created.info.run_id, params=params)
        return created.info.run_id, None

    def log(self, run_id, step, values):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with written(self.store):
            self.client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def end(self, run_id, finished):
        with written(self.store):
            self.client.set_terminated(run_id, status="FINISHED" if finished else "KILLED")


class NoLog:
    """``logger=none``."""

    def write(self, p: int, row: dict) -> None:
        pass

    def close_member(self, p: int) -> None:
        pass

    def close(self) -> None:
        pass


# logger value -> its class (harness.config.LOGGERS lists the same names and the packages they need)
TRACKERS: dict[str, type[TrackerLog]] = {"tensorboard": TensorBoardLog, "wandb": WandbLog, "mlflow": MlflowLog}


def make_logger(cfg, runs: Sequence[Any]):
    """The logger ``cfg.logger`` names, for ``runs`` (validated already: ``harness.config.check_logger``)."""
    cls = TRACKERS.get(cfg.get("logger", "none"))
    return NoLog() if cls is None else cls(cfg, runs)


__all__ = ["TB_DIR", "WANDB_DIR", "MLFLOW_DB", "RUN_TAG", "GROUP_TAG", "STEP", "TRACKERS", "TrackerLog",
           "TensorBoardLog", "WandbLog", "MlflowLog", "NoLog", "make_logger", "scalars", "flat_config",
           "group_name", "tracker_run_id", "check_tracker"]
