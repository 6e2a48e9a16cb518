"""stable-baselines3's own PPO and A2C on a harness control config (``reference=sb3``).

The translation (SB3 2.x names), each setting to the one that does the same thing there:

================================  ==============================================================
harness                           stable-baselines3
================================  ==============================================================
``task.num_envs``, ``rollout_steps``  ``make_vec_env(n_envs)``, ``n_steps``
``minibatches``, ``epochs``       ``batch_size = num_envs * rollout_steps / minibatches``, ``n_epochs``
``lr``, ``anneal_lr``             ``learning_rate`` (``lambda p: p * lr`` when annealed: SB3 reads the
                                  budget left after the rollout, the harness before it: one
                                  iteration's shift)
``gamma``, ``gae_lambda``         the same (A2C: ``gae_lambda=1``, ``n_steps`` = the rollout: SB3's A2C
                                  bootstraps at the rollout's end, the harness's n-step return with
                                  ``n_steps >= task.rollout_steps``)
``clip_eps``                      ``clip_range``
``normalize_advantages``          ``normalize_advantage`` (per minibatch; ``none``: off). SB3 divides by
                                  torch's Bessel-corrected std (n - 1), the harness by the plain one
                                  (:func:`harness.losses.whiten`): SB3's normalised advantages are the
                                  harness's times ``sqrt((n - 1) / n)`` over a minibatch of n (0.992 at 64)
``ent_coef``                      ``ent_coef``
``vf_coef``                       ``vf_coef / 2``: SB3's value loss is the mean squared error, the
                                  harness's half of it (:func:`harness.losses.value_loss`), so the
                                  objective is the same
``max_grad_norm`` (``grad_clip=joint``)  ``max_grad_norm`` (one norm over every parameter)
``task.hidden``, ``activation``   ``net_arch=dict(pi=hidden, vf=hidden)``, ``activation_fn``
``task.ortho_init``, ``init_log_std``   ``ortho_init``, ``log_std_init``
``task.normalize_obs``/``_reward``, ``obs_clip``  ``VecNormalize(norm_obs, norm_reward, clip_obs, gamma)``,
                                  rewards not clipped (the harness does not clip them)
Adam, eps 1e-5                    A2C: ``use_rms_prop=False`` (Adam, ``rms_prop_eps=1e-5`` is its eps);
                                  PPO: its default Adam with eps 1e-5
================================  ==============================================================

What cannot be translated (another policy loss, aggregation, a KL term, an adaptive KL or its
clamps, an asymmetric, capped (``delta``), clamped (``log_ratio_clamp``) or absent
(``clip_eps=null``) clip, value clipping, per-network clipping, a squashed or state-dependent std,
whole-episode batches) is refused by :func:`check`; checkpoints and trackers by
:data:`harness.reference.RUN_SETTINGS`. Value clipping: SB3's ``clip_range_vf`` regresses the
clipped prediction alone, ``mse(R, V_old + clip(V - V_old))``, the harness's ``vf_clip_eps`` the
larger of the clipped and unclipped errors (:func:`harness.losses.value_loss`, PPO2's), so it has
no counterpart there (nor in SB3's A2C). Evaluation is the harness's (:func:`harness.tasks.control.evaluate`: the same
greedy episodes, the same evaluation seeds, at the same env-step marks, observations normalised
with the training statistics frozen), with SB3's policy acting greedily (``predict(deterministic=True)``).
A metric row per iteration (one rollout and its update) holds SB3's own training statistics
(``train/*``; ``value_loss`` halved to the harness's definition).
"""
from __future__ import annotations

import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from omegaconf import DictConfig

from ..config import bad_field
from ..io.rundir import RunDir
from ..plan import RunPlan
from ..tasks.control import EvalEpisodes, env_info, evaluate
from ..train.control import cores_available, evaluation_seeds
from ..train.loop import RowHead, common_fields, eval_due, flush_due, metric_row

__all__ = ["check", "library", "train"]

ALGORITHMS = {"ppo_gae": "PPO", "a2c": "A2C"}
_UPDATE = {"ppo_gae": "clip", "a2c": "pg"}


