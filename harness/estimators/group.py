"""Critic-free group baselines over scores ``[n_groups, group_size]``.

Members of a group are trajectories from the identical start (same prompt / same reset
state). Each function returns per-trajectory advantages ``[n_groups, group_size]``; a
trainer gives every step of trajectory ``i`` the advantage of ``i`` (002, "every token in
a response gets the same advantage").
"""
from __future__ import annotations

import torch

from ._checks import check_finite, check_groups


def _centred(scores: torch.Tensor) -> torch.Tensor:
    """``R_i - mean_j R_j`` per group, exactly 0 in a group whose scores are all equal."""
    centred = scores - scores.mean(dim=1, keepdim=True)
    return torch.where(_constant(scores), torch.zeros_like(centred), centred)


def zero_std_groups(scores: torch.Tensor) -> torch.Tensor:
    """``[n_groups]`` bool: the groups of ``scores [n_groups, k]`` whose scores are all equal (zero
    standard deviation: every group-relative advantage of the group is 0). The one definition of a
    zero-std group: DAPO's dynamic sampling (:mod:`harness.train.sampling`) drops them and the LM
    task's ``zero_std_frac`` counts them."""
    return (scores == scores[:, :1]).all(dim=1)


def _constant(scores: torch.Tensor) -> torch.Tensor:
    """``[n_groups, 1]`` bool: every member of the group has the same score."""
    return zero_std_groups(scores).unsqueeze(1)


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
    centred = _centred(scores)
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


def reinforce_pp_baseline(scores: torch.Tensor) -> torch.Tensor:
    r"""REINFORCE++-baseline's group step (Hu et al. 2025, arXiv:2501.03262; verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``, OpenRLHF ``reinforce_baseline``).

    .. math:: A_i = R_i - \operatorname{mean}_{j \in \text{group}} R_j

    The method then whitens these over the whole batch, ``(A - mean_batch A) / std_batch A``
    with statistics over every unmasked token. That second step is *not* here: it is the
    ``normalize_advantages: batch`` axis of the update step, which the preset's YAML sets
    (``harness/conf/estimator/reinforce_pp_baseline.yaml``), so an ablation can turn it off by name.
    The harness's whitening (:func:`harness.losses.whiten`: token-weighted mean, biased std,
    ``/(std + 1e-8)``) is OpenRLHF's (biased variance, ``rsqrt(max(var, 1e-8))``) up to where
    the epsilon sits; verl's ``masked_whiten`` uses the Bessel-corrected variance over the ``N``
    unmasked tokens and ``rsqrt(var + 1e-8)``, so verl's advantages are the harness's times
    ``sqrt((N - 1) / N)`` (0.05% at N = 1000), tested in ``tests/test_group_kl.py``.
    Which score enters is the caller's: with ``kl.in_reward`` the per-token penalty is inside
    ``R_i`` (verl's ``token_level_rewards`` summed); OpenRLHF instead subtracts the group mean
    from the task score first and adds the per-token KL after, as a reward-to-go.
    """
    check_groups("scores", scores, min_size=2)
    return _centred(scores)


def opo(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    r"""OPO's optimal (length-weighted) group baseline (Hao et al. 2025, "On-Policy RL with
    Optimal Reward Baseline", arXiv:2505.23585; verl ``compute_opo_outcome_advantage``).

    .. math:: b_g = \frac{\sum_{j} l_j R_j}{\sum_j l_j}, \qquad A_i = R_i - b_{g(i)}

    ``lengths [n_groups, group_size]`` is ``l_j``, the number of unmasked steps (tokens) of
    trajectory ``j``; on control tasks it is the episode's step count. No std division (OPO
    omits it). A group whose lengths are all 0 falls back to equal weights (the plain mean;
    verl would divide 0 by 0), and a group with equal scores gets exactly 0.
    """
    check_groups("scores", scores, min_size=2)
    if lengths.shape != scores.shape:
        raise ValueError(f"lengths must be [n_groups, group_size]={list(scores.shape)}, got {list(lengths.shape)}")
    check_finite("lengths", lengths)
    if (lengths < 0).any():
        raise ValueError("lengths must be >= 0")
    weights = lengths.to(scores.dtype)
    total = weights.sum(dim=1, keepdim=True)
    weights = torch.where(total > 0, weights, torch.ones_like(weights))
    baseline = (weights * scores).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True)
    adv = scores - baseline
    return torch.where(_constant(scores), torch.zeros_like(adv), adv)


def gpg(scores: torch.Tensor, std_normalize: bool = False, eps: float = 1e-6) -> torch.Tensor:
    r"""GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546; the authors'
    code AMAP-ML/GPG ``open-r1/src/open_r1/gpg_trainer.py``).

    .. math:: A_i = \alpha\,\frac{R_i - \operatorname{mean}_{j \in \text{group}} R_j}{F_{norm}},
              \qquad \alpha = \frac{G}{\max(1, G_{valid})}

    over the groups of *one* batch: ``G`` groups, ``G_valid`` of them with a non-zero std
    (not all scores equal). A constant group has zero advantage, so it adds no gradient; alpha
    rescales the batch-mean gradient as if only the valid groups were in the batch (the paper's
    ``B / (B - M)``, ``M`` the samples of constant groups). ``F_norm = 1`` by default (verl's
    default ``f_norm``); ``std_normalize=True`` divides by the group's unbiased std plus ``eps``
    (the GPG code's ``scale_rewards``, which adds 1e-4).

    Differs from verl: verl's ``compute_gpg_outcome_advantage`` sets ``alpha = bsz /
    count_nonzero(scores)``, the responses whose *score* is non-zero, not the groups with a
    non-zero std (the two agree on neither all-correct groups nor rewards in {-1, 1}). This
    follows the paper and its authors' code. Call it once per population member: alpha is a
    statistic of that member's batch.
    """
    check_groups("scores", scores, min_size=2)
    n_valid = int((~_constant(scores)).sum())
    alpha = scores.shape[0] / max(1, n_valid)
    adv = _centred(scores)
    if std_normalize:
        adv = adv / (scores.std(dim=1, keepdim=True) + eps)
    return alpha * adv


def grpo_passk(scores: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    r"""Pass@k advantage, verl's ``compute_grpo_passk_outcome_advantage`` (its docstring cites
    arXiv:2503.19595; see also Chen et al. 2025, "Pass@k Training", arXiv:2508.10751).

    Only the best member of each group gets an advantage:

    .. math:: A_i = \begin{cases} \dfrac{R_{(1)} - R_{(2)}}{s} & i = \arg\max_j R_j \\
              0 & \text{otherwise} \end{cases}

    with ``R_(1) >= R_(2)`` the group's largest and second-largest scores and ``s = std_group R
    + eps`` (unbiased std, verl's ``norm_adv_by_std_in_grpo``) or ``s = 1`` with
    ``std_normalize=False``. It is the leave-one-out advantage of the group's maximum:
    ``max_j R_j - max_{j != i} R_j`` is 0 for every member but the best. With ties at the top
    every advantage is 0, whichever member ``argmax`` names.
    """
    check_groups("scores", scores, min_size=2)
    top2, idx = torch.topk(scores, 2, dim=1)
    gap = top2[:, :1] - top2[:, 1:]
    if std_normalize:
        gap = gap / (scores.std(dim=1, keepdim=True) + eps)
    return torch.zeros_like(scores).scatter(1, idx[:, :1], gap)
