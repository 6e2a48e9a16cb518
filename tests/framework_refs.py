"""The frameworks' own functions, transcribed for the tests (never imported by the harness).

Each function is written from the framework's source at the version cited, defaults and guards
included (clamps, epsilons, the dual clip), on ``[B, T]`` tensors (a row is one response, right
padded, ``mask`` 1 on its tokens). Used by tests/test_frameworks.py (docs/frameworks.md's
configurations) and tests/test_recipes.py (harness/conf/recipe/).

- verl: ``verl/trainer/ppo/core_algos.py``, ``verl/utils/torch_functional.py`` (``masked_whiten``),
  ``verl/workers/actor/dp_actor.py`` (the KL loss), ``verl/trainer/ppo/ray_trainer.py``
  (``apply_kl_penalty``) at volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7;
- OpenRLHF: ``openrlhf/models/loss.py`` (``PolicyLoss``, ``aggregate_loss``), ``openrlhf/models/utils.py``
  (``compute_approx_kl``, ``compute_reward``), ``openrlhf/trainer/ppo_utils/experience_maker.py``,
  ``openrlhf/trainer/ray/ppo_actor.py`` at OpenRLHF/OpenRLHF 3c3be6234e0cb353e76bb8019947db9dfe99fca7;
- TRL: ``trl/trainer/grpo_trainer.py`` (``GRPOTrainer._compute_loss``, the advantages of
  ``_generate_and_score_completions``), ``trl/trainer/rloo_trainer.py`` at trl 1.16.0.
"""
from __future__ import annotations

import torch

# ============================================================================ verl (b178a3c)


def verl_agg_loss(loss_mat, mask, mode):
    """``agg_loss`` on one process (``dp_size=1``, global batch = this batch)."""
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        n = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1) / (n + 1e-8)
        keep = (n > 0).double()
        return (seq * keep).sum() / keep.sum()
    raise ValueError(mode)


def verl_policy_loss(mode, old, logp, adv, mask, agg="token-mean", clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0):
    """``compute_policy_loss_vanilla`` (dual clip always, ``log r`` clamped to +-20),
    ``compute_policy_loss_gspo`` (token form, ``log s <= 10``, always seq-mean-token-mean),
    ``compute_policy_loss_cispo`` (``log r`` clamped to +-20, detached clipped weight),
    ``compute_policy_loss_geo_mean`` (mean over sequences); ``adv [B, T]``."""
    nk = logp - old
    if mode == "vanilla":
        assert clip_ratio_c > 1.0
        ratio = torch.exp(torch.clamp(nk, -20.0, 20.0))
        l1 = -adv * ratio
        l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
        c1 = torch.maximum(l1, l2)
        c2 = torch.min(-adv * clip_ratio_c, c1)
        return verl_agg_loss(torch.where(adv < 0, c2, c1), mask, agg)
    if mode == "gspo":
        n = mask.sum(-1).clamp(min=1)
        seq = (nk * mask).sum(-1) / n
        log_s = torch.clamp(logp - logp.detach() + seq.detach().unsqueeze(-1), max=10.0)
        s = torch.exp(log_s)
        loss = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - clip_low, 1 + clip_high))
        return verl_agg_loss(loss, mask, "seq-mean-token-mean")
    if mode == "cispo":
        ratio = torch.exp(torch.clamp(nk, -20.0, 20.0))
        w = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
        return verl_agg_loss(-w * adv * logp, mask, agg)
    if mode == "geo_mean":
        sgn = torch.sign(adv)
        nk_c = torch.clamp(nk, -clip_low, clip_high)
        nk_min = sgn * torch.min(sgn * nk, sgn * nk_c)
        n = mask.sum(-1)
        ratio = torch.exp((nk_min * mask).sum(-1) / (n + 1e-8))
        a = (adv * mask).sum(-1) / (n + 1e-8)
        return torch.mean(-a * ratio)
    raise ValueError(mode)


def verl_kl_penalty(logp, ref, kind):
    """``kl_penalty_forward``: kl/k1, mse/k2, and low_var_kl/k3, which clamps ``log ref - log pi`` to
    +-20 and the value to +-10 (verl's "k3" is this clamped estimator)."""
    if kind in ("kl", "k1"):
        return logp - ref
    if kind in ("mse", "k2"):
        return 0.5 * (logp - ref).square()
    if kind in ("low_var_kl", "k3"):
        kl = torch.clamp(ref - logp, -20, 20)
        return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)
    raise ValueError(kind)


def verl_actor_loss(pg_loss, logp, ref, mask, agg="token-mean", kl_loss_coef=0.0, kl_loss_type="low_var_kl"):
    """``DataParallelPPOActor.update_policy``: ``pg_loss + kl_loss_coef * agg_loss(kl_penalty)``
    when ``use_kl_loss`` (``kl_loss_coef > 0`` here)."""
    if not kl_loss_coef:
        return pg_loss
    return pg_loss + kl_loss_coef * verl_agg_loss(verl_kl_penalty(logp, ref, kl_loss_type), mask, agg)


