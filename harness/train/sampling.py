"""Sampling-side options of the group-sampling sources (toy, LM), each written once here.

* :func:`dynamic_sample` (with :func:`~harness.estimators.group.zero_std_groups`): DAPO's dynamic sampling (Yu et al. 2025,
  arXiv:2503.14476, §3.2; verl ``algorithm.filter_groups``): a group whose members all got the
  same score has zero group-relative advantage and contributes no gradient, so such groups are
  dropped and more are drawn until the batch holds ``n_groups`` informative ones, or
  ``max_draws`` generation batches have been drawn. Every drawn sample counts against the budget.
* :func:`overlong_penalty`: DAPO's soft overlong punishment (§3.4, eq. 13).

A source supplies how to draw one generation batch, read its scores, keep some of its groups
and concatenate batches; the rule (which groups, when to stop, what is counted) is only here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..estimators.group import zero_std_groups


@dataclass
class Drawn:
    """What :func:`dynamic_sample` drew: ``batches`` (every generation batch, for the budget),
    ``draws`` (how many), ``groups`` (groups drawn) and ``zero_std`` (of those, how many had
    zero score std)."""

    batches: list[Any]
    draws: int
    groups: int
    zero_std: int

    @property
    def zero_std_frac(self) -> float:
        return self.zero_std / self.groups if self.groups else float("nan")


def dynamic_sample(draw: Callable[[], Any], scores: Callable[[Any], torch.Tensor],
                   take: Callable[[Any, torch.Tensor], Any], cat: Callable[[list[Any]], Any],
                   n_groups: int, max_draws: int) -> tuple[Any, Drawn]:
    """DAPO's dynamic sampling: draw generation batches of ``n_groups`` groups (``draw()``),
    keep the groups whose scores (``scores(batch) [n_groups, k]``) are not all equal, in the
    order drawn, until ``n_groups`` are kept (the surplus of the last draw is dropped, as in verl)
    or ``max_draws`` batches were drawn. Returns the batch to train on (``cat`` of ``take(batch,
    group_indices)``) and what was drawn.

    When ``max_draws`` is reached first, the batch holds the informative groups found (fewer
    than ``n_groups``); when none was found, the last draw unfiltered (its advantages are all
    0 under a group estimator: the update does nothing, as without filtering)."""
    if max_draws < 1:
        raise ValueError(f"max_draws must be >= 1, got {max_draws}")
    kept, n_kept, drawn, n_zero = [], 0, [], 0
    for _ in range(max_draws):
        b = draw()
        drawn.append(b)
        flat = zero_std_groups(scores(b))
        n_zero += int(flat.sum())
        idx = (~flat).nonzero().flatten()[: n_groups - n_kept]
        if len(idx):
            kept.append(take(b, idx))
            n_kept += len(idx)
        if n_kept >= n_groups:
            break
    info = Drawn(drawn, len(drawn), len(drawn) * n_groups, n_zero)
    if not kept:
        return drawn[-1], info
    return (kept[0] if len(kept) == 1 else cat(kept)), info


def take_groups(batch: Any, groups: torch.Tensor, k: int) -> Any:
    """The groups ``groups`` of a dataclass batch whose tensor fields are batch-major ``[N, ...]``
    with ``N = n_groups * k`` group-major rows (other fields are kept as they are)."""
    rows = (groups.view(-1, 1) * k + torch.arange(k).view(1, -1)).flatten()
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)
                                         if torch.is_tensor(getattr(batch, f.name))})


def cat_rows(batches: list[Any]) -> Any:
    """Row-wise concatenation of dataclass batches with batch-major tensor fields."""
    first = batches[0]
    return dataclasses.replace(first, **{f.name: torch.cat([getattr(b, f.name) for b in batches])
                                         for f in dataclasses.fields(first) if torch.is_tensor(getattr(first, f.name))})


def overlong_penalty(length: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    r"""DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), added to a response's score:

    .. math:: R(y) = \begin{cases} 0 & |y| \le L_{max} - L_{cache} \\
              \frac{(L_{max} - L_{cache}) - |y|}{L_{cache}} & L_{max} - L_{cache} < |y| \le L_{max} \\
              -1 & |y| > L_{max} \end{cases}

    ``length`` counts a response's tokens (EOS included), ``max_len`` is :math:`L_{max}` (the
    sampling cap, so the last case never occurs here) and ``cache`` :math:`L_{cache}`."""
    if not 0 < cache <= max_len:
        raise ValueError(f"cache must be in (0, max_len={max_len}], got {cache}")
    free = max_len - cache
    pen = (free - length.to(torch.float64)) / cache
    return torch.where(length <= free, torch.zeros_like(pen), torch.where(length <= max_len, pen, -torch.ones_like(pen)))
