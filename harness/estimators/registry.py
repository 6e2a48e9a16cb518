"""Estimator presets by name, all behind one signature.

A trainer looks a preset up with :func:`get_estimator`, asks the returned
:class:`EstimatorSpec` what it needs (``needs_critic``, ``needs_groups``, ``needs_greedy``,
``full_episodes``) and calls ``spec(batch, params)``. It never branches on the name
(verl's ``core_algos`` registers by name but its caller still branches on it; we don't).

Normalisation, clipping and loss aggregation are *not* done here: they are separate config
axes applied by the trainer, so an ablation cannot silently credit whitening to GAE. A
preset's defaults for those axes (``update``, ``epochs``, whitening, ``loss_agg``, ...) live
in its Hydra file ``harness/conf/estimator/<name>.yaml`` and nowhere else, e.g. ``reinforce_pp.yaml``
sets batch whitening and ``dr_grpo.yaml`` the token-sum aggregation. Adding an estimator is
one adapter function, one :func:`register` call and that one YAML file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import group as _group
from . import returns as _returns


@dataclass
class AdvantageBatch:
    """What every estimator receives; time-major ``[T, B]``.

    ``mask[t, b]`` is 1 on steps that belong to a trajectory (0 on padding after an
    episode ended, for estimators that collect whole episodes). For group estimators the
    ``B`` columns are ``n_groups * group_size`` whole episodes laid out group-major
    (column ``g * group_size + j`` is member ``j`` of group ``g``), one episode per column.
    ``values``/``next_values`` are present when the spec needs a critic; ``greedy_scores``
    ``[n_groups]`` when it needs a greedy rollout.

    ``members``: the ``B`` columns are that many independent population members side by side,
    member-major, in equal blocks (a control population, or a probe's batches). An estimator
    with a batch-wide statistic (``gpg``'s alpha) computes it per block, so members never share
    statistics; the loop sets it from the source's ``P``.
    """

    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    mask: torch.Tensor | None = None
    values: torch.Tensor | None = None
    next_values: torch.Tensor | None = None
    greedy_scores: torch.Tensor | None = None
    group_size: int | None = None
    members: int = 1


@dataclass
class EstimatorParams:
    gamma: float = 0.99
    gae_lambda: float = 0.95
    n_steps: int = 5
    std_normalize: bool = True
    group_eps: float = 1e-6

    @classmethod
    def from_cfg(cls, cfg) -> "EstimatorParams":
        """The estimator knobs of a run's config (``gamma, gae_lambda, n_steps, std_normalize``)."""
        return cls(gamma=float(cfg.gamma), gae_lambda=float(cfg.gae_lambda), n_steps=int(cfg.n_steps),
                   std_normalize=bool(cfg.std_normalize))


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [T, B]
    returns: torch.Tensor | None  # [T, B] critic targets, None without a critic


EstimatorFn = Callable[[AdvantageBatch, EstimatorParams], AdvantageResult]


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    fn: EstimatorFn
    needs_critic: bool
    needs_groups: bool = False
    needs_greedy: bool = False
    full_episodes: bool = False  # Monte Carlo: collect whole episodes, no bootstrap

    def __call__(self, batch: AdvantageBatch, params: EstimatorParams) -> AdvantageResult:
        if self.needs_critic and (batch.values is None or batch.next_values is None):
            raise ValueError(f"estimator {self.name!r} needs batch.values and batch.next_values")
        if self.needs_groups and not batch.group_size:
            raise ValueError(f"estimator {self.name!r} needs batch.group_size")
        if self.needs_greedy and batch.greedy_scores is None:
            raise ValueError(f"estimator {self.name!r} needs batch.greedy_scores")
        return self.fn(batch, params)


ESTIMATORS: dict[str, EstimatorSpec] = {}


def register(spec: EstimatorSpec) -> EstimatorSpec:
    if spec.name in ESTIMATORS:
        raise ValueError(f"estimator {spec.name!r} is already registered")
    ESTIMATORS[spec.name] = spec
    return spec


def estimator_names() -> list[str]:
    """Every registered estimator name, in registration order (stable): what tests,
    benchmarks and validation enumerate instead of keeping their own list."""
    return list(ESTIMATORS)


def get_estimator(name: str) -> EstimatorSpec:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown estimator {name!r}; valid: {', '.join(sorted(ESTIMATORS))}"
        ) from None


# ---------------------------------------------------------------------------------------
# Adapters from the batch to the pure functions. Scores of whole-episode estimators are
# undiscounted episode returns R_i = sum_t r_t over the trajectory (docs/design.md, Estimators).


def episode_scores(batch: AdvantageBatch) -> torch.Tensor:
    """``R_i = sum_t mask * r_t`` per column, shaped ``[n_groups, group_size]``."""
    mask = batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)
    totals = (batch.rewards * mask).sum(dim=0)
    return totals.view(-1, batch.group_size)


def episode_lengths(batch: AdvantageBatch) -> torch.Tensor:
    """``l_i = sum_t mask``: unmasked steps (tokens) per column, ``[n_groups, group_size]``."""
    mask = batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)
    return mask.sum(dim=0).view(-1, batch.group_size)


def _per_member(fn, scores: torch.Tensor, members: int) -> torch.Tensor:
    """``fn`` on each member's block of groups (rows of ``scores``, member-major)."""
    if members <= 1:
        return fn(scores)
    if scores.shape[0] % members:
        raise ValueError(f"{scores.shape[0]} groups do not split into members={members} equal blocks")
    return torch.cat([fn(block) for block in scores.chunk(members, dim=0)], dim=0)


