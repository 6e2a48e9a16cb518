"""Registers, on import, an estimator and a policy loss with its own knob with the harness's own
registries, and the example env (by importing :mod:`pgh_example.envs`)."""
from dataclasses import dataclass, replace

import torch

from harness.config import bad_field
from harness.estimators import register_estimator
from harness.losses import NoSettings, pg_loss, register_policy_loss

from . import envs  # noqa: F401  (registers Corridor-v0 with gymnasium)


@register_estimator("median_baseline")
def median_baseline(scores: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - the median return of its group, the same for every step of episode i (a group
    baseline that one outlier cannot move). ``scores``: ``[n_groups, group_size]`` episode returns."""
    return scores - scores.median(dim=1, keepdim=True).values


@dataclass(frozen=True)
class ClampSettings:
    """``adv_clamp``: the bound of the advantages (a new config key, ``adv_clamp=0.5``)."""

    adv_clamp: float = 1.0

    def __post_init__(self):
        if not self.adv_clamp > 0:
            bad_field("adv_clamp", "a number > 0", self.adv_clamp)


@register_policy_loss("clamped_pg", settings=ClampSettings)
def clamped_pg_loss(x, s: ClampSettings):
    """Vanilla policy gradient on advantages clamped to [-adv_clamp, adv_clamp]."""
    clamped = torch.clamp(x.advantages, -s.adv_clamp, s.adv_clamp)
    return pg_loss(replace(x, advantages=clamped), NoSettings())
