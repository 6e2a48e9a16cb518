"""Population MLPs: ``P`` independent networks evaluated with one batched matmul.

Weights are ``[P, in, out]``; member ``p`` is initialised from its own generator, so member
``p`` of a population and a lone run with the same seed start from identical weights. Adam is
elementwise, so a single optimizer over these tensors keeps per-member optimizer state;
gradient-norm clipping is done per member by :func:`harness.train.update.clip_grad_norms`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
from torch import nn


def _np_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.tanh((x.detach() if x.requires_grad else x).numpy()))


class _NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _np_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad * (1 - y^2), torch.tanh's own backward


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh`` of a CPU tensor by numpy's SIMD ``np.tanh``; other devices: ``torch.tanh``.

    Why: torch 2.13's CPU float32 ``tanh`` is 5-11x slower than numpy's on the hidden layers'
    shapes (``benchmarks/tanh_floor.py``; about a quarter of a population update). The two agree
    to a float32 ulp (5.96e-08 there), so runs differ from ``torch.tanh`` ones in the last digits,
    not in what they learn. numpy computes each element alone (no reductions), so a member's
    values do not depend on how many rows are stacked with it: member == lone run still holds
    exactly. The gradient is torch's own ``tanh_backward`` of the output, ``g (1 - y^2)``, as
    ``torch.tanh``'s autograd computes it."""
    if x.device.type != "cpu":
        return torch.tanh(x)
    if torch.is_grad_enabled() and x.requires_grad:
        return _NumpyTanh.apply(x)
    return _np_tanh(x)


ACTIVATIONS = {"tanh": tanh, "relu": torch.relu}

# A layer whose output is at most this fraction of its input's width is computed by
# :func:`narrow_baddbmm` (on the CPU): the control networks' output layers (64 -> 1, 2 or 2 x act_dim).
NARROW_OUT = 0.25


def _is_narrow(w: torch.Tensor) -> bool:
    """Whether the layer of weight ``w [R, in, out]`` is computed transposed (:func:`narrow_baddbmm`'s
    product): narrow (:data:`NARROW_OUT`) and on the CPU, where that pays."""
    return w.device.type == "cpu" and w.shape[2] <= NARROW_OUT * w.shape[1]


