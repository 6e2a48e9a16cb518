"""Gradient probes on the exact-gradient toy task.

At a frozen policy (the initial one, random logits, or a training run's ``policy.safetensors``) the
probe draws ``M = probe.batches`` independent batches of ``task.episodes_per_iter`` sequences
(prompts x ``group_size``, the trainer's layout), runs the estimator chosen by name and the
shared loss code on each batch, and differentiates that batch's loss with respect to the
logits. The estimate of a batch is

.. math:: \\hat g = \\frac1B \\sum_i \\sum_t A_{it} \\nabla_\\theta \\log \\pi(a_{it} \\mid s_{it})

(``pg_loss`` aggregated with ``seq_mean_token_sum_norm`` and ``norm_len=1``: sum over tokens,
mean over sequences, whose expectation is ``grad J`` for an unbiased advantage). The advantages are
whitened per batch as the update step whitens them (``normalize_advantages``, by the update's rule
:func:`harness.losses.whitening_plan`; ``minibatch`` is refused unless ``minibatches=1``, where it is
the batch's whitening: a probe estimates the gradient of one batch, not of several minibatches). It is compared
with the exact gradient: bias (debiased squared norm, and the weight along the truth), total
variance, cosine, SNR, each with a bootstrap interval over batches (:mod:`.stats`).

Common random numbers: the prompts and the uniforms that drive sampling come from a generator
seeded by ``seed`` alone, so every estimator probed with the same seed and batch layout sees the
*same* sequences, and a variance ratio between two of them is a paired comparison.

Targets (``probe.target``):

* ``policy_gradient``: the estimator's policy gradient vs ``grad J``. Critic-based estimators
  use ``probe.critic``: ``fitted`` (tabular mean of returns over ``probe.critic_samples``
  independent sequences of the frozen policy; the fit is recorded as ``critic_rmse`` against the
  exact ``V^pi`` and ``critic_ev``), ``exact`` (``V^pi``), or ``noisy`` (``V^pi`` plus
  ``probe.critic_noise`` x N(0, 1) per state: a critic of controlled quality, C5).
  With ``gamma < 1`` the exact critic is the discounted ``V^pi_gamma`` (:meth:`ToyTask.values`) and
  the fitted one regresses on discounted returns; the truth stays ``grad J``, undiscounted (C27).
  A KL penalty (``kl.beta > 0``) is placed as the trainer places it: ``kl.in_reward=true`` subtracts
  ``beta * k_t`` (``kl.estimator``) from each token's reward before the estimator runs
  (:func:`harness.tasks.toy.advantage_batch`'s ``reward_penalty``, InstructGPT style), otherwise
  ``beta * kl_penalty`` is added to the loss (GRPO style); the truth is then the gradient of the
  KL-regularised objective ``J - beta KL(pi || ref)`` (C23), labelled ``<estimator>+<k>_reward`` or
  ``<estimator>+<k>_loss``.
  ``probe.arcsin=true`` (binary rewards) also compares ``E g`` with the gradient of
  :meth:`ToyTask.arcsin_objective`: columns ``cos_arcsin``, ``cos_linear`` (``= cos_exp``, against
  ``grad J``) and ``cos_arcsin_gap``, each with an interval (C25).
  ``probe.truth_scale=reward_std`` (no KL term) divides the truth by ``sigma_tok``, the
  token-weighted std of the reward-to-go under the frozen policy (:meth:`ToyTask.reward_to_go_moments`,
  at the estimator's gamma): the expected gradient of REINFORCE++'s batch-whitened reward-to-go
  ``(G - mean) / std`` in the infinite-batch limit is ``grad J / sigma_tok``, so ``weight``,
  ``rel_bias_sq`` and ``cos_exp`` then measure it against that population-whitened gradient, scale
  included (C24). Every row records ``truth_scale`` and ``reward_std_tok`` (nan with ``none``).
  ``probe.negative_control=true`` subtracts an action-dependent baseline
  ``probe.control_scale * [a_t == 0]`` from the advantages: a deliberately biased estimator the
  probe must flag (labelled ``<estimator>+action_baseline``).
* ``importance``: samples from the proposal ``q = softmax(theta + shift * xi)`` (``xi`` fixed
  N(0, 1) logits, ``probe.proposal_shift``), gradient of the unclipped importance-weighted
  surrogate (``clipped_surrogate_loss(clip_eps=None)`` with ``old_logp = log q``); the value
  estimate is the sequence-level ``mean(w R)``. Exact ``E_q[w^2]`` is recorded (C13).
* ``kl``: the per-token KL estimator ``kl.estimator`` (k1 | k2 | k3) to the reference policy
  (the initial logits, or the checkpoint's reference): value = mean over sequences of
  ``sum_t k_t`` vs the exact ``KL(pi || ref)`` over sequences, gradient = that of
  ``kl_penalty`` in the loss vs the exact ``grad KL`` (C22). Labelled ``kl_<k>``.
"""
from __future__ import annotations

