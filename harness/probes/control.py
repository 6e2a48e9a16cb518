"""Gradient probes on control tasks (gymnasium), against a high-sample reference.

The frozen policy is the trainer's initial policy for ``probe.init_seed`` (actor and critic
initialised together, so every estimator probes the same actor; the control trainer writes no
checkpoint, so ``probe.checkpoint`` is refused here). ``M = probe.batches`` batches are collected
at once as a *population* of M identical agents (the trainer's population axis: batched weights,
per-member generators and envs), each batch being ``task.episodes_per_iter`` whole episodes laid
out in groups of ``group_size`` identical starts (the group estimators' layout, used for every
estimator so all of them see the same episodes: common random numbers; ReMax's extra greedy
columns change the noise layout, so ReMax is not paired). The estimate of a batch is

.. math:: \\hat g = \\frac1E \\sum_{i=1}^{E} \\sum_t A_{it} \\nabla_\\theta \\log \\pi(a_{it} \\mid s_{it})

over the actor's parameters (sum over steps, mean over episodes), the advantages of each batch
whitened as the update step whitens them (``normalize_advantages``, :func:`.toy.probe_whitening`;
the reference is never whitened). There is no exact gradient: the
truth is the mean of ``probe.reference_batches`` independent REINFORCE estimates with
reward-to-go and gamma = 1 (unbiased for the undiscounted episode return), and the squared bias
subtracts the reference's own noise. With ``gamma < 1`` an estimator targets a discounted
objective, which then shows up as bias: the claim experiments probe at gamma = 1.

Critic-based estimators use a critic fitted to the frozen policy: ``probe.critic_episodes``
independent episodes, discounted returns-to-go, 300 full-batch Adam steps; ``critic_ev`` is its
explained variance on as many held-out episodes. Step-based estimators (``a2c``, ``ppo_gae``:
fixed-length windows, not whole episodes) are refused: probe them on the toy task.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch

from ..estimators import EstimatorParams, get_estimator, reward_to_go
from ..io import RunDir, atomic_write_bytes
from ..plan import RunPlan
from ..losses import (SEQUENCE_SUM, PolicyInputs, explained_variance, get_policy_loss, whiten,
                      within_sequence_std)
from ..models.control import AgentSpec, ControlAgent
from ..models.mlp import member_view
from ..tasks.control import EpisodeCollector, EpisodeLayout, advantage_batch, env_info
from . import stats as pstats
from ..config import ProbeSettings, settings_from_config
from .toy import _parquet_bytes, probe_whitening



def validate_control_probe(cfg, s: ProbeSettings) -> None:
    spec = get_estimator(cfg.estimator)
    if not spec.full_episodes:
        raise ValueError(f"mode=probe on task.family=control covers whole-episode estimators; estimator "
                         f"{cfg.estimator!r} uses fixed-length windows (probe it on task=toy)")
    if s.checkpoint:
        raise ValueError("probe.checkpoint: the control trainer writes no policy checkpoint; probe.init_seed "
                         "selects the initial policy")
    if s.target != "policy_gradient":
        raise ValueError(f"probe.target must be policy_gradient on control tasks, got {s.target!r}")
    if s.truth_scale != "none":
        raise ValueError("probe.truth_scale must be none on control tasks (its scale is computed exactly on the toy "
                         f"task), got {s.truth_scale!r}")
    if s.arcsin:
        raise ValueError("probe.arcsin must be false on control tasks (it needs the toy task's exact success "
                         "probabilities), got True")
    E, k = int(cfg.task.episodes_per_iter), int(cfg.group_size)
    if spec.needs_groups and E % k:
        raise ValueError(f"task.episodes_per_iter must be a multiple of group_size={k}, got {E}")
    probe_whitening(str(cfg.normalize_advantages), int(cfg.minibatches))


def _make_agent(cfg, info, population: int, seed: int) -> ControlAgent:
    return ControlAgent(population, AgentSpec.from_task(cfg.task, info), True,
                        [torch.Generator().manual_seed(int(seed)) for _ in range(population)])


def _broadcast_weights(src: ControlAgent, dst: ControlAgent) -> None:
    """Every member of ``dst`` gets member 0 of ``src`` (actor and critic)."""
    with torch.no_grad():
        for ps, pd_ in zip(src.parameters(), dst.parameters()):
            vs, vd = member_view(ps.data, 1), member_view(pd_.data, dst.population)
            vd.copy_(vs.expand_as(vd))


def _actor_grad(agent: ControlAgent) -> torch.Tensor:
    """Per-member gradient of the actor's parameters, ``[M, D]`` (the critic rows are block 1)."""
    M = agent.population
    parts = []
    for p in agent.parameters():
        if p.grad is None:
            continue
        v = member_view(p.grad, M)[0]  # [M, ...] actor block
        parts.append(v.reshape(M, -1))
    return torch.cat(parts, dim=1)


