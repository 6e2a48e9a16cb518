"""Entry point: ``python -m harness`` composes the config and calls :func:`run`."""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from .config import DISK_FULL, bad_field, error_line, member_configs, os_problem, task_kind
from .estimators.registry import ContractError
from .io import RunDir
from .plan import RunPlan
from .plugins import load_plugins
from .probes import run_probe
from .reference import reference_trainer
from .train import control as control_training
from .train import lm as lm_training
from .train import toy as toy_training
from .validation import validate

__all__ = ["run", "main_entry", "describe", "imports_dynamo", "TRAINERS"]

log = logging.getLogger("harness")


# each task kind's trainer, ``(plan, runs) -> None`` (plan: harness.plan.RunPlan): builds the task and
# hands its rollout source to the loop (harness.train.loop); one entry per harness.config.TASK_KINDS name
TRAINERS: dict[str, Callable] = {
    "control": control_training.train,
    "lm": lm_training.train,
    "toy": toy_training.train,
}


def get_trainer(family: str):
    """The trainer of task kind ``family`` (:data:`TRAINERS`; an unknown kind is refused by name)."""
    return TRAINERS[task_kind(family).name]


def get_worker(plan: RunPlan):
    """What runs on the members, ``(plan, runs) -> None``: the task kind's trainer, a reference
    library's (``reference``, :mod:`harness.reference`), or the gradient probes (mode=probe)."""
    if plan.cfg.mode == "probe":
        return run_probe
    if plan.cfg.get("reference"):
        return reference_trainer(plan.cfg)
    return TRAINERS[plan.kind.name]


def imports_dynamo(cfg: DictConfig) -> bool:
    """Whether the runs of ``cfg`` import ``torch._dynamo`` (most of a second of a process; the
    CLI imports it before they start, with the collector paused: :func:`harness.__main__.end_startup`):
    a probe or a reference library's trainer (their ``torch.optim`` optimizers import it), or a
    task kind whose training does (:attr:`harness.config.TaskKind.imports_dynamo`). Training a
    control task does not (``tests/test_startup.py``). ``deterministic=true`` imports it before
    start-up ends (``torch.use_deterministic_algorithms``: :func:`set_determinism`)."""
    return cfg.mode != "train" or bool(cfg.get("reference")) or task_kind(cfg.task.family).imports_dynamo


