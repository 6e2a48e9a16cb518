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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..config import ProbeSettings, bad_field, settings_from_config
from ..estimators import EstimatorParams, EstimatorSpec, get_estimator, kl_estimate, reward_to_go
from ..io import RunDir, atomic_write_bytes
from ..io.checkpoint import CheckpointError
from ..io.checkpoint import load as load_checkpoint
from ..losses import (SEQUENCE_SUM, PolicyInputs, PPOClipSettings, clipped_surrogate_loss, get_policy_loss, kl_penalty,
                      loss_settings, whiten, whitening_plan)
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


def estimator_advantages(task: ToyTask, spec: EstimatorSpec, params: EstimatorParams, batch: ToyBatch,
                         theta: torch.Tensor, M: int, k: int, critic: torch.Tensor | None,
                         normalize: str = "none", reward_penalty: torch.Tensor | None = None,
                         minibatches: int = 1) -> torch.Tensor:
    """Advantages ``[L, M*B]`` of every batch at once (groups never straddle two batches);
    ``reward_penalty [L, M*B]`` is subtracted from the per-token rewards first (in-reward KL);
    each batch whitened on its own as the update step whitens it (:func:`probe_whitening`)."""
    greedy = None
    if spec.needs_greedy:
        leaves = task.greedy(theta)[batch.prompts[::k]]
        greedy = task.leaf_reward[leaves]
    ab = advantage_batch(task, batch, critic if spec.needs_critic else None, greedy, k if spec.needs_groups else None,
                         reward_penalty)
    ab.members = M  # M independent batches side by side: batch-wide statistics per batch
    adv = spec(ab, params).advantages * ab.mask
    if probe_whitening(normalize, minibatches):
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


