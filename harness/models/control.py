"""Actor and critic for control tasks: categorical (Discrete) or diagonal Gaussian (Box).

The Gaussian policy's switches are the continuous-control choices that "What Matters in
On-Policy Reinforcement Learning?" (Andrychowicz et al. 2021) ablates, each a ``task.*`` key
with the PPO literature's default (:class:`AgentSpec`):

- ``task.log_std``: ``state_independent`` (default; a learned vector per member, Schulman et
  al. 2017, CleanRL, SB3) or ``state_dependent`` (a second head of the actor's output layer);
  both start at ``task.init_log_std``.
- ``task.action_bound``: ``clip`` (default; the Gaussian sample ``u`` is the action, clipped to
  the bounds only when sent to the env, so the log-prob is the Gaussian's, as CleanRL and SB3)
  or ``tanh`` (the env gets ``a = c + s tanh(u)``, ``c = (high + low) / 2``,
  ``s = (high - low) / 2``; the rollout keeps ``u`` and the log-prob is that of ``a``:
  ``log pi(a) = log N(u; mu, sigma) - sum_i [log(1 - tanh(u_i)^2) + log s_i]``, the change of
  variables of Haarnoja et al. 2018, appendix C; ``log(1 - tanh(u)^2)`` computed as
  ``2 (log 2 - u - softplus(-2u))``, as :class:`torch.distributions.transforms.TanhTransform`).
  The entropy reported with ``tanh`` is the pre-squash Gaussian's (the squashed one has no
  closed form).
- ``task.ortho_init``: orthogonal initialisation (default) or torch's default
  (:class:`harness.models.mlp.PopulationMLP`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ACTION_BOUNDS, LOG_STD_MODES
from .mlp import PopulationMLP


@dataclass(frozen=True)
class AgentSpec:
    """A :class:`ControlAgent`'s networks and action head: ``obs_dim`` inputs, ``act_dim`` actions
    (Discrete categories or Box dimensions), ``hidden`` layer widths with ``activation``; for a
    Gaussian policy the switches of the module docstring (``init_log_std``, ``log_std``,
    ``action_bound``; ``ortho_init`` for every policy) and the Box bounds ``low``/``high``."""

    obs_dim: int
    act_dim: int
    discrete: bool
    hidden: Sequence[int]
    activation: str = "tanh"
    init_log_std: float = 0.0
    log_std: str = "state_independent"
    action_bound: str = "clip"
    ortho_init: bool = True
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @classmethod
    def from_task(cls, task: Any, info: Any) -> AgentSpec:
        """What a ``task`` config node sets, for an env's spaces ``info``
        (:func:`harness.tasks.control.env_info`)."""
        return cls(info.obs_dim, info.act_dim, info.discrete, list(task.hidden), task.activation,
                   init_log_std=float(task.init_log_std), log_std=str(task.log_std),
                   action_bound=str(task.action_bound), ortho_init=bool(task.ortho_init), low=info.low, high=info.high)


class ControlAgent(nn.Module):
    """Actor rows ``0..P-1`` and critic rows ``P..2P-1`` of one :class:`PopulationMLP`, so a
    minibatch's policy and value come out of one batched pass (separate weights, no sharing).
    The critic's value is output column 0 (its other columns are unused). With
    ``log_std="state_dependent"`` the output has ``2 x act_dim`` columns: mean, then log-std."""

    def __init__(self, population: int, spec: AgentSpec, critic: bool, generators: list[torch.Generator]):
        super().__init__()
        discrete, act_dim, log_std, action_bound = spec.discrete, spec.act_dim, spec.log_std, spec.action_bound
        low, high, init_log_std = spec.low, spec.high, spec.init_log_std
        if log_std not in LOG_STD_MODES or action_bound not in ACTION_BOUNDS:
            raise ValueError(f"log_std {log_std!r} (one of {LOG_STD_MODES}), action_bound {action_bound!r} "
                             f"(one of {ACTION_BOUNDS})")
        self.discrete = discrete
        self.population = population
        self.has_critic = critic
        self.state_dependent = not discrete and log_std == "state_dependent"
        self.squash = not discrete and action_bound == "tanh"
        if self.squash and (low is None or high is None or not (np.isfinite(low).all() and np.isfinite(high).all())):
            raise ValueError("action_bound='tanh' needs finite action bounds")
        rows = list(generators) + (list(generators) if critic else [])
        gains = [0.01] * population + ([1.0] * population if critic else [])
        out = act_dim * (2 if self.state_dependent else 1)
        self.net = PopulationMLP(len(rows), [spec.obs_dim, *spec.hidden, out], spec.activation, gains, rows,
                                 spec.ortho_init)
        self.act_dim = act_dim
        self.init_log_std = float(init_log_std)
        self.log_std = None if discrete or self.state_dependent else nn.Parameter(
            torch.full((population, 1, act_dim), float(init_log_std)))
        if self.squash:  # a = centre + scale * tanh(u)
            self.register_buffer("act_centre", torch.as_tensor((high + low) / 2.0, dtype=torch.float32), persistent=False)
            self.register_buffer("act_scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32), persistent=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        P = self.population
        return self.net(obs, slice(P, 2 * P))[..., 0]

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs, slice(0, self.population))

    def policy(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`dist_params` of the current weights as a function without grad, for one rollout
        or evaluation (:meth:`PopulationMLP.frozen`: the same values bit for bit, less per step);
        made again after every update."""
        return self.net.frozen(slice(0, self.population))

    def dist_params_and_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.has_critic:
            return self.dist_params(obs), None
        out = self.net(torch.cat([obs, obs]))
        P = self.population
        return out[:P], out[P:, :, 0]

    def mean_log_std(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log-std (``[P, N, A]`` or ``[P, 1, A]``) from the actor output."""
        if self.state_dependent:
            A = self.act_dim
            return params[..., :A], params[..., A:] + self.init_log_std
        return params, self.log_std

    def sample(self, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Sample with pre-drawn noise: uniforms (Gumbel-max) or standard normals. Box actions are
        the Gaussian sample ``u`` (pre-squash with ``tanh``; :meth:`env_actions` maps them)."""
        if self.discrete:  # argmax(params + g), Gumbel g = -log(-log u): params - log(-log u), in place
            return torch.sub(params, noise.clamp(1e-20, 1.0 - 1e-7).log_().neg_().log_()).argmax(dim=-1)
        mean, log_std = self.mean_log_std(params)
        return mean + log_std.exp() * noise

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1) if self.discrete else self.mean_log_std(params)[0]

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """What the env is sent for the stored ``actions``: ``centre + scale * tanh(u)`` with
        ``action_bound=tanh``, else the actions themselves (Box ones are clipped to the bounds by
        :class:`harness.tasks.control.MemberEnvs`)."""
        return self.act_centre + self.act_scale * torch.tanh(actions) if self.squash else actions

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return torch.log_softmax(params, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        return self.log_prob_entropy(params, actions)[0]

    def log_prob_entropy(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            logp_all = torch.log_softmax(params, dim=-1)
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            return logp, entropy
        mean, log_std = self.mean_log_std(params)
        z = (actions - mean) / log_std.exp()
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        if self.squash:  # change of variables u -> centre + scale * tanh(u) (module docstring)
            log_det = 2.0 * (math.log(2.0) - actions - F.softplus(-2.0 * actions)) + torch.log(self.act_scale)
            logp = logp - log_det.sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1).expand_as(logp)
        return logp, entropy