def _narrow_t(bt: torch.Tensor, wt: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # (w^T x^T + b^T)^T from bt = b^T and a contiguous wt = w^T: one wide [out, in] x [in, N]
    # product per row instead of [N, in] x [in, out]
    return torch.baddbmm(bt, wt, x.mT).mT


def _narrow(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _narrow_t(b.mT, w.mT.contiguous(), x)


class _Narrow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _narrow(b, x, w)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        need_b, need_x, need_w = ctx.needs_input_grad
        gb = g.sum(1, keepdim=True) if need_b else None  # b broadcast over the N rows
        gx = torch.bmm(g, w.mT) if need_x else None  # g w^T, as baddbmm's own backward
        gw = torch.bmm(g.mT, x).mT.contiguous() if need_w else None  # x^T g, as (g^T x)^T
        return gb, gx, gw


def narrow_baddbmm(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.baddbmm(b, x, w)`` (``b [R, 1, out] + x [R, N, in] @ w [R, in, out]``) for a layer
    whose output is much narrower than its input, on the CPU; other devices: ``torch.baddbmm``.

    Why: torch 2.13's CPU batched matmul (MKL) is slow when the product has a few columns: on the
    zoo CartPole population's output layer (16 rows of ``[256, 64] @ [64, 2]``) the forward took
    164 us and ``x^T g``, the weight's gradient, 195 us, where the same products taken transposed,
    ``(w^T x^T)^T`` and ``(g^T x)^T``, took 35 us and 29 us. Both compute the same sums; their
    float32 rounding differs in the last digits (a different summation order inside MKL), so runs
    differ from ``torch.baddbmm`` ones there, not in what they learn
    (``tests/test_control.py::test_narrow_layer_moves_an_update_only_in_float32s_last_digits``).
    Each row is its own product, as in ``torch.baddbmm``, so member == lone run holds as it did
    (the same samples, losses to float rounding: ``tests/test_one_path.py``). The gradients are
    baddbmm's own formulas: ``g.sum`` over the rows for ``b``, ``g w^T`` for ``x``, ``x^T g`` for ``w``."""
    if x.device.type != "cpu":
        return torch.baddbmm(b, x, w)
    if torch.is_grad_enabled() and (b.requires_grad or x.requires_grad or w.requires_grad):
        return _Narrow.apply(b, x, w)
    return _narrow(b, x, w)


def population_layer(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One layer of :class:`PopulationMLP`, ``b [R, 1, out] + x [R, N, in] @ w [R, in, out]``:
    :func:`narrow_baddbmm` when ``out <= NARROW_OUT * in`` on the CPU (:func:`_is_narrow`), else
    ``torch.baddbmm``."""
    return (narrow_baddbmm if _is_narrow(w) else torch.baddbmm)(b, x, w)


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
        self._row_views: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def _rows(self, rows: slice) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The weights' and biases' rows ``rows`` as views, made once (without grad) and kept:
        slicing the six parameters took about 9 us of every collection step's forward (a lone
        run's is about 24 us). Views share their parameter's memory, so the optimizer's in-place
        steps and a checkpoint's ``copy_`` are seen through them; :meth:`_apply` (``.to``,
        ``.cuda``, ``.double``: new tensors) drops them. Only for forwards without grad: the
        views record no graph."""
        key = (rows.start, rows.stop, rows.step)
        views = self._row_views.get(key)
        if views is None:
            with torch.no_grad():
                views = self._row_views[key] = self._sliced(rows)
        return views

    def _sliced(self, rows: slice | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The weights and biases (their rows ``rows``; all for None), from the lists' own parameter
        dicts: ``ParameterList``'s indexing (per item, by string key) was about 9 us of every forward."""
        ws, bs = self.weights._parameters.values(), self.biases._parameters.values()
        if rows is None:
            return list(ws), list(bs)
        return [w[rows] for w in ws], [b[rows] for b in bs]

    def _apply(self, fn, *args, **kwargs):
        self._row_views = {}
        return super()._apply(fn, *args, **kwargs)

    def frozen(self, rows: slice) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward(·, rows)`` without grad, for as long as the weights do not change (a rollout,
        an evaluation): a function of ``x`` whose output equals ``forward(x, rows)``'s under
        ``torch.no_grad`` bit for bit, with the same kernels on the same values, that records no
        graph. What it leaves out is per call work whose result is the same while the weights
        are: the module call, the rows' views, the checks of :func:`population_layer` and
        :func:`tanh`, and the transposed copy of a narrow layer's weight (:func:`narrow_baddbmm`),
        made here once: a zoo CartPole rollout (32 steps of 8 envs, then the critic's values) took
        0.86-0.90 of its time with the module's forward (alternating in one process). Equality:
        ``tests/test_control.py::test_a_frozen_forward_is_the_forward_bit_for_bit``. After the
        weights change (an optimizer step, a checkpoint's load), make a new one."""
        layers = []
        for w, b in zip(*self._rows(rows)):
            w, b = w.detach(), b.detach()  # the parameters' memory, never a graph
            narrow = _is_narrow(w)  # population_layer's choice
            layers.append((True, b.mT, w.mT.contiguous()) if narrow else (False, b, w))  # _narrow's operands
        act, last = self.act, len(layers) - 1
        baddbmm = torch.baddbmm

        def forward(x: torch.Tensor) -> torch.Tensor:
            for i, (narrow, b, w) in enumerate(layers):
                x = _narrow_t(b, w, x) if narrow else baddbmm(b, x, w)
                if i < last:
                    x = act(x)
            return x

        return forward

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """``x [R, N, in] -> [R, N, out]`` for the rows ``rows`` (all by default)."""
        ws, bs = self._rows(rows) if rows is not None and not torch.is_grad_enabled() else self._sliced(rows)
        n = len(ws)
        for i, (w, b) in enumerate(zip(ws, bs)):
            x = population_layer(b, x, w)
            if i < n - 1:
                x = self.act(x)
        return x


def member_view(t: torch.Tensor, population: int) -> torch.Tensor:
    """View a tensor whose leading dim stacks ``k`` blocks of ``population`` rows (e.g. actor
    rows then critic rows) as ``[k, P, ...]``, so index ``[:, p]`` is everything of member p."""
    return t.view(t.shape[0] // population, population, *t.shape[1:])