def verl_token_rewards(score, old, ref, mask, kl_coef=0.0, kl_penalty="kl"):
    """The score on each response's last token (the reward manager), minus, with
    ``use_kl_in_reward``, ``kl_coef * kl_penalty(old, ref)`` on every token (``apply_kl_penalty``)."""
    B, T = mask.shape
    r = torch.zeros(B, T, dtype=score.dtype)
    r[torch.arange(B), mask.sum(-1).long() - 1] = score
    if kl_coef:
        r = r - kl_coef * verl_kl_penalty(old, ref, kl_penalty) * mask
    return r


def verl_masked_whiten(x, mask):
    """``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)`` with the Bessel-corrected masked variance."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8)


def verl_advantages(name, r, mask, n, values=None, greedy=None, gamma=1.0, lam=1.0, epsilon=1e-6,
                    norm_adv_by_std_in_grpo=True):
    """The registered advantage estimators on token-level rewards ``r [B, T]`` (groups of ``n``
    consecutive responses)."""
    B, T = r.shape
    if name == "gae":
        nextvalues, lastgaelam, rev = torch.zeros(B, dtype=r.dtype), torch.zeros(B, dtype=r.dtype), []
        for t in reversed(range(T)):
            delta = r[:, t] + gamma * nextvalues - values[:, t]
            lg = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
            lastgaelam = lg * mask[:, t] + (1 - mask[:, t]) * lastgaelam
            rev.append(lastgaelam)
        return verl_masked_whiten(torch.stack(rev[::-1], dim=1), mask)
    scores = r.sum(-1).view(-1, n)
    if name == "grpo":
        mean, std = scores.mean(-1, keepdim=True), scores.std(-1, keepdim=True)
        a = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        return a.reshape(-1, 1) * mask
    if name == "rloo":
        a = scores * n / (n - 1) - scores.mean(-1, keepdim=True) * n / (n - 1)
        return a.reshape(-1, 1) * mask
    if name == "reinforce_plus_plus_baseline":
        a = (scores - scores.mean(-1, keepdim=True)).reshape(-1, 1).tile([1, T]) * mask
        return verl_masked_whiten(a, mask) * mask
    if name == "reinforce_plus_plus":
        returns, run = torch.zeros_like(r), torch.zeros(B, dtype=r.dtype)
        for t in reversed(range(T)):
            run = r[:, t] + gamma * run
            returns[:, t] = run
            run = run * mask[:, t]
        return verl_masked_whiten(returns, mask) * mask
    if name == "remax":
        returns = (r * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        return returns - greedy.repeat_interleave(n).unsqueeze(-1) * mask
    raise ValueError(name)


# ============================================================================ OpenRLHF (3c3be62)


def openrlhf_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    """``compute_approx_kl``: k1, k2, k3 of ``log_probs - log_probs_base``, clamped to [-10, 10]."""
    log_ratio = log_probs - log_probs_base
    if kl_estimator == "k2":
        log_ratio = log_ratio ** 2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = (-log_ratio).exp() - 1 + log_ratio
    return log_ratio.clamp(min=-10, max=10)


def openrlhf_rewards(score, old, ref, mask, kl_coef, kl_estimator="k1", use_loss=False):
    """``compute_reward`` after the experience maker's KL (``use_loss`` off): the score on the last
    action token plus ``-kl_coef * compute_approx_kl(old, ref)``."""
    kl = torch.zeros_like(old) if use_loss else openrlhf_approx_kl(old, ref, kl_estimator)
    B, T = mask.shape
    last = torch.zeros(B, T, dtype=score.dtype)
    last[torch.arange(B), mask.sum(-1).long() - 1] = score
    return last - kl_coef * kl


def openrlhf_advantages(name, score, old, ref, mask, n, values=None, gamma=1.0, lambd=1.0, kl_coef=0.01,
                        kl_estimator="k1", use_loss=False):
    """``compute_advantages_and_returns``: the group shaping of the score (group_norm: ``(r - mean) /
    (std + 1e-9)``), ``compute_reward``, GAE or the cumulative return, then for gae/reinforce the
    whitening over every action token (biased variance, ``rsqrt(clamp(var, 1e-8))``)."""
    s = score.view(-1, n)
    if name == "group_norm":
        s = (s - s.mean(-1, keepdim=True)) / (s.std(-1, keepdim=True) + 1e-9)
    r = openrlhf_rewards(s.reshape(-1), old, ref, mask, kl_coef, kl_estimator, use_loss)
    B, T = mask.shape
    if name == "gae":
        v, rr = mask * values, mask * r
        lastgaelam, rev = 0.0, []
        for t in reversed(range(T)):
            nextvalues = v[:, t + 1] if t < T - 1 else 0.0
            delta = rr[:, t] + gamma * nextvalues - v[:, t]
            lastgaelam = delta + gamma * lambd * lastgaelam
            rev.append(lastgaelam)
        adv = torch.stack(rev[::-1], dim=1)
    else:
        rr, ret, cum = mask * r, torch.zeros_like(r), torch.zeros(B, dtype=r.dtype)
        for t in reversed(range(T)):
            cum = rr[:, t] + gamma * cum
            ret[:, t] = cum
        adv = ret
    if name in ("gae", "reinforce", "reinforce_baseline"):
        num = mask.sum()
        mean = (adv * mask).sum() / num
        var = ((adv - mean).pow(2) * mask).sum() / num
        adv = (adv - mean) * var.clamp(min=1e-8).rsqrt()
    return adv


def openrlhf_policy_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=None):
    """``PolicyLoss`` (policy_loss_type="ppo": ``log r`` clamped to +-20; dual clip when set),
    aggregated token-level (``aggregate_loss``, ``token_level_loss=True``)."""
    ratio = (logp - old).clamp(min=-20.0, max=20.0).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv
    if dual_clip is None:
        loss = -torch.min(surr1, surr2)
    else:
        clip1 = torch.min(surr1, surr2)
        clip2 = torch.max(clip1, dual_clip * adv)
        loss = -torch.where(adv < 0, clip2, clip1)
    return (loss * mask).sum() / mask.sum()


def openrlhf_actor_loss(pg_loss, logp, ref, mask, kl_coef=0.0, kl_estimator="k3", use_loss=False):
    """``PPOActor``: ``actor_loss + kl_loss * kl_ctl`` with ``use_loss`` (``compute_approx_kl``, token mean)."""
    if not use_loss:
        return pg_loss
    kl = openrlhf_approx_kl(logp, ref, kl_estimator)
    return pg_loss + kl_coef * (kl * mask).sum() / mask.sum()


# ============================================================================ TRL (1.16.0)


def trl_grpo_advantages(score, n, scale_rewards="group"):
    """``_generate_and_score_completions``: ``rewards - group mean``, divided by ``std + 1e-4``
    (Bessel-corrected ``nanstd``) unless ``scale_rewards="none"``; ``[B]``."""
    g = score.view(-1, n)
    a = g - g.mean(-1, keepdim=True)
    if scale_rewards != "none":
        a = a / (g.std(-1, keepdim=True) + 1e-4)
    return a.reshape(-1)


def trl_aggregate(per_token, mask, loss_type, max_completion_length):
    """``_compute_loss``'s reductions on one process, no gradient accumulation (``num_items_in_batch``:
    this batch's completion tokens)."""
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    if loss_type in ("cispo", "dapo"):
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    raise ValueError(loss_type)