def set_determinism(on: bool) -> dict:
    """``deterministic=true``: deterministic torch kernels (an op without one raises, naming
    itself), ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` if unset (cuBLAS needs it, before CUDA starts),
    cuDNN without autotuning (``benchmark=False``) and with deterministic algorithms.
    Harmless on CPU, whose kernels are already repeatable at a fixed thread count.
    Returns the previous settings for :func:`restore_determinism`; ``on=False`` changes nothing."""
    previous = {"algorithms": torch.are_deterministic_algorithms_enabled(),
                "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                "benchmark": torch.backends.cudnn.benchmark, "cudnn": torch.backends.cudnn.deterministic}
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return previous


def restore_determinism(previous: dict) -> None:
    """Undo :func:`set_determinism` (jobs of one sweep share the process). Only what changed is
    set: ``torch.use_deterministic_algorithms`` imports ``torch._inductor`` and ``torch._dynamo``
    (over a second of a process's time) even when it changes nothing."""
    if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != (
            previous["algorithms"], previous["warn_only"]):
        torch.use_deterministic_algorithms(previous["algorithms"], warn_only=previous["warn_only"])
    torch.backends.cudnn.benchmark = previous["benchmark"]
    torch.backends.cudnn.deterministic = previous["cudnn"]


def claim_runs(runs: list[RunDir], counts: dict[str, int]) -> list[RunDir]:
    """The runs this process will do: not finished (:meth:`RunDir.finished` checks summary
    *and* metrics, naming a corrupt file) and claimed (a run whose lock another live process
    holds is skipped as ``held``, not failed). The caller releases the claims."""
    todo = []
    for r in runs:
        problem = r.blocker()  # before reading anything in the run's folder
        if problem is not None:
            refuse_run(r, problem, counts)
            continue
        try:
            claimed_or_done = claim_one(r, counts)
        except OSError as exc:  # the run's folder cannot be made or locked
            refuse_run(r, os_problem(exc), counts)
            continue
        if claimed_or_done:
            todo.append(r)
    return todo


def refuse_run(r: RunDir, problem: str, counts: dict[str, int]) -> None:
    """A run that cannot be done here (its folder or one of its files is not what it must be):
    one log line naming the path, counted as failed; nothing in its folder is touched."""
    counts["failed"] = counts.get("failed", 0) + 1
    log.error("run %s failed: %s", r.run_id, problem)


def claim_one(r: RunDir, counts: dict[str, int]) -> bool:
    """True when ``r`` is claimed and to be done; False when skipped (finished, or held)."""
    status = r.finished()
    if status is None and not r.claim():
        counts["held"] = counts.get("held", 0) + 1
        log.info("skip %s (held by another sweep: %s)", r.path, r.holder)
        return False
    if status is None:
        status = r.finished(quiet=True)  # finished by another sweep before our claim?
        if status is not None:
            r.release()
    if status is not None:
        counts["skipped"] += 1
        log.info("skip %s (already %s)", r.path, status)
        return False
    return True


def run(cfg: DictConfig, on_start: Callable[[], None] | None = None) -> dict[str, int]:
    """Validate, skip finished members, train (or probe) the rest; returns counts by outcome.
    ``on_start``: called once the config is valid and some member is claimed to train, before its
    run folder is started and the trainer built (the CLI's :func:`harness.__main__.end_startup`).

    A run that raises is recorded as ``failed`` (with the traceback's last line as reason) and
    the sweep goes on (a full disk, ``ENOSPC`` or ``EDQUOT``, is recorded and raised: the next run
    would fail too, and :func:`main_entry` names the file); a non-finite loss or parameter is
    recorded as ``diverged`` by the trainer.
    Each run is claimed (``.lock``) while this process works on it; a run another sweep holds
    counts as ``held``. Training runs of a kind that resumes (every kind: :class:`harness.config.TaskKind`)
    resume from their checkpoint (``checkpoint_every``).
    A run whose folder cannot be used (a crafted entry: :meth:`RunDir.blocker`, or an OS error
    making or locking it) counts as ``failed`` with one log line naming the path; the others run.
    """
    load_plugins(cfg.get("plugins") or [])  # the user's registrations first: validation checks names against them
    plan = validate(cfg)
    runs = [RunDir(m) for m in member_configs(cfg)]
    counts = {"skipped": 0}
    todo = claim_runs(runs, counts)
    if not todo:
        return counts
    previous = set_determinism(bool(cfg.get("deterministic", False)))
    try:
        worker = get_worker(plan)
        # before any run folder starts: what on_start does (the CLI may import torch._dynamo, ~1 s)
        # is then not inside a run's first seconds, where a Ctrl-C meets it mid-import
        if on_start is not None:
            on_start()
        started = []
        for r in todo:
            try:
                r.start(keep_checkpoint=plan.resumes)
                started.append(r)
            except OSError as exc:  # e.g. a crafted entry in the folder: named, the run not done
                refuse_run(r, os_problem(exc), counts)
                r.release()
        todo[:] = started
        if not todo:
            return counts
        t0 = time.perf_counter()
        try:
            worker(plan, todo)
        except Exception as exc:  # record, never drop
            full = isinstance(exc, OSError) and exc.errno in DISK_FULL
            reason = os_problem(exc) if full else f"{type(exc).__name__}: {exc}"
            # a broken contract of an estimator or loss is its line (the traceback would show only the check)
            broken = isinstance(exc, ContractError) and exc.__cause__ is None
            if not full:
                log.error("run failed: %s%s", reason, "" if broken else "\n" + traceback.format_exc())
            for r in todo:
                if r.status() is None:
                    r.finish("failed", reason, time.perf_counter() - t0)
            if full:  # a full disk (a run's file or its tracker's store): the command ends in one line naming it
                raise
        for r in todo:
            status = r.status() or "failed"
            counts[status] = counts.get(status, 0) + 1
    finally:
        restore_determinism(previous)
        for r in todo:
            r.release()
    return counts


def where_job_ran() -> dict[str, str | None]:
    """Where this process runs: ``host`` (the hostname) and ``ray_node_id``, the Ray node's id
    when the job runs in a Ray worker (``hydra/launcher=ray`` or ``ray_cluster``: one machine
    can hold several nodes, see docs/ray.md), else None. Ray is an optional extra: it is looked
    up only when the process has imported it already (the launcher's workers have), never
    imported here."""
    node = None
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except Exception:  # a half-imported or shut-down ray: the hostname still says where
            node = None
    return {"host": socket.gethostname(), "ray_node_id": node}


def write_outcome(counts: dict[str, int]) -> None:
    """Leave the job's outcome in Hydra's job folder for the end-of-sweep summary: the counts by
    status, and under ``ran_on`` where the job ran (:func:`where_job_ran`)."""
    try:
        out = Path(HydraConfig.get().runtime.output_dir) / "outcome.json"
        out.write_text(json.dumps({**counts, "ran_on": where_job_ran()}))
    except Exception:
        pass


def describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if v)


