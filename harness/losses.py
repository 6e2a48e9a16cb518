"""Policy, value, entropy and KL loss terms, and loss aggregation over a mask.

All inputs are time-major ``[T, B]`` with a 0/1 ``mask`` (1 on steps/tokens that count).
Every loss returns ``(loss, metrics)``: ``loss`` is the value to *minimise*; ``metrics`` are
detached tensors for logging. Inputs may carry leading dims (a population ``P`` of
independent agents, ``[P, T, B]``): losses and metrics then have shape ``[P]`` and the
trainer sums the losses, so each member's gradient is its own. Policy losses share one signature and are looked up by
name in :data:`POLICY_LOSSES` (``update: pg | clip``).
"""
from __future__ import annotations

from typing import Callable

import torch

from .estimators.kl import kl_estimate

# The only list of loss aggregations (config key ``loss_agg``); presets named after TRL's
# ``loss_type`` are in conf/loss_type/.
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "token_sum", "seq_mean_token_sum")


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              norm_len: int | None = None, seq_id: torch.Tensor | None = None) -> torch.Tensor:
    r"""Reduce per-token ``x [..., T, B]`` over its last two dims; a column of ``B`` is one sequence.

    * ``token_mean``: :math:`\sum_{t,b} m x / \sum_{t,b} m` (every token weighs the same;
      DAPO, Yu et al. 2025).
    * ``seq_mean_token_mean``: :math:`\frac1{S}\sum_b \frac{\sum_t m x}{\sum_t m}` (each
      sequence weighs the same, so a token of a short sequence weighs more: the GRPO paper's
      1/|o_i|, whose length bias Dr. GRPO points out).
    * ``seq_mean_token_sum_norm``: :math:`\frac1{S}\sum_b \frac{\sum_t m x}{L}` with a constant
      ``L = norm_len`` (default ``T``), Dr. GRPO (Liu et al. 2025, arXiv:2503.20783), as TRL's
      ``loss_type="dr_grpo"`` (``sum / (B * max_completion_length)``). verl's
      ``seq-mean-token-sum-norm`` differs: it divides the token sum by ``L`` only, not by ``S``.
    * ``token_sum``: :math:`\sum_{t,b} m x`, no division at all (verl's ``agg_loss`` modes are
      token-mean, seq-mean-token-mean, seq-mean-token-sum and seq-mean-token-sum-norm; this one
      is the unnormalised sum, so its scale grows with the number of tokens in a minibatch).
    * ``seq_mean_token_sum``: :math:`\frac1{S}\sum_b \sum_t m x` (verl's
      ``seq-mean-token-sum``: each sequence's token sum, mean over sequences; the same number as
      ``seq_mean_token_sum_norm`` with ``norm_len=1``).

    ``S`` counts the sequences with at least one unmasked token. Leading dims (a population
    of independent agents ``P``) are kept: the result has shape ``x.shape[:-2]``.

    TRL's ``GRPOConfig.loss_type`` names are presets of these (``loss_type=<name>``,
    ``conf/loss_type/``), each on one minibatch = one optimizer step of one process:
    ``grpo`` = ``seq_mean_token_mean`` (TRL divides by all ``B`` sequences, empty ones
    included, and clamps each length to >= 1; here ``S`` counts non-empty ones: the same when
    every sequence has a token); ``bnpo`` = ``token_mean`` (TRL: the tokens of each process's
    local micro-batch, then a mean over gradient-accumulation steps); ``dapo`` = ``token_mean``
    (TRL: the tokens of the whole accumulated batch of every process); ``dr_grpo`` =
    ``seq_mean_token_sum_norm`` with the task's ``norm_len`` (the LM's ``lm.max_response_len``,
    TRL's ``max_completion_length``). With one process and no accumulation bnpo and dapo are
    one thing; they part only where the harness has nothing to part them.

    ``seq_id`` (long, the shape of ``x``) names each entry's sequence when a column is not one
    sequence: the control task's step-level minibatches, where an entry is one environment step
    and its sequence is its episode (or the segment of one env column between resets). Ids are
    are non-negative; the sums above then run over the entries sharing an id.
    """
    if x.shape != mask.shape or x.dim() < 2:
        raise ValueError(f"x and mask must share a shape [..., T, B], got {list(x.shape)} and {list(mask.shape)}")
    mask = mask.to(x.dtype)
    if mode == "token_mean":
        return (x * mask).sum(dim=(-2, -1)) / mask.sum(dim=(-2, -1)).clamp(min=1.0)
    if mode == "token_sum":
        return (x * mask).sum(dim=(-2, -1))
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg must be one of {list(AGG_MODES)}, got {mode!r}")
    if seq_id is None:
        tokens = mask.sum(dim=-2)
        sums = (x * mask).sum(dim=-2)
    else:  # [..., n_ids]: per-sequence token counts and sums
        lead = x.shape[:-2]
        ids = seq_id.reshape(*lead, -1).long()
        n_ids = int(ids.max()) + 1 if ids.numel() else 1
        tokens = torch.zeros(*lead, n_ids, dtype=x.dtype, device=x.device).scatter_add(-1, ids, mask.reshape(*lead, -1))
        sums = torch.zeros(*lead, n_ids, dtype=x.dtype, device=x.device).scatter_add(
            -1, ids, (x * mask).reshape(*lead, -1))
    has_tokens = (tokens > 0).to(x.dtype)
    n_seq = has_tokens.sum(dim=-1).clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        return (sums / tokens.clamp(min=1.0) * has_tokens).sum(dim=-1) / n_seq
    if mode == "seq_mean_token_sum_norm":
        length = float(norm_len if norm_len is not None else x.shape[-2])
        return (sums / length).sum(dim=-1) / n_seq
    if mode == "seq_mean_token_sum":
        return sums.sum(dim=-1) / n_seq
    raise ValueError(f"loss_agg must be one of {list(AGG_MODES)}, got {mode!r}")


