"""Gradient bias/variance probes at a frozen policy (``mode=probe``).

``run_probe(cfg, runs)`` has a trainer's signature: the app hands it the run directories of a
config (one per population member, seeds ``seed + i``) and it writes ``probe.parquet`` (one row
per scope: ``all`` and ``prompt<x>`` on the toy task) and ``probe_batches.parquet`` (per-batch
scalars, for paired comparisons between estimators probed on the same batches) into each, then
``summary.json`` with ``mode: probe``.

``run(cfg)`` is the app's ``run`` for probes (validate, skip finished run directories, probe
the rest); :mod:`analysis.claims` uses it, and it is what ``python -m harness mode=probe``
dispatches to once the app routes that mode here (toy configs already get here through
``harness.train.toy.train``). Meanwhile ``python -m harness.probes [overrides] [-m]`` is the same
Hydra app with ``mode=probe`` for every family.

Families: ``toy`` (exact gradient, :mod:`.toy`) and ``control`` (whole-episode estimators against
a high-sample REINFORCE reference, :mod:`.control`). ``lm`` is refused by :func:`validate_probe`.
"""
from __future__ import annotations

import logging
import time
import traceback

from omegaconf import DictConfig, open_dict

from .toy import ProbeSettings, probe_toy, settings_from_config

log = logging.getLogger("harness.probes")

PROBE_FAMILIES = ("toy", "control")

__all__ = ["ProbeSettings", "probe_toy", "run", "run_probe", "settings_from_config", "validate_probe"]


def validate_probe(cfg: DictConfig) -> None:
    """Checks for ``mode=probe`` that can fail before any work starts."""
    if cfg.task.family not in PROBE_FAMILIES:
        raise ValueError(f"mode=probe supports task.family in {list(PROBE_FAMILIES)}, got {cfg.task.family!r}")
    s = settings_from_config(cfg)
    if cfg.task.family == "toy":
        from ..tasks.toy import validate_toy

        validate_toy(cfg)
    else:
        from .control import validate_control_probe

        validate_control_probe(cfg, s)


def run_probe(cfg: DictConfig, runs) -> None:
    """Probe every run directory of ``runs`` (already started by the caller)."""
    validate_probe(cfg)
    if cfg.task.family == "toy":
        from .toy import probe_run
    else:
        from .control import probe_run

    for r in runs:
        t0 = time.time()
        try:
            probe_run(r.cfg, r)
        except Exception as exc:  # record, never drop
            log.error("probe %s failed: %s", r.run_id, traceback.format_exc())
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.time() - t0)
            if len(runs) == 1:
                raise


def run(cfg: DictConfig) -> dict[str, int]:
    """``harness.app.run`` with ``mode=probe`` (the same run directories and skipping)."""
    from ..app import run as app_run

    with open_dict(cfg):
        cfg.mode = "probe"
    return app_run(cfg)
