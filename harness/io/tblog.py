"""``logger=tensorboard``: each run's metric rows also as TensorBoard event files, live.

``metrics.parquet`` stays the record (analysis reads only it); this is a copy for watching a
sweep as it trains: ``tensorboard --logdir <results_dir>`` finds every run's ``<run dir>/tb/``
(``run`` column of TensorBoard = the run directory below results_dir).

What is written, per row the training loop appends (:meth:`harness.train.loop.Loop.run` calls
:meth:`TensorBoardLog.write` right after ``RunDir.log``; rows are never built here):

* one scalar per numeric column of the row (int or float, not bool; null columns are left
  out, so ``eval_return`` appears at the evaluated rows only), tagged with the column's name;
* at step ``env_steps``: the budget's unit, the x axis analysis uses (environment steps of
  control tasks, sampled tokens of the LM task, sampled sequences of the toy task); it grows
  every iteration. ``iteration`` is one of the scalars.

TensorBoard stores scalars as 32-bit floats (exact for integers up to 2**24).

Resume: at the start of :meth:`Loop.run` the ``tb/`` folder of each run it writes is removed and
the rows the run starts with are written again: none from zero; from a checkpoint, exactly the
rows metrics.parquet is truncated to. Steps a killed attempt logged past its checkpoint are thus
gone with its event files, not duplicated. A run that is skipped (finished before) is not
touched: a sweep rerun with ``logger=tensorboard`` writes no events for runs finished without it.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Sequence

TB_DIR = "tb"
STEP = "env_steps"  # the row column used as TensorBoard's step
FLUSH_SECS = 10  # the writer's own flush interval: a live view lags by at most this much


def scalars(row: dict) -> dict[str, float]:
    """The numeric columns of a metric row (name -> value; bools, strings and nulls left out)."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _clear(path: Path) -> None:
    """Remove ``path`` (a run's ``tb/``): a folder with what is in it, or a file or symlink
    itself (a symlink's target is never touched)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


class TensorBoardLog:
    """One ``SummaryWriter`` per writable run (population members that are shadows write nothing)."""

    def __init__(self, runs: Sequence[Any]):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writers: list[Any] = []
        for r in runs:
            if not getattr(r, "writable", True):
                self.writers.append(None)
                continue
            path = Path(r.path) / TB_DIR
            _clear(path)
            w = SummaryWriter(log_dir=str(path), flush_secs=FLUSH_SECS)
            for row in r.rows:  # resumed from a checkpoint: its rows, again
                self._add(w, row)
            w.flush()
            self.writers.append(w)

    @staticmethod
    def _add(w, row: dict) -> None:
        step = int(row[STEP])
        for tag, value in scalars(row).items():
            w.add_scalar(tag, value, global_step=step)

    def write(self, p: int, row: dict) -> None:
        """Member ``p``'s new row."""
        if self.writers[p] is not None:
            self._add(self.writers[p], row)

    def close_member(self, p: int) -> None:
        """Member ``p`` finished: its events reach the disk now."""
        if self.writers[p] is not None:
            self.writers[p].close()
            self.writers[p] = None

    def close(self) -> None:
        for p in range(len(self.writers)):
            self.close_member(p)


class NoLog:
    """``logger=none``."""

    def write(self, p: int, row: dict) -> None:
        pass

    def close_member(self, p: int) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(cfg, runs: Sequence[Any]):
    """The logger ``cfg.logger`` names, for ``runs`` (validated already: ``harness.config.check_logger``)."""
    return TensorBoardLog(runs) if cfg.get("logger", "none") == "tensorboard" else NoLog()


__all__ = ["TB_DIR", "STEP", "TensorBoardLog", "NoLog", "make_logger", "scalars"]
