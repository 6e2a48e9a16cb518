"""Control tasks' rollout source (gymnasium) for the one training loop (:mod:`.loop`).

Seeds are a leading population axis ``P``: member ``p`` is the lone run with seed ``seed + p``
(own weights, generators, envs, optimizer state, gradient clipping, advantage statistics,
learning-rate schedule, KL beta, evaluation schedule, budget); the members share only the
batched matmuls. Step-based estimators (``a2c``, ``ppo_gae``) collect ``task.rollout_steps``
steps of ``task.num_envs`` persistent envs per member; whole-episode estimators collect
``task.episodes_per_iter`` episodes (in groups of identical starts, plus ReMax's greedy ones).

For the update the ``[T, P, N]`` rollout becomes ``[P, 1, T*N]``: one step per column, so
minibatches are drawn over steps (SB3, CleanRL). ``loss_agg`` still aggregates by sequence:
each step carries its sequence id (``seq_id``): its episode for whole-episode collectors, its
segment of one env column between resets for step-based ones. ``seq_mean_token_sum_norm``'s
constant ``L`` is the episode time limit (``task.max_episode_steps``, else the env's own;
``task.rollout_steps`` for step-based rollouts, the longest segment there can be).

Checkpoint state of the source: for step-based estimators the persistent envs' state, kept as
the initial reset seeds plus every action sent to them (gymnasium envs are deterministic given
both, so the envs are rebuilt by replaying the actions and checked against the saved
observation on resume); with ``task.normalize_obs`` / ``task.normalize_reward`` each member's
normalisation statistics (:meth:`harness.tasks.control.MemberEnvs.norm_state`), which the
replay must reproduce too (whole-episode collectors reset their envs every iteration: the
statistics are all they carry over).
"""
from __future__ import annotations

import os
from collections import deque

import numpy as np
import torch
from omegaconf import DictConfig

from ..estimators import AdvantageBatch
from ..io import RunDir
from ..io import checkpoint as ckpt
from ..models.control import AgentSpec, ControlAgent
from ..models.mlp import member_view
from ..plan import RunPlan
from ..tasks.control import (EpisodeCollector, EpisodeLayout, EvalEpisodes, MemberEnvs, Normalization, StepCollector,
                             advantage_batch, env_info, evaluate, time_limit)
from .loop import Source
from .update import UpdateBatch, clip_grad_norms, norms_finite
from .workers import train_members


class ControlLearner:
    """The population's actor and critic (one :class:`ControlAgent`) for the update step."""

    def __init__(self, agent: ControlAgent):
        self.agent, self.population = agent, agent.population
        self.params = list(agent.parameters())

    def named_params(self):
        return list(self.agent.named_parameters())

    def forward(self, inputs, idx, need_entropy):
        obs, act = inputs
        if idx is not None:
            P = self.population
            sel = lambda x: x.gather(1, idx.view(P, -1, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:]))  # noqa: E731
            obs, act = sel(obs), sel(act)
        params, v = self.agent.dist_params_and_value(obs)
        if need_entropy:
            logp, entropy = self.agent.log_prob_entropy(params, act)
            entropy = entropy.unsqueeze(1)
        else:
            logp, entropy = self.agent.log_prob(params, act), None
        return logp.unsqueeze(1), entropy, None if v is None else v.unsqueeze(1)

    def clip_grads(self, max_norm, per_network):
        return clip_grad_norms([p.grad for p in self.params if p.grad is not None], max_norm, per_network,
                               self.population)

    @torch.no_grad()
    def finite_members(self) -> torch.Tensor:
        """``[P]``: whether every weight of member ``p`` is finite. First one fused norm per tensor
        (:func:`~harness.train.update.norms_finite`): finite norms answer for every member at once
        (about 20 us against 130 for the member by member check, once an iteration); a non-finite
        norm (or one that overflows) falls back to it."""
        ok = torch.ones(self.population, dtype=torch.bool)
        if norms_finite(self.params):
            return ok
        for prm in self.params:
            v = member_view(prm.data, self.population)
            ok &= torch.isfinite(v.transpose(0, 1).reshape(self.population, -1)).all(dim=1)
        return ok


def sequence_ids(done: torch.Tensor, whole_episodes: bool) -> torch.Tensor:
    """``[T, P, N]`` sequence id of every step: the column for whole episodes; for persistent envs
    the segment of one env column between resets (``n * (T + 1) + resets before t``)."""
    T, P, N = done.shape
    col = torch.arange(N).view(1, 1, N)
    if whole_episodes:
        return col.expand(T, P, N).clone()
    before = torch.cumsum(done.long(), dim=0) - done.long()
    return col * (T + 1) + before


def evaluation_seeds(seeds: list[int]) -> list[int]:
    """The first evaluation episode's env seed of each member (its others follow it: +1, +2, ...),
    far from any training seed."""
    return [10_000_019 * (s + 1) % (2**31 - 1000) for s in seeds]


RECENT_EPISODES = 20  # episodes the progress bar's mean return covers


