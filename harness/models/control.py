"""Actor and critic for control tasks: categorical (Discrete) or Gaussian with a
state-independent log-std (Box; actions clipped to the bounds only when sent to the env)."""
from __future__ import annotations

import math

import torch
from torch import nn

from .mlp import PopulationMLP


class ControlAgent(nn.Module):
    def __init__(self, population: int, obs_dim: int, act_dim: int, discrete: bool,
                 hidden: list[int], activation: str, critic: bool,
                 generators: list[torch.Generator], init_log_std: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.population = population
        self.actor = PopulationMLP(population, [obs_dim, *hidden, act_dim], activation, 0.01, generators)
        self.critic = (PopulationMLP(population, [obs_dim, *hidden, 1], activation, 1.0, generators)
                       if critic else None)
        self.log_std = None if discrete else nn.Parameter(torch.full((population, 1, act_dim), float(init_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)

    def sample(self, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Sample with pre-drawn noise: uniforms (Gumbel-max) or standard normals."""
        if self.discrete:
            gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
            return (params + gumbel).argmax(dim=-1)
        return params + self.log_std.exp() * noise

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return params.argmax(dim=-1) if self.discrete else params

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