def probe_toy(task: ToyTask, theta: torch.Tensor, spec: EstimatorSpec, params: EstimatorParams, *,
              settings: ProbeSettings, batch_size: int, group_size: int, seed: int,
              normalize: str = "none", theta_ref: torch.Tensor | None = None,
              kl_name: str = "k3", update: str = "pg", loss_knobs: object = None, kl_beta: float = 0.0,
              kl_in_reward: bool = False, minibatches: int = 1) -> ProbeResult:
    """Run one probe (one estimator, one target) and summarise it per scope (all, prompt<x>);
    ``update``/``loss_knobs``: the registered policy loss and its settings (None: its defaults);
    ``normalize``/``minibatches``: the update's whitening (:func:`probe_whitening`)."""
    s = settings
    check_truth_scale(s, kl_beta)
    M, k = int(s.batches or TOY_DEFAULT_BATCHES), int(group_size)
    if batch_size % k:
        raise ValueError(f"batch_size={batch_size} must be a multiple of group_size={k}")
    n_groups = batch_size // k
    theta = theta.detach().to(DTYPE)
    theta_ref = task.init_logits() if theta_ref is None else theta_ref.detach().to(DTYPE)
    L = task.spec.length
    meta: dict = {"target": s.target, "batches": M, "batch_size": batch_size, "group_size": k,
                  "samples_per_batch": batch_size + (n_groups if spec.needs_greedy else 0),
                  "truth": "exact", "normalize_advantages": normalize, "negative_control": bool(s.negative_control),
                  "gae_lambda": params.gae_lambda, "gamma": params.gamma, "n_steps": params.n_steps,
                  "std_normalize": params.std_normalize, "critic": "none", "critic_noise": 0.0,
                  "critic_rmse": float("nan"), "critic_ev": float("nan"), "proposal_shift": float("nan"),
                  "is_weight_m2": float("nan"), "kl_estimator": None, "label": spec.name,
                  "kl_beta": 0.0, "kl_placement": "none", "truth_scale": s.truth_scale,
                  "reward_std_tok": float("nan")}
    V_exact, Q_exact = task.values(theta)
    per_batch_extra: dict[str, np.ndarray] = {}

    if s.target == "importance":
        xi = torch.randn(task.param_shape, generator=torch.Generator().manual_seed(int(s.proposal_seed)), dtype=DTYPE)
        theta_q = theta + float(s.proposal_shift) * xi
        batch = draw_batches(task, theta_q, M, n_groups, k, seed)
        meta["proposal_shift"] = float(s.proposal_shift)
        lp, lq = task.leaf_log_probs(theta), task.leaf_log_probs(theta_q)
        m2 = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, (2 * lp - lq).exp())
        meta["is_weight_m2"] = float(m2.mean())
    else:
        batch = draw_batches(task, theta, M, n_groups, k, seed)
    mask_tm = batch.mask.T

    if s.target == "kl":
        meta.update(label=f"kl_{kl_name}", kl_estimator=kl_name, kl_placement="loss")
        ref_logp = torch.log_softmax(theta_ref, -1)[batch.states, batch.tokens].view(M, batch_size, L).transpose(1, 2)

        def loss_fn(logp, mask):
            loss, _ = kl_penalty(logp, ref_logp, mask, kl_name, agg="seq_mean_token_sum_norm")
            return loss * L  # kl_penalty's constant normaliser is L; undo it: sum over tokens

        grads, losses = batch_gradients(theta, batch, M, loss_fn)
        th = theta.clone().requires_grad_(True)
        kl_true = task.sequence_kl(th, theta_ref)
        (true_grad,) = torch.autograd.grad(kl_true, th)
        values, value_true = losses.numpy(), float(kl_true.detach())
    else:
        critic = None
        if spec.needs_critic:
            critic, cinfo = fit_critic(task, theta, s, seed, params.gamma)
            meta.update(cinfo)
        beta = float(kl_beta) if s.target == "policy_gradient" else 0.0
        penalty = None
        if beta > 0:  # the trainer's KL placement; the truth becomes grad (J - beta KL)
            logp_tm = torch.log_softmax(theta, -1)[batch.states, batch.tokens].T
            ref_tm = torch.log_softmax(theta_ref, -1)[batch.states, batch.tokens].T
            k_tm = kl_estimate(kl_name, logp_tm, ref_tm) * mask_tm  # [L, M*B]
            placement = "reward" if kl_in_reward else "loss"
            meta.update(kl_beta=beta, kl_placement=placement, kl_estimator=kl_name,
                        label=f"{spec.name}+{kl_name}_{placement}")
            if kl_in_reward:
                penalty = beta * k_tm
            ref_mb = _to_mb(ref_tm, M)
        adv = estimator_advantages(task, spec, params, batch, theta, M, k, critic, normalize, penalty,
                                   minibatches)
        if s.negative_control:
            adv = adv - float(s.control_scale) * (batch.tokens.T == 0).to(DTYPE) * mask_tm
            meta["label"] = f"{spec.name}+action_baseline"
        adv_mb = _to_mb(adv, M)
        if s.target == "importance":
            old_logp = torch.log_softmax(theta_q, -1)[batch.states, batch.tokens].view(M, batch_size, L).transpose(1, 2)

            def loss_fn(logp, mask):
                x = PolicyInputs(logp, old_logp, adv_mb, mask, with_metrics=False, **SEQUENCE_SUM)
                return clipped_surrogate_loss(x, PPOClipSettings(clip_eps=None))[0]

            lw = (task.leaf_log_probs(theta) - task.leaf_log_probs(theta_q))[batch.leaf]
            values = (lw.exp() * batch.reward).view(M, batch_size).mean(1).numpy()
        else:
            policy_loss = get_policy_loss(update)

            kl_loss = beta > 0 and not kl_in_reward

            def loss_fn(logp, mask):  # the registered loss at the sampling policy (ratio 1)
                x = PolicyInputs(logp, logp.detach(), adv_mb, mask, with_metrics=False, **SEQUENCE_SUM)
                loss = policy_loss(x, loss_knobs)[0]
                if kl_loss:
                    loss = loss + beta * kl_penalty(logp, ref_mb, mask, kl_name, **SEQUENCE_SUM)[0]
                return loss

            values = batch.reward.view(M, batch_size).mean(1).numpy()
            if beta > 0:  # the regularised return R - beta sum_t k_t
                values = values - beta * k_tm.sum(0).view(M, batch_size).mean(1).numpy()
        grads, _ = batch_gradients(theta, batch, M, loss_fn)
        grads = -grads  # loss = -objective
        th = theta.clone().requires_grad_(True)
        objective = task.expected_reward(th)
        if beta > 0:
            objective = objective - beta * task.sequence_kl(th, theta_ref)
        (true_grad,) = torch.autograd.grad(objective, th)
        value_true = float(objective.detach())
        if s.truth_scale == "reward_std":  # the population limit of batch whitening (C24)
            sigma = float(task.reward_to_go_moments(theta, params.gamma)[1])
            if not sigma > 0:
                raise ValueError("probe.truth_scale=reward_std needs a reward-to-go that varies: its token-weighted "
                                 f"std is {sigma} at this policy")
            meta["reward_std_tok"] = sigma
            true_grad = true_grad / sigma
        # advantage diagnostics against the exact advantage Q(s, a) - V(s)
        true_adv = (Q_exact[batch.states, batch.tokens] - V_exact[batch.states]).T * mask_tm
        err = ((adv - true_adv) ** 2 * mask_tm).reshape(L, M, -1)
        per_batch_extra["adv_mse"] = (err.sum(dim=(0, 2)) / mask_tm.reshape(L, M, -1).sum(dim=(0, 2))).numpy()
        n_tok = mask_tm.sum(0).clamp(min=1.0)
        col_mean = (adv * mask_tm).sum(0) / n_tok
        within = ((((adv - col_mean) ** 2) * mask_tm).sum(0) / n_tok).sqrt()
        per_batch_extra["adv_within_std"] = within.view(M, -1).mean(1).numpy()
        if critic is not None:
            ret = discounted_returns(task, batch, params.gamma)
            vals = critic[batch.states].T
            m = mask_tm.bool()
            var_r = ret[m].var(unbiased=False)
            meta["critic_ev"] = float(1 - (ret[m] - vals[m]).var(unbiased=False) / var_r) if var_r > 0 else float("nan")

    meta["tokens_per_batch"] = float(batch.length.double().sum()) / M
    meta["value_kind"] = {"kl": "sequence KL to ref", "importance": "IS estimate of J",
                          "policy_gradient": "mean sampled reward (J)"}[s.target]
    if meta["kl_beta"] > 0:
        meta["value_kind"] = "mean regularised return (J - beta KL)"
    G = grads.numpy()
    truth = true_grad.reshape(-1).numpy()
    directions = {}
    if s.arcsin:  # C25: the population GRPO direction
        th = theta.clone().requires_grad_(True)
        (g_arcsin,) = torch.autograd.grad(task.arcsin_objective(th), th)
        directions["arcsin"] = g_arcsin.reshape(-1).numpy()
    W = pstats.resample_weights(M, int(s.reps), seed=int(seed) + 7)
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
        row = {**meta, "scope": scope, **summ}
        if s.arcsin:  # the comparison's other side, under the name C25 gives it
            row.update({f"cos_linear{x}": summ[f"cos_exp{x}"] for x in ("", "_low", "_high", "_se")})
        pb = pstats.per_batch_scalars(G[:, cols], truth[cols])
        tab = {"scope": scope, "batch": np.arange(M), **pb}
        if scope == "all":
            row.update(pstats.value_summary(np.asarray(values, dtype=float), value_true, W))
            for name, arr in per_batch_extra.items():
                row[name] = float(np.mean(arr))
                row.update(pstats.bootstrap_columns(name, W @ arr / M))
            tab["value_est"] = np.asarray(values, dtype=float)
            for name, arr in per_batch_extra.items():
                tab[name] = arr
        else:
            x = int(scope[len("prompt"):])
            pspec = task.spec.prompts[x]
            row["prompt_kind"] = pspec.kind
            row["prompt_success"] = float(task.prompt_rewards(theta)[x])
        out_rows.append(row)
        tables.append(pd.DataFrame(tab))
    return ProbeResult(out_rows, pd.concat(tables, ignore_index=True), G, truth)


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


def probe_run(cfg, run: RunDir) -> None:
    """``mode=probe`` for ``task.family=toy``: probe.parquet (+ probe_batches.parquet) in the run dir."""
    t0 = time.perf_counter()
    validate_toy(cfg)
    s = settings_from_config(cfg)
    task = build_task(cfg)
    theta, theta_ref, policy = load_policy(task, s)
    spec = get_estimator(cfg.estimator)
    params = EstimatorParams.from_cfg(cfg)
    res = probe_toy(task, theta, spec, params, settings=s, batch_size=int(cfg.task.episodes_per_iter),
                    group_size=int(cfg.group_size), seed=int(cfg.seed), normalize=str(cfg.normalize_advantages),
                    theta_ref=theta_ref, kl_name=str(cfg.kl.estimator), update=str(cfg["update"]),
                    loss_knobs=loss_settings(cfg), kl_beta=float(cfg.kl.beta), kl_in_reward=bool(cfg.kl.in_reward),
                    minibatches=int(cfg.minibatches))
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