class ControlSource(Source):
    cost_unit = "step"
    fused_adam = True  # fused Adam: one kernel for all parameters (elementwise, so still per-member state)

    def __init__(self, plan: RunPlan, runs: list[RunDir]):
        cfg = plan.cfg
        self.cfg, self.P = cfg, len(runs)
        self.seeds = [int(r.cfg.seed) for r in runs]
        self.spec = spec = plan.estimator
        t = cfg.task
        self.info = env_info(t.env_id)
        self.gens = [torch.Generator().manual_seed(s) for s in self.seeds]
        self.agent = ControlAgent(self.P, AgentSpec.from_task(t, self.info), spec.needs_critic, self.gens)
        norm = Normalization.from_cfg(cfg)
        self.learner = ControlLearner(self.agent)
        self.budget = cfg.budget.env_steps
        self.uses_groups = spec.needs_groups
        self.whole_episodes = spec.full_episodes
        limit = time_limit(t.env_id, t.max_episode_steps)
        self.norm_len = limit if spec.full_episodes else int(t.rollout_steps)
        self.seq_ids = str(cfg.loss_agg) != "token_mean"
        if spec.full_episodes:
            group = cfg.group_size if spec.needs_groups else 1
            layout = EpisodeLayout(t.episodes_per_iter, group, spec.needs_greedy)
            self.collector = EpisodeCollector(t.env_id, self.P, layout, t.max_episode_steps, self.info, self.gens, norm)
        else:
            envs = MemberEnvs(t.env_id, self.P, t.num_envs, t.max_episode_steps, self.info, native=True, norm=norm)
            self.collector = StepCollector(envs, self.gens, t.rollout_steps)
            if int(cfg.get("checkpoint_every", 0) or 0):
                envs.action_log = []  # replayed on resume (persistent envs)
        self.eval_seeds = evaluation_seeds(self.seeds)
        self.group_size = int(cfg.group_size) if spec.needs_groups else None
        self.eval_episodes, self.max_steps, self.env_id = int(cfg.eval_episodes), t.max_episode_steps, t.env_id
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)  # the progress bar's, all members

    def generators(self):
        return self.gens

    def shuffle_generators(self):
        return self.gens

    def collect(self):
        ro = self.collector.collect(self.agent)
        ro.cost = ro.steps
        return ro

    def advantage_batch(self, ro) -> AdvantageBatch:
        return advantage_batch(self.agent, ro, self.spec.needs_critic, self.group_size)

    def update_batch(self, ro, adv, returns, values) -> UpdateBatch:
        T, P, N = ro.rewards.shape
        # member-major flat samples [P, 1, M]: one step per column
        to_pm = lambda x: None if x is None else x.reshape(T, P, N).transpose(0, 1).reshape(P, 1, T * N)  # noqa: E731
        obs = ro.obs.transpose(0, 1).reshape(P, T * N, -1)
        act = ro.actions.transpose(0, 1).reshape(P, T * N, *ro.actions.shape[3:])
        old_logp = ro.logp.transpose(0, 1).reshape(P, 1, T * N)
        seq = None
        if self.seq_ids:
            done = (ro.terminated + ro.truncated) > 0
            seq = sequence_ids(done, self.whole_episodes).transpose(0, 1).reshape(P, 1, T * N)
        return UpdateBatch(adv=to_pm(adv), mask=ro.mask.transpose(0, 1).reshape(P, 1, T * N), old_logp=old_logp,
                           inputs=(obs, act), returns=to_pm(returns), old_values=to_pm(values), kl_target=old_logp,
                           seq_id=seq, columns=None if ro.horizon is None else [h * N for h in ro.horizon])

    def evaluate(self, flags):
        spec = EvalEpisodes(self.env_id, self.eval_episodes, self.max_steps, self.info, self.eval_seeds)
        evals = evaluate(self.agent, spec, train_envs=self.collector.envs, members=flags)
        return [{"eval_return": v} if f else None for v, f in zip(evals, flags)]

    def episode_return(self, p, ro):
        eps = ro.episode_returns[p]
        return sum(eps) / len(eps) if eps else None

    def row_extras(self, p, ro, stats, ev, pre, row):
        return {"episodes": len(ro.episode_returns[p])}

    def postfix(self, ro, rows):
        """The progress bar's ``ret``: the mean return of the last :data:`RECENT_EPISODES` episodes that
        ended, over all members; an iteration that ends none keeps the previous mean (it is no return
        of 0), and before the first episode ends the bar says so."""
        self.recent_returns.extend(x for p in range(self.P) for x in ro.episode_returns[p])
        if not self.recent_returns:
            return {"ret": "no episode ended yet"}
        return {"ret": f"{sum(self.recent_returns) / len(self.recent_returns):.1f}"}

    # ------------------------------------------------------------------ checkpoints
    def state(self):
        norm = {f"norm/{k}": v for k, v in self.collector.envs.norm_state().items()}
        if not isinstance(self.collector, StepCollector):
            return norm, {}
        c = self.collector
        log_ = c.envs.action_log or []
        actions = np.concatenate(log_) if log_ else np.zeros((0, self.P, c.envs.num_envs), np.int64)
        c.envs.action_log = [actions]  # one array from now on (no repeated concatenation)
        if self.info.discrete:  # category indices: the smallest integer type that holds them
            actions = actions.astype(np.int8 if self.info.act_dim <= 127 else np.int32)
        tensors = {"obs": c.obs, "after_done": torch.from_numpy(c.after_done),
                   "running": torch.from_numpy(c.running), "actions": torch.from_numpy(np.ascontiguousarray(actions)),
                   **norm}
        return tensors, {"reset_seeds": [int(x) for x in c.reset_seeds]}

    def load_state(self, tensors, meta):
        norm = {k[len("norm/"):]: v for k, v in tensors.items() if k.startswith("norm/")}
        if not isinstance(self.collector, StepCollector):
            self._load_norm(norm, check=False)
            return
        c = self.collector
        P, N = self.P, c.envs.num_envs
        try:
            obs, after, running, actions = (tensors["obs"], tensors["after_done"], tensors["running"],
                                            tensors["actions"])
            seeds = meta["reset_seeds"]
        except (KeyError, TypeError) as exc:
            raise ckpt.CheckpointError(f"control source state: missing {exc}") from None
        if tuple(obs.shape) != tuple(c.obs.shape) or obs.dtype != c.obs.dtype:
            raise ckpt.CheckpointError(f"source/obs: saved {tuple(obs.shape)} {obs.dtype}, envs have "
                                       f"{tuple(c.obs.shape)} {c.obs.dtype}")
        for name, t, dtype in (("after_done", after, torch.bool), ("running", running, torch.float32)):
            if tuple(t.shape) != (P, N) or t.dtype != dtype:
                raise ckpt.CheckpointError(f"source/{name}: saved {tuple(t.shape)} {t.dtype}, expected {(P, N)} {dtype}")
        if actions.dim() < 3 or tuple(actions.shape[1:3]) != (P, N):
            raise ckpt.CheckpointError(f"source/actions: saved {tuple(actions.shape)}, expected [S, {P}, {N}, ...]")
        if not (isinstance(seeds, list) and len(seeds) == P and all(isinstance(s, int) for s in seeds)):
            raise ckpt.CheckpointError(f"reset_seeds {seeds!r}")
        a = actions.numpy()
        if self.info.discrete:
            a = a.astype(np.int64)
            if a.size and (a.min() < 0 or a.max() >= self.info.act_dim):
                raise ckpt.CheckpointError("source/actions: action index out of range")
        replayed = c.envs.replay(seeds, a)
        if not np.array_equal(replayed, obs.numpy()):
            raise ckpt.CheckpointError("replaying the saved actions does not reproduce the saved "
                                       "observations (another gymnasium version?)")
        self._load_norm(norm, check=True)
        c.reset_seeds = list(seeds)
        c.obs = obs.clone()
        c.after_done = after.numpy().copy()
        c.running = running.numpy().copy()
        if c.envs.action_log is not None:
            c.envs.action_log = [a]

    def _load_norm(self, norm: dict, check: bool) -> None:
        try:
            self.collector.envs.load_norm_state(norm, check=check)
        except ValueError as exc:
            raise ckpt.CheckpointError(str(exc)) from None

    def close(self) -> None:
        closer = getattr(self.collector, "close", None) or self.collector.envs.close
        closer()


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity: what Slurm or ``taskset`` gave it),
    shared among the workers of a parallel Hydra launcher."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        from hydra.core.hydra_config import HydraConfig

        n_jobs = int(HydraConfig.get().launcher.get("n_jobs") or 1)
    except Exception:
        n_jobs = 1
    if n_jobs < 1:  # joblib's -1: one worker per core
        n_jobs = cores
    return max(1, cores // n_jobs)


def layout(cfg: DictConfig, population: int) -> tuple[int, int]:
    """``(workers, threads)``: how many processes train the population's members (contiguous
    slices of them, :func:`harness.train.workers.train_population`) and torch's intra-op threads in
    each. ``population_workers`` and ``threads`` where set; by default one worker per available
    core, each with the cores left over (one thread when every core has a worker), and a lone run
    one worker with one thread. A small MLP's update is a few thousand short kernels per
    iteration, and collection is Python: intra-op threads only split the kernels (and wake each
    other for every one), while processes run everything side by side. Measured in
    benchmarks/control_speed.py (``--one-process``)."""
    cores = cores_available()
    workers = cfg.population_workers
    if workers is None:
        workers = min(population, cores)
    workers = max(1, min(int(workers), population))
    if cfg.threads:
        threads = int(cfg.threads)
    else:
        threads = 1 if population == 1 else max(1, cores // workers)
    return workers, threads


def train(plan: RunPlan, runs: list[RunDir]) -> None:
    """Train ``runs`` (claimed and started by :func:`harness.app.run`) as one population,
    resuming from the newest valid checkpoint if there is one, else from zero."""
    workers, threads = layout(plan.cfg, int(plan.cfg.population))
    torch.set_num_threads(threads)
    train_members(plan, runs, ControlSource, workers=workers)
