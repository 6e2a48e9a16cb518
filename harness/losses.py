"""Policy, value, entropy and KL loss terms, and loss aggregation over a mask.

All inputs are time-major ``[T, B]`` with a 0/1 ``mask`` (1 on steps/tokens that count).
Every loss returns ``(loss, metrics)``: ``loss`` is the value to *minimise*; ``metrics`` are
detached tensors for logging. Inputs may carry leading dims (a population ``P`` of
independent agents, ``[P, T, B]``): losses and metrics then have shape ``[P]`` and the
trainer sums the losses, so each member's gradient is its own. Policy losses are looked up by
name in :data:`POLICY_LOSSES` (``update: pg | clip | dual_clip | gspo | cispo | gmpo | sapo``).

A policy loss is ``fn(x: PolicyInputs, s: <its settings>) -> (loss, metrics)``: ``x`` holds the
tensors and how to reduce them (log-probs, old log-probs, advantages, mask, ``seq_id``, ``agg``,
``norm_len``, ``with_metrics``); ``s`` is the loss's own frozen dataclass of knobs (``ClipSettings``:
``clip_eps``, ``clip_eps_high``, ``delta``; ``PPOClipSettings``: those and ``log_ratio_clamp``;
``SapoSettings``: the two temperatures; ...), registered
with it. Its fields are config keys of the same names: :func:`register_policy_loss` adds the ones
the schema lacks (:data:`harness.config.LOSS_KNOBS`), :func:`loss_settings` builds the dataclass
from a run's config, and validation refuses a knob set away from its default for a loss that does
not read it. Adding a loss with a knob is its function, its settings dataclass and its YAML.
Every loss reports ``approx_kl``, ``ratio_mean``, ``ratio_max`` (of the
token ratios, the same meaning for every loss) and ``clip_frac``, the fraction of unmasked tokens
whose gradient the loss zeroes (a soft gate counts by the share of the gradient it removes).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .config import bad_field, first_sentence, is_finite, name_problem, register_loss_knobs
from .estimators.kl import kl_estimate
from .estimators.registry import called, contract_error, described, refuse_unknown, tensor_mismatch

# The only list of loss aggregations (config key ``loss_agg``); presets named after TRL's
# ``loss_type`` are in harness/conf/loss_type/.
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "token_sum", "seq_mean_token_sum")
# Sum over tokens, mean over sequences: the aggregation under which the loss's gradient at ratio 1 is,
# in expectation, minus the policy gradient (the probes' estimates, harness.probes)
SEQUENCE_SUM = {"agg": "seq_mean_token_sum_norm", "norm_len": 1}


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
    ``harness/conf/loss_type/``), each on one minibatch = one optimizer step of one process:
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


def whitening_plan(normalize: str, minibatches: int) -> tuple[bool, bool]:
    """Where ``normalize_advantages`` applies :func:`whiten` in an update over ``minibatches``
    minibatches of a batch: ``(once over the whole batch, in each minibatch)``. ``none``: never;
    ``batch``: once; ``minibatch``: in each minibatch, except with one minibatch, whose whitening
    is the batch's (the same every epoch), so once. The update step (:func:`harness.train.update.update`)
    and the gradient probes both follow it."""
    each = normalize == "minibatch" and minibatches > 1
    return normalize == "batch" or (normalize == "minibatch" and not each), each


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


def sequence_mean(x: torch.Tensor, mask: torch.Tensor, seq_id: torch.Tensor | None = None) -> torch.Tensor:
    r"""Per entry of ``x [..., T, B]``, the mean of ``x`` over the unmasked entries of its sequence,
    broadcast back to ``x``'s shape (0 for a sequence without unmasked entries).

    A sequence is a column of ``B`` when ``seq_id`` is None, else the entries sharing an id (the
    scatter of :func:`aggregate`: a control minibatch's steps of one episode). Differentiable in
    ``x``. Masked entries never enter a sum (``torch.where``, so a non-finite padding value stays
    out)."""
    if x.shape != mask.shape or x.dim() < 2:
        raise ValueError(f"x and mask must share a shape [..., T, B], got {list(x.shape)} and {list(mask.shape)}")
    m = mask.to(x.dtype)
    xm = torch.where(mask.bool(), x, torch.zeros_like(x))
    if seq_id is None:
        mean = xm.sum(dim=-2, keepdim=True) / m.sum(dim=-2, keepdim=True).clamp(min=1.0)
        return mean.expand_as(x)
    lead = x.shape[:-2]
    ids = seq_id.reshape(*lead, -1).long()
    n_ids = int(ids.max()) + 1 if ids.numel() else 1
    tokens = x.new_zeros(*lead, n_ids).scatter_add(-1, ids, m.reshape(*lead, -1))
    sums = x.new_zeros(*lead, n_ids).scatter_add(-1, ids, xm.reshape(*lead, -1))
    return (sums / tokens.clamp(min=1.0)).gather(-1, ids).reshape(x.shape)


def _eps(clip_eps: float | None, clip_eps_high: float | None) -> tuple[float, float]:
    """``(eps_low, eps_high)``: ``clip_eps`` and ``clip_eps_high`` (default ``clip_eps``);
    ``clip_eps=None``: no clipping (both infinite). The values come from a :class:`ClipRange`,
    which checked them."""
    if clip_eps is None:
        return float("inf"), float("inf")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return float(clip_eps), float(high)


def _band(clip_eps: float | None, clip_eps_high: float | None) -> tuple[float, float]:
    """``(low, high)`` of the clip band ``[1 - clip_eps, 1 + clip_eps_high]`` (infinite when
    ``clip_eps=None``)."""
    eps_low, eps_high = _eps(clip_eps, clip_eps_high)
    return 1.0 - eps_low, 1.0 + eps_high


def _clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float, delta: float
                       ) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    r"""PPO's per-token :math:`\min(\min(r, \delta) A,\ \operatorname{clip}(r, low, high) A)` and a
    function giving the tokens where its gradient in ``r`` is zero: ``A > 0`` and ``r > min(high, delta)``;
    ``A < 0`` and ``r < low`` or ``r > max(high, delta)``. ``delta = inf`` is the plain clipped surrogate.
    The mask is built only when called (``clip_frac``, with diagnostics), not in a trainer's hot loop."""
    capped = ratio if delta == float("inf") else torch.clamp(ratio, max=delta)
    objective = torch.minimum(capped * advantages, torch.clamp(ratio, low, high) * advantages)

    @torch.no_grad()
    def zeroed() -> torch.Tensor:
        return ((advantages > 0) & (ratio > min(high, delta))) | (
            (advantages < 0) & ((ratio < low) | (ratio > max(high, delta))))
    return objective, zeroed


def _policy_result(objective: torch.Tensor, log_ratio: torch.Tensor, x: "PolicyInputs",
                   clip_frac: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The end every policy loss shares: ``L = -agg[objective]`` and its ``(loss, metrics)``; with
    ``x.with_metrics`` the ratio diagnostics of ``log_ratio`` and ``clip_frac``, the masked token mean
    of ``clip_frac()`` (per-token 0/1 or a soft share, built only when diagnostics are asked for)."""
    loss = -aggregate(objective, x.mask, x.agg, x.norm_len, x.seq_id)
    metrics = {}
    if x.with_metrics:
        metrics = _ratio_metrics(log_ratio.detach(), x.mask)
        metrics["clip_frac"] = _masked_mean(clip_frac().to(objective.dtype), x.mask)
    metrics["policy_loss"] = loss.detach()
    return loss, metrics


@dataclass(frozen=True)
class PolicyInputs:
    """What every policy loss is called with: time-major ``[..., T, B]`` tensors and how to reduce them.

    ``logp``: log-probabilities of the taken actions under the policy being updated (the gradient
    flows through it); ``old_logp``: the same under the sampling policy (detached); ``advantages``;
    ``mask`` (1 on the steps/tokens that count). ``agg``/``norm_len``/``seq_id``: the aggregation
    (:func:`aggregate`); ``with_metrics=False`` skips the diagnostics (a trainer's hot loop),
    leaving ``policy_loss``."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    agg: str = "token_mean"
    norm_len: int | None = None
    seq_id: torch.Tensor | None = None
    with_metrics: bool = True


@dataclass(frozen=True)
class NoSettings:
    """A loss without knobs (``pg``)."""


@dataclass(frozen=True)
class ClipRange:
    """The clip band ``[1 - clip_eps, 1 + clip_eps_high]`` (``clip_eps_high`` null: ``clip_eps``;
    ``clip_eps`` null: no clipping); config keys ``clip_eps``, ``clip_eps_high``."""

    clip_eps: float | None = 0.2
    clip_eps_high: float | None = None

    def __post_init__(self):
        if self.clip_eps is not None and not (is_finite(self.clip_eps) and self.clip_eps > 0):
            bad_field("clip_eps", "a finite number > 0 or null (no clipping)", self.clip_eps)
        if self.clip_eps_high is not None and not (is_finite(self.clip_eps_high) and self.clip_eps_high > 0):
            bad_field("clip_eps_high", "a finite number > 0 or null (the same as clip_eps)", self.clip_eps_high)


@dataclass(frozen=True)
class ClipSettings(ClipRange):
    """``clip`` and ``gspo``: the band and ``delta``, TRL's two-sided cap (``GRPOConfig.delta``):
    the ratio of the unclipped term is capped at ``delta`` (null: off)."""

    delta: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.delta is not None and not (is_finite(self.delta) and self.delta > 1):
            bad_field("delta", "a finite number > 1 (TRL recommends > 1 + clip_eps) or null (off)", self.delta)

    @property
    def cap(self) -> float:
        """``delta`` as the cap of :func:`_clipped_objective` (``inf``: off)."""
        return float("inf") if self.delta is None else float(self.delta)


@dataclass(frozen=True)
class PPOClipSettings(ClipSettings):
    """``clip``: :class:`ClipSettings` and ``log_ratio_clamp``, a clamp of ``log r`` to
    ``[-c, c]`` before exp (null: none, the default). OpenRLHF's ``PolicyLoss`` clamps at 20
    (``openrlhf/models/loss.py``); ``dual_clip``, ``cispo`` and ``sapo`` always clamp at
    :data:`LOG_RATIO_CLAMP`, as verl does."""

    log_ratio_clamp: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.log_ratio_clamp is not None and not (is_finite(self.log_ratio_clamp) and self.log_ratio_clamp > 0):
            bad_field("log_ratio_clamp", "a finite number > 0 or null (no clamp)", self.log_ratio_clamp)


@dataclass(frozen=True)
class DualClipSettings(ClipRange):
    """``dual_clip``: the band and ``clip_ratio_c``, the bound ``c A`` for A < 0 (verl's ``clip_ratio_c``)."""

    clip_ratio_c: float = 3.0

    def __post_init__(self):
        super().__post_init__()
        if not (is_finite(self.clip_ratio_c) and self.clip_ratio_c > 1):
            bad_field("clip_ratio_c", "a finite number > 1 (dual-clip PPO's c; verl's default 3.0)", self.clip_ratio_c)


@dataclass(frozen=True)
class SapoSettings:
    """``sapo``: the gate temperatures for A > 0 and A <= 0 (TRL's ``sapo_temperature_pos/neg``,
    verl's ``tau_pos/tau_neg``)."""

    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05

    def __post_init__(self):
        for name in ("sapo_tau_pos", "sapo_tau_neg"):
            value = getattr(self, name)
            if not (is_finite(value) and value > 0):
                bad_field(name, "a finite number > 0 (SAPO's gate temperature)", value)


# Clamp of a log ratio before exp in the losses that follow verl in doing so (dual_clip, cispo,
# sapo): exp(log r) of a far-off token stays finite, so its zero gradient is not inf * 0 = nan.
LOG_RATIO_CLAMP = 20.0


def clipped_surrogate_loss(x: PolicyInputs, s: PPOClipSettings = PPOClipSettings()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated.

    .. math:: L = -\operatorname{agg}\big[\min(r_t A_t,\ \operatorname{clip}(r_t, 1-\epsilon,
              1+\epsilon_{high}) A_t)\big],\qquad r_t = \exp(\log\pi(a_t|s_t) -
              \log\pi_{old}(a_t|s_t))

    The ratio is built from the log-probabilities of the *taken actions* (000's pseudo-code
    uses raw logits: a known slip). ``clip_eps_high`` defaults to ``clip_eps`` (asymmetric
    "clip-higher" of DAPO when set). ``clip_eps=None`` is the unclipped importance-weighted
    surrogate. The gradient vanishes where A>0 and r>1+eps_high, and where A<0 and r<1-eps;
    ``clip_frac`` is the fraction of unmasked tokens in those two regions.

    ``delta`` (default None: off) is TRL's two-sided clipping (``GRPOConfig.delta``, from the
    INTELLECT-2 report, arXiv:2505.07291), applied as ``GRPOTrainer._compute_loss`` applies it:
    the ratio of the *unclipped* term is capped, :math:`\min(\min(r_t, \delta) A_t,
    \operatorname{clip}(r_t) A_t)`, so for A<0 the objective is bounded below by
    :math:`\delta A_t` (zero gradient where r > max(delta, 1+eps_high); counted in ``clip_frac``).

    ``log_ratio_clamp`` (default None: off): ``log r`` clamped to ``[-c, c]`` before exp, as
    OpenRLHF's ``PolicyLoss`` does at 20 (a token past it has gradient 0).
    """
    low, high = _band(s.clip_eps, s.clip_eps_high)
    log_ratio = x.logp - x.old_logp
    ratio = (log_ratio if s.log_ratio_clamp is None else
             torch.clamp(log_ratio, -s.log_ratio_clamp, s.log_ratio_clamp)).exp()
    if s.clip_eps is None and s.delta is None:
        objective = ratio * x.advantages
        zeroed = lambda: torch.zeros_like(x.mask, dtype=torch.bool)  # noqa: E731
    else:
        objective, zeroed = _clipped_objective(ratio, x.advantages, low, high, s.cap)
    return _policy_result(objective, log_ratio, x, zeroed)


def pg_loss(x: PolicyInputs, s: NoSettings = NoSettings()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Vanilla policy gradient (REINFORCE, Williams 1992), negated:
    :math:`L = -\operatorname{agg}[\log\pi(a_t|s_t) A_t]`.

    ``old_logp`` is used only for diagnostics (ratio, approx KL); it has no knob. Its gradient
    equals the surrogate's at ``r = 1`` (the first epoch).
    """
    return _policy_result(x.logp * x.advantages, x.logp - x.old_logp, x, lambda: torch.zeros_like(x.logp))


def dual_clip_loss(x: PolicyInputs, s: DualClipSettings = DualClipSettings()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL",
    arXiv:1912.09729, eq. 5), negated:

    .. math:: J_t = \begin{cases} \min(r_t A_t,\ \operatorname{clip}(r_t, 1-\epsilon,
              1+\epsilon_{high}) A_t) & A_t \ge 0 \\ \max\big(\min(r_t A_t,\
              \operatorname{clip}(r_t, 1-\epsilon, 1+\epsilon_{high}) A_t),\ c\,A_t\big) & A_t < 0
              \end{cases},\qquad L = -\operatorname{agg}[J_t]

    with ``c = clip_ratio_c > 1`` (default 3.0). For A<0 a token whose ratio has grown past ``c``
    no longer pushes the objective to minus infinity: it is bounded by ``c A``. This is verl's
    ``compute_policy_loss_vanilla`` (``verl/trainer/ppo/core_algos.py``, ``clip_ratio_c``), which
    applies the dual clip always; OpenRLHF's ``PolicyLoss`` applies it when its ``dual_clip`` is
    set. Like verl, ``log r`` is clamped to [-20, 20] before exp. ``clip_eps=None`` keeps only the
    ``c A`` bound. ``clip_frac``: tokens with zero gradient, PPO's two regions plus A<0 and r>c.
    """
    low, high = _band(s.clip_eps, s.clip_eps_high)
    c = s.clip_ratio_c
    log_ratio = x.logp - x.old_logp
    ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    ppo, zeroed = _clipped_objective(ratio, x.advantages, low, high, float("inf"))
    negative = x.advantages < 0
    objective = torch.where(negative, torch.maximum(ppo, c * x.advantages), ppo)
    bounded = lambda: zeroed() | (negative & (ratio.detach() > c))  # noqa: E731
    return _policy_result(objective, log_ratio, x, bounded)


def gspo_loss(x: PolicyInputs, s: ClipSettings = ClipSettings()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), its GSPO-token
    form, negated. With the sequence ratio
    :math:`s_i = \exp\big(\frac1{|y_i|}\sum_{t \in i} (\log\pi_t - \log\pi_{old,t})\big)`
    (the geometric mean of the token ratios of sequence i),

    .. math:: s_{i,t} = \operatorname{sg}[s_i]\,\frac{\pi_t}{\operatorname{sg}[\pi_t]},\qquad
              L = -\operatorname{agg}\big[\min(s_{i,t} A_t,\ \operatorname{clip}(s_{i,t},
              1-\epsilon, 1+\epsilon_{high}) A_t)\big]

    :math:`s_{i,t}` has the value :math:`s_i` (so the clip acts per sequence) and the gradient of
    :math:`\log\pi_t` times :math:`s_i`; no gradient flows through the sequence mean. This is the
    form of verl's ``compute_policy_loss_gspo`` (``verl/trainer/ppo/core_algos.py``), whose
    gradient it matches, including verl's clamp ``log s_{i,t} <= 10``; verl always aggregates it
    with ``seq-mean-token-mean``, which here is ``loss_agg=seq_mean_token_mean`` (then the gradient
    is the paper's :math:`\frac{s_i A_i}{|y_i|}\sum_t\nabla\log\pi_t`); ``loss_agg`` is honoured as
    for every loss. TRL's GSPO (``importance_sampling_level="sequence"``) differentiates through
    :math:`s_i` itself: the same loss and gradient when the advantage is constant over a
    sequence (GRPO-style), a different gradient when it varies (GAE advantages on control
    tasks), where each token here keeps its own advantage's gradient (the paper's reason for
    GSPO-token). The paper's clip range is tiny (3e-4, 4e-4):
    set ``clip_eps``/``clip_eps_high``. ``delta`` caps :math:`s_{i,t}` in the unclipped term, as TRL
    does for its sequence-level ratio.

    A *sequence* is a column of ``[..., T, B]`` when ``seq_id`` is None (LM and toy tasks), else
    the entries sharing a ``seq_id`` (control: the steps of one episode, or one env column's
    segment, within the minibatch, :func:`sequence_mean`). With one token per sequence it is
    PPO's clip. ``clip_frac``: tokens with zero gradient (sequence ratio past the band on the
    side of the advantage's sign).
    """
    low, high = _band(s.clip_eps, s.clip_eps_high)
    log_ratio = x.logp - x.old_logp
    seq_log_ratio = sequence_mean(log_ratio.detach(), x.mask, x.seq_id)
    log_s = torch.clamp(x.logp - x.logp.detach() + seq_log_ratio, max=10.0)
    objective, zeroed = _clipped_objective(log_s.exp(), x.advantages, low, high, s.cap)
    return _policy_result(objective, log_ratio, x, zeroed)


def cispo_loss(x: PolicyInputs, s: ClipRange = ClipRange()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585, eq. 4), negated:

    .. math:: L = -\operatorname{agg}\big[\operatorname{sg}(\operatorname{clip}(r_t,
              1-\epsilon, 1+\epsilon_{high}))\,A_t \log\pi(a_t|s_t)\big]

    The clipped ratio is a fixed weight: every token keeps a gradient
    :math:`\operatorname{clip}(r_t) A_t \nabla\log\pi_t` (PPO's clip drops the gradient of the tokens
    past the band; CISPO only bounds their weight). This is verl's ``compute_policy_loss_cispo``
    (two-sided clip of ``clip_ratio_low/high``, ``log r`` clamped to [-20, 20]). TRL's
    ``loss_type="cispo"`` caps only from above, ``min(r, epsilon_high)`` with an absolute cap
    (ScaleRL's 5.0): that is ``clip_eps >= 1`` (no lower bound, r > 0) and ``clip_eps_high =
    epsilon_high - 1`` here. ``clip_eps=None``: the unclipped weight. ``clip_frac``: no gradient
    is zeroed, so it counts the tokens whose weight is clipped (verl's ``pg_clipfrac``).
    """
    low, high = _band(s.clip_eps, s.clip_eps_high)
    log_ratio = x.logp - x.old_logp
    ratio = torch.clamp(log_ratio.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    weight = torch.clamp(ratio, low, high)
    return _policy_result(weight * x.advantages * x.logp, log_ratio, x, lambda: weight != ratio)


def gmpo_loss(x: PolicyInputs, s: ClipRange = ClipRange()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673), negated: per
    sequence i, the geometric mean of its token ratios, each clipped in log space on the side
    of the advantage's sign,

    .. math:: \ell_t = \operatorname{sgn}(A_t)\min\big(\operatorname{sgn}(A_t)\log r_t,\
              \operatorname{sgn}(A_t)\operatorname{clip}(\log r_t, -\epsilon, \epsilon_{high})\big),
              \qquad J_i = \bar A_i \exp\Big(\frac1{|y_i|}\sum_{t\in i}\ell_t\Big)

    with :math:`\bar A_i` the mean advantage over the sequence's tokens, and
    :math:`L = -\operatorname{agg}[J_{i(t)}]` (each token carries its sequence's objective).
    This is verl's ``compute_policy_loss_geo_mean`` (``verl/trainer/ppo/core_algos.py``, from the
    authors' ``train_zero_math_gmpo.py``), which ignores its ``loss_agg_mode`` and averages
    :math:`-J_i` over the sequences: that is ``loss_agg=seq_mean_token_mean`` here (``token_mean``
    weighs a sequence by its length). verl divides by ``|y_i| + 1e-8``, here by ``|y_i|``.
    ``clip_eps``/``clip_eps_high`` are the log-space range, as in verl (the paper uses 0.4,
    i.e. ratios in (e^-0.4, e^0.4)); ``clip_eps=None``: no clip. A *sequence* is as in
    :func:`gspo_loss` (``seq_id`` or a column). ``clip_frac``: tokens whose clipped log ratio
    is the active term (zero gradient): A>0 and log r > eps_high, A<0 and log r < -eps (verl's
    ``pg_clipfrac`` counts every clamped token of either sign).
    """
    eps_low, eps_high = _eps(s.clip_eps, s.clip_eps_high)
    adv = x.advantages
    log_ratio = x.logp - x.old_logp
    sign = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -eps_low, eps_high)  # the clip in log space
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    seq_ratio = sequence_mean(pessimistic, x.mask, x.seq_id).exp()
    seq_adv = sequence_mean(adv, x.mask, x.seq_id)
    lr = log_ratio.detach()
    zeroed = lambda: ((adv > 0) & (lr > eps_high)) | ((adv < 0) & (lr < -eps_low))  # noqa: E731
    return _policy_result(seq_adv * seq_ratio, log_ratio, x, zeroed)


def sapo_loss(x: PolicyInputs, s: SapoSettings = SapoSettings()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347), negated: a smooth
    gate of the ratio instead of a hard clip,

    .. math:: f_\tau(r) = \sigma(\tau (r - 1))\,\frac4\tau,\qquad
              L = -\operatorname{agg}[f_{\tau_t}(r_t) A_t],\qquad
              \tau_t = \tau_{pos}\ (A_t > 0),\ \tau_{neg}\ (A_t \le 0)

    :math:`\nabla f = 4\sigma(1-\sigma)\, r\,\nabla\log\pi`: at r = 1 the gradient of the plain
    surrogate, fading smoothly as r leaves 1 (faster for larger tau). This is TRL's
    ``loss_type="sapo"`` (``GRPOTrainer.get_sapo_token_loss``, ``sapo_temperature_pos/neg``, defaults
    1.0 and 1.05) and verl's ``compute_policy_loss_sapo`` (``tau_pos``/``tau_neg``; it clamps
    ``log r`` to [-20, 20], as here, and always aggregates with ``seq-mean-token-mean``;
    ``loss_agg`` is honoured here). ``clip_eps`` is not used. ``clip_frac``: the share of the
    gradient the gate removes, averaged over the unmasked tokens (0 on tokens with A = 0),
    :math:`1 - 4\sigma(1-\sigma)` per token (a hard clip's 0/1 made soft; verl reports 0).
    """
    adv = x.advantages
    log_ratio = x.logp - x.old_logp
    ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    tau = torch.where(adv > 0, torch.full_like(ratio, s.sapo_tau_pos), torch.full_like(ratio, s.sapo_tau_neg))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    g = sig.detach()
    removed = lambda: (1.0 - 4.0 * g * (1.0 - g)) * (adv != 0).to(g.dtype)  # noqa: E731
    return _policy_result(sig * (4.0 / tau) * adv, log_ratio, x, removed)


PolicyLossFn = Callable[[PolicyInputs, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its function and its settings dataclass (the knobs it reads)."""

    name: str
    fn: PolicyLossFn
    settings: type = NoSettings
    summary: str = ""  # one line for the tables of README and docs (default: the docstring's first sentence)

    def __call__(self, x: PolicyInputs, s: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``fn(x, s)`` (``s`` None: the settings' defaults), its output checked against the contract
        every loss keeps: ``(loss, metrics)``, ``loss`` a floating tensor of shape ``x.advantages.shape[:-2]``
        (a scalar for ``[T, B]`` inputs, ``[P]`` for a population's) on the advantages' device, with a
        gradient when ``logp`` has one; ``metrics`` a dict of tensors of the loss's shape. A result that
        breaks it, or a function that raises, is a :class:`harness.estimators.registry.ContractError`
        naming the loss and its module. Attributes only: no copy, no device sync."""
        out = called("policy loss", self.name, self.fn, x, self.settings() if s is None else s)
        a = x.advantages
        shape, grad = a.shape[:-2], x.logp.requires_grad and torch.is_grad_enabled()
        want = lambda: (f"(loss, metrics): loss a floating tensor of shape {tuple(shape)} on {a.device} "  # noqa: E731
                        f"(advantages {tuple(a.shape)} reduced over [T, B]){' with a gradient' if grad else ''}, "
                        "metrics a dict of tensors of that shape")  # built only for a message
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else described(out)
            raise contract_error("policy loss", self.name, self.fn, f"returned {got}; expected {want()}")
        loss, metrics = out
        if tensor_mismatch(loss, shape, None, a.device) or (grad and not loss.requires_grad):
            got = described(loss) + (" without a gradient" if isinstance(loss, torch.Tensor) and grad and
                                     not loss.requires_grad else "")
            raise contract_error("policy loss", self.name, self.fn, f"returned loss: {got}; expected {want()}")
        if not isinstance(metrics, dict) or any(tensor_mismatch(v, shape, None, a.device) for v in metrics.values()):
            bad = {k: described(v) for k, v in metrics.items() if tensor_mismatch(v, shape, None, a.device)} \
                if isinstance(metrics, dict) else described(metrics)
            raise contract_error("policy loss", self.name, self.fn, f"returned metrics: {bad}; expected {want()}")
        return out

    def trial(self, s: Any = None, agg: str = "token_mean") -> None:
        """One call on small synthetic inputs, checked as every call is: 2 population members of
        ``[T, B] = [3, 4]`` random log-probs (with a gradient), advantages and a full mask, aggregated
        by ``agg``, with metrics. Validation runs it before any run folder exists, so a function that
        breaks its contract is refused with exit 2; the global RNG is restored after it, so a function
        that draws leaves the run's draws as they were."""
        g = torch.Generator().manual_seed(0)
        logp = torch.rand(2, 3, 4, generator=g).log().requires_grad_()
        old = torch.rand(2, 3, 4, generator=g).log()
        adv = torch.rand(2, 3, 4, generator=g) - 0.5
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            self(PolicyInputs(logp, old, adv, torch.ones(2, 3, 4), agg=agg), s)

    @property
    def knobs(self) -> tuple[str, ...]:
        """The config keys it reads (its settings' fields)."""
        return tuple(f.name for f in dataclasses.fields(self.settings))


# The only list of policy losses (config key ``update``): name -> :class:`PolicyLoss`. Adding one is
# one function, its settings dataclass and one :func:`register_policy_loss` call; config schema,
# validation, tests and docs enumerate this dict.
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str, fn: PolicyLossFn | None = None, settings: type = NoSettings, *,
                         summary: str | None = None):
    """Register ``fn(x: PolicyInputs, s: settings) -> (loss, metrics)`` as the policy loss selected by
    ``update: <name>``; ``settings`` is a frozen dataclass whose fields (each with a default) are the
    config keys it reads: the ones the schema lacks become config keys (:data:`harness.config.LOSS_KNOBS`).

    Usable as a decorator, ``@register_policy_loss("sapo", settings=SapoSettings)``, or a plain call,
    ``register_policy_loss("clip", clipped_surrogate_loss, ClipSettings)``; either way returns ``fn``.
    ``summary``: its line in the tables of README and docs (default: the first sentence of ``fn``'s
    docstring). Registering a name twice raises ``ValueError``.
    """
    def _register(f: PolicyLossFn) -> PolicyLossFn:
        problem = name_problem(name) if isinstance(name, str) else "not a string"
        if problem:  # it names the run's update and reaches file and tracker names: one safe word
            raise ValueError(f"policy loss name {name!r}: {problem}; allowed: one folder name (no '/', '\\', "
                             "leading '.' or control characters)")
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        if not (dataclasses.is_dataclass(settings) and isinstance(settings, type)):
            raise ValueError(f"policy loss {name!r}: settings must be a dataclass, got {settings!r}")
        register_loss_knobs(settings, name)
        POLICY_LOSSES[name] = PolicyLoss(name, f, settings, first_sentence(f) if summary is None else summary)
        return f

    return _register if fn is None else _register(fn)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name`` (config key ``update``); another name is refused,
    listing the registered ones and ``plugins=``, which imports a user's module that registers its own."""
    if name not in POLICY_LOSSES:
        refuse_unknown("update", POLICY_LOSSES, name, "policy loss")
    return POLICY_LOSSES[name]


def knob_defaults() -> dict[str, Any]:
    """Every knob a registered policy loss reads (a field of its settings dataclass: ``clip_eps``,
    ``delta``, ``clip_ratio_c``, ...), with its default; a knob two losses share has one default
    (:func:`harness.config.register_loss_knobs` checks the knobs it adds to the schema; the shared
    ``clip_eps`` and ``clip_eps_high`` are the schema's own, with the same defaults)."""
    return {f.name: f.default for spec in POLICY_LOSSES.values() for f in dataclasses.fields(spec.settings)}


def loss_settings(cfg: Any, name: str | None = None) -> Any:
    """The settings dataclass of loss ``name`` (default ``cfg.update``) built from the config keys of
    its fields (a key the config lacks keeps the dataclass's default); its checks raise ``ValueError``
    naming the field (:func:`harness.config.bad_field`)."""
    spec = get_policy_loss(cfg["update"] if name is None else name)
    values = {}
    for k in spec.knobs:
        if k in cfg:
            v = cfg[k]
            values[k] = float(v) if isinstance(v, int) and not isinstance(v, bool) else v
    return spec.settings(**values)


register_policy_loss("pg", pg_loss, summary="Vanilla policy gradient, log pi_t A_t (Williams 1992)")
register_policy_loss("clip", clipped_surrogate_loss, PPOClipSettings,
                     summary="PPO's clipped surrogate, min(r_t A_t, clip(r_t, 1-eps, 1+eps_high) A_t), optional "
                             "`delta` cap on r_t (Schulman et al. 2017; DAPO clip-higher; INTELLECT-2)")
register_policy_loss("dual_clip", dual_clip_loss, DualClipSettings,
                     summary="Dual-clip PPO: as `clip`, and for A < 0 at least c A_t (Ye et al. 2020)")
register_policy_loss("gspo", gspo_loss, ClipSettings,
                     summary="GSPO: `clip` on the sequence ratio exp(mean_t log r_t), per token with "
                             "stop-gradient (Zheng et al. 2025)")
register_policy_loss("cispo", cispo_loss, ClipRange,
                     summary="CISPO: sg(clip(r_t)) A_t log pi_t, the clipped ratio as a fixed weight (MiniMax-M1 2025)")
register_policy_loss("gmpo", gmpo_loss, ClipRange,
                     summary="GMPO: mean A_i exp(mean_t of the sign-aware clipped log r_t) per sequence "
                             "(Zhao et al. 2025)")
register_policy_loss("sapo", sapo_loss, SapoSettings,
                     summary="SAPO: sigmoid(tau (r_t - 1)) 4/tau A_t, tau by the sign of A (Gao et al. 2025)")


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


@dataclass(frozen=True)
class KLTerm:
    """Which KL estimate a KL penalty takes: ``estimator`` (a key of
    :data:`harness.estimators.kl.KL_ESTIMATORS`: k1, k2, k3, low_var_kl, or a straight-through ``+``
    variant) and its ``guards``, the clamps of :func:`harness.estimators.kl.kl_estimate`
    (``kl.log_ratio_clamp``, ``kl.value_clamp``: :func:`harness.estimators.kl.kl_guards`; None: off)."""

    estimator: str = "k3"
    guards: dict | None = None


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kl: KLTerm = KLTerm(),
               agg: str = "token_mean", norm_len: int | None = None, seq_id: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""KL penalty as a loss term (GRPO style): :math:`\operatorname{agg}[\hat{k}(x)]` with the
    per-sample estimate of ``kl`` (:class:`KLTerm`: its estimator and clamps); the trainer multiplies
    by the config's ``kl.beta``. ``ref_logp`` is the target policy (pre-update or reference), detached.
    Aggregated like the policy loss (same ``agg``, ``norm_len``, ``seq_id``): with
    ``seq_mean_token_sum_norm`` the constant ``norm_len``, never the batch's longest sequence,
    so the effective beta does not depend on the batch."""
    estimate = kl_estimate(kl.estimator, logp, ref_logp.detach(), **(kl.guards or {}))
    loss = aggregate(estimate, mask, agg, norm_len, seq_id)
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