def _broadcast(per_traj: torch.Tensor, batch: AdvantageBatch) -> torch.Tensor:
    adv = per_traj.reshape(1, -1).expand_as(batch.rewards)
    return adv * batch.mask if batch.mask is not None else adv.clone()


def _reinforce(batch, p):
    """``reinforce``: A_t = G_t, the reward-to-go (Williams 1992). Also ``reinforce_pp``
    (REINFORCE++, Hu 2025): the same advantages, whitened over the batch by its config."""
    return AdvantageResult(
        _returns.reward_to_go(batch.rewards, batch.terminated, batch.truncated, p.gamma), None
    )


def _baseline(batch, p):
    """``baseline``: A_t = G_t - V(s_t), V regressed on G_t."""
    g = _returns.reward_to_go(batch.rewards, batch.terminated, batch.truncated, p.gamma)
    return AdvantageResult(g - batch.values, g)


def _a2c(batch, p):
    """``a2c``: n-step TD advantage (Mnih et al. 2016)."""
    a, r = _returns.n_step(batch.rewards, batch.values, batch.next_values,
                           batch.terminated, batch.truncated, p.gamma, p.n_steps)
    return AdvantageResult(a, r)


def _ppo_gae(batch, p):
    """``ppo_gae``: GAE(gamma, lambda) (Schulman et al. 2016/2017); returns = A + V_old."""
    a, r = _returns.gae(batch.rewards, batch.values, batch.next_values,
                        batch.terminated, batch.truncated, p.gamma, p.gae_lambda)
    return AdvantageResult(a, r)


def _grpo(batch, p):
    """``grpo``: (R_i - group mean) / (group std + eps) (Shao et al. 2024)."""
    adv = _group.grpo(episode_scores(batch), std_normalize=p.std_normalize, eps=p.group_eps)
    return AdvantageResult(_broadcast(adv, batch), None)


def _dr_grpo(batch, p):
    """``dr_grpo``: R_i - group mean, no std (Liu et al. 2025); its config adds the
    token-sum aggregation."""
    adv = _group.grpo(episode_scores(batch), std_normalize=False, eps=p.group_eps)
    return AdvantageResult(_broadcast(adv, batch), None)


def _rloo(batch, p):
    """``rloo``: R_i - mean of the other group members (Ahmadian et al. 2024)."""
    return AdvantageResult(_broadcast(_group.rloo(episode_scores(batch)), batch), None)


def _remax(batch, p):
    """``remax``: R_i - R_greedy, the greedy rollout's return from the same start (Li et al. 2023)."""
    adv = _group.remax(episode_scores(batch), batch.greedy_scores)
    return AdvantageResult(_broadcast(adv, batch), None)


def _reinforce_pp_baseline(batch, p):
    """``reinforce_pp_baseline``: R_i - group mean (REINFORCE++-baseline, Hu et al. 2025); its
    config adds the batch whitening (``normalize_advantages: batch``)."""
    return AdvantageResult(_broadcast(_group.reinforce_pp_baseline(episode_scores(batch)), batch), None)


def _opo(batch, p):
    """``opo``: R_i - length-weighted group mean of R (Hao et al. 2025)."""
    adv = _group.opo(episode_scores(batch), episode_lengths(batch))
    return AdvantageResult(_broadcast(adv, batch), None)


def _gpg(batch, p):
    """``gpg``: alpha (R_i - group mean) [/ group std] (Chu et al. 2025); alpha per member."""
    adv = _per_member(lambda s: _group.gpg(s, std_normalize=p.std_normalize, eps=p.group_eps),
                      episode_scores(batch), batch.members)
    return AdvantageResult(_broadcast(adv, batch), None)


def _grpo_passk(batch, p):
    """``grpo_passk``: (R_max - R_second) [/ group std] for the group's best member, 0 elsewhere."""
    adv = _group.grpo_passk(episode_scores(batch), std_normalize=p.std_normalize, eps=p.group_eps)
    return AdvantageResult(_broadcast(adv, batch), None)


# The only list of estimators. Each name has its defaults in harness/conf/estimator/<name>.yaml.
register(EstimatorSpec("reinforce", _reinforce, needs_critic=False, full_episodes=True))
register(EstimatorSpec("baseline", _baseline, needs_critic=True, full_episodes=True))
register(EstimatorSpec("a2c", _a2c, needs_critic=True))
register(EstimatorSpec("ppo_gae", _ppo_gae, needs_critic=True))
register(EstimatorSpec("grpo", _grpo, needs_critic=False, needs_groups=True, full_episodes=True))
register(EstimatorSpec("rloo", _rloo, needs_critic=False, needs_groups=True, full_episodes=True))
register(EstimatorSpec("remax", _remax, needs_critic=False, needs_groups=True, needs_greedy=True,
                       full_episodes=True))
register(EstimatorSpec("dr_grpo", _dr_grpo, needs_critic=False, needs_groups=True,
                       full_episodes=True))
register(EstimatorSpec("reinforce_pp", _reinforce, needs_critic=False, full_episodes=True))
register(EstimatorSpec("reinforce_pp_baseline", _reinforce_pp_baseline, needs_critic=False, needs_groups=True,
                       full_episodes=True))
register(EstimatorSpec("opo", _opo, needs_critic=False, needs_groups=True, full_episodes=True))
register(EstimatorSpec("gpg", _gpg, needs_critic=False, needs_groups=True, full_episodes=True))
register(EstimatorSpec("grpo_passk", _grpo_passk, needs_critic=False, needs_groups=True, full_episodes=True))