def check(cfg: DictConfig) -> None:
    """Refuse (:func:`harness.config.bad_field`) a setting SB3's PPO/A2C has no counterpart of."""
    est, t = cfg.estimator, cfg.task
    need = {
        "update": (cfg["update"], _UPDATE[est]),
        "loss_agg": (cfg.loss_agg, "token_mean"),
        "clip_eps_high": (cfg.clip_eps_high, None),
        "vf_clip_eps": (cfg.vf_clip_eps, None),  # SB3's clip_range_vf is another loss (module docstring)
        "delta": (cfg.get("delta"), None),  # the clip loss's knobs: SB3's PPO loss has neither
        "log_ratio_clamp": (cfg.get("log_ratio_clamp"), None),
        "kl.beta": (float(cfg.kl.beta), 0.0),
        "kl.adaptive": (bool(cfg.kl.adaptive), False),
        "kl.log_ratio_clamp": (cfg.kl.get("log_ratio_clamp"), None),  # SB3 has no KL term to clamp
        "kl.value_clamp": (cfg.kl.get("value_clamp"), None),
        "grad_clip": (cfg.grad_clip, "joint"),
        "task.log_std": (t.log_std, "state_independent"),
        "task.action_bound": (t.action_bound, "clip"),
        "budget.iterations": (cfg.budget.iterations, None),
        "dynamic_sampling": (bool(cfg.dynamic_sampling), False),
    }
    for key, (value, allowed) in need.items():
        if value != allowed:
            bad_field(key, f"{allowed!r} with reference=sb3 (SB3's {ALGORITHMS[est]} has no other)", value)
    if cfg.budget.env_steps is None:
        bad_field("budget.env_steps", "an int with reference=sb3 (SB3 trains for total_timesteps)", None)
    allowed_norm = ("none", "minibatch") if est == "ppo_gae" else ("none", "batch", "minibatch")
    if cfg.normalize_advantages not in allowed_norm:
        bad_field("normalize_advantages", f"one of {list(allowed_norm)} with reference=sb3", cfg.normalize_advantages)
    if cfg.max_grad_norm is None:
        bad_field("max_grad_norm", "a number with reference=sb3 (SB3 always clips)", None)
    if est == "ppo_gae" and cfg.clip_eps is None:
        bad_field("clip_eps", "a number with reference=sb3 estimator=ppo_gae (SB3's PPO always clips: clip_range)",
                  None)
    if est == "a2c":
        if int(cfg.epochs) != 1 or int(cfg.minibatches) != 1:
            bad_field("epochs", "1 (and minibatches 1) with reference=sb3 estimator=a2c",
                      f"epochs={cfg.epochs} minibatches={cfg.minibatches}")
        if int(cfg.n_steps) < int(t.rollout_steps):
            bad_field("n_steps", f">= task.rollout_steps ({t.rollout_steps}) with reference=sb3 estimator=a2c "
                      "(SB3's A2C bootstraps at the rollout's end)", cfg.n_steps)
    elif (int(t.num_envs) * int(t.rollout_steps)) % int(cfg.minibatches):
        bad_field("minibatches", f"a divisor of task.num_envs * task.rollout_steps "
                  f"({int(t.num_envs) * int(t.rollout_steps)}) with reference=sb3", cfg.minibatches)


def library(cfg: DictConfig) -> None:
    """Import what :func:`train` uses of stable-baselines3 (raises what a broken install raises)."""
    import stable_baselines3  # noqa: F401
    from stable_baselines3.common import callbacks, env_util, logger, vec_env  # noqa: F401


class _GreedySB3:
    """The agent interface :func:`harness.tasks.control.evaluate` drives, for one SB3 model: greedy
    actions (``predict(deterministic=True)``) on observations normalised with SB3's frozen statistics."""

    population = 1

    def __init__(self, model, vec_normalize):
        self.model, self.norm = model, vec_normalize

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:  # [1, E, obs_dim] -> greedy actions [1, E, ...]
        o = obs[0].numpy()
        if self.norm is not None:
            o = self.norm.normalize_obs(o)
        actions, _ = self.model.predict(o, deterministic=True)
        return torch.as_tensor(np.asarray(actions)).unsqueeze(0)

    def policy(self):  # what evaluate calls each step (ControlAgent.policy)
        return self.dist_params

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        return params

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions


