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
                 out_gains: list[float], generators: list[torch.Generator], ortho_init: bool = True):
        """Row ``p`` is initialised from ``generators[p]`` (rows may share a generator: it is drawn
        from in row order, layer by layer).

        ``ortho_init=True``: orthogonal weights with gain sqrt(2) on hidden layers and
        ``out_gains[p]`` on the output layer, zero biases (Saxe et al. 2014; the OpenAI baselines
        PPO init that CleanRL's ``layer_init`` and SB3's ``ortho_init=True`` copy). ``False``:
        :class:`torch.nn.Linear`'s own default, weights and biases uniform in
        ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` (weight then bias, per row), ``out_gains`` unused
        (SB3's ``ortho_init=False``; the "What matters" ablation of Andrychowicz et al. 2021)."""
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            w = torch.empty(population, n_in, n_out)
            b = torch.zeros(population, 1, n_out)
            for p, gen in enumerate(generators):
                w_out_in = torch.empty(n_out, n_in)  # torch.nn.Linear's layout
                if ortho_init:
                    gain = out_gains[p] if last else math.sqrt(2.0)
                    torch.nn.init.orthogonal_(w_out_in, gain=gain, generator=gen)
                else:  # nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)), then the bias
                    torch.nn.init.kaiming_uniform_(w_out_in, a=math.sqrt(5), generator=gen)
                    bound = 1.0 / math.sqrt(n_in)
                    b[p, 0].uniform_(-bound, bound, generator=gen)
                w[p] = w_out_in.T
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """``x [R, N, in] -> [R, N, out]`` for the rows ``rows`` (all by default)."""
        n = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if rows is not None:
                w, b = w[rows], b[rows]
            x = torch.baddbmm(b, x, w)
            if i < n - 1:
                x = self.act(x)
        return x


def member_view(t: torch.Tensor, population: int) -> torch.Tensor:
    """View a tensor whose leading dim stacks ``k`` blocks of ``population`` rows (e.g. actor
    rows then critic rows) as ``[k, P, ...]``, so index ``[:, p]`` is everything of member p."""
    return t.view(t.shape[0] // population, population, *t.shape[1:])


@torch.no_grad()
def clip_grad_norm_per_member(params: list[torch.Tensor], max_norm: float | None,
                              population: int, per_network: bool = False) -> torch.Tensor:
    """Clip each member's gradient to global norm ``max_norm``, members apart.

    Parameters stack ``k`` blocks of ``population`` rows (:func:`member_view`): block 0 is the
    actor, block 1 the critic. ``per_network=False`` clips actor and critic together (one
    norm per member, as SB3 and CleanRL do); ``per_network=True`` clips each block on its own,
    so a large value-loss gradient cannot shrink the policy's step. Returns the pre-clip norms
    per block ``[k_max, P]`` (row 0: the actor).
    """
    P = population
    if P == 1:  # fused norms per block; a gradient's rows are its blocks (unbind: one op per tensor)
        rows = [p.grad.unbind(0) for p in params if p.grad is not None]
        k_max = max(len(r) for r in rows)
        blocks = [[r[k] for r in rows if len(r) > k] for k in range(k_max)]
        norms = torch.stack([torch.linalg.vector_norm(torch.stack(torch._foreach_norm(b))) for b in blocks])
        if max_norm is not None:
            if per_network:
                for b, n in zip(blocks, norms.unbind(0)):
                    torch._foreach_mul_(b, (max_norm / (n + 1e-6)).clamp(max=1.0))
            else:  # one joint norm: one scale for every block
                joint = torch.linalg.vector_norm(norms)
                torch._foreach_mul_([g for b in blocks for g in b], (max_norm / (joint + 1e-6)).clamp(max=1.0))
        return norms.view(k_max, 1)
    views = [member_view(p.grad, P) for p in params if p.grad is not None]
    k_max = max(v.shape[0] for v in views)
    sq = torch.zeros(k_max, P, dtype=views[0].dtype)
    for v in views:
        sq[: v.shape[0]] += v.pow(2).reshape(v.shape[0], P, -1).sum(dim=-1)
    norms = sq.sqrt()
    if max_norm is not None:
        total = norms if per_network else sq.sum(dim=0, keepdim=True).sqrt().expand(k_max, P)
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for v in views:
            v.mul_(scale[: v.shape[0]].view(v.shape[0], P, *([1] * (v.dim() - 2))))
    return norms
