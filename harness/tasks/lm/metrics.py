r"""Metrics of verifiable-reward LM tasks: pass@k, zero-std groups, length by correctness.

Pure functions over plain numbers and tensors; :class:`harness.train.lm.LMSource` calls them
where it builds its metric row.
"""
from __future__ import annotations

import math

import torch

from ...estimators.group import zero_std_groups


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""The unbiased pass@k estimate from ``n`` samples of which ``c`` are correct
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv:2107.03374, eq. 1):

    .. math:: \text{pass@}k = 1 - \binom{n - c}{k} \Big/ \binom{n}{k}
              = 1 - \prod_{i = n - c + 1}^{n} \Big(1 - \frac{k}{i}\Big)

    the probability that a size-``k`` subset of the ``n`` samples (drawn without replacement)
    holds a correct one. The product form (the paper's numerically stable version) never forms
    the binomials, which overflow floats for large ``n``. ``n - c < k``: every subset holds one, 1.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: list[list[float]], k: int) -> float:
    """Mean of :func:`pass_at_k` over prompts; ``correct[j]``: the 0/1 verdicts of prompt ``j``'s samples."""
    vals = [pass_at_k(len(c), int(round(sum(c))), k) for c in correct]
    return sum(vals) / max(len(vals), 1)


def zero_std_fraction(scores: torch.Tensor, group_size: int) -> float | None:
    """Fraction of groups (``[n_groups * group_size]``, group-major) whose scores are all equal:
    a group-normalised advantage is 0 for every member, so the group teaches nothing
    (DAPO, Yu et al. 2025, arXiv:2503.14476, "dynamic sampling"). None for ``group_size < 2``."""
    if group_size < 2:
        return None
    return float(zero_std_groups(scores.detach().float().reshape(-1, group_size)).float().mean())


def length_by_correctness(lengths: torch.Tensor, correct: torch.Tensor) -> tuple[float | None, float | None]:
    """``(mean length of correct responses, of incorrect ones)``, None where there are none."""
    lengths, correct = lengths.detach().float().cpu(), correct.detach().cpu() > 0.5

    def mean(sel: torch.Tensor) -> float | None:
        return float(lengths[sel].mean()) if bool(sel.any()) else None

    return mean(correct), mean(~correct)