def _model(cfg: DictConfig):
    """SB3's algorithm for ``cfg`` (:data:`ALGORITHMS`), its vectorised env, and its VecNormalize (or None)."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    t = cfg.task
    kwargs = {} if t.max_episode_steps is None else {"max_episode_steps": int(t.max_episode_steps)}
    env = make_vec_env(t.env_id, n_envs=int(t.num_envs), seed=int(cfg.seed), env_kwargs=kwargs)
    norm = None
    if t.normalize_obs or t.normalize_reward:
        env = norm = VecNormalize(env, norm_obs=bool(t.normalize_obs), norm_reward=bool(t.normalize_reward),
                                  clip_obs=math.inf if t.obs_clip is None else float(t.obs_clip),
                                  clip_reward=math.inf, gamma=float(cfg.gamma))
    lr = float(cfg.lr)
    policy_kwargs = dict(net_arch=dict(pi=list(t.hidden), vf=list(t.hidden)),
                         activation_fn={"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[t.activation],
                         ortho_init=bool(t.ortho_init), log_std_init=float(t.init_log_std))
    common = dict(learning_rate=(lambda p: p * lr) if cfg.anneal_lr else lr, n_steps=int(t.rollout_steps),
                  gamma=float(cfg.gamma), ent_coef=float(cfg.ent_coef), vf_coef=float(cfg.vf_coef) / 2,
                  max_grad_norm=float(cfg.max_grad_norm), normalize_advantage=cfg.normalize_advantages != "none",
                  policy_kwargs=policy_kwargs, seed=int(cfg.seed), device="cpu", verbose=0)
    if cfg.estimator == "a2c":
        model = sb3.A2C("MlpPolicy", env, gae_lambda=1.0, use_rms_prop=False, rms_prop_eps=1e-5, **common)
    else:
        batch = int(t.num_envs) * int(t.rollout_steps)
        model = sb3.PPO("MlpPolicy", env, batch_size=batch // int(cfg.minibatches), n_epochs=int(cfg.epochs),
                        gae_lambda=float(cfg.gae_lambda), clip_range=float(cfg.clip_eps), clip_range_vf=None,
                        **common)
    # SB3's logger without outputs, set here: left to learn(), SB3 makes one it writes nothing to,
    # in a new empty folder /tmp/SB3-<time> per run. The values it records (name_to_value) are the same.
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model, env, norm


def _train_one(run: RunDir) -> None:
    from stable_baselines3.common.callbacks import BaseCallback

    cfg = run.cfg
    torch.set_num_threads(int(cfg.threads or 1))
    model, env, norm = _model(cfg)
    info = env_info(cfg.task.env_id)
    seeds = evaluation_seeds([int(cfg.seed)])
    common = common_fields(cfg, uses_groups=False)
    budget = int(cfg.budget.env_steps)
    evaluating = int(cfg.eval_every) > 0 or bool(cfg.eval_every_steps)
    t0 = time.perf_counter()

    class Rows(BaseCallback):
        """One metric row per iteration, written when its update is done (the next rollout's start, or the end)."""

        def _on_training_start(self) -> None:
            self.iteration, self.last_eval, self.episodes, self.flushed = 0, 0, [], time.perf_counter()

        def _on_step(self) -> bool:
            self.episodes += [i["episode"]["r"] for i in self.locals["infos"] if "episode" in i]
            return True

        def _on_rollout_start(self) -> None:
            if self.model.num_timesteps > 0:
                self._row(done=False)

        def _on_training_end(self) -> None:
            self._row(done=True)

        def _row(self, done: bool) -> None:
            self.iteration += 1
            steps = int(self.model.num_timesteps)
            ev = None
            if evaluating and eval_due(self.iteration, steps, self.last_eval, done or steps >= budget,
                                       int(cfg.eval_every), cfg.eval_every_steps):
                self.last_eval = steps
                spec = EvalEpisodes(cfg.task.env_id, int(cfg.eval_episodes), cfg.task.max_episode_steps, info, seeds)
                ev = evaluate(_GreedySB3(self.model, norm), spec)[0]
            logged = self.model.logger.name_to_value
            stat = lambda k, f=1.0: None if k not in logged else float(logged[k]) * f  # noqa: E731
            ent = stat("train/entropy_loss", -1.0)
            head = RowHead(run.run_id, int(cfg.seed), self.iteration, steps, time.perf_counter() - t0,
                           float(np.mean(self.episodes)) if self.episodes else None, ev, 0.0,
                           float(self.model.lr_schedule(self.model._current_progress_remaining)))
            row = metric_row(head, common)
            row.update({"policy_loss": stat("train/policy_gradient_loss") if "train/policy_gradient_loss" in logged
                        else stat("train/policy_loss"),
                        "entropy": ent, "approx_kl": stat("train/approx_kl"), "clip_frac": stat("train/clip_fraction"),
                        "value_loss": stat("train/value_loss", 0.5),
                        "explained_variance": stat("train/explained_variance"), "episodes": len(self.episodes)})
            self.episodes = []
            run.log(row)
            if flush_due(self.iteration, self.flushed):  # as the harness's loop; run.finish writes the rest
                run.flush()
                self.flushed = time.perf_counter()

    try:
        model.learn(total_timesteps=budget, callback=Rows(), log_interval=None)
    finally:
        env.close()
    run.finish("completed", None, time.perf_counter() - t0)


def _train_member(cfg: DictConfig) -> None:
    """One member, in whichever process: its RunDir again from its config (the parent holds the lock)."""
    run, t0 = RunDir(cfg), time.perf_counter()
    try:
        _train_one(run)
    except Exception as exc:  # record, never drop (as harness.app.run does for a whole worker)
        run.finish("failed", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)


def train(plan: RunPlan, runs: list[RunDir]) -> None:
    """Train each member (its own seed) with SB3 on one thread, ``population_workers`` processes at
    a time (default: one per core, as the harness's control trainer); a member that raises is
    recorded as failed and the others go on."""
    cfg = plan.cfg
    workers = min(len(runs), int(cfg.get("population_workers") or cores_available()))
    if workers <= 1:
        for run in runs:
            _train_member(run.cfg)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(_train_member, [run.cfg for run in runs]))
