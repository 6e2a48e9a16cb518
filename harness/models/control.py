"""Actor and critic for control tasks: categorical (Discrete) or Gaussian with a
state-independent log-std (Box; actions clipped to the bounds only when sent to the env)."""
from __future__ import annotations

import math

import torch
from torch import nn

from .mlp import PopulationMLP


class ControlAgent(nn.Module):
    """Actor rows ``0..P-1`` and critic rows ``P..2P-1`` of one :class:`PopulationMLP`, so a
    minibatch's policy and value come out of one batched pass (separate weights, no sharing).
    The critic's value is output column 0 (its other columns are unused)."""

    def __init__(self, population: int, obs_dim: int, act_dim: int, discrete: bool,
                 hidden: list[int], activation: str, critic: bool,
                 generators: list[torch.Generator], init_log_std: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.population = population
        self.has_critic = critic
        rows = list(generators) + (list(generators) if critic else [])
        gains = [0.01] * population + ([1.0] * population if critic else [])
        self.net = PopulationMLP(len(rows), [obs_dim, *hidden, act_dim], activation, gains, rows)
        self.act_dim = act_dim
        self.log_std = None if discrete else nn.Parameter(torch.full((population, 1, act_dim), float(init_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        P = self.population
        return self.net(obs, slice(P, 2 * P))[..., 0]

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs, slice(0, self.population))

    def dist_params_and_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.has_critic:
            return self.dist_params(obs), None
        out = self.net(torch.cat([obs, obs]))
        P = self.population
        return out[:P], out[P:, :, 0]

    def sample(self, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Sample with pre-drawn noise: uniforms (Gumbel-max) or standard normals."""
        if self.discrete:
            gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
            return (params + gumbel).argmax(dim=-1)
        return params + self.log_std.exp() * noise

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1) if self.discrete else params

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
        log_std = self.log_std
        z = (actions - params) / log_std.exp()
        logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1).expand_as(logp)
        return logp, entropy