import io
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..config import ProbeSettings, bad_field, settings_from_config
from ..estimators import EstimatorParams, EstimatorSpec, kl_estimate, reward_to_go
from ..io import RunDir, atomic_write_bytes
from ..plan import RunPlan
from ..io.checkpoint import CheckpointError
from ..io.checkpoint import load as load_checkpoint
from ..losses import (SEQUENCE_SUM, KLTerm, PolicyInputs, PPOClipSettings, clipped_surrogate_loss, get_policy_loss,
                      kl_penalty, whiten, whitening_plan)
from ..tasks.toy import DTYPE, ToyBatch, ToyTask, advantage_batch, build_task, time_major, validate_toy
from . import stats as pstats

TOY_DEFAULT_BATCHES = 2000


# ----------------------------------------------------------------------------- policy

def load_policy(task: ToyTask, s: ProbeSettings) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``(theta, theta_ref, description)``: a checkpoint (run directory or file) or init logits."""
    if s.checkpoint:
        path = Path(s.checkpoint)
        if path.is_dir():  # policy.pt: runs written before policy.safetensors
            path = next((path / n for n in ("policy.safetensors", "policy.pt") if (path / n).is_file()),
                        path / "policy.safetensors")
        if not path.is_file():
            raise ValueError(f"probe.checkpoint: no policy checkpoint at {path}")
        if path.suffix == ".safetensors":  # never unpickle what a results folder holds
            try:
                ck = load_checkpoint(path)[0]
            except CheckpointError as exc:
                raise ValueError(f"probe.checkpoint: {exc}") from None
        else:
            ck = torch.load(path, map_location="cpu", weights_only=True)
        theta = ck["theta"].to(DTYPE)
        if tuple(theta.shape) != task.param_shape:
            raise ValueError(f"probe.checkpoint {path} holds logits {list(theta.shape)}, the task needs "
                             f"{list(task.param_shape)} (another toy preset?)")
        ref = ck.get("theta_ref")
        ref = task.init_logits() if ref is None else ref.to(DTYPE)
        return theta, ref, f"checkpoint:{path}"
    theta = task.init_logits(s.init_scale, s.init_seed)
    desc = "initial (uniform)" if not s.init_scale else f"random logits scale={s.init_scale} seed={s.init_seed}"
    return theta, task.init_logits(), desc


def reach_probabilities(task: ToyTask, theta: torch.Tensor) -> torch.Tensor:
    """P(the response passes through state s), prompts uniform, ``[S]``."""
    probs = torch.softmax(theta, -1)
    reach = torch.zeros(task.n_states, dtype=DTYPE)
    reach[task.root] = 1.0 / task.n_prompts
    for states in task.levels[:-1]:
        ch = task.child[states]  # [n, V]
        ok = ch >= 0
        contrib = reach[states, None] * probs[states]
        reach = reach.index_add(0, ch[ok], contrib[ok])
    return reach


def fit_critic(task: ToyTask, theta: torch.Tensor, s: ProbeSettings, seed: int,
               gamma: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Critic for critic-based estimators at the frozen policy, and how well it fits ``V^pi_gamma``
    (the estimator's own discount: the exact critic of GAE(gamma, lambda) is the discounted value)."""
    V_exact = task.values(theta.detach(), gamma)[0]
    info = {"critic": s.critic, "critic_noise": float(s.critic_noise) if s.critic == "noisy" else 0.0}
    if s.critic == "exact":
        V = V_exact.clone()
    elif s.critic == "noisy":
        g = torch.Generator().manual_seed(int(s.critic_seed))
        V = V_exact + s.critic_noise * torch.randn(task.n_states, generator=g, dtype=DTYPE)
    else:  # fitted: per-state Monte Carlo mean of the return, on sequences the probe never uses
        g = torch.Generator().manual_seed(1_000_003 * (int(s.critic_seed) + 1) + int(seed))
        prompts = torch.randint(task.n_prompts, (s.critic_samples,), generator=g)
        b = task.sample(theta, prompts, g)
        st = b.states[b.mask.bool()]
        ret = discounted_returns(task, b, gamma).T[b.mask.bool()]
        sums = torch.zeros(task.n_states, dtype=DTYPE).index_add(0, st, ret)
        counts = torch.zeros(task.n_states, dtype=DTYPE).index_add(0, st, torch.ones_like(ret))
        prompt_mean = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, b.prompts, b.reward) / \
            torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, b.prompts, torch.ones_like(b.reward)).clamp(min=1)
        V = torch.where(counts > 0, sums / counts.clamp(min=1), prompt_mean[task.state_prompt])
        info["critic_samples"] = int(s.critic_samples)
    w = reach_probabilities(task, theta.detach())
    info["critic_rmse"] = float(((w * (V - V_exact) ** 2).sum() / w.sum()).sqrt())
    return V, info