def _collect(cfg, info, agent, seeds: list[int], group: int, greedy: bool):
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    col = EpisodeCollector(cfg.task.env_id, len(seeds), EpisodeLayout(int(cfg.task.episodes_per_iter), group, greedy),
                           cfg.task.max_episode_steps, info, gens)
    try:
        return col.collect(agent)
    finally:
        col.close()


def _batch_seeds(seed: int, start: int, n: int, stream: int) -> list[int]:
    return [(int(seed) * 1_000_003 + stream * 7_919_993 + i) % (2**31 - 1) for i in range(start, start + n)]


def _gradients(agent: ControlAgent, ro, spec, params: EstimatorParams, group: int, loss=("pg", None),
               whitened: bool = False):
    """Per-member policy-gradient estimates of one collected population rollout; ``loss``: the
    registered policy loss and its settings (None: its defaults), taken at ratio 1; ``whitened``:
    each member's (batch's) advantages whitened as the update step does (:func:`probe_whitening`)."""
    T, M, E = ro.rewards.shape
    batch = advantage_batch(agent, ro, spec.needs_critic, group if spec.needs_groups else None)
    batch.members = M  # M independent batches side by side: batch-wide statistics per batch
    adv = spec(batch, params).advantages.reshape(T, M, E) * ro.mask
    obs = ro.obs.transpose(0, 1).reshape(M, T * E, -1)
    act = ro.actions.transpose(0, 1).reshape(M, T * E, *ro.actions.shape[3:])
    agent.zero_grad(set_to_none=True)
    logp = agent.log_prob(agent.dist_params(obs), act).reshape(M, T, E)
    adv_m = adv.permute(1, 0, 2)
    mask_m = ro.mask.permute(1, 0, 2)
    if whitened:
        adv_m = whiten(adv_m, mask_m)
    x = PolicyInputs(logp, logp.detach(), adv_m, mask_m, with_metrics=False, **SEQUENCE_SUM)  # at ratio 1
    pl, _ = get_policy_loss(loss[0])(x, loss[1])
    pl.sum().backward()
    g = -_actor_grad(agent).double()
    spread = within_sequence_std(adv_m, mask_m)  # C14-style spread of the advantage across an episode's steps
    returns = (ro.rewards * ro.mask).sum(0).mean(1)  # [M] mean episode return per batch
    return g, spread.double().numpy(), returns.double().numpy(), int(ro.steps.sum())


def _fit_critic(cfg, info, agent1: ControlAgent, s: ProbeSettings, gamma: float) -> dict:
    """Regress the critic rows of the single agent on discounted returns-to-go of its own policy."""
    def episodes(stream):
        n = max(8, int(s.critic_episodes))
        seeds = _batch_seeds(int(cfg.seed), 0, 1, stream)
        gens = [torch.Generator().manual_seed(seeds[0])]
        col = EpisodeCollector(cfg.task.env_id, 1, EpisodeLayout(n), cfg.task.max_episode_steps, info, gens)
        try:
            ro = col.collect(agent1)
        finally:
            col.close()
        T, _, N = ro.rewards.shape
        G = reward_to_go(ro.rewards.reshape(T, N), ro.terminated.reshape(T, N), ro.truncated.reshape(T, N), gamma)
        m = ro.mask.reshape(T, N).bool()
        return ro.obs.reshape(T, N, -1)[m], G[m]

    x, y = episodes(stream=11)
    xh, yh = episodes(stream=12)
    critic_params = [p for p in agent1.parameters()]
    opt = torch.optim.Adam(critic_params, lr=3e-3)
    for _ in range(300):
        opt.zero_grad()
        v = agent1.value(x[None])[0]
        ((v - y) ** 2).mean().backward()
        # only the critic rows (block 1) move: the policy stays frozen
        for p in critic_params:
            if p.grad is not None:
                member_view(p.grad, 1)[0].zero_()
        opt.step()
    with torch.no_grad():
        ev = explained_variance(agent1.value(xh[None])[0], yh)
    return {"critic": "fitted", "critic_ev": float(ev), "critic_samples": int(x.shape[0])}