def in_sweep() -> bool:
    """True inside a Hydra multirun (``-m``): the sweep's end decides the exit code."""
    try:
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:
        return False


def check_group_choices() -> str | None:
    """The command line's choice of ``recipe`` must be one of its group's options: Hydra also takes
    a path into another group (``recipe=../estimator/rloo``, an estimator preset loaded as a recipe)
    and a list (``recipe=[verl_grpo,trl_grpo]``, two frameworks merged), neither a recipe. Raises
    ``ValueError`` naming ``recipe`` and the options; nothing outside a Hydra command is checked.
    Returns the recipe chosen (by the command line or an experiment's defaults), else None."""
    from hydra.core.global_hydra import GlobalHydra

    try:
        hc = HydraConfig.get()
        choice = hc.runtime.choices.get("recipe")
        options = GlobalHydra.instance().config_loader().get_group_options("recipe")
    except Exception:  # not under Hydra's command line (an in-process run): nothing chose a group
        return None
    for override in hc.overrides.task:  # a list of options is no choice Hydra records: read it off the command
        key, _, value = str(override).partition("=")
        if key.lstrip("+~") == "recipe" and value.strip().startswith("["):
            choice = value
    if choice in (None, "null"):
        return None
    if choice not in options:
        bad_field("recipe", f"one of {sorted(options)} (a framework's recipe, one at a time)", choice)
    return str(choice)


def record_recipe(cfg: DictConfig, recipe: str | None) -> None:
    """Add ``recipe: <name>`` to ``cfg`` when a recipe was chosen, so each run's config.yaml says
    which framework's settings it ran with: a recipe file is ``@package _global_`` and leaves no
    key of its own, and ``estimator=...`` beside it keeps the recipe's other settings. A config
    without a recipe gets no key (its config.yaml and hash stay as they were); validation knows the
    key (:class:`harness.config.Recorded`), the run folder's hash leaves it out (``harness.io.rundir``)."""
    if recipe is not None:
        with open_dict(cfg):
            cfg.recipe = recipe


def main_entry(cfg: DictConfig, on_start: Callable[[], None] | None = None) -> None:
    """Run ``cfg`` (``on_start``: as :func:`run`'s); exit 2 with one line for an invalid config or
    an unusable results path (nothing started), exit 1 when a run failed (in a sweep: at its end, see
    :class:`harness.callbacks.SweepSummary`, after the other jobs ran) or a write failed at run
    time (one line naming the file: ``cannot write results: <file>: No space left on device``)."""
    try:
        record_recipe(cfg, check_group_choices())
        counts = run(cfg, on_start)
    except ValueError as exc:  # invalid config: nothing was started
        print(f"invalid config: {error_line(exc)}")
        raise SystemExit(2)
    except OSError as exc:  # a write failed at run time (disk full, results_dir turned unusable)
        print(f"cannot write results: {os_problem(exc)}")
        raise SystemExit(1)
    write_outcome(counts)
    print(f"[harness] {cfg.task.name}/{cfg.estimator} seed={cfg.seed}"
          f"{' population=' + str(cfg.population) if cfg.population > 1 else ''}: {describe(counts)}"
          f"  -> {cfg.results_dir}")
    if counts.get("failed") and not in_sweep():
        raise SystemExit(1)