def trl_grpo_loss(logp, old, ref, adv, mask, *, loss_type="dapo", epsilon=0.2, epsilon_high=None, beta=0.0,
                  importance_sampling_level="token", delta=None, sapo_temperature_pos=1.0,
                  sapo_temperature_neg=1.05, use_bias_correction_kl=True, max_completion_length=None):
    """``GRPOTrainer._compute_loss`` (its defaults: loss_type="dapo", epsilon 0.2, epsilon_high = epsilon,
    beta 0); ``adv [B]``."""
    eps_low, eps_high = epsilon, epsilon if epsilon_high is None else epsilon_high
    a = adv.unsqueeze(1)
    log_ratio = logp - old
    if importance_sampling_level == "token":
        log_w = log_ratio
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    if beta != 0.0:
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=eps_high).detach() * a * logp
    elif loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    elif loss_type == "sapo":
        temps = torch.where(a > 0, sapo_temperature_pos, sapo_temperature_neg)
        per_token_loss = -torch.sigmoid(temps * (coef_1 - 1)) * 4 / temps * a
    else:
        raise ValueError(loss_type)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    return trl_aggregate(per_token_loss, mask, loss_type, max_completion_length or logp.shape[-1])


def trl_rloo_advantages(score, old, ref, mask, n, beta=0.05):
    """``RLOOTrainer``: ``rewards - beta * sum_t (old - ref)`` (k1 of the completion), minus the mean
    of the other ``n - 1`` completions of the prompt; ``[B]`` (``normalize_advantages`` off)."""
    r = score - beta * ((old - ref) * mask).sum(-1)
    g = r.view(-1, n)
    base = (g.sum(-1, keepdim=True) - g) / (n - 1)
    return (g - base).reshape(-1)


def trl_rloo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=None):
    """``RLOOTrainer._compute_loss``: the sequence ratio ``exp(sum_t log r_t)`` clipped per completion,
    the mean over completions."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    coef_1 = torch.exp((logp * mask).sum(1) - (old * mask).sum(1))
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + eps_high)
    return (-torch.min(coef_1 * adv, coef_2 * adv)).mean()