def discounted_returns(task: ToyTask, batch: ToyBatch, gamma: float) -> torch.Tensor:
    """``G_t = gamma^(n - 1 - t) R`` of every token, time-major ``[L, N]`` (the reward-to-go of
    :func:`harness.estimators.reward_to_go` on the batch's per-token rewards)."""
    tm = time_major(task, batch)
    return reward_to_go(tm["rewards"], tm["terminated"], tm["truncated"], gamma) * tm["mask"]


# ----------------------------------------------------------------------------- batches

def draw_batches(task: ToyTask, theta_sample: torch.Tensor, M: int, n_groups: int, k: int, seed: int) -> ToyBatch:
    """``M * n_groups * k`` sequences, batch-major then group-major; the random numbers depend on
    the seed and the layout only (common random numbers across estimators and policies)."""
    g = torch.Generator().manual_seed(int(seed))
    prompts = torch.randint(task.n_prompts, (M * n_groups,), generator=g).repeat_interleave(k)
    uniforms = torch.rand(prompts.shape[0], task.spec.length, generator=g, dtype=DTYPE)
    return task.sample(theta_sample, prompts, uniforms=uniforms)


def probe_whitening(normalize: str, minibatches: int) -> bool:
    """Whether a probe whitens each batch's advantages (:func:`harness.losses.whiten`, per batch), by
    the update step's own rule (:func:`harness.losses.whitening_plan`; training validates
    ``minibatches`` to at most the samples of a batch, so the update runs that many). A probe
    estimates the gradient of one batch's loss: whitening in each of several minibatches
    (``normalize_advantages=minibatch`` with ``minibatches > 1``) is not that, and is refused (one
    line naming the field). Used by the toy and the control probes."""
    once, each = whitening_plan(normalize, int(minibatches))
    if each:
        bad_field("normalize_advantages", f"none or batch in mode=probe with minibatches={minibatches} (a probe "
                  "estimates one batch's gradient; per-minibatch whitening is the batch's only with minibatches=1)",
                  normalize)
    return once


def estimator_advantages(p: ToyProbe, critic: torch.Tensor | None = None,
                         reward_penalty: torch.Tensor | None = None) -> torch.Tensor:
    """Advantages ``[L, M*B]`` of every batch of ``p.batch`` at once (groups never straddle two
    batches); ``reward_penalty [L, M*B]`` is subtracted from the per-token rewards first (in-reward
    KL); each batch whitened on its own as the update step whitens it (:func:`probe_whitening`)."""
    task, spec, batch, M, k = p.task, p.spec, p.batch, p.M, p.k
    greedy = None
    if spec.needs_greedy:
        leaves = task.greedy(p.theta)[batch.prompts[::k]]
        greedy = task.leaf_reward[leaves]
    ab = advantage_batch(task, batch, critic if spec.needs_critic else None, greedy, k if spec.needs_groups else None,
                         reward_penalty)
    ab.members = M  # M independent batches side by side: batch-wide statistics per batch
    adv = spec(ab, p.params).advantages * ab.mask
    if probe_whitening(p.training.normalize, p.training.minibatches):
        adv = _to_tm(whiten(_to_mb(adv, M), _to_mb(ab.mask, M)))
    return adv


