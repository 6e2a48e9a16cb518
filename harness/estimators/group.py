"""Critic-free group baselines over scores ``[n_groups, group_size]``.

Members of a group are trajectories from the identical start (same prompt / same reset
state). Each function returns per-trajectory advantages ``[n_groups, group_size]``; a
trainer gives every step of trajectory ``i`` the advantage of ``i`` (002, "every token in
a response gets the same advantage").
"""
from __future__ import annotations

import torch

from ._checks import check_finite, check_groups


def grpo(scores: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    r"""Group-relative advantage of GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.2).

    .. math:: A_i = \frac{R_i - \operatorname{mean}_j R_j}{\operatorname{std}_j R_j + \epsilon}

    ``std`` is the unbiased sample std (Bessel-corrected, ``torch.std``), as in DeepSeekMath's
    and verl's implementations; ``eps`` is added to the std (verl's convention; TRL adds 1e-4).
    ``std_normalize=False`` is Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): ``A_i = R_i - mean``.
    A group whose scores are all equal gets advantages of exactly 0 (never NaN, never the
    rounding residue of ``R_i - mean``).
    """
    check_groups("scores", scores, min_size=2)
    centred = scores - scores.mean(dim=1, keepdim=True)
    constant = (scores == scores[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(constant, torch.zeros_like(centred), centred)
    if not std_normalize:
        return centred
    return centred / (scores.std(dim=1, keepdim=True) + eps)


def rloo(scores: torch.Tensor) -> torch.Tensor:
    r"""REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 5).

    .. math:: A_i = R_i - \frac{1}{k - 1} \sum_{j \ne i} R_j

    The baseline of sample ``i`` does not depend on ``R_i``, so it adds no bias. Which score
    enters is the caller's choice: with a KL penalty folded into the reward (the trainers' ``kl.in_reward``)
    this is the "KL inside the score" RLOO of Ahmadian et al.
    """
    check_groups("scores", scores, min_size=2)
    k = scores.shape[1]
    others_mean = (scores.sum(dim=1, keepdim=True) - scores) / (k - 1)
    return scores - others_mean


def remax(scores: torch.Tensor, greedy_scores: torch.Tensor) -> torch.Tensor:
    r"""ReMax (Li et al. 2023, arXiv:2310.10505, Algorithm 1): ``A_i = R_i - R_greedy``.

    ``greedy_scores[g]`` is the score of the greedy (argmax / mean-action) rollout from the
    start of group ``g``; its cost counts against the sample budget like any other rollout.
    """
    check_groups("scores", scores, min_size=1)
    if greedy_scores.shape != (scores.shape[0],):
        raise ValueError(
            f"greedy_scores must be [n_groups]={[scores.shape[0]]}, got {list(greedy_scores.shape)}"
            f" (scores={list(scores.shape)})"
        )
    check_finite("greedy_scores", greedy_scores)
    return scores - greedy_scores[:, None]