def probe_run(plan: RunPlan, run: RunDir) -> None:
    """``mode=probe`` for ``task.family=control``: probe.parquet (+ probe_batches.parquet)."""
    t0 = time.perf_counter()
    cfg = plan.cfg
    s = settings_from_config(cfg)
    torch.set_num_threads(int(cfg.threads or 1))
    info = env_info(cfg.task.env_id)
    spec = plan.estimator
    ref_spec = get_estimator("reinforce")  # the truth: plain REINFORCE's gradient, whatever is probed
    M = int(s.batches) if s.batches else 200
    R = int(s.reference_batches) if s.reference_batches else 2 * M
    chunk = max(2, int(s.chunk))
    E, k = int(cfg.task.episodes_per_iter), int(cfg.group_size)
    group = k if E % k == 0 else 1  # one layout for every estimator (common random numbers)
    params = EstimatorParams.from_cfg(cfg)
    ref_params = EstimatorParams(gamma=1.0)
    normalize = str(cfg.normalize_advantages)
    agent1 = _make_agent(cfg, info, 1, s.init_seed)
    meta = {"target": "policy_gradient", "batches": M, "batch_size": E, "group_size": group,
            "samples_per_batch": E + (E // group if spec.needs_greedy else 0), "truth": "reference",
            "reference_batches": R, "normalize_advantages": normalize, "negative_control": False,
            "gae_lambda": params.gae_lambda, "gamma": params.gamma, "n_steps": params.n_steps,
            "std_normalize": params.std_normalize, "critic": "none", "critic_noise": 0.0,
            "critic_rmse": float("nan"), "critic_ev": float("nan"), "proposal_shift": float("nan"),
            "is_weight_m2": float("nan"), "kl_estimator": None, "label": spec.name}
    if spec.needs_critic:
        meta.update(_fit_critic(cfg, info, agent1, s, params.gamma))

    def run_batches(est, est_params, n, stream, greedy, loss=("pg", None), whitened=False):
        gs, spreads, rets, steps = [], [], [], 0
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            agent = _make_agent(cfg, info, m, s.init_seed)
            _broadcast_weights(agent1, agent)
            ro = _collect(cfg, info, agent, _batch_seeds(int(cfg.seed), start, m, stream), group, greedy)
            g, sp, r, st = _gradients(agent, ro, est, est_params, group, loss, whitened)
            gs.append(g)
            spreads.append(sp)
            rets.append(r)
            steps += st
        return torch.cat(gs).numpy(), np.concatenate(spreads), np.concatenate(rets), steps

    G, spread, rets, steps = run_batches(spec, params, M, stream=1, greedy=spec.needs_greedy,
                                         loss=(cfg["update"], plan.loss_settings),
                                         whitened=probe_whitening(normalize, int(cfg.minibatches)))
    Gref, _, ref_rets, _ = run_batches(ref_spec, ref_params, R, stream=2, greedy=False)
    truth = Gref.mean(0)
    Wref = pstats.resample_weights(R, int(s.reps), seed=int(cfg.seed) + 11)
    ref_reps = Wref @ Gref / R
    ref_sq = np.einsum("rd,rd->r", Gref, Gref)
    tr_ref = float(((Gref - truth) ** 2).sum(1).mean() * R / (R - 1))
    tr_ref_reps = (Wref @ ref_sq / R - np.einsum("rd,rd->r", ref_reps, ref_reps)) * R / (R - 1)
    W = pstats.resample_weights(M, int(s.reps), seed=int(cfg.seed) + 7)
    summ = pstats.gradient_summary(G, truth, W, noisy_truth=pstats.NoisyTruth(ref_reps, tr_ref / R, tr_ref_reps / R))
    row = {**meta, "scope": "all", **summ, "reference_rel_noise": tr_ref / R / float(truth @ truth),
           "env_steps_per_batch": steps / M}
    row.update(pstats.value_summary(rets, float(ref_rets.mean()), W))
    row["adv_within_std"] = float(spread.mean())
    row.update(pstats.bootstrap_columns("adv_within_std", W @ spread / M))
    wall = time.perf_counter() - t0
    ident = {"run_id": run.run_id, "task": str(cfg.task.name), "estimator": str(cfg.estimator),
             "seed": int(cfg.seed), "policy": f"initial (init_seed={s.init_seed})", "wall_time_s": wall}
    atomic_write_bytes(run.path / "probe.parquet", _parquet_bytes(pd.DataFrame([{**ident, **row}])))
    if s.store_batches:
        pb = pstats.per_batch_scalars(G, truth)
        b = pd.DataFrame({"scope": "all", "batch": np.arange(M), **pb, "value_est": rets, "adv_within_std": spread})
        for key in ("run_id", "estimator", "seed"):
            b.insert(0, key, ident[key])
        b.insert(0, "label", spec.name)
        atomic_write_bytes(run.path / "probe_batches.parquet", _parquet_bytes(b))
    run.finish("completed", None, wall, extra={"mode": "probe", "probe": {
        k_: (None if isinstance(v, float) and not math.isfinite(v) else v) for k_, v in row.items()
        if k_ in ("label", "batches", "batch_size", "rel_bias_sq", "rel_bias_sq_low", "rel_bias_sq_high",
                  "total_var", "cos", "snr", "reference_batches")}, "settings": asdict(s)})
