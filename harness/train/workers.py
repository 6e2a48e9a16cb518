"""Members to loops: one batched population or one by one, in worker processes or not.

:func:`train_members` trains a task kind's members the way its :class:`harness.config.TaskKind`
entry says: :func:`train_population` (members that are finished or held elsewhere ride along as
write-nothing :class:`ShadowRun` s, so batch shapes stay those of an uninterrupted run) or
:func:`train_one_by_one`; with ``population_workers`` the members are split over forked
processes either way (:func:`in_workers`).
"""
from __future__ import annotations

import logging
import time

import torch
from omegaconf import DictConfig

from ..config import member_configs, member_seeds
from ..io import RunDir
from ..plan import RunPlan
from .checkpointing import start
from .loop import Loop

log = logging.getLogger("harness")


class ShadowRun(RunDir):
    """A population member trained for its neighbours' sake (already finished, or held by
    another sweep): rows are kept in memory (for checkpoints), nothing is written."""

    writable = False

    def start(self, keep_checkpoint: bool = False) -> None:
        pass

    def flush(self) -> None:
        pass

    def finish(self, status, reason, wall_time_s, extra=None) -> None:
        pass

    def discard_progress(self) -> None:
        self.rows = []

    def resume_rows(self, rows: list[dict]) -> None:
        self.rows = list(rows)

    def remove_checkpoint(self) -> None:
        pass


def population_runs(cfg: DictConfig, runs: list[RunDir]) -> list[RunDir]:
    """All ``cfg.population`` members in seed order: ``runs`` where given, a :class:`ShadowRun`
    for each other member (finished already, or held by another sweep)."""
    seeds = member_seeds(cfg)
    mine = {int(r.cfg.seed): r for r in runs}
    if not set(mine) <= set(seeds):  # not this config's members: as given
        return list(runs)
    if len(mine) == len(seeds):  # every member given: no shadow to configure
        return [mine[s] for s in seeds]
    return [mine.get(int(m.seed)) or ShadowRun(m) for m in member_configs(cfg)]


def train_members(plan: RunPlan, runs: list[RunDir], make_source, workers: int = 1) -> None:
    """Train ``runs`` the way the plan's task kind trains (its :class:`harness.config.TaskKind`
    entry): as one batched population (:func:`train_population`, over ``workers`` processes) or one
    after another (:func:`train_one_by_one`). ``make_source(plan, runs)``: the kind's rollout source."""
    if plan.kind.population:
        train_population(plan, runs, make_source, workers=workers)
    else:
        train_one_by_one(plan, runs, make_source, workers=workers)


def train_population(plan: RunPlan, runs: list[RunDir], make_source, workers: int = 1) -> None:
    """Train every member of ``cfg.population`` as one batched population (members that are
    already finished or held elsewhere as write-nothing shadows: the batch shapes, which couple
    members, stay those of an uninterrupted run).

    ``workers > 1``: the members are split into that many contiguous slices
    (:func:`worker_slices`), each trained as its own batched population by a forked process
    (:func:`_slice_worker`, with this process's torch thread count); this process waits for them.
    Members share nothing but batch shapes, so a member's run is the same whatever the split, up
    to float rounding (as it is its lone run's). Each slice checkpoints and resumes on its own:
    a resumed run with the same split continues, one with another split restarts the slices
    whose checkpoint does not fit (named in a log line)."""
    in_workers(plan, population_runs(plan.cfg, runs), train_slice, make_source, workers)


