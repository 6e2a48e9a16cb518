"""Population MLPs: ``P`` independent networks evaluated with one batched matmul.

Weights are ``[P, in, out]``; member ``p`` is initialised from its own generator, so member
``p`` of a population and a lone run with the same seed start from identical weights. Adam is
elementwise, so a single optimizer over these tensors keeps per-member optimizer state;
gradient-norm clipping is done per member by :func:`clip_grad_norm_per_member`.
"""
from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


class PopulationMLP(nn.Module):
    def __init__(self, population: int, sizes: list[int], activation: str,
                 out_gain: float, generators: list[torch.Generator]):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            w = torch.empty(population, n_in, n_out)
            gain = out_gain if last else math.sqrt(2.0)
            for p, gen in enumerate(generators):  # orthogonal init, as CleanRL / SB3
                w_out_in = torch.empty(n_out, n_in)
                torch.nn.init.orthogonal_(w_out_in, gain=gain, generator=gen)
                w[p] = w_out_in.T
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(population, 1, n_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [P, N, in] -> [P, N, out]``."""
        n = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < n - 1:
                x = self.act(x)
        return x


@torch.no_grad()
def clip_grad_norm_per_member(params: list[torch.Tensor], max_norm: float | None,
                              population: int) -> torch.Tensor:
    """Scale each member's gradient so its global norm is <= max_norm; returns the norms ``[P]``."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.zeros(population, dtype=grads[0].dtype)
    for g in grads:
        sq += g.reshape(population, -1).pow(2).sum(dim=1)
    norms = sq.sqrt()
    if max_norm is not None:
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(population, *([1] * (g.dim() - 1))))
    return norms
