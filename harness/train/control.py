"""Control trainer: collect, estimate advantages by registry name, update, log.

One code path for every estimator: the trainer asks the :class:`EstimatorSpec` what it needs
(``needs_critic``, ``full_episodes``, ``needs_groups``, ``needs_greedy``) and never its name.
Seeds are a leading population axis ``P``: member ``p`` is the lone run with seed
``seed + p`` (own weights, generators, envs, optimizer state, gradient clipping, advantage
statistics); the members share only the batched matmuls.

Checkpoints (``checkpoint_every``, issue 7): every ``checkpoint_every`` iterations the whole
population's state goes into ``checkpoint.safetensors`` in each still-running member's run
directory (:mod:`harness.io.checkpoint`: safetensors + JSON, written atomically, never
unpickled): weights (policy and critic), Adam state, the members' generators and the global
torch/numpy/python RNG states, budgets, adaptive KL betas, evaluation schedule, every member's
metric rows, and for step-based estimators the persistent envs' state, kept as the initial
reset seeds plus every action sent to them (gymnasium envs are deterministic given both, so
the envs are rebuilt by replaying the actions and checked against the saved observation).
A restarted run resumes from the newest valid checkpoint of its population, its
metrics.parquet truncated to the checkpoint's iteration; the result equals an uninterrupted
run bit for bit (same thread count), with or without checkpoints. Members of the population
that are already finished (or held by another sweep) are trained as *shadows* that write
nothing, so the population, which couples members only through batch shapes, is the same as
in an uninterrupted run.
"""
from __future__ import annotations

import logging
import math
import os
import time
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..estimators import AdvantageBatch, EstimatorParams, get_estimator
from ..io import RunDir, atomic_write_bytes, config_hash
from ..io import checkpoint as ckpt
from ..losses import adaptive_kl_beta, entropy_bonus, explained_variance, get_policy_loss, kl_penalty, value_loss
from ..models.control import ControlAgent
from ..models.mlp import clip_grad_norm_per_member, member_view
from ..tasks.control import EpisodeCollector, MemberEnvs, StepCollector, env_info, evaluate

log = logging.getLogger("harness")
CHECKPOINT_FORMAT = 1


class ShadowRun(RunDir):
    """A population member trained for its neighbours' sake (already finished, or held by
    another sweep): rows are kept in memory (for checkpoints), nothing is written."""

    writable = False

    def start(self, keep_checkpoint: bool = False) -> None:
        pass

    def flush(self) -> None:
        pass

    def finish(self, status, reason, wall_time_s, extra=None) -> None:
        pass

    def discard_progress(self) -> None:
        self.rows = []

    def resume_rows(self, rows: list[dict]) -> None:
        self.rows = list(rows)

    def remove_checkpoint(self) -> None:
        pass