def in_workers(plan: RunPlan, runs: list[RunDir], target, make_source, workers: int) -> None:
    """``target(plan, part, make_source)`` on each of ``min(workers, len(runs))`` contiguous
    slices of ``runs`` (:func:`worker_slices`), each in a forked process (:func:`_slice_worker`,
    with this process's torch thread count; a slice with nothing to write is skipped), this
    process waiting for them; a single slice runs in this process. A worker that exits non-zero is raised here,
    naming its seeds."""
    slices = worker_slices(len(runs), workers)
    if len(slices) == 1:
        target(plan, runs, make_source)
        return
    import multiprocessing

    threads = torch.get_num_threads()
    log.info("population of %d: %d worker processes (seeds %s), %d torch thread(s) each", len(runs), len(slices),
             ", ".join(f"{runs[i.start].cfg.seed}-{runs[i.stop - 1].cfg.seed}" for i in slices), threads)
    ctx = multiprocessing.get_context("fork")  # the children need nothing re-imported or pickled
    procs = []
    try:
        for idx in slices:
            part = [runs[i] for i in idx]
            if not any(getattr(r, "writable", True) for r in part):
                continue  # every member finished or held elsewhere
            show = plan.cfg.progress and not procs  # one progress bar: the first slice's
            procs.append((ctx.Process(target=_slice_worker, args=(plan, part, target, make_source, show, threads),
                                      name=f"population-worker-{part[0].cfg.seed}", daemon=True), part))
            procs[-1][0].start()
        for proc, _ in procs:
            proc.join()
    except BaseException:  # e.g. Ctrl-C: stop every worker before going
        for proc, _ in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
        raise
    lost = [f"seeds {part[0].cfg.seed}-{part[-1].cfg.seed} (exit code {proc.exitcode})"
            for proc, part in procs if proc.exitcode != 0]
    if lost:
        raise RuntimeError(f"population worker(s) failed: {', '.join(lost)}")


def worker_slices(n: int, workers: int) -> list[range]:
    """Members ``0..n-1`` as ``min(workers, n)`` contiguous slices, sizes differing by at most one
    (the larger first)."""
    k = max(1, min(int(workers), n))
    q, extra = divmod(n, k)
    out, lo = [], 0
    for w in range(k):
        hi = lo + q + (w < extra)
        out.append(range(lo, hi))
        lo = hi
    return out


def train_slice(plan: RunPlan, runs: list[RunDir], make_source) -> None:
    """Train ``runs`` as one batched population, resuming from their newest valid checkpoint."""
    loop, resume = start(plan.cfg, lambda: Loop(plan, make_source(plan, runs), runs), runs)
    loop.run(resume)


def _slice_worker(plan: RunPlan, runs: list[RunDir], target, make_source, progress: bool, threads: int) -> None:
    """A worker process's ``target`` (:func:`train_slice` or :func:`train_one_by_one`), on
    ``threads`` torch threads, with or without its progress bar. If it raises, its unfinished
    members are recorded as failed with the exception (the parent sees only an exit code), then
    the worker exits non-zero."""
    torch.set_num_threads(threads)
    if progress != plan.cfg.progress:
        cfg = plan.cfg.copy()
        cfg.progress = progress
        plan = plan.member(cfg)
    t0 = time.perf_counter()
    try:
        target(plan, runs, make_source)
    except Exception as exc:
        log.exception("%s population worker (seeds %s-%s) failed", plan.kind.name, runs[0].cfg.seed,
                      runs[-1].cfg.seed)
        for r in runs:  # a shadow's finish writes nothing
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
        raise


def train_one_by_one(plan: RunPlan, runs: list[RunDir], make_source, workers: int = 1) -> None:
    """Train the members one after another, each a lone run of its own seed (``P = 1``); a
    member that raises is recorded as failed and the next one goes on. ``workers > 1``: the
    members are split over that many forked processes (:func:`in_workers`), each training its
    slice one after another; a member's run is its lone run whichever process trains it."""
    if workers > 1:  # in_workers runs a single slice here, as workers=1
        in_workers(plan, runs, train_one_by_one, make_source, workers)
        return
    for r in runs:
        t0 = time.perf_counter()
        mcfg = r.cfg
        if mcfg.progress and not plan.cfg.progress:  # a worker without the progress bar (_slice_worker)
            mcfg = mcfg.copy()
            mcfg.progress = False
        member = plan.member(mcfg)
        loop = None  # the previous member's trainer is freed before this one is built (and measured)
        try:
            loop, resume = start(mcfg, lambda: Loop(member, make_source(member, [r]), [r]), [r])
            loop.run(resume)
            loop = None
        except Exception as exc:  # record this member as failed, go on with the next
            loop = None
            log.exception("%s run %s failed", plan.kind.name, r.run_id)
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
            if len(runs) == 1:
                raise