# ----------------------------------------------------------------------------- advantage whitening

def masked_mean_std(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-member mean and (biased) std of ``x [P, ...]`` over its unmasked entries: ``[P]`` each."""
    dims = tuple(range(1, x.dim()))
    n = mask.sum(dim=dims).clamp(min=1.0)
    mean = (x * mask).sum(dim=dims) / n
    shape = (-1,) + (1,) * (x.dim() - 1)
    var = (((x - mean.view(shape)) ** 2) * mask).sum(dim=dims) / n
    return mean, var.sqrt()


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Advantage whitening, per member (``normalize_advantages: batch | minibatch``):
    ``(x - mean) / (std + 1e-8)`` over the unmasked entries, masked entries set to 0
    (PPO's per-minibatch normalisation as in OpenAI baselines / SB3 / CleanRL)."""
    mean, std = masked_mean_std(x, mask)
    shape = (-1,) + (1,) * (x.dim() - 1)
    return (x - mean.view(shape)) / (std.view(shape) + 1e-8) * mask


def within_sequence_std(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per member, the mean over columns of the std of the advantage across a column's steps
    (claim C14: 0 when every step of a sequence gets the same advantage). Float64 so that a
    constant column gives exactly 0. ``[P]``."""
    a64, m64 = adv.double(), mask.double()
    n_tok = m64.sum(-2).clamp(min=1.0)
    col_mean = (a64 * m64).sum(-2) / n_tok
    col_std = ((((a64 - col_mean.unsqueeze(-2)) ** 2) * m64).sum(-2) / n_tok).sqrt()
    return col_std.mean(-1)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return aggregate(x.detach(), mask, "token_mean")


@torch.no_grad()
def _ratio_metrics(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    ratio = log_ratio.exp()
    big = torch.where(mask.bool(), ratio, torch.full_like(ratio, float("-inf")))
    return {
        # k3 estimate of KL(pi_old || pi) from samples of pi_old (Schulman 2020)
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "ratio_max": big.amax(dim=(-2, -1)),
    }


def clipped_surrogate_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    norm_len: int | None = None,
    with_metrics: bool = True,
    seq_id: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated.

    .. math:: L = -\operatorname{agg}\big[\min(r_t A_t,\ \operatorname{clip}(r_t, 1-\epsilon,
              1+\epsilon_{high}) A_t)\big],\qquad r_t = \exp(\log\pi(a_t|s_t) -
              \log\pi_{old}(a_t|s_t))

    The ratio is built from the log-probabilities of the *taken actions* (000's pseudo-code
    uses raw logits: a known slip). ``clip_eps_high`` defaults to ``clip_eps`` (asymmetric
    "clip-higher" of DAPO when set). ``clip_eps=None`` is the unclipped importance-weighted
    surrogate. The gradient vanishes where A>0 and r>1+eps_high, and where A<0 and r<1-eps;
    ``clip_frac`` is the fraction of unmasked tokens in those two regions.
    ``with_metrics=False`` skips the diagnostics (a trainer's hot loop), leaving ``policy_loss``.
    """
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    metrics = _ratio_metrics(log_ratio.detach(), mask) if with_metrics else {}
    if clip_eps is None:
        objective = unclipped
        if with_metrics:
            metrics["clip_frac"] = torch.zeros_like(metrics["approx_kl"])
    else:
        if clip_eps < 0:
            raise ValueError(f"clip_eps must be >= 0 or None, got {clip_eps!r}")
        high = clip_eps if clip_eps_high is None else clip_eps_high
        if high < 0:
            raise ValueError(f"clip_eps_high must be >= 0 or None, got {clip_eps_high!r}")
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
        objective = torch.minimum(unclipped, clipped)
        if with_metrics:
            active = ((advantages > 0) & (ratio > 1.0 + high)) | ((advantages < 0) & (ratio < 1.0 - clip_eps))
            metrics["clip_frac"] = _masked_mean(active.to(logp.dtype), mask)  # detached inside
    loss = -aggregate(objective, mask, agg, norm_len, seq_id)
    metrics["policy_loss"] = loss.detach()
    return loss, metrics


def pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = None,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    norm_len: int | None = None,
    with_metrics: bool = True,
    seq_id: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Vanilla policy gradient (REINFORCE, Williams 1992), negated:
    :math:`L = -\operatorname{agg}[\log\pi(a_t|s_t) A_t]`.

    ``old_logp`` is used only for diagnostics (ratio, approx KL); ``clip_eps`` is ignored.
    Its gradient equals the surrogate's at ``r = 1`` (the first epoch).
    """
    loss = -aggregate(logp * advantages, mask, agg, norm_len, seq_id)
    metrics = {}
    if with_metrics:
        metrics = _ratio_metrics((logp - old_logp).detach(), mask)
        metrics["clip_frac"] = torch.zeros_like(metrics["approx_kl"])
    metrics["policy_loss"] = loss.detach()
    return loss, metrics


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
# The only list of policy losses (config key ``update``): name -> loss function. Adding one is
# one function plus one :func:`register_policy_loss` call; config checks, tests and docs
# enumerate this dict.
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, fn: PolicyLoss | None = None):
    """Register ``fn`` as the policy loss selected by ``update: <name>``.

    Usable as a decorator, ``@register_policy_loss("clip")``, or a plain call,
    ``register_policy_loss("clip", clipped_surrogate_loss)``; either way returns ``fn``.
    Registering a name twice raises ``ValueError``.
    """
    def _register(f: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = f
        return f

    return _register if fn is None else _register(fn)


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise ValueError(f"update must be one of {sorted(POLICY_LOSSES)}, got {name!r}")
    return POLICY_LOSSES[name]


register_policy_loss("pg", pg_loss)
register_policy_loss("clip", clipped_surrogate_loss)


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip_eps: float | None = None,
    agg: str = "token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Value regression :math:`\tfrac12 (V_\theta(s_t) - R_t)^2` onto fixed targets ``returns``
    (built from ``V_old``: returns = A + V_old, 002). With ``clip_eps`` the PPO2/OpenAI-baselines
    clipped variant :math:`\tfrac12\max((V-R)^2, (V_{old} + \operatorname{clip}(V - V_{old},
    \pm\epsilon) - R)^2)`.
    """
    err = (values - returns).pow(2)
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        v_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        err = torch.maximum(err, (v_clipped - returns).pow(2))
    loss = 0.5 * aggregate(err, mask, agg)
    return loss, {"value_loss": loss.detach()}


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, agg: str = "token_mean",
                  norm_len: int | None = None, seq_id: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Entropy term to *minimise*: :math:`-\operatorname{agg}[H(\pi(\cdot|s_t))]`; the trainer
    adds ``ent_coef`` times it (PPO paper eq. 9, ``+ c_2 H``). Aggregated like the policy loss
    (same ``agg``, ``norm_len``, ``seq_id``), so ``ent_coef`` means the same under every mode."""
    loss = -aggregate(entropy, mask, agg, norm_len, seq_id)
    return loss, {"entropy": -loss.detach()}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
               estimator: str = "k3", agg: str = "token_mean", norm_len: int | None = None,
               seq_id: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""KL penalty as a loss term (GRPO style): :math:`\operatorname{agg}[\hat{k}(x)]` with the
    per-sample estimator ``estimator`` (a key of :data:`harness.estimators.kl.KL_ESTIMATORS`: k1, k2,
    k3, low_var_kl, or a straight-through ``+`` variant); the trainer multiplies
    by ``kl.beta``. ``ref_logp`` is the target policy (pre-update or reference), detached.
    Aggregated like the policy loss (same ``agg``, ``norm_len``, ``seq_id``): with
    ``seq_mean_token_sum_norm`` the constant ``norm_len``, never the batch's longest sequence,
    so the effective beta does not depend on the batch."""
    kl = kl_estimate(estimator, logp, ref_logp.detach())
    loss = aggregate(kl, mask, agg, norm_len, seq_id)
    return loss, {"kl": loss.detach()}


def adaptive_kl_beta(beta: float, kl: float, target: float) -> float:
    """Adaptive KL coefficient of the PPO paper (Schulman et al. 2017, §4): halve beta when
    the measured KL < target / 1.5, double it when KL > target * 1.5."""
    if kl < target / 1.5:
        return beta / 2.0
    if kl > target * 1.5:
        return beta * 2.0
    return beta


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """1 - Var[R - V] / Var[R] over unmasked entries (nan when Var[R] = 0)."""
    if mask is not None:
        m = mask.bool()
        values, returns = values[m], returns[m]
    if returns.numel() < 2:
        return float("nan")
    var_r = returns.var(unbiased=False)
    if var_r == 0:
        return float("nan")
    return float(1.0 - (returns - values).var(unbiased=False) / var_r)
