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
  each step once.

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
* :class:`MlflowLog`: MLflow's usage telemetry off (``MLFLOW_DISABLE_TELEMETRY=true`` unless the
  environment sets it); ``MLFLOW_TRACKING_URI`` if set, else a SQLite store
  ``<results_dir>/mlflow.db`` (MLflow's file store is in maintenance mode); one experiment per
  results_dir (named by its absolute path; ``MLFLOW_EXPERIMENT_NAME`` overrides), one run per
  harness run, named ``task/estimator/seed<seed>-<hash>`` and found again by its tag
  ``harness.run_id``, the group in the tag ``group``, the flattened config as parameters. Resumed,
  the same MLflow run continues (MLflow deletes no metric values: the steps it holds are skipped).

A run that is skipped (finished before) is not touched: a sweep rerun with a logger writes nothing
for runs finished without it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the store is opened unlocked
    fcntl = None

from ..config import results_path
from .rundir import config_hash

TB_DIR = "tb"
WANDB_DIR = "wandb"
MLFLOW_DB = "mlflow.db"  # the default MLflow store, in results_dir
MLFLOW_ARTIFACTS = "mlartifacts"  # the default experiment's artifact root (nothing is logged there)
RUN_TAG = "harness.run_id"  # MLflow tag naming the harness run (task/estimator/seed<seed>-<hash>)
GROUP_TAG = "group"  # MLflow tag: the group, as wandb's group
WANDB_PROJECT = "pg-harness"  # unless WANDB_PROJECT is set
STEP = "env_steps"  # the row column used as every tracker's step
FLUSH_SECS = 10  # TensorBoard's own flush interval: a live view lags by at most this much


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

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._writer = SummaryWriter
        super().__init__(runs)

    def open(self, run, start):
        path = Path(run.path) / TB_DIR
        _clear(path)
        return self._writer(log_dir=str(path), flush_secs=FLUSH_SECS), None

    def log(self, w, step, values):
        for tag, value in values.items():
            w.add_scalar(tag, value, global_step=step)

    def flush(self, w):
        w.flush()

    def end(self, w, finished):
        w.close()


class WandbLog(TrackerLog):
    """``logger=wandb``: one wandb run per run, its files in ``<run dir>/wandb/``."""

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        import wandb  # needs the wandb package

        self._wandb = wandb
        self.mode = os.environ.get("WANDB_MODE") or "offline"  # offline: synced later with wandb sync
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


class MlflowLog(TrackerLog):
    """``logger=mlflow``: one MLflow run per run, in one experiment per results_dir."""

    def __init__(self, cfg: Any, runs: Sequence[Any]):
        # MLflow's usage telemetry (reported to its vendor; it writes ~/.config/mlflow/telemetry.json) is
        # off unless the environment sets MLFLOW_DISABLE_TELEMETRY itself; read by mlflow at import
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient  # needs mlflow(-skinny), and SQLAlchemy for the SQLite store

        root = Path(results_path(cfg)).resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY)
        try:  # the jobs of a sweep, one at a time: the first creates the SQLite tables (two at once fail:
            if fcntl is not None:  # "table spans already exists") and the experiment
                fcntl.flock(fd, fcntl.LOCK_EX)
            self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{root / MLFLOW_DB}")
            self.experiment_id = self._experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or str(root),
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
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def end(self, run_id, finished):
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
           "group_name", "tracker_run_id"]
