"""Gradient bias/variance probes at a frozen policy (``mode=probe``).

``run_probe(plan, runs)`` has a trainer's signature: the app hands it the run directories of a
config (one per population member, seeds ``seed + i``) and it writes ``probe.parquet`` (one row
per scope: ``all`` and ``prompt<x>`` on the toy task) and ``probe_batches.parquet`` (per-batch
scalars, for paired comparisons between estimators probed on the same batches) into each, then
``summary.json`` with ``mode: probe``.

To probe a config (validate, skip finished run directories, probe the rest) call
``harness.app.run`` with ``mode=probe``: ``python -m harness mode=probe [overrides] [-m]``.

Families: ``toy`` (exact gradient, :mod:`.toy`) and ``control`` (whole-episode estimators against
a high-sample REINFORCE reference, :mod:`.control`): their entries of :data:`PROBES`. A task kind
without one (``lm``) is refused by :func:`validate_probe`.
The settings (``probe.*``) are :class:`harness.config.ProbeSettings`, re-exported here.
"""
from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from ..config import ProbeSettings, settings_from_config
from ..plan import RunPlan
from . import control, toy
from .toy import ProbeTraining, probe_toy

log = logging.getLogger("harness.probes")

__all__ = ["PROBES", "Probe", "ProbeSettings", "ProbeTraining", "probe_toy", "run_probe", "settings_from_config", "validate_probe"]


@dataclass(frozen=True)
class Probe:
    """A task kind's gradient probe: ``run(plan, run)`` probes one started run directory (``plan``:
    its member's :class:`harness.plan.RunPlan`) and finishes it; ``validate(cfg, settings: ProbeSettings)`` refuses what it cannot probe."""

    run: Callable
    validate: Callable


# the task kinds (harness.config.TASK_KINDS names) that have a probe
PROBES: dict[str, Probe] = {
    "control": Probe(control.probe_run, control.validate_control_probe),
    "toy": Probe(toy.probe_run, toy.validate_toy_probe),
}


def validate_probe(cfg: DictConfig) -> None:
    """Checks for ``mode=probe`` that can fail before any work starts."""
    probe = PROBES.get(cfg.task.family)
    if probe is None:
        raise ValueError(f"mode=probe supports task.family in {list(PROBES)}, got {cfg.task.family!r}")
    probe.validate(cfg, settings_from_config(cfg))


def run_probe(plan: RunPlan, runs) -> None:
    """Probe every run directory of ``runs`` (already started by the caller; the plan's config
    checked by :func:`harness.validation.validate`, :func:`validate_probe` among its checks)."""
    probe_run = PROBES[plan.kind.name].run
    for r in runs:
        t0 = time.perf_counter()
        try:
            probe_run(plan.member(r.cfg), r)
        except Exception as exc:  # record, never drop
            log.error("probe %s failed: %s", r.run_id, traceback.format_exc())
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
            if len(runs) == 1:
                raise