def batch_gradients(theta: torch.Tensor, batch: ToyBatch, M: int, loss_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-batch gradient of ``loss_fn(logp [M, L, B], mask [M, L, B]) -> [M]`` w.r.t. the logits:
    one copy of theta per batch, so one backward pass gives all M gradients. Returns
    ``(grads [M, S*V], per-batch loss values [M])``."""
    N, L = batch.tokens.shape
    B = N // M
    th = theta.detach().expand(M, *theta.shape).clone().requires_grad_(True)
    logpi = torch.log_softmax(th, dim=-1)
    m_idx = torch.arange(M)[:, None, None]
    logp = logpi[m_idx, batch.states.view(M, B, L), batch.tokens.view(M, B, L)].transpose(1, 2)
    mask = batch.mask.view(M, B, L).transpose(1, 2)
    loss = loss_fn(logp, mask)
    (grad,) = torch.autograd.grad(loss.sum(), th)
    return grad.reshape(M, -1), loss.detach()


def _to_mb(x_tm: torch.Tensor, M: int) -> torch.Tensor:
    """``[L, M*B]`` -> ``[M, L, B]``."""
    L = x_tm.shape[0]
    return x_tm.reshape(L, M, -1).permute(1, 0, 2)


def _to_tm(x_mb: torch.Tensor) -> torch.Tensor:
    """``[M, L, B]`` -> ``[L, M*B]``."""
    M, L, B = x_mb.shape
    return x_mb.permute(1, 0, 2).reshape(L, M * B)


# ----------------------------------------------------------------------------- the probe

@dataclass
class ProbeResult:
    rows: list[dict]
    batches: pd.DataFrame
    grads: np.ndarray  # [M, D] estimates
    truth: np.ndarray  # [D]


@dataclass(frozen=True)
class ProbeTraining:
    """The training settings a toy probe mirrors.

    ``batch_size`` sequences per batch in groups of ``group_size`` (prompts x group, the trainer's
    layout), drawn from ``seed``; ``normalize``/``minibatches``: the update's whitening
    (:func:`probe_whitening`); ``update``/``loss_knobs``: the registered policy loss and its settings
    (None: its defaults); ``kl_name``/``kl_beta``/``kl_in_reward``: the KL estimator, its weight and
    placement (in the reward or in the loss)."""
    batch_size: int
    group_size: int
    seed: int
    normalize: str = "none"
    minibatches: int = 1
    update: str = "pg"
    loss_knobs: object = None
    kl_name: str = "k3"
    kl_beta: float = 0.0
    kl_in_reward: bool = False

    @classmethod
    def from_plan(cls, plan: RunPlan) -> ProbeTraining:
        """The training settings of ``plan.cfg``, with the plan's policy-loss settings."""
        cfg = plan.cfg
        return cls(batch_size=int(cfg.task.episodes_per_iter), group_size=int(cfg.group_size), seed=int(cfg.seed),
                   normalize=str(cfg.normalize_advantages), minibatches=int(cfg.minibatches),
                   update=str(cfg["update"]), loss_knobs=plan.loss_settings, kl_name=str(cfg.kl.estimator),
                   kl_beta=float(cfg.kl.beta), kl_in_reward=bool(cfg.kl.in_reward))


@dataclass
class ToyProbe:
    """One probe's inputs: the frozen policy and its KL reference, the estimator, the probe's
    settings and the training it mirrors; then the batches it draws (``M = settings.batches``
    batches of ``training.batch_size``, groups of ``k = training.group_size``) and the columns it
    records."""
    task: ToyTask
    theta: torch.Tensor
    theta_ref: torch.Tensor
    spec: EstimatorSpec
    params: EstimatorParams
    settings: ProbeSettings
    training: ProbeTraining
    batch: ToyBatch | None = None
    theta_q: torch.Tensor | None = None  # the importance target's proposal logits
    meta: dict = field(default_factory=dict)

    @property
    def M(self) -> int:
        return int(self.settings.batches or TOY_DEFAULT_BATCHES)

    @property
    def k(self) -> int:
        return int(self.training.group_size)

    @property
    def n_groups(self) -> int:
        return self.training.batch_size // self.k


@dataclass
class _Estimates:
    """Per-batch gradient estimates ``grads [M, D]`` and values, the truths they are compared with,
    and per-batch diagnostics (name -> ``[M]``)."""
    grads: torch.Tensor
    true_grad: torch.Tensor
    values: np.ndarray
    value_true: float
    per_batch_extra: dict[str, np.ndarray]


def probe_toy(task: ToyTask, theta: torch.Tensor, spec: EstimatorSpec, params: EstimatorParams, *,
              settings: ProbeSettings, training: ProbeTraining,
              theta_ref: torch.Tensor | None = None) -> ProbeResult:
    """Run one probe (one estimator, one target) and summarise it per scope (all, prompt<x>);
    ``training``: the trainer's batch layout, whitening, policy loss and KL placement it mirrors."""
    s, t = settings, training
    check_truth_scale(s, t.kl_beta)
    M, k = int(s.batches or TOY_DEFAULT_BATCHES), int(t.group_size)
    if t.batch_size % k:
        raise ValueError(f"batch_size={t.batch_size} must be a multiple of group_size={k}")
    theta = theta.detach().to(DTYPE)
    theta_ref = task.init_logits() if theta_ref is None else theta_ref.detach().to(DTYPE)
    p = ToyProbe(task, theta, theta_ref, spec, params, s, t)
    p.meta = _probe_meta(p)
    _draw_probe_batches(p)
    est = _kl_estimates(p) if s.target == "kl" else _gradient_estimates(p)
    _finish_meta(p)
    return _summarise(p, est)


def _probe_meta(p: ToyProbe) -> dict:
    """The columns every row of a probe carries, before the target fills its own."""
    spec, params, s, t, M, k, n_groups = p.spec, p.params, p.settings, p.training, p.M, p.k, p.n_groups
    return {"target": s.target, "batches": M, "batch_size": t.batch_size, "group_size": k,
            "samples_per_batch": t.batch_size + (n_groups if spec.needs_greedy else 0),
            "truth": "exact", "normalize_advantages": t.normalize, "negative_control": bool(s.negative_control),
            "gae_lambda": params.gae_lambda, "gamma": params.gamma, "n_steps": params.n_steps,
            "std_normalize": params.std_normalize, "critic": "none", "critic_noise": 0.0,
            "critic_rmse": float("nan"), "critic_ev": float("nan"), "proposal_shift": float("nan"),
            "is_weight_m2": float("nan"), "kl_estimator": None, "label": spec.name,
            "kl_beta": 0.0, "kl_placement": "none", "truth_scale": s.truth_scale,
            "reward_std_tok": float("nan")}


def _draw_probe_batches(p: ToyProbe) -> None:
    """The probe's batches: from the proposal ``q`` for the importance target (with exact
    ``E_q[w^2]``), else from the frozen policy."""
    task, s, t = p.task, p.settings, p.training
    if s.target == "importance":
        xi = torch.randn(task.param_shape, generator=torch.Generator().manual_seed(int(s.proposal_seed)), dtype=DTYPE)
        p.theta_q = p.theta + float(s.proposal_shift) * xi
        p.batch = draw_batches(task, p.theta_q, p.M, p.n_groups, p.k, t.seed)
        p.meta["proposal_shift"] = float(s.proposal_shift)
        lp, lq = task.leaf_log_probs(p.theta), task.leaf_log_probs(p.theta_q)
        m2 = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, (2 * lp - lq).exp())
        p.meta["is_weight_m2"] = float(m2.mean())
    else:
        p.batch = draw_batches(task, p.theta, p.M, p.n_groups, p.k, t.seed)


