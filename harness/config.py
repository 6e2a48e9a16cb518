"""Typed config schema (Hydra ConfigStore) and the checks that run before any work.

The YAML groups under ``conf/`` fill these dataclasses; a typo'd key or a wrong type fails
at composition (OmegaConf struct mode), a value out of range fails in :func:`validate`
with the field's name and what is allowed, before a run directory is created.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig


@dataclass
class TaskConfig:
    name: str = MISSING
    family: str = "control"  # control | lm | toy
    env_id: Optional[str] = None
    num_envs: int = 8  # envs per member for step-based estimators
    rollout_steps: int = 128  # steps per env per iteration (step-based estimators)
    episodes_per_iter: int = 16  # whole episodes per iteration (Monte Carlo / group estimators)
    max_episode_steps: Optional[int] = None  # None: the env's own time limit
    hidden: List[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    init_log_std: float = 0.0


@dataclass
class BudgetConfig:
    env_steps: Optional[int] = None
    tokens: Optional[int] = None
    iterations: Optional[int] = None


@dataclass
class KLConfig:
    beta: float = 0.0
    estimator: str = "k3"
    target: str = "old"  # control: the pre-update policy; lm: "ref"
    in_reward: bool = False
    adaptive: bool = False
    kl_target: float = 0.01


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    estimator: str = MISSING
    seed: int = 0
    population: int = 1
    results_dir: str = "results"
    mode: str = "train"  # train | probe (gradient bias/variance at a frozen policy)
    device: str = "cpu"  # auto | cpu | cuda
    threads: Optional[int] = None  # torch intra-op threads; None: the trainer's default (control: 1 alone, all cores for a population)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    eval_every: int = 10  # iterations; 0 disables iteration-based evaluation
    eval_every_steps: Optional[int] = None  # also evaluate each time env_steps crosses a multiple
    eval_episodes: int = 10
    progress: bool = True
    # update
    update: str = "clip"
    epochs: int = 10
    minibatches: int = 4
    lr: float = 3e-4
    anneal_lr: bool = False
    clip_eps: Optional[float] = 0.2
    clip_eps_high: Optional[float] = None
    vf_clip_eps: Optional[float] = None
    normalize_advantages: str = "minibatch"  # none | batch | minibatch
    loss_agg: str = "token_mean"
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: Optional[float] = 0.5
    grad_clip: str = "joint"  # joint: actor+critic one norm (SB3, CleanRL) | per_network
    # estimator knobs
    gamma: float = 0.99
    gae_lambda: float = 0.95
    n_steps: int = 5
    group_size: int = 8
    std_normalize: bool = True
    kl: KLConfig = field(default_factory=KLConfig)
    lm: Any = None  # the LM task's own node (conf/task/lm_*.yaml)
    toy: Any = None  # the toy task's own node (conf/task/toy.yaml)
    probe: Any = None  # mode=probe settings (harness.probes)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


NORMALIZE = ("none", "batch", "minibatch")
FAMILIES = ("control", "lm", "toy")
MODES = ("train", "probe")
DEVICES = ("auto", "cpu", "cuda")


def validate(cfg: DictConfig) -> None:
    """Raise ``ValueError`` naming the first invalid field and what it allows."""
    from .estimators import ESTIMATORS, KL_ESTIMATORS, get_estimator
    from .losses import AGG_MODES, POLICY_LOSSES

    def bad(field_name: str, allowed: str, value: Any) -> None:
        raise ValueError(f"{field_name} must be {allowed}, got {value!r}")

    if cfg.estimator not in ESTIMATORS:
        bad("estimator", f"one of {sorted(ESTIMATORS)}", cfg.estimator)
    spec = get_estimator(cfg.estimator)
    if cfg.task.family not in FAMILIES:
        bad("task.family", f"one of {list(FAMILIES)}", cfg.task.family)
    if cfg.mode not in MODES:
        bad("mode", f"one of {list(MODES)}", cfg.mode)
    if not 0.0 < cfg.gamma <= 1.0:
        bad("gamma", "in (0, 1]", cfg.gamma)
    if not 0.0 <= cfg.gae_lambda <= 1.0:
        bad("gae_lambda", "in [0, 1]", cfg.gae_lambda)
    if cfg.clip_eps is not None and cfg.clip_eps < 0:
        bad("clip_eps", ">= 0 or null (no clipping)", cfg.clip_eps)
    if cfg.clip_eps_high is not None and cfg.clip_eps_high < 0:
        bad("clip_eps_high", ">= 0 or null", cfg.clip_eps_high)
    if cfg.vf_clip_eps is not None and cfg.vf_clip_eps <= 0:
        bad("vf_clip_eps", "> 0 or null", cfg.vf_clip_eps)
    if cfg.n_steps < 1:
        bad("n_steps", "an integer >= 1", cfg.n_steps)
    if spec.needs_groups and cfg.group_size < 2 and not spec.needs_greedy:
        bad("group_size", f">= 2 for estimator {cfg.estimator}", cfg.group_size)
    if cfg.group_size < 1:
        bad("group_size", "an integer >= 1", cfg.group_size)
    if cfg.population < 1:
        bad("population", "an integer >= 1", cfg.population)
    if cfg["update"] not in POLICY_LOSSES:
        bad("update", f"one of {sorted(POLICY_LOSSES)}", cfg["update"])
    if cfg.epochs < 1:
        bad("epochs", "an integer >= 1", cfg.epochs)
    if cfg.minibatches < 1:
        bad("minibatches", "an integer >= 1", cfg.minibatches)
    if not cfg.lr > 0:
        bad("lr", "> 0", cfg.lr)
    if cfg.normalize_advantages not in NORMALIZE:
        bad("normalize_advantages", f"one of {list(NORMALIZE)}", cfg.normalize_advantages)
    if cfg.loss_agg not in AGG_MODES:
        bad("loss_agg", f"one of {list(AGG_MODES)}", cfg.loss_agg)
    if cfg.kl.estimator not in KL_ESTIMATORS:
        bad("kl.estimator", f"one of {sorted(KL_ESTIMATORS)}", cfg.kl.estimator)
    if cfg.kl.beta < 0:
        bad("kl.beta", ">= 0", cfg.kl.beta)
    if cfg.kl.adaptive and not cfg.kl.kl_target > 0:
        bad("kl.kl_target", "> 0 with kl.adaptive", cfg.kl.kl_target)
    if cfg.ent_coef < 0:
        bad("ent_coef", ">= 0", cfg.ent_coef)
    if cfg.vf_coef < 0:
        bad("vf_coef", ">= 0", cfg.vf_coef)
    if cfg.grad_clip not in ("joint", "per_network"):
        bad("grad_clip", "one of ['joint', 'per_network']", cfg.grad_clip)
    if cfg.max_grad_norm is not None and not cfg.max_grad_norm > 0:
        bad("max_grad_norm", "> 0 or null", cfg.max_grad_norm)
    if cfg.device not in DEVICES:
        bad("device", f"one of {list(DEVICES)}", cfg.device)
    if cfg.threads is not None and cfg.threads < 1:
        bad("threads", ">= 1 or null", cfg.threads)
    if cfg.eval_every < 0:
        bad("eval_every", ">= 0 (0 disables evaluation)", cfg.eval_every)
    if cfg.eval_every_steps is not None and cfg.eval_every_steps < 1:
        bad("eval_every_steps", ">= 1 or null", cfg.eval_every_steps)
    if cfg.eval_episodes < 1:
        bad("eval_episodes", ">= 1", cfg.eval_episodes)
    b = cfg.budget
    if b.iterations is not None and b.iterations < 1:
        bad("budget.iterations", ">= 1 or null", b.iterations)
    if cfg.task.family == "control":
        t = cfg.task
        if not t.env_id:
            bad("task.env_id", "a gymnasium environment id", t.env_id)
        from .tasks.control import env_info

        env_info(t.env_id)  # refuses unknown ids and unsupported spaces, naming them
        for key in ("num_envs", "rollout_steps", "episodes_per_iter"):
            if t[key] < 1:
                bad(f"task.{key}", "an integer >= 1", t[key])
        if spec.needs_groups and t.episodes_per_iter % cfg.group_size:
            bad("task.episodes_per_iter", f"a multiple of group_size={cfg.group_size}",
                t.episodes_per_iter)
        if b.env_steps is None and b.iterations is None and cfg.mode == "train":
            bad("budget.env_steps", "set (or budget.iterations)", None)
        if b.env_steps is not None and cfg.mode == "train":
            per_iter = t.num_envs * t.rollout_steps
            if not spec.full_episodes and b.env_steps < per_iter:
                bad("budget.env_steps",
                    f">= one iteration ({t.num_envs} envs x {t.rollout_steps} steps = {per_iter})",
                    b.env_steps)
            if spec.full_episodes and b.env_steps < t.episodes_per_iter:
                bad("budget.env_steps", f">= one iteration (at least {t.episodes_per_iter} steps)",
                    b.env_steps)
        if len(t.hidden) < 1 or any(h < 1 for h in t.hidden):
            bad("task.hidden", "a non-empty list of positive widths", list(t.hidden))
        if t.activation not in ("tanh", "relu"):
            bad("task.activation", "one of ['relu', 'tanh']", t.activation)
    if cfg.task.family == "lm":
        from .tasks.lm import validate_lm

        validate_lm(cfg)
    if cfg.task.family == "toy":
        from .tasks.toy import validate_toy

        validate_toy(cfg)
    if cfg.mode == "probe":
        from .probes import validate_probe

        validate_probe(cfg)
