"""A run's checked config and what it names, looked up once: :class:`RunPlan`.

:func:`harness.validation.validate` checks a composed config and returns its plan;
:func:`harness.app.run` hands the plan to the worker (a task kind's trainer, a reference library's,
or the probes), and the loop, its rollout source and the update step take the estimator, the
policy loss and its settings from it: no layer below looks a registry entry up by the config's
name again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from .config import TaskKind, task_kind
from .estimators import EstimatorSpec, get_estimator
from .losses import PolicyLoss, get_policy_loss, loss_settings

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """``cfg`` (a composed config, or one member's: :meth:`member`) with its task kind
    (``task.family``), its estimator (``estimator``), its policy loss (``update``) and that loss's
    settings dataclass built from the config's knobs (:func:`harness.losses.loss_settings`)."""

    cfg: DictConfig
    kind: TaskKind
    estimator: EstimatorSpec
    loss: PolicyLoss
    loss_settings: Any

    @classmethod
    def of(cls, cfg: DictConfig) -> RunPlan:
        """Look up what ``cfg`` names (an unknown name is refused by its registry, naming the field).
        A run's plan comes from :func:`harness.validation.validate`, which checks the config first;
        this alone is for code that builds a loop or source from a config it composed itself."""
        return cls(cfg, task_kind(cfg.task.family), get_estimator(cfg.estimator), get_policy_loss(cfg["update"]),
                   loss_settings(cfg))

    def member(self, cfg: DictConfig) -> RunPlan:
        """The plan of ``cfg``, a member of this plan's population (the same config but for its seed
        and ``population``, or ``progress``): the same entries, the member's config."""
        return dataclasses.replace(self, cfg=cfg)

    @property
    def resumes(self) -> bool:
        """Training runs of a kind that resumes continue from their checkpoint (``checkpoint_every``)."""
        return self.cfg.mode == "train" and self.kind.resumes