def _kl_estimates(p: ToyProbe) -> _Estimates:
    """The ``kl`` target: per-sequence KL estimates and the gradient of ``kl_penalty`` against the
    exact sequence KL to the reference and its gradient."""
    task, theta, batch, M, kl_name = p.task, p.theta, p.batch, p.M, p.training.kl_name
    L = task.spec.length
    p.meta.update(label=f"kl_{kl_name}", kl_estimator=kl_name, kl_placement="loss")
    ref_logp = torch.log_softmax(p.theta_ref, -1)[batch.states, batch.tokens]
    ref_logp = ref_logp.view(M, p.training.batch_size, L).transpose(1, 2)

    def loss_fn(logp, mask):
        loss, _ = kl_penalty(logp, ref_logp, mask, KLTerm(kl_name), agg="seq_mean_token_sum_norm")
        return loss * L  # kl_penalty's constant normaliser is L; undo it: sum over tokens

    grads, losses = batch_gradients(theta, batch, M, loss_fn)
    th = theta.clone().requires_grad_(True)
    kl_true = task.sequence_kl(th, p.theta_ref)
    (true_grad,) = torch.autograd.grad(kl_true, th)
    return _Estimates(grads, true_grad, losses.numpy(), float(kl_true.detach()), {})


def _gradient_estimates(p: ToyProbe) -> _Estimates:
    """The ``policy_gradient`` and ``importance`` targets: the estimator's advantages (with the
    trainer's KL placement and the negative control), the loss's per-batch gradients, the truth
    and the advantage diagnostics."""
    task, theta, batch, s, M = p.task, p.theta, p.batch, p.settings, p.M
    mask_tm = batch.mask.T
    critic = None
    if p.spec.needs_critic:
        critic, cinfo = fit_critic(task, theta, s, p.training.seed, p.params.gamma)
        p.meta.update(cinfo)
    beta = float(p.training.kl_beta) if s.target == "policy_gradient" else 0.0
    penalty = k_tm = ref_mb = None
    if beta > 0:  # the trainer's KL placement; the truth becomes grad (J - beta KL)
        k_tm, ref_mb = _kl_terms(p, beta)
        if p.training.kl_in_reward:
            penalty = beta * k_tm
    adv = estimator_advantages(p, critic, penalty)
    if s.negative_control:
        adv = adv - float(s.control_scale) * (batch.tokens.T == 0).to(DTYPE) * mask_tm
        p.meta["label"] = f"{p.spec.name}+action_baseline"
    loss_fn, values = _surrogate(p, _to_mb(adv, M), beta, k_tm, ref_mb)
    grads, _ = batch_gradients(theta, batch, M, loss_fn)
    grads = -grads  # loss = -objective
    true_grad, value_true = _true_gradient(p, beta)
    extra = _advantage_diagnostics(p, adv)
    if critic is not None:
        p.meta["critic_ev"] = _critic_ev(p, critic)
    return _Estimates(grads, true_grad, values, value_true, extra)


