"""``validate(cfg)``: every check a config passes before any work starts, in one call.

It sits above the schema, the registries and the task families, and only puts their checks
together: the schema's per-field checks (:func:`harness.config.check_fields`), the names the
registries know (estimators, policy losses, loss aggregations, KL estimators), each task
family's own checks (:func:`harness.tasks.control.validate_control`,
:func:`harness.tasks.lm.validate_lm`, :func:`harness.tasks.toy.validate_toy`) and, with
``mode=probe``, the probes' (:func:`harness.probes.validate_probe`). ``harness.app.run`` calls it
first; it raises ``ValueError`` naming the first invalid field and what it allows.
"""
from __future__ import annotations

from omegaconf import DictConfig

from .config import ProbeSettings, bad_field, check_fields, check_known_keys, refuse_unknown_keys
from .estimators import ESTIMATORS, KL_ESTIMATORS, EstimatorSpec, get_estimator
from .losses import AGG_MODES, POLICY_LOSSES
from .probes import validate_probe
from .tasks.control import validate_control
from .tasks.lm import validate_lm
from .tasks.toy import validate_toy

__all__ = ["validate", "check_registered"]


def check_registered(cfg: DictConfig) -> EstimatorSpec:
    """Names the registries must know, and the estimator's own needs; returns its spec."""
    bad = bad_field
    if cfg.estimator not in ESTIMATORS:
        bad("estimator", f"one of {sorted(ESTIMATORS)}", cfg.estimator)
    spec = get_estimator(cfg.estimator)
    if spec.needs_groups and cfg.group_size < 2 and not spec.needs_greedy:
        bad("group_size", f">= 2 for estimator {cfg.estimator}", cfg.group_size)
    if cfg["update"] not in POLICY_LOSSES:
        bad("update", f"one of {sorted(POLICY_LOSSES)}", cfg["update"])
    if cfg.loss_agg not in AGG_MODES:
        bad("loss_agg", f"one of {list(AGG_MODES)}", cfg.loss_agg)
    if cfg.kl.estimator not in KL_ESTIMATORS:
        bad("kl.estimator", f"one of {sorted(KL_ESTIMATORS)}", cfg.kl.estimator)
    return spec


def validate(cfg: DictConfig) -> None:
    """Raise ``ValueError`` naming the first invalid field and what it allows."""
    check_known_keys(cfg)
    spec = check_registered(cfg)
    check_fields(cfg)
    family = cfg.task.family
    if family == "control":
        validate_control(cfg, needs_groups=spec.needs_groups, full_episodes=spec.full_episodes)
    elif family == "lm":
        validate_lm(cfg)
    elif family == "toy":
        validate_toy(cfg)
    if cfg.mode == "probe":
        refuse_unknown_keys(cfg, "probe", ProbeSettings)  # names the key (probe.<key>) before the probe's checks
        validate_probe(cfg)