def _masked_mean_std(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-member mean and (biased) std over all but the leading dim, masked."""
    dims = tuple(range(1, x.dim()))
    n = mask.sum(dim=dims).clamp(min=1.0)
    mean = (x * mask).sum(dim=dims) / n
    shape = (-1,) + (1,) * (x.dim() - 1)
    var = (((x - mean.view(shape)) ** 2) * mask).sum(dim=dims) / n
    return mean, var.sqrt()


def _whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean, std = _masked_mean_std(x, mask)
    shape = (-1,) + (1,) * (x.dim() - 1)
    return (x - mean.view(shape)) / (std.view(shape) + 1e-8) * mask


class ControlTrainer:
    def __init__(self, cfg: DictConfig, runs: list[RunDir]):
        self.cfg, self.runs = cfg, runs
        self.P = len(runs)
        self.seeds = [int(r.cfg.seed) for r in runs]
        self.spec = get_estimator(cfg.estimator)
        t = cfg.task
        self.info = env_info(t.env_id)
        self.gens = [torch.Generator().manual_seed(s) for s in self.seeds]
        self.agent = ControlAgent(self.P, self.info.obs_dim, self.info.act_dim, self.info.discrete,
                                  list(t.hidden), t.activation, self.spec.needs_critic, self.gens,
                                  t.init_log_std)
        self.params = list(self.agent.parameters())
        # fused Adam: one kernel for all parameters (elementwise, so still per-member state)
        self.optim = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5, fused=True)
        self.policy_loss = get_policy_loss(cfg["update"])
        self.est_params = EstimatorParams(gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, n_steps=cfg.n_steps,
                                          std_normalize=cfg.std_normalize)
        if self.spec.full_episodes:
            group = cfg.group_size if self.spec.needs_groups else 1
            self.collector = EpisodeCollector(t.env_id, self.P, t.episodes_per_iter, group,
                                              self.spec.needs_greedy, t.max_episode_steps, self.info, self.gens)
        else:
            envs = MemberEnvs(t.env_id, self.P, t.num_envs, t.max_episode_steps, self.info, native=True)
            self.collector = StepCollector(envs, self.gens, t.rollout_steps)
        self.eval_seeds = [10_000_019 * (s + 1) % (2**31 - 1000) for s in self.seeds]
        self.kl_beta = torch.full((self.P,), float(cfg.kl.beta))
        # plain-Python copies of the knobs read in the hot loop (OmegaConf access is slow)
        self.hp = SimpleNamespace(
            normalize=cfg.normalize_advantages, minibatches=int(cfg.minibatches), epochs=int(cfg.epochs),
            clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, vf_clip_eps=cfg.vf_clip_eps,
            ent_coef=float(cfg.ent_coef), vf_coef=float(cfg.vf_coef), max_grad_norm=cfg.max_grad_norm,
            clip_per_network=cfg.grad_clip == "per_network",
            use_kl=bool(cfg.kl.beta > 0 or cfg.kl.adaptive), kl_estimator=cfg.kl.estimator)
        self.active = torch.ones(self.P, dtype=torch.bool)
        self.env_steps = torch.zeros(self.P, dtype=torch.long)
        self.writable = torch.tensor([getattr(r, "writable", True) for r in runs], dtype=torch.bool)
        self.outcome: list[dict | None] = [None] * self.P  # status/reason/wall once a member stops
        self.checkpoint_every = int(cfg.get("checkpoint_every", 0) or 0)
        if self.checkpoint_every and isinstance(self.collector, StepCollector):
            self.collector.envs.action_log = []  # replayed on resume (persistent envs)

    # ------------------------------------------------------------------ advantages
    def advantages(self, ro):
        """Per-member estimator call on ``[T, P*N]`` columns (members never mix: every
        estimator works column-wise or within a group, and groups lie inside a member)."""
        T, P, N = ro.rewards.shape
        flat = lambda x: x.reshape(T, P * N)  # noqa: E731
        values = next_values = None
        if self.spec.needs_critic:
            with torch.no_grad():
                values = self.agent.value(ro.obs.transpose(0, 1).reshape(P, T * N, -1)).reshape(P, T, N).transpose(0, 1)
                next_values = self.agent.value(ro.next_obs.transpose(0, 1).reshape(P, T * N, -1)).reshape(P, T, N).transpose(0, 1)
            values, next_values = flat(values), flat(next_values)
        greedy = None if ro.greedy_returns is None else ro.greedy_returns.reshape(-1)
        batch = AdvantageBatch(
            rewards=flat(ro.rewards), terminated=flat(ro.terminated), truncated=flat(ro.truncated),
            mask=flat(ro.mask), values=values, next_values=next_values, greedy_scores=greedy,
            group_size=self.cfg.group_size if self.spec.needs_groups else None,
        )
        out = self.spec(batch, self.est_params)
        unflat = lambda x: None if x is None else x.reshape(T, P, N)  # noqa: E731
        return unflat(out.advantages), unflat(out.returns), unflat(values)

    # ------------------------------------------------------------------ update
    def update(self, ro, adv, returns, old_values) -> dict[str, torch.Tensor]:
        """``epochs`` passes over the batch in ``minibatches``; diagnostics from the last epoch."""
        h = self.hp
        T, P, N = ro.rewards.shape
        # member-major flat samples [P, M]
        to_pm = lambda x: None if x is None else x.transpose(0, 1).reshape(P, T * N, *x.shape[3:])  # noqa: E731
        obs, act, old_logp = to_pm(ro.obs), to_pm(ro.actions), to_pm(ro.logp)
        adv, mask = to_pm(adv), to_pm(ro.mask)
        returns, old_values = to_pm(returns), to_pm(old_values)
        mask = mask * self.active.view(P, 1).float()
        M = T * N
        n_mb = min(h.minibatches, M)
        # one minibatch: per-minibatch whitening is the batch's, the same every epoch
        normalize_each = h.normalize == "minibatch" and n_mb > 1
        if h.normalize == "batch" or (h.normalize == "minibatch" and n_mb == 1):
            adv_used = _whiten(adv, mask)
        else:
            adv_used = adv
        mb_size = math.ceil(M / n_mb)
        critic = self.spec.needs_critic
        stats: dict[str, list[torch.Tensor]] = {}
        e = lambda x: x.unsqueeze(-1)  # noqa: E731  [P, mb] -> [P, mb, 1]: one "sequence"
        for epoch in range(h.epochs):
            last_epoch = epoch == h.epochs - 1
            perm = torch.stack([torch.randperm(M, generator=g) for g in self.gens]) if n_mb > 1 else None
            for i in range(n_mb):
                if perm is None:
                    sel = lambda x: x  # noqa: E731
                else:
                    idx = perm[:, i * mb_size:(i + 1) * mb_size]
                    sel = lambda x: None if x is None else x.gather(1, idx.view(P, -1, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))  # noqa: E731
                m_obs, m_act, m_old, m_adv, m_mask = sel(obs), sel(act), sel(old_logp), sel(adv_used), sel(mask)
                if normalize_each:
                    m_adv = _whiten(m_adv, m_mask)
                params, v = self.agent.dist_params_and_value(m_obs)
                if h.ent_coef > 0 or last_epoch:
                    logp, entropy = self.agent.log_prob_entropy(params, m_act)
                else:
                    logp = self.agent.log_prob(params, m_act)
                pl, metrics = self.policy_loss(e(logp), e(m_old), e(m_adv), e(m_mask), clip_eps=h.clip_eps,
                                               clip_eps_high=h.clip_eps_high, agg="token_mean",
                                               with_metrics=last_epoch)
                loss = pl
                if h.ent_coef > 0 or last_epoch:
                    ent_l, ent_m = entropy_bonus(e(entropy), e(m_mask))
                    if h.ent_coef > 0:
                        loss = loss + h.ent_coef * ent_l
                    metrics.update(ent_m)
                if critic:
                    vl, vm = value_loss(e(v), e(sel(returns)), e(m_mask), old_values=e(sel(old_values)),
                                        clip_eps=h.vf_clip_eps)
                    loss = loss + h.vf_coef * vl
                    metrics.update(vm)
                if h.use_kl:
                    kl_l, klm = kl_penalty(e(logp), e(m_old), e(m_mask), h.kl_estimator)
                    loss = loss + self.kl_beta * kl_l
                    metrics["kl_penalty"] = klm["kl"]
                self.optim.zero_grad()
                loss.sum().backward()
                grad_norm = clip_grad_norm_per_member(self.params, h.max_grad_norm, P, h.clip_per_network)
                self._step_active_members()
                if last_epoch:
                    metrics["grad_norm"] = grad_norm[0]  # the policy's (actor block)
                    if critic:
                        metrics["value_grad_norm"] = grad_norm[1]
                    metrics["loss"] = loss.detach()
                    for k, v_ in metrics.items():
                        stats.setdefault(k, []).append(v_)
        out = {k: torch.stack(v).mean(0) for k, v in stats.items()}
        a_mean, a_std = _masked_mean_std(adv, mask)
        out["adv_mean"], out["adv_std"] = a_mean, a_std
        if critic:
            out["explained_variance"] = torch.tensor(
                [explained_variance(old_values[p], returns[p], mask[p]) for p in range(P)])
        return out

    def _step_active_members(self) -> None:
        """Adam step; frozen members (budget reached, or diverged) keep weights and state."""
        if self.active.all():
            self.optim.step()
            return
        frozen = (~self.active).nonzero().flatten()
        P = self.P
        saved = []
        for p in self.params:
            st = self.optim.state.get(p, {})
            saved.append((member_view(p.data, P)[:, frozen].clone(),
                          {k: member_view(v, P)[:, frozen].clone() for k, v in st.items()
                           if torch.is_tensor(v) and v.dim() > 0}))
        self.optim.step()
        for p, (data, st) in zip(self.params, saved):
            member_view(p.data, P)[:, frozen] = data
            for k, v in st.items():
                member_view(self.optim.state[p][k], P)[:, frozen] = v

    # ------------------------------------------------------------------ loop
    def run(self, resume: dict | None = None) -> None:
        """Train until every writable member stopped; ``resume``: what :meth:`restore` returned."""
        cfg = self.cfg
        budget, max_iters = cfg.budget.env_steps, cfg.budget.iterations
        t0 = time.time() - (resume["wall_time_s"] if resume else 0.0)
        finished_flags = [False] * self.P
        bar = tqdm(total=budget or max_iters, disable=not cfg.progress, unit="step" if budget else "it",
                   desc=f"{cfg.task.name}/{cfg.estimator} seed={self.seeds[0]}" + (f"+{self.P - 1}" if self.P > 1 else ""),
                   dynamic_ncols=True, leave=False)
        lr0 = cfg.lr
        iteration = resume["iteration"] if resume else 0
        last_eval_steps = list(resume["last_eval_steps"]) if resume else [0] * self.P
        recent: list[float] = []
        try:
            while (self.active & self.writable).any():
                iteration += 1
                if cfg.anneal_lr and budget:
                    frac = 1.0 - float(self.env_steps.min()) / budget
                    for g in self.optim.param_groups:
                        g["lr"] = lr0 * max(frac, 0.0)
                ro = self.collector.collect(self.agent)
                self.env_steps += ro.steps.long() * self.active
                adv, returns, old_values = self.advantages(ro)
                stats = self.update(ro, adv, returns, old_values)
                if cfg.kl.adaptive:
                    self.kl_beta = torch.tensor([adaptive_kl_beta(float(b), float(k), cfg.kl.kl_target)
                                                 for b, k in zip(self.kl_beta, stats["approx_kl"])])
                done_now = torch.zeros(self.P, dtype=torch.bool)
                if budget:
                    done_now |= self.env_steps >= budget
                if max_iters:
                    done_now |= torch.tensor(iteration >= max_iters)
                # per member: a member's eval schedule must not depend on its neighbours
                eval_flags = []
                for p in range(self.P):
                    steps_p = int(self.env_steps[p])
                    crossed = bool(cfg.eval_every_steps) and (
                        steps_p // cfg.eval_every_steps > last_eval_steps[p] // cfg.eval_every_steps)
                    periodic = cfg.eval_every > 0 and iteration % cfg.eval_every == 0
                    last = bool(done_now[p]) and (cfg.eval_every > 0 or bool(cfg.eval_every_steps))
                    eval_flags.append(bool(self.active[p]) and (periodic or crossed or last))
                    if eval_flags[-1]:
                        last_eval_steps[p] = steps_p
                evals = (evaluate(self.agent, cfg.task.env_id, cfg.eval_episodes, cfg.task.max_episode_steps,
                                  self.info, self.eval_seeds) if any(eval_flags) else None)
                if evals is not None:
                    evals = [v if f else None for v, f in zip(evals, eval_flags)]
                wall = time.time() - t0
                for p, r in enumerate(self.runs):
                    if not self.active[p]:
                        continue
                    row = self._row(p, iteration, wall, ro, stats, evals)
                    diverged = self._diverged(p, stats)
                    r.log(row)
                    if diverged or done_now[p]:
                        self.active[p] = False
                        self.outcome[p] = {"status": "diverged" if diverged else "completed",
                                           "reason": f"{diverged} at iteration {iteration}" if diverged else None,
                                           "wall_time_s": wall}
                        r.finish(self.outcome[p]["status"], self.outcome[p]["reason"], wall)
                        r.remove_checkpoint()  # finished: summary.json is the record now
                        finished_flags[p] = True
                    elif iteration % 10 == 0:
                        r.flush()
                    if ro.episode_returns[p]:
                        recent = (recent + ro.episode_returns[p])[-20:]
                if self.checkpoint_every and iteration % self.checkpoint_every == 0:
                    self.save_checkpoint(iteration, wall, last_eval_steps)
                bar.n = int(self.env_steps.max()) if budget else iteration
                bar.set_postfix(ret=f"{sum(recent) / max(len(recent), 1):.1f}",
                                sps=f"{float(self.env_steps.sum()) / max(time.time() - t0, 1e-9):.0f}", refresh=False)
                bar.refresh()
        finally:
            bar.close()
            self.close()

    # ------------------------------------------------------------------ checkpoints
    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        return list(self.agent.named_parameters())

    def checkpoint_state(self, iteration: int, wall: float, last_eval_steps: list[int]):
        """``(tensors, meta)`` of the whole population after ``iteration``."""
        tensors: dict[str, torch.Tensor] = {}
        for name, prm in self._named_params():
            tensors[f"param/{name}"] = prm.data
            for key, value in self.optim.state.get(prm, {}).items():
                tensors[f"adam/{name}/{key}"] = value
        rng_t, rng_m = ckpt.rng_state(self.gens)
        tensors.update(rng_t)
        tensors.update({"kl_beta": self.kl_beta, "env_steps": self.env_steps, "active": self.active})
        meta = {
            "format": CHECKPOINT_FORMAT, "trainer": "control", "config_hash": config_hash(self.cfg),
            "seeds": self.seeds, "iteration": iteration, "wall_time_s": wall,
            "last_eval_steps": [int(x) for x in last_eval_steps], "rng": rng_m,
            "members": [{"run_id": r.run_id, "outcome": self.outcome[p], "rows": r.rows}
                        for p, r in enumerate(self.runs)],
        }
        if isinstance(self.collector, StepCollector):
            c = self.collector
            log_ = c.envs.action_log
            actions = np.concatenate(log_) if log_ else np.zeros((0, self.P, c.envs.num_envs), np.int64)
            c.envs.action_log = [actions]  # one array from now on (no repeated concatenation)
            if self.info.discrete:  # category indices: the smallest integer type that holds them
                actions = actions.astype(np.int8 if self.info.act_dim <= 127 else np.int32)
            tensors.update({"collector/obs": c.obs, "collector/after_done": torch.from_numpy(c.after_done),
                            "collector/running": torch.from_numpy(c.running),
                            "collector/actions": torch.from_numpy(np.ascontiguousarray(actions))})
            meta["reset_seeds"] = [int(x) for x in c.reset_seeds]
        return tensors, meta

    def save_checkpoint(self, iteration: int, wall: float, last_eval_steps: list[int]) -> None:
        """Flush each running writable member's metrics, then write the population's checkpoint
        into its run directory (one serialisation, one atomic write per directory)."""
        targets = [r for p, r in enumerate(self.runs) if r.writable and self.active[p]]
        if not targets:
            return
        for r in targets:
            r.flush()
        data = ckpt.dumps(*self.checkpoint_state(iteration, wall, last_eval_steps))
        for r in targets:
            atomic_write_bytes(r.path / ckpt.CHECKPOINT_FILE, data)

    def check_checkpoint(self, meta: dict) -> None:
        """Raise :class:`CheckpointError` unless ``meta`` is this population's (same config
        hash, seeds and format) with consistent metric rows."""
        def bad(msg):
            raise ckpt.CheckpointError(msg)

        k = ckpt.check_header(meta, "control", CHECKPOINT_FORMAT, config_hash(self.cfg))
        if meta.get("seeds") != self.seeds:
            bad(f"saved by a population of seeds {meta.get('seeds')}, this one has {self.seeds}")
        members = meta.get("members")
        if not isinstance(members, list) or len(members) != self.P:
            bad("member list does not match the population")
        for p, m in enumerate(members):
            its = [row.get("iteration") for row in m.get("rows", [])]
            if its != list(range(1, len(its) + 1)) or len(its) > k or (m.get("outcome") is None and len(its) != k):
                bad(f"member {p} rows hold iterations {its[:1]}..{its[-1:]} at checkpoint iteration {k}")

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict) -> dict:
        """Load a checkpoint into this freshly built trainer; returns the loop's resume state.
        Raises :class:`CheckpointError` (nothing written yet) if it does not fit."""
        self.check_checkpoint(meta)
        try:
            with torch.no_grad():
                for name, prm in self._named_params():
                    t = tensors[f"param/{name}"]
                    if t.shape != prm.shape or t.dtype != prm.dtype:
                        raise ckpt.CheckpointError(f"param/{name}: saved {tuple(t.shape)} {t.dtype}, "
                                                   f"model has {tuple(prm.shape)} {prm.dtype}")
                    prm.data.copy_(t)
                    state = {key[len(f"adam/{name}/"):]: v.clone() for key, v in tensors.items()
                             if key.startswith(f"adam/{name}/")}
                    if state:
                        self.optim.state[prm] = state
                self.kl_beta = tensors["kl_beta"].clone()
                self.env_steps = tensors["env_steps"].clone()
                self.active = tensors["active"].clone()
            ckpt.set_rng_state(tensors, meta["rng"], self.gens)
            if isinstance(self.collector, StepCollector):
                c = self.collector
                actions = tensors["collector/actions"].numpy()
                if self.info.discrete:
                    actions = actions.astype(np.int64)
                obs = c.envs.replay(meta["reset_seeds"], actions)
                if not np.array_equal(obs, tensors["collector/obs"].numpy()):
                    raise ckpt.CheckpointError("replaying the saved actions does not reproduce the saved "
                                               "observations (another gymnasium version?)")
                c.reset_seeds = list(meta["reset_seeds"])
                c.obs = tensors["collector/obs"].clone()
                c.after_done = tensors["collector/after_done"].numpy().copy()
                c.running = tensors["collector/running"].numpy().copy()
                if c.envs.action_log is not None:
                    c.envs.action_log = [actions]
        except KeyError as exc:
            raise ckpt.CheckpointError(f"missing tensor {exc}") from None
        # fits: now (and only now) touch the run directories
        for p, (r, m) in enumerate(zip(self.runs, meta["members"])):
            self.outcome[p] = m.get("outcome")
            r.resume_rows(m["rows"])
            if self.outcome[p] is not None and not self.active[p]:  # stopped before the checkpoint
                o = self.outcome[p]
                r.finish(o["status"], o["reason"], o["wall_time_s"])
                r.remove_checkpoint()
        return {"iteration": meta["iteration"], "wall_time_s": float(meta["wall_time_s"]),
                "last_eval_steps": meta["last_eval_steps"]}

    def close(self) -> None:
        closer = getattr(self.collector, "close", None) or self.collector.envs.close
        closer()

    def _diverged(self, p: int, stats: dict[str, torch.Tensor]) -> str | None:
        for k in ("loss", "grad_norm"):
            if not math.isfinite(float(stats[k][p])):
                return f"non-finite {k}"
        for prm in self.params:
            if not torch.isfinite(member_view(prm.data, self.P)[:, p]).all():
                return "non-finite parameters"
        return None

    def _row(self, p, iteration, wall, ro, stats, evals) -> dict:
        cfg = self.cfg
        eps = ro.episode_returns[p]
        get = lambda k: float(stats[k][p]) if k in stats else None  # noqa: E731
        return {
            "run_id": self.runs[p].run_id, "task": cfg.task.name, "estimator": cfg.estimator,
            "seed": self.seeds[p], "iteration": iteration, "env_steps": int(self.env_steps[p]),
            "wall_time_s": wall,
            "episode_return": sum(eps) / len(eps) if eps else None,
            "eval_return": evals[p] if evals is not None else None,  # None unless member p evaluated
            "gamma": cfg.gamma, "gae_lambda": cfg.gae_lambda, "clip_eps": cfg.clip_eps,
            "kl_beta": float(self.kl_beta[p]), "n_steps": cfg.n_steps,
            "group_size": cfg.group_size if self.spec.needs_groups else None, "lr": cfg.lr,
            "policy_loss": get("policy_loss"), "entropy": get("entropy"), "approx_kl": get("approx_kl"),
            "clip_frac": get("clip_frac"), "grad_norm": get("grad_norm"), "adv_mean": get("adv_mean"),
            "adv_std": get("adv_std"), "value_loss": get("value_loss"),
            "explained_variance": get("explained_variance"),
            "value_grad_norm": get("value_grad_norm"), "episodes": len(eps),
        }


def default_threads(cfg: DictConfig, population: int) -> int:
    """A lone small MLP gains nothing from intra-op threads (they only add synchronisation);
    a population's batched matmuls do. Measured in benchmarks/control_speed.py."""
    if cfg.threads:
        return int(cfg.threads)
    if population == 1:
        return 1
    cores = os.cpu_count() or 1
    try:  # under a parallel Hydra launcher, share the cores among its workers
        from hydra.core.hydra_config import HydraConfig

        n_jobs = int(HydraConfig.get().launcher.get("n_jobs") or 1)
    except Exception:
        n_jobs = 1
    if n_jobs < 1:  # joblib's -1: one worker per core
        n_jobs = cores
    return max(1, cores // n_jobs)


def population_runs(cfg: DictConfig, runs: list[RunDir]) -> list[RunDir]:
    """All ``cfg.population`` members in seed order: ``runs`` where given, a :class:`ShadowRun`
    for each other member (finished already, or held by another sweep)."""
    from ..app import member_configs

    members = member_configs(cfg)
    mine = {int(r.cfg.seed): r for r in runs}
    if not set(mine) <= {int(m.seed) for m in members}:  # not this config's members: as given
        return list(runs)
    return [mine.get(int(m.seed)) or ShadowRun(m) for m in members]


def find_checkpoint(trainer: ControlTrainer) -> tuple[str, dict, dict] | None:
    """The newest checkpoint in any member's directory that fits ``trainer``'s population,
    as ``(path, tensors, meta)``; unusable ones are named in a log line and passed over."""
    best = None
    for r in trainer.runs:
        path = r.path / ckpt.CHECKPOINT_FILE
        if not path.is_file():
            continue
        try:
            tensors, meta = ckpt.load(path)
            trainer.check_checkpoint(meta)
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s", path, exc)
            continue
        if best is None or meta["iteration"] > best[2]["iteration"]:
            best = (str(path), tensors, meta)
    return best


def train(cfg: DictConfig, runs: list[RunDir]) -> None:
    """Train ``runs`` (claimed and started by :func:`harness.app.run`) as one population,
    resuming from the newest valid checkpoint if there is one, else from zero."""
    full = population_runs(cfg, runs)
    torch.set_num_threads(default_threads(cfg, len(full)))
    trainer = ControlTrainer(cfg, full)
    resume = None
    found = find_checkpoint(trainer)
    if found is not None:
        path, tensors, meta = found
        try:
            resume = trainer.restore(tensors, meta)
            log.info("resume %s from %s at iteration %d (metrics.parquet truncated to it)",
                     ", ".join(r.run_id for r in runs), path, resume["iteration"])
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s; starting from zero", path, exc)
            trainer.close()
            trainer = ControlTrainer(cfg, full)
    if resume is None:
        for r in full:
            r.discard_progress()
    trainer.run(resume)