def _kl_terms(p: ToyProbe, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token KL estimates ``k_t [L, M*B]`` to the reference and the reference log-probs
    ``[M, L, B]``; records the placement in the probe's columns."""
    batch, kl_name = p.batch, p.training.kl_name
    logp_tm = torch.log_softmax(p.theta, -1)[batch.states, batch.tokens].T
    ref_tm = torch.log_softmax(p.theta_ref, -1)[batch.states, batch.tokens].T
    k_tm = kl_estimate(kl_name, logp_tm, ref_tm) * batch.mask.T  # [L, M*B]
    placement = "reward" if p.training.kl_in_reward else "loss"
    p.meta.update(kl_beta=beta, kl_placement=placement, kl_estimator=kl_name,
                  label=f"{p.spec.name}+{kl_name}_{placement}")
    return k_tm, _to_mb(ref_tm, p.M)


def _surrogate(p: ToyProbe, adv_mb: torch.Tensor, beta: float, k_tm: torch.Tensor | None,
               ref_mb: torch.Tensor | None):
    """``(loss_fn, per-batch values [M])``: the unclipped importance-weighted surrogate for the
    importance target, else the registered policy loss at the sampling policy (ratio 1) with the
    loss-placed KL term; the values are the estimates of the objective."""
    task, theta, batch, M, B = p.task, p.theta, p.batch, p.M, p.training.batch_size
    L = task.spec.length
    if p.settings.target == "importance":
        old_logp = torch.log_softmax(p.theta_q, -1)[batch.states, batch.tokens].view(M, B, L).transpose(1, 2)

        def loss_fn(logp, mask):
            x = PolicyInputs(logp, old_logp, adv_mb, mask, with_metrics=False, **SEQUENCE_SUM)
            return clipped_surrogate_loss(x, PPOClipSettings(clip_eps=None))[0]

        lw = (task.leaf_log_probs(theta) - task.leaf_log_probs(p.theta_q))[batch.leaf]
        return loss_fn, (lw.exp() * batch.reward).view(M, B).mean(1).numpy()
    policy_loss = get_policy_loss(p.training.update)
    kl_loss = beta > 0 and not p.training.kl_in_reward
    loss_knobs, kl_name = p.training.loss_knobs, p.training.kl_name

    def loss_fn(logp, mask):  # the registered loss at the sampling policy (ratio 1)
        x = PolicyInputs(logp, logp.detach(), adv_mb, mask, with_metrics=False, **SEQUENCE_SUM)
        loss = policy_loss(x, loss_knobs)[0]
        if kl_loss:
            loss = loss + beta * kl_penalty(logp, ref_mb, mask, KLTerm(kl_name), **SEQUENCE_SUM)[0]
        return loss

    values = batch.reward.view(M, B).mean(1).numpy()
    if beta > 0:  # the regularised return R - beta sum_t k_t
        values = values - beta * k_tm.sum(0).view(M, B).mean(1).numpy()
    return loss_fn, values


def _true_gradient(p: ToyProbe, beta: float) -> tuple[torch.Tensor, float]:
    """``(grad of J - beta KL, its value)``, divided by ``sigma_tok`` with ``truth_scale=reward_std``."""
    task, theta = p.task, p.theta
    th = theta.clone().requires_grad_(True)
    objective = task.expected_reward(th)
    if beta > 0:
        objective = objective - beta * task.sequence_kl(th, p.theta_ref)
    (true_grad,) = torch.autograd.grad(objective, th)
    value_true = float(objective.detach())
    if p.settings.truth_scale == "reward_std":  # the population limit of batch whitening (C24)
        sigma = float(task.reward_to_go_moments(theta, p.params.gamma)[1])
        if not sigma > 0:
            raise ValueError("probe.truth_scale=reward_std needs a reward-to-go that varies: its token-weighted "
                             f"std is {sigma} at this policy")
        p.meta["reward_std_tok"] = sigma
        true_grad = true_grad / sigma
    return true_grad, value_true


def _advantage_diagnostics(p: ToyProbe, adv: torch.Tensor) -> dict[str, np.ndarray]:
    """Per batch: the mean squared error against the exact advantage ``Q(s, a) - V(s)`` and the
    mean within-sequence std of the advantages."""
    task, batch, M = p.task, p.batch, p.M
    L = task.spec.length
    mask_tm = batch.mask.T
    V_exact, Q_exact = task.values(p.theta)
    true_adv = (Q_exact[batch.states, batch.tokens] - V_exact[batch.states]).T * mask_tm
    err = ((adv - true_adv) ** 2 * mask_tm).reshape(L, M, -1)
    extra = {"adv_mse": (err.sum(dim=(0, 2)) / mask_tm.reshape(L, M, -1).sum(dim=(0, 2))).numpy()}
    n_tok = mask_tm.sum(0).clamp(min=1.0)
    col_mean = (adv * mask_tm).sum(0) / n_tok
    within = ((((adv - col_mean) ** 2) * mask_tm).sum(0) / n_tok).sqrt()
    extra["adv_within_std"] = within.view(M, -1).mean(1).numpy()
    return extra


def _critic_ev(p: ToyProbe, critic: torch.Tensor) -> float:
    """Explained variance of the discounted returns by the critic, over the probe's tokens."""
    ret = discounted_returns(p.task, p.batch, p.params.gamma)
    vals = critic[p.batch.states].T
    m = p.batch.mask.T.bool()
    var_r = ret[m].var(unbiased=False)
    return float(1 - (ret[m] - vals[m]).var(unbiased=False) / var_r) if var_r > 0 else float("nan")


def _finish_meta(p: ToyProbe) -> None:
    p.meta["tokens_per_batch"] = float(p.batch.length.double().sum()) / p.M
    p.meta["value_kind"] = {"kl": "sequence KL to ref", "importance": "IS estimate of J",
                            "policy_gradient": "mean sampled reward (J)"}[p.settings.target]
    if p.meta["kl_beta"] > 0:
        p.meta["value_kind"] = "mean regularised return (J - beta KL)"


def _summarise(p: ToyProbe, est: _Estimates) -> ProbeResult:
    """One row per scope (all, prompt<x>) with the bootstrap summaries, and the per-batch table."""
    task, s, M = p.task, p.settings, p.M
    G = est.grads.numpy()
    truth = est.true_grad.reshape(-1).numpy()
    directions = {}
    if s.arcsin:  # C25: the population GRPO direction
        th = p.theta.clone().requires_grad_(True)
        (g_arcsin,) = torch.autograd.grad(task.arcsin_objective(th), th)
        directions["arcsin"] = g_arcsin.reshape(-1).numpy()
    W = pstats.resample_weights(M, int(s.reps), seed=int(p.training.seed) + 7)
    gbar_reps = W @ G / M
    scopes = [("all", np.arange(G.shape[1]))]
    V = task.spec.vocab
    for x in range(task.n_prompts):
        rows = task.prompt_rows(x).numpy()
        scopes.append((f"prompt{x}", (rows[:, None] * V + np.arange(V)[None, :]).reshape(-1)))
    out_rows, tables = [], []
    for scope, cols in scopes:
        summ = pstats.gradient_summary(G[:, cols], truth[cols], W, gbar_reps[:, cols],
                                       directions={n: u[cols] for n, u in directions.items()})
        row = {**p.meta, "scope": scope, **summ}
        if s.arcsin:  # the comparison's other side, under the name C25 gives it
            row.update({f"cos_linear{x}": summ[f"cos_exp{x}"] for x in ("", "_low", "_high", "_se")})
        tab = {"scope": scope, "batch": np.arange(M), **pstats.per_batch_scalars(G[:, cols], truth[cols])}
        if scope == "all":
            _add_value_columns(row, tab, est, W, M)
        else:
            x = int(scope[len("prompt"):])
            row["prompt_kind"] = task.spec.prompts[x].kind
            row["prompt_success"] = float(task.prompt_rewards(p.theta)[x])
        out_rows.append(row)
        tables.append(pd.DataFrame(tab))
    return ProbeResult(out_rows, pd.concat(tables, ignore_index=True), G, truth)


def _add_value_columns(row: dict, tab: dict, est: _Estimates, W: np.ndarray, M: int) -> None:
    """The value estimate's summary and the per-batch diagnostics, on the ``all`` scope."""
    values = np.asarray(est.values, dtype=float)
    row.update(pstats.value_summary(values, est.value_true, W))
    for name, arr in est.per_batch_extra.items():
        row[name] = float(np.mean(arr))
        row.update(pstats.bootstrap_columns(name, W @ arr / M))
    tab["value_est"] = values
    for name, arr in est.per_batch_extra.items():
        tab[name] = arr


# ----------------------------------------------------------------------------- run directory

def check_truth_scale(s: ProbeSettings, kl_beta: float) -> None:
    """``probe.truth_scale=reward_std`` scales ``grad J``: it needs the ``policy_gradient`` target
    and no KL term."""
    if s.truth_scale == "none":
        return
    if s.target != "policy_gradient":
        raise ValueError(f"probe.truth_scale must be none with probe.target={s.target} (it scales the policy "
                         f"gradient's truth; set probe.target=policy_gradient), got {s.truth_scale!r}")
    if float(kl_beta) > 0:
        raise ValueError(f"probe.truth_scale must be none with kl.beta={kl_beta} (it scales grad J, without a KL "
                         f"term), got {s.truth_scale!r}")


def validate_toy_probe(cfg, s: ProbeSettings) -> None:
    """Toy probe checks (the toy kind's ``probe_validate``): the task's own (:func:`validate_toy`),
    ``probe.truth_scale`` (:func:`check_truth_scale`), the whitening (:func:`probe_whitening`:
    ``normalize_advantages=minibatch`` only with one minibatch); ``probe.arcsin`` needs binary rewards, the
    ``policy_gradient`` target and no KL term (its ``cos_linear`` is against ``grad J``)."""
    validate_toy(cfg)
    check_truth_scale(s, float(cfg.kl.beta))
    probe_whitening(str(cfg.normalize_advantages), int(cfg.minibatches))
    if not s.arcsin:
        return
    if s.target != "policy_gradient":
        raise ValueError(f"probe.arcsin must be false with probe.target={s.target} (it compares the policy "
                         "gradient; set probe.target=policy_gradient), got True")
    if float(cfg.kl.beta) > 0:
        raise ValueError(f"probe.arcsin must be false with kl.beta={cfg.kl.beta} (the comparison is with grad J "
                         "and the arcsin objective, without a KL term), got True")
    if not build_task(cfg).binary_rewards:
        raise ValueError("probe.arcsin must be false unless every reward is 0 or 1 (toy.prompts of kind binary or "
                         f"first_token; preset {cfg.task.get('env_id')!r} has other rewards), got True")



def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def probe_run(plan: RunPlan, run: RunDir) -> None:
    """``mode=probe`` for ``task.family=toy``: probe.parquet (+ probe_batches.parquet) in the run dir."""
    t0 = time.perf_counter()
    cfg = plan.cfg
    s = settings_from_config(cfg)
    task = build_task(cfg)
    theta, theta_ref, policy = load_policy(task, s)
    params = EstimatorParams.from_cfg(cfg)
    res = probe_toy(task, theta, plan.estimator, params, settings=s, training=ProbeTraining.from_plan(plan),
                    theta_ref=theta_ref)
    wall = time.perf_counter() - t0
    ident = {"run_id": run.run_id, "task": str(cfg.task.name), "estimator": str(cfg.estimator),
             "seed": int(cfg.seed), "policy": policy, "wall_time_s": wall}
    df = pd.DataFrame([{**ident, **r} for r in res.rows])
    atomic_write_bytes(run.path / "probe.parquet", _parquet_bytes(df))
    if s.store_batches:
        b = res.batches.copy()
        for key in ("run_id", "estimator", "seed"):
            b.insert(0, key, ident[key])
        b.insert(0, "label", res.rows[0]["label"])
        atomic_write_bytes(run.path / "probe_batches.parquet", _parquet_bytes(b))
    top = res.rows[0]
    run.finish("completed", None, wall, extra={"mode": "probe", "probe": {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in top.items() if k in ("label", "target", "batches", "batch_size", "rel_bias_sq",
                                         "rel_bias_sq_low", "rel_bias_sq_high", "total_var", "cos", "snr")},
        "settings": asdict(s)})
