"""Typed config schema (Hydra ConfigStore) and the per-field checks: the bottom layer.

The YAML groups under ``harness/conf/`` fill these dataclasses; a typo'd key or a wrong type fails
at composition (OmegaConf struct mode), a value out of range fails in :func:`check_fields`
with the field's name and what is allowed, before a run directory is created.

This module imports nothing from the harness (stdlib, omegaconf and hydra only). Checks that
need a registry (estimators, policy losses) or a task family live above it; the one entry
point that runs them all is :func:`harness.validation.validate`. The task kinds' table
(:data:`TASK_KINDS`: what differs between ``task.family`` values for the schema and the loop)
lives here, the lowest layer, so that every user can look it up; the kinds' functions are
registered by name where they are called (:class:`TaskKind`).
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, open_dict


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
    # Continuous-control switches ("What matters in on-policy RL", Andrychowicz et al. 2021), each at
    # the PPO literature's default (CleanRL ppo_continuous_action, SB3): harness.models.control and
    # harness.tasks.control hold the formulas. Control tasks only.
    log_std: str = "state_independent"  # state_independent: a learned vector | state_dependent: an actor output
    action_bound: str = "clip"  # clip: Gaussian action, clipped at the env | tanh: squashed into the bounds
    ortho_init: bool = True  # orthogonal init (sqrt 2; policy head 0.01, value head 1) | torch.nn.Linear's default
    normalize_obs: bool = False  # running mean/std per member (gymnasium NormalizeObservation)
    normalize_reward: bool = False  # divide by the std of the discounted return (gymnasium NormalizeReward)
    obs_clip: Optional[float] = 10.0  # clip of the *normalised* observation (SB3 clip_obs); null: none
    # A known lower bound on an episode's return (eval_return / episode_return) in this task, or
    # None. Analysis scores a diverged run with it from the divergence on (analysis.stats); it
    # does not change training, so it is not part of the run directory's hash.
    worst_return: Optional[float] = None


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
    # numeric guards on every KL estimate (harness.estimators.kl.kl_estimate), for the frameworks that clamp
    # (OpenRLHF's compute_approx_kl: the value to [-10, 10]); null: no clamp. low_var_kl has verl's own clamps.
    log_ratio_clamp: Optional[float] = None  # |log ref - log pi| clamped to this before the estimator
    value_clamp: Optional[float] = None  # the estimate clamped to [-value_clamp, value_clamp]
    # ReMax with in_reward (LM task): the greedy response's return carries its own KL penalty (true, as every
    # sampled return) or is its reward alone (false: verl's reward_baselines). The toy task's greedy baseline
    # is its reward alone either way.
    greedy_penalty: bool = True


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    estimator: str = MISSING
    seed: int = 0
    population: int = 1
    results_dir: str = "results"
    mode: str = "train"  # train | probe (gradient bias/variance at a frozen policy)
    device: str = "cpu"  # auto | cpu | cuda
    threads: Optional[int] = None  # torch intra-op threads; None: the trainer's default (control: the cores each population worker has)
    population_workers: Optional[int] = None  # processes a population's members are split across; None: control one per core, toy and LM one
    checkpoint_every: int = 0  # iterations between checkpoints (every trainer; resume continues from the last); 0: off
    deterministic: bool = False  # torch deterministic algorithms + cuDNN/cuBLAS settings (GPU bitwise repeatability)
    logger: str = "none"  # none | tensorboard | wandb | mlflow: also send each metric row to that tracker (harness.io.trackers); not hashed
    plugins: list[str] = field(default_factory=list)  # modules imported before validation (harness.plugins); not hashed
    reference: Optional[str] = None  # sb3 | trl: that library's own trainer runs this config (harness.reference); None: the harness
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
    # the knobs of one policy loss alone (delta, clip_ratio_c, sapo_tau_pos, ...) are not listed here: each
    # loss's settings dataclass declares them (harness.losses) and register_configs adds them (LOSS_KNOBS)
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
    group_std_eps: float = 1e-6  # the epsilon added to a group's std (verl 1e-6; TRL 1e-4; OpenRLHF group_norm 1e-9)
    kl: KLConfig = field(default_factory=KLConfig)
    # sampling-side options of the group-sampling tasks (toy, LM; harness.train.sampling)
    dynamic_sampling: bool = False  # DAPO: drop groups whose scores are all equal, draw again (verl filter_groups)
    dynamic_sampling_max_draws: int = 10  # generation batches drawn at most per iteration (verl max_num_gen_batches)
    mask_truncated: bool = False  # TRL mask_truncated_completions: responses without EOS leave the loss
    overlong_cache: Optional[int] = None  # DAPO's soft overlong punishment: its L_cache in tokens; null: off
    lm: Any = None  # the LM task's own node (harness/conf/task/lm_*.yaml)
    toy: Any = None  # the toy task's own node (harness/conf/task/toy.yaml)
    probe: Any = None  # mode=probe settings (harness.probes)


@dataclass
class ProbeSettings:
    """``probe.*``: gradient bias/variance at a frozen policy (``mode=probe``, :mod:`harness.probes`)."""

    batches: Optional[int] = None  # None: 2000 on the toy task, 200 on control tasks
    target: str = "policy_gradient"
    checkpoint: Optional[str] = None
    init_scale: float = 0.0
    init_seed: int = 0
    critic: str = "fitted"
    critic_noise: float = 0.0
    critic_samples: int = 8192
    critic_seed: int = 1
    proposal_shift: float = 0.0
    proposal_seed: int = 2
    negative_control: bool = False
    control_scale: float = 0.5
    arcsin: bool = False  # toy, policy_gradient, binary rewards: also cos(E g, grad sum_x arcsin sqrt p_x) (C25)
    # toy, policy_gradient, no KL: none | reward_std (the truth is grad J / sigma_tok, the population limit
    # of batch whitening of the reward-to-go: REINFORCE++, C24)
    truth_scale: str = "none"
    reps: int = 1000
    store_batches: bool = True
    reference_batches: int = 0  # control: batches of the REINFORCE reference (0: 2 x batches)
    critic_episodes: int = 256  # control: episodes to fit the critic (and as many held out)
    chunk: int = 100  # control: batches collected at once (population members)


PROBE_TARGETS = ("policy_gradient", "importance", "kl")
PROBE_CRITICS = ("fitted", "exact", "noisy")
PROBE_TRUTH_SCALES = ("none", "reward_std")


def settings_from_config(cfg) -> ProbeSettings:
    """``ProbeSettings`` from the optional ``probe`` node (unknown keys refused, naming them)."""
    node = cfg.get("probe") if "probe" in cfg else None
    if not node:
        s = ProbeSettings()
    else:
        known = {f.name for f in fields(ProbeSettings)}
        extra = sorted(set(node.keys()) - known)
        if extra:
            raise ValueError(f"probe has unknown keys {extra}; known: {sorted(known)}")
        for k in node.keys():
            check_probe_type(str(k), node[k])
        s = ProbeSettings(**{k: node[k] for k in node.keys()})
    check_probe_settings(s)
    return s


_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def check_probe_type(name: str, value: Any) -> None:
    """``++probe.<name>=<value>`` bypasses the schema: its type is checked here, by name."""
    check_node_type("probe", ProbeSettings, name, value)


def check_node_type(node: str, schema: type, name: str, value: Any) -> None:
    """``++<node>.<name>=<value>`` bypasses the schema: its type is checked against the field
    ``name`` of the dataclass ``schema`` here, by name."""
    declared = {f.name: str(f.type) for f in fields(schema)}[name]
    optional = declared.startswith("Optional[")
    base = declared[len("Optional["):-1] if optional else declared
    if value is None:
        ok = optional
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ValueError(f"{node}.{name} must be {_KINDS[base]}{' or null' if optional else ''}, got {value!r}")


def check_probe_settings(s: ProbeSettings) -> None:
    """Per-field checks of the probe settings (family-specific ones live in :mod:`harness.probes`)."""
    def bad(name, allowed, value):
        bad_field(f"probe.{name}", allowed, value)

    if s.batches is not None and (s.batches < 4 or s.batches % 2):
        bad("batches", "an even integer >= 4 (or null: the family's default)", s.batches)
    if s.reference_batches < 0:
        bad("reference_batches", ">= 0 (0: twice probe.batches)", s.reference_batches)
    for name, choices in (("target", PROBE_TARGETS), ("critic", PROBE_CRITICS), ("truth_scale", PROBE_TRUTH_SCALES)):
        check_choice(f"probe.{name}", getattr(s, name), choices)
    for name, lowest in (("critic_noise", 0), ("critic_samples", 1), ("reps", 10)):
        if getattr(s, name) < lowest:
            bad(name, f">= {lowest}", getattr(s, name))
    if s.batches is not None and s.batches > COUNT_MAX:
        bad("batches", f"at most {COUNT_MAX} (or null)", s.batches)
    for name in ("critic_samples", "reps", "reference_batches", "critic_episodes", "chunk"):
        value = getattr(s, name)
        if value > COUNT_MAX:
            bad(name, f"at most {COUNT_MAX}", value)
    for name in ("critic_episodes", "chunk"):
        if getattr(s, name) < 1:
            bad(name, ">= 1", getattr(s, name))
    for name in ("init_seed", "critic_seed", "proposal_seed"):
        value = getattr(s, name)
        if not 0 <= value <= SEED_MAX:
            bad(name, f"an integer in [0, {SEED_MAX}]", value)
    for name in ("init_scale", "critic_noise", "proposal_shift", "control_scale"):
        value = getattr(s, name)
        if not is_finite(value):
            bad(name, "a finite number", value)
    if s.checkpoint is not None and "\0" in str(s.checkpoint):
        bad("checkpoint", "a path without NUL characters", s.checkpoint)


@dataclass
class ToySettings:
    """``toy.*`` training settings of the toy task (its shape - vocab, length, prompts, task_seed -
    is :class:`harness.tasks.toy.ToySpec`; the ``toy`` node holds the fields of both)."""

    reward: str = "table"  # table: R(x, y) of the task | random: Bernoulli(1/2) per sequence, independent of y (C26)
    log_prompts: bool = False  # per-prompt columns success_prompt<x>, update_prompt<x> (C28)


TOY_REWARDS = ("table", "random")
TOY_LOG_PROMPTS_MAX = 8  # toy.log_prompts: two columns per prompt, for presets of at most this many prompts


def toy_settings_from_config(cfg) -> ToySettings:
    """``ToySettings`` from the optional ``toy`` node (other keys are the task shape's; the toy
    task refuses keys neither knows), each field's type and value checked by name."""
    node = cfg.get("toy") if "toy" in cfg else None
    known = {f.name for f in fields(ToySettings)}
    given = {str(k): node[k] for k in node.keys() if k in known} if isinstance(node, DictConfig) else {}
    for k, v in given.items():
        check_node_type("toy", ToySettings, k, v)
    s = ToySettings(**given)
    check_choice("toy.reward", s.reward, TOY_REWARDS)
    return s


# ----------------------------------------------------------------------------- task kinds

@dataclass(frozen=True)
class TaskKind:
    """What differs between task kinds (``task.family``) for the schema and the loop, in one entry
    per kind: how its members train, whether it resumes, its settings node and budget. Code never
    branches on the kind's name; it looks the entry up (:func:`task_kind`).

    A kind's functions are registered, by the same name, at the layer that calls them:
    its trainer in :data:`harness.app.TRAINERS`, its checks in :data:`harness.validation.TASK_CHECKS`,
    its probe (if any) in :data:`harness.probes.PROBES`; this schema imports none of them."""

    name: str
    # True: the members train as one batched population (harness.train.workers.train_population,
    # split over population_workers processes); False: one after another (train_one_by_one)
    population: bool
    resumes: bool  # checkpoint_every honoured: the loop's checkpoints, resumed by harness.app.run
    node: str | None = None  # its own settings node (lm.*, toy.*), refused on the other kinds
    budget: str = "env_steps"  # the budget.* field that counts its budget: env_steps | tokens
    control_keys: bool = False  # reads the task.* keys of CONTROL_ONLY (refused off their defaults elsewhere)
    # its training imports torch._dynamo (most of a second: a torch.optim optimizer's step, transformers'
    # import), which the CLI then imports at start-up with the collector paused (harness.__main__.end_startup);
    # False: it does not (control and toy: Adam made and stepped without it, harness.train.update.MemberOptimizer)
    imports_dynamo: bool = True


TASK_KINDS: dict[str, TaskKind] = {k.name: k for k in (
    TaskKind("control", population=True, resumes=True, control_keys=True, imports_dynamo=False),
    TaskKind("lm", population=False, resumes=True, node="lm", budget="tokens"),
    TaskKind("toy", population=True, resumes=True, node="toy", imports_dynamo=False),
)}


def task_kind(name: str) -> TaskKind:
    """The registry entry of ``task.family=name``; ``ValueError`` naming the field and the kinds."""
    if name not in TASK_KINDS:
        bad_field("task.family", f"one of {list(TASK_KINDS)}", name)
    return TASK_KINDS[name]


def member_seeds(cfg: DictConfig) -> list[int]:
    """The seeds of ``cfg``'s population members in order: member i has ``seed + i``."""
    return [int(cfg.seed) + i for i in range(int(cfg.population))]


def member_configs(cfg: DictConfig) -> list[DictConfig]:
    """Population member i is the lone run with seed ``seed + i`` (:func:`member_seeds`; same config otherwise)."""
    out = []
    for seed in member_seeds(cfg):
        m = cfg.copy()
        with open_dict(m):
            m.seed = seed
            m.population = 1
            m.pop("hydra", None)
        out.append(m)
    return out


def first_sentence(fn: Any) -> str:
    """The first sentence of ``fn``'s docstring, on one line: what a registry shows in the docs' tables
    when its entry gives no summary (harness.estimators.register_estimator, harness.losses.register_policy_loss).
    A sentence ends at a full stop followed by a capital or a backquote, or at a reST directive
    (``.. math::``), so ``Schulman et al. 2017``, ``eq. 7`` and ``e.g. Adam`` do not end it."""
    doc = " ".join((getattr(fn, "__doc__", None) or "").split())
    return re.split(r"(?<=\.)(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z`])|\s\.\.\s", doc, maxsplit=1)[0].rstrip(".:, ") if doc else ""


# The knobs a policy loss alone reads (harness.losses: each loss's settings dataclass), name -> (type,
# default): filled by harness.losses.register_policy_loss, so a new loss's knob needs no edit here.
# register_configs adds them to the schema as top-level keys (``clip_ratio_c=4``); harness.io.rundir
# hashes one only when it is not at its default (runs recorded before it existed keep their folders).
LOSS_KNOBS: dict[str, tuple[Any, Any]] = {}


def register_loss_knobs(settings: type, loss: str) -> None:
    """Add the fields of the dataclass ``settings`` (loss ``loss``'s knobs) that :class:`Config` lacks
    to :data:`LOSS_KNOBS`. A knob two losses share must have one type and one default."""
    import types
    import typing

    hints = typing.get_type_hints(settings)
    base = {f.name for f in fields(Config)}
    for f in dataclasses.fields(settings):
        if f.name in base:
            continue
        kind = hints[f.name]
        args = typing.get_args(kind)
        if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
            kind = Optional[next(a for a in args if a is not type(None))] if type(None) in args else kind
        if f.default is dataclasses.MISSING:
            raise ValueError(f"policy loss {loss!r}: its setting {f.name!r} needs a default")
        known = LOSS_KNOBS.get(f.name)
        if known is not None and known != (kind, f.default):
            raise ValueError(f"policy loss {loss!r}: its setting {f.name!r} = {f.default!r} ({kind}) differs from "
                             f"the one another loss registered, {known[1]!r} ({known[0]})")
        LOSS_KNOBS[f.name] = (kind, f.default)


_RUN_SCHEMA_PREFIX = "RunConfig_"


def run_schema() -> type:
    """The schema of a run's config: :class:`Config` with the registered losses' knobs
    (:data:`LOSS_KNOBS`) as top-level keys. One class per set of knobs, an attribute of this
    module (``RunConfig_<hash>``), so that a composed config pickles (an isolated claim point is
    sent to a spawned process) and unpickles in a process that has not built it yet."""
    if not LOSS_KNOBS:
        return Config
    knobs = sorted((name, repr(kind), repr(default)) for name, (kind, default) in LOSS_KNOBS.items())
    name = _RUN_SCHEMA_PREFIX + hashlib.sha1(repr(knobs).encode()).hexdigest()[:12]
    if name not in globals():
        cls = dataclasses.make_dataclass(
            name, [(k, kind, field(default=default)) for k, (kind, default) in LOSS_KNOBS.items()], bases=(Config,))
        cls.__module__ = __name__  # (make_dataclass's module= is Python 3.12's)
        globals()[name] = cls
    return globals()[name]


def __getattr__(name: str) -> type:
    """PEP 562: a ``RunConfig_<hash>`` this process has not built (unpickling a run config sent by
    another process): the schema of the knobs registered here, its fields a superset of
    :class:`Config`'s (what the unpickled config's type is used for)."""
    if name.startswith(_RUN_SCHEMA_PREFIX):
        return run_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_configs() -> None:
    """Store the schema ``base_config`` (:func:`run_schema`). Call it after the losses (and plugins)
    are imported; calling it again stores the schema with the knobs registered since."""
    ConfigStore.instance().store(name="base_config", node=run_schema())


NORMALIZE = ("none", "batch", "minibatch")
GRAD_CLIPS = ("joint", "per_network")  # grad_clip: one norm over actor+critic (SB3, CleanRL) | each network alone
LOG_STD_MODES = ("state_independent", "state_dependent")  # task.log_std (harness.models.control)
ACTION_BOUNDS = ("clip", "tanh")  # task.action_bound (harness.models.control)
# task.* keys only the control family reads, with their defaults (also left out of the run hash at
# these values: harness.io.rundir)
CONTROL_ONLY = {"log_std": "state_independent", "action_bound": "clip", "ortho_init": True,
                "normalize_obs": False, "normalize_reward": False, "obs_clip": 10.0}
MODES = ("train", "probe")
DEVICES = ("auto", "cpu", "cuda")
# logger: where metric rows go besides metrics.parquet (harness.io.trackers.TRACKERS has a class for
# each but none) -> the modules it imports, installed by the extra of the same name (pyproject.toml);
# mlflow's default store is SQLite (SQLAlchemy and alembic; mlflow-skinny does not require them)
LOGGERS = {"none": (), "tensorboard": ("tensorboard",), "wandb": ("wandb",),
           "mlflow": ("mlflow", "sqlalchemy", "alembic")}


def refuse_unknown_keys(cfg: DictConfig, name: str, *schemas: type) -> None:
    """Refuse keys of node ``name`` (``""``: the root) that every dataclass of ``schemas`` lacks."""
    node = cfg if not name else cfg.get(name)
    if not isinstance(node, DictConfig):
        return
    known = {f.name for schema in schemas for f in fields(schema)}
    extra = sorted(str(k) for k in node.keys() if k not in known and not (k == "hydra" and not name))
    if extra:
        where = f"{name}." if name else ""
        raise ValueError(f"{where}{extra[0]} is not a known setting (known keys{' of ' + name if name else ''}: "
                         f"{sorted(known)})")


@dataclass
class Recorded:
    """Keys a run's config records beside its settings, added after composing and only when set,
    so a config without them writes and hashes as before: ``recipe``, the framework recipe the
    settings came from (``harness.app.record_recipe``; not hashed, ``harness.io.rundir``)."""
    recipe: Optional[str] = None


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse keys the schema does not know (``+foo=1`` adds one past struct mode)."""
    for name, schemas in (("", (run_schema(), Recorded)), ("task", (TaskConfig,)), ("budget", (BudgetConfig,)),
                          ("kl", (KLConfig,))):
        refuse_unknown_keys(cfg, name, *schemas)


# Sane upper bounds: beyond them a value is a typo, and it would crash or hang
# (a 64-bit seed overflows the generators; 100000 threads segfault; population=10000 makes
# 10,000 run directories).
SEED_MAX = 2**32 - 1  # numpy's and gymnasium's seeds are 32-bit
POPULATION_MAX = 4096
COUNT_MAX = 2**31 - 1  # iterations, epochs, envs, widths...: what torch and numpy index with
BUDGET_MAX = 2**53  # env steps / tokens: exact as a float
NAME_MAX = 100  # task.name: one folder of the run directory's path


def threads_max() -> int:
    """``threads`` above this is a typo (four per core; at least 16)."""
    return max(16, 4 * (os.cpu_count() or 1))


PARAM_BYTES = 16  # a trained float32 parameter: its weight, its gradient and Adam's two moments
GIB = 2**30


def memory_bytes() -> int:
    """What this machine can hold: its physical memory, or its cgroup's limit when lower (a
    container's). The size checks (:func:`check_fits`) refuse a config whose least memory does
    not fit in it, before any work starts, instead of dying in the allocator mid-run."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            return min(total, int(f.read().strip()))
    except (OSError, ValueError):  # no cgroup v2 limit ("max", or not mounted)
        return total


def largest_fitting(need, value: int, budget: int) -> int:
    """The largest ``v`` in ``[0, value]`` with ``need(v) <= budget``, for a ``need`` that grows
    with ``v`` (a binary search: ``need`` is a formula, never an allocation)."""
    lo, hi = 0, value
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(sizes: dict[str, tuple[int, int]], need, what: str, budget: int | None = None) -> None:
    """Refuse sizes whose memory exceeds :func:`memory_bytes` (or ``budget``), naming one field.

    ``sizes`` maps each field to ``(value, lowest allowed)``; ``need(values)`` is at least the
    bytes a run holds at once with those values (``what`` says of what), growing with each. The
    field named is the one that, alone set to its lowest, shrinks ``need`` the most (the one at
    fault), with the largest value that fits, the others as given."""
    budget = memory_bytes() if budget is None else budget
    values = {name: value for name, (value, _) in sizes.items()}
    total = need(values)
    if total <= budget:
        return
    name = max(sizes, key=lambda n: total / max(need({**values, n: sizes[n][1]}), 1))
    most = largest_fitting(lambda v: need({**values, name: v}), values[name], budget)
    others = ", ".join(f"{n}={v}" for n, v in values.items() if n != name)
    bad_field(name, f"at most {most} here{' with ' + others if others else ''} ({what} need at least "
              f"{total / GIB:.3g} GiB at this value; this machine holds {budget / GIB:.3g} GiB)", values[name])


def expand_path(value: Any) -> str:
    """The one rule for a path in a config (``results_dir``; the LM paths follow it too): a
    leading ``~`` is the user's home (:func:`os.path.expanduser`), nothing else is expanded."""
    return os.path.expanduser(str(value))


def results_path(cfg: Any) -> str:
    """``cfg.results_dir`` as a path on disk (:func:`expand_path`); every place that turns
    results_dir into a path uses this."""
    return expand_path(cfg.results_dir)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one folder inside results_dir, or None."""
    if not name.strip():
        return "blank"
    if name.startswith("."):
        return "starts with '.' (hidden, or a step out of results_dir)"
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad:
        return f"contains {bad[0]!r}"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    if len(name) > NAME_MAX:
        return f"{len(name)} characters long (at most {NAME_MAX})"
    return None


def path_problem(path: str, writable: bool = False, below: str | None = None) -> str | None:
    """Why ``path`` (a results_dir) cannot hold run directories, or None: it must be a
    directory or creatable as one; with ``writable`` an existing one must take new folders too
    (the command line always writes Hydra's job folder there; in-process, a read-only folder of
    finished runs is fine: each run that needs writing says so itself). ``below``: a folder
    inside ``path`` that will be created too (Hydra's job folder), checked the same way.

    The whole path is checked, every component, not only the nearest existing parent: no name
    longer than the file system takes (``NAME_MAX``, 255 bytes on most) nor a path longer than
    ``PATH_MAX``; an existing component must be a directory (a symlink to one is fine; a dangling
    symlink or a symlink loop is named). Checked without leaving anything: a temporary folder is
    made in the nearest existing ancestor and removed at once."""
    import errno
    import stat
    import tempfile

    if "\0" in path or (below is not None and "\0" in below):
        return "it contains a NUL character"
    p = os.path.abspath(path)
    target = os.path.normpath(os.path.join(p, below)) if below else p
    parts = target.split(os.sep)[1:]
    ancestor, current = os.sep, os.sep
    for i, name in enumerate(parts):
        current = os.path.join(current, name)
        try:
            st = os.stat(current)
        except FileNotFoundError:
            if os.path.islink(current):
                return f"{current} is a dangling symlink (to {os.readlink(current)})"
            break  # this one and the rest are created
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{current} is a symlink loop"
            if exc.errno == errno.ENAMETOOLONG:
                break  # named below with the limit
            return f"{current}: {exc.strerror or exc}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{current} exists and is not a directory"
        ancestor = current
    problem = length_problem(target, ancestor)
    if problem or (not writable and (ancestor == target or os.path.isdir(p))):
        return problem
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".harness-write-test-", dir=ancestor))
    except OSError as exc:
        return f"cannot create folders in {ancestor} ({exc.strerror or exc})"
    return None


def connect_problem(host: str, port: int, timeout_s: float, name: str | None = None) -> str | None:
    """Why no TCP connection to ``host:port`` opens within ``timeout_s`` seconds (refused,
    unreachable, unresolvable, timed out), or None: the one probe of a server the harness would
    otherwise wait on after its folders exist (a tracker's database, a Ray cluster). ``name``:
    how the message writes the address (default ``host:port``)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"no connection to {name or f'{host}:{port}'} within {timeout_s:g} s: {exc.strerror or exc}"
    return None


def length_problem(path: str, where: str | None = None) -> str | None:
    """Why the absolute ``path`` is too long for the file system it would be made on, or None:
    a name over its ``NAME_MAX`` (255 bytes on most) or the whole over ``PATH_MAX``. ``where``:
    an existing folder on that file system (default: the nearest existing ancestor)."""
    if where is None:
        where = path
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
    name_max = _pathconf(where, "PC_NAME_MAX", 255)
    for name in path.split(os.sep):
        if len(os.fsencode(name)) > name_max:
            return f"the folder name {name[:20]}... is {len(os.fsencode(name))} bytes long (at most {name_max})"
    path_max = _pathconf(where, "PC_PATH_MAX", 4096)
    if len(os.fsencode(path)) >= path_max:
        return f"the path ...{path[-48:]} is {len(os.fsencode(path))} bytes long (at most {path_max - 1})"
    return None


def _pathconf(path: str, name: str, default: int) -> int:
    """``os.pathconf(path, name)``, or ``default`` where the system does not say."""
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError, AttributeError):
        return default
    return value if value and value > 0 else default


#: errno of a write the file system cannot take: no space left on the device, the user's quota used up
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def os_problem(exc: OSError) -> str:
    """One line for an OS error on a path: the path and what went wrong."""
    where = exc.filename if exc.filename is not None else "?"
    return f"{where}: {exc.strerror or exc}"


def error_line(exc: Exception) -> str:
    """An error's message as one line: an OmegaConf error (an unresolvable interpolation such as
    ``${oc.env:UNSET}``) as ``<key>: <its first line>``, without the ``full_key``/``object_type``
    lines OmegaConf appends; any other message's lines joined with ``; ``."""
    from omegaconf.errors import OmegaConfBaseException

    text = str(exc)
    if isinstance(exc, OmegaConfBaseException):
        first = (str(getattr(exc, "msg", None) or text).strip().splitlines() or [""])[0]
        key = getattr(exc, "full_key", None)
        return f"{key}: {first}" if key else first
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def bad_field(field_name: str, allowed: str, value: Any) -> None:
    raise ValueError(f"{field_name} must be {allowed}, got {value!r}")


def check_choice(field_name: str, value: Any, choices) -> None:
    """``value`` must be one of ``choices``: else :func:`bad_field` with ``one of [...]``."""
    if value not in choices:
        bad_field(field_name, f"one of {list(choices)}", value)


def is_finite(x: Any) -> bool:
    return x is not None and math.isfinite(x)


def check_fields(cfg: DictConfig) -> None:
    """Raise ``ValueError`` naming the first field out of range and what it allows.

    Only checks that need the schema alone, in named groups; :func:`harness.validation.validate`
    runs these with the registry, task-family and probe checks."""
    kind = task_kind(cfg.task.family)
    check_choice("mode", cfg.mode, MODES)
    _check_nodes(cfg, kind)
    _check_names(cfg)
    _check_seeds(cfg)
    _check_update(cfg)
    _check_run(cfg, kind)
    _check_budget(cfg, kind)
    _check_task(cfg, kind)
    check_bounds(cfg)


def _check_nodes(cfg: DictConfig, kind: TaskKind) -> None:
    """A task kind's own settings node (``lm.*``, ``toy.*``) is unset on the other kinds."""
    bad = bad_field
    family = kind.name
    for owner in TASK_KINDS.values():  # task-specific nodes on another family
        node = owner.node
        if node is not None and owner is not kind and cfg.get(node) is not None:
            keys = list(cfg[node].keys()) if isinstance(cfg[node], DictConfig) else []
            bad(f"{node}.{keys[0]}" if keys else node,
                f"unset for task.family={family} (the {node}.* settings belong to task.family={owner.name})",
                cfg[node][keys[0]] if keys else cfg[node])
    # probe.* settings with mode=train are allowed and inert: one sweep may cover both modes
    # (harness/conf/experiment/claim_c20.yaml sweeps mode=probe,train with ++probe.batches)


def _check_names(cfg: DictConfig) -> None:
    """``task.name`` names a folder; ``results_dir`` is a path."""
    bad = bad_field
    if not str(cfg.task.name) or "/" in str(cfg.task.name):
        bad("task.name", "a non-empty name without '/' (it names the run directory's folder)", cfg.task.name)
    problem = name_problem(str(cfg.task.name))
    if problem:
        bad("task.name", f"a folder name inside results_dir: not empty, not starting with '.', without '/', "
            f"'\\', NUL or control characters, at most {NAME_MAX} characters (this one {problem})",
            cfg.task.name)
    if not str(cfg.results_dir).strip():
        bad("results_dir", "a non-empty path", cfg.results_dir)
    if "\0" in str(cfg.results_dir):
        bad("results_dir", "a path without NUL characters", cfg.results_dir)


def _check_seeds(cfg: DictConfig) -> None:
    """``seed`` and ``population``: every member's seed ``seed + i`` is a 32-bit seed."""
    bad = bad_field
    if cfg.seed < 0:
        bad("seed", "an integer >= 0", cfg.seed)
    if cfg.seed > SEED_MAX:
        bad("seed", f"an integer in [0, {SEED_MAX}] (2**32 - 1)", cfg.seed)
    if cfg.population > POPULATION_MAX:
        bad("population", f"an integer in [1, {POPULATION_MAX}]", cfg.population)
    if cfg.population >= 1 and cfg.seed + cfg.population - 1 > SEED_MAX:
        bad("seed", f"at most {SEED_MAX} - (population - 1) = {SEED_MAX - cfg.population + 1} "
            f"(member i runs with seed + i)", cfg.seed)


def _check_update(cfg: DictConfig) -> None:
    """The estimator's and the update's numbers: discounting, sizes, step size, KL, clipping."""
    bad, finite = bad_field, is_finite
    if not 0.0 < cfg.gamma <= 1.0:
        bad("gamma", "in (0, 1]", cfg.gamma)
    if not 0.0 <= cfg.gae_lambda <= 1.0:
        bad("gae_lambda", "in [0, 1]", cfg.gae_lambda)
    if cfg.dynamic_sampling_max_draws < 1:
        bad("dynamic_sampling_max_draws", ">= 1 (generation batches per iteration)", cfg.dynamic_sampling_max_draws)
    if cfg.overlong_cache is not None and cfg.overlong_cache < 1:
        bad("overlong_cache", "a number of tokens >= 1 (and at most the maximal response length), or null (off)",
            cfg.overlong_cache)
    if cfg.vf_clip_eps is not None and not (finite(cfg.vf_clip_eps) and cfg.vf_clip_eps > 0):
        bad("vf_clip_eps", "> 0 or null", cfg.vf_clip_eps)
    for name in ("n_steps", "group_size", "population", "epochs", "minibatches"):
        if cfg[name] < 1:
            bad(name, "an integer >= 1", cfg[name])
    if not (finite(cfg.lr) and cfg.lr > 0):
        bad("lr", "a finite number > 0", cfg.lr)
    check_choice("normalize_advantages", cfg.normalize_advantages, NORMALIZE)
    if not (finite(cfg.kl.beta) and cfg.kl.beta >= 0):
        bad("kl.beta", "a finite number >= 0", cfg.kl.beta)
    if cfg.kl.adaptive and not (finite(cfg.kl.kl_target) and cfg.kl.kl_target > 0):
        bad("kl.kl_target", "> 0 with kl.adaptive", cfg.kl.kl_target)
    check_choice("kl.target", cfg.kl.target, ("old", "ref"))
    for name in ("log_ratio_clamp", "value_clamp"):
        value = cfg.kl.get(name)
        if value is not None and not (finite(value) and value > 0):
            bad(f"kl.{name}", "a finite number > 0 or null (no clamp)", value)
        if value is not None and cfg.mode == "probe":
            bad(f"kl.{name}", "null with mode=probe (the probes' KL terms have no clamps)", value)
    if not isinstance(cfg.kl.get("greedy_penalty", True), bool):
        bad("kl.greedy_penalty", "true or false", cfg.kl.get("greedy_penalty"))
    if not (finite(cfg.group_std_eps) and cfg.group_std_eps > 0):
        bad("group_std_eps", "a finite number > 0", cfg.group_std_eps)
    if not (finite(cfg.ent_coef) and cfg.ent_coef >= 0):
        bad("ent_coef", "a finite number >= 0", cfg.ent_coef)
    if not (finite(cfg.vf_coef) and cfg.vf_coef >= 0):
        bad("vf_coef", "a finite number >= 0", cfg.vf_coef)
    check_choice("grad_clip", cfg.grad_clip, GRAD_CLIPS)
    if cfg.max_grad_norm is not None and not cfg.max_grad_norm > 0:
        bad("max_grad_norm", "> 0 or null", cfg.max_grad_norm)


def _check_run(cfg: DictConfig, kind: TaskKind) -> None:
    """How a run runs: device, threads, checkpoints, determinism, logger, evaluation."""
    bad = bad_field
    family = kind.name
    check_choice("device", cfg.device, DEVICES)
    if cfg.threads is not None and cfg.threads < 1:
        bad("threads", ">= 1 or null", cfg.threads)
    if cfg.population_workers is not None and cfg.population_workers < 1:
        bad("population_workers", ">= 1 or null", cfg.population_workers)
    ck = cfg.get("checkpoint_every", 0)
    if not isinstance(ck, int) or isinstance(ck, bool) or ck < 0:
        bad("checkpoint_every", "an integer >= 0 (iterations; 0 disables checkpoints)", ck)
    if ck and not kind.resumes and cfg.mode == "train":
        resuming = [k.name for k in TASK_KINDS.values() if k.resumes]
        bad("checkpoint_every", f"0 for task.family={family} (only the task families {'|'.join(resuming)} "
            "checkpoint)", ck)
    if not isinstance(cfg.get("deterministic", False), bool):
        bad("deterministic", "true or false", cfg.get("deterministic"))
    check_logger(cfg.get("logger", "none"))
    if cfg.eval_every < 0:
        bad("eval_every", ">= 0 (0 disables evaluation)", cfg.eval_every)
    if cfg.eval_every_steps is not None and cfg.eval_every_steps < 1:
        bad("eval_every_steps", ">= 1 or null", cfg.eval_every_steps)
    if cfg.eval_episodes < 1:
        bad("eval_episodes", ">= 1", cfg.eval_episodes)


def _check_budget(cfg: DictConfig, kind: TaskKind) -> None:
    """``budget.*``: positive, and counted in the task kind's own unit."""
    bad = bad_field
    family = kind.name
    b = cfg.budget
    if b.iterations is not None and b.iterations < 1:
        bad("budget.iterations", ">= 1 or null", b.iterations)
    if b.env_steps is not None and b.env_steps < 1:
        bad("budget.env_steps", ">= 1 or null", b.env_steps)
    if b.tokens is not None and b.tokens < 1:
        bad("budget.tokens", ">= 1 or null", b.tokens)
    if kind.budget != "tokens" and b.tokens is not None:  # it would be ignored: the run would use env_steps
        bad("budget.tokens", f"null for task.family={family} (it counts LM response tokens; "
            "set budget.env_steps or budget.iterations)", b.tokens)
    if kind.budget == "tokens" and b.env_steps is not None:
        bad("budget.env_steps", f"null for task.family={family} (its budget is budget.tokens)", b.env_steps)


def _check_task(cfg: DictConfig, kind: TaskKind) -> None:
    """``task.*``: episode limit, policy switches, observation clip, control-only keys."""
    bad, finite = bad_field, is_finite
    family = kind.name
    if cfg.task.max_episode_steps is not None and cfg.task.max_episode_steps < 1:
        bad("task.max_episode_steps", ">= 1 or null (the environment's own limit)", cfg.task.max_episode_steps)
    t = cfg.task
    check_choice("task.log_std", t.log_std, LOG_STD_MODES)
    check_choice("task.action_bound", t.action_bound, ACTION_BOUNDS)
    if t.obs_clip is not None and not (finite(t.obs_clip) and t.obs_clip > 0):
        bad("task.obs_clip", "a finite number > 0 or null (no clip)", t.obs_clip)
    if not t.normalize_obs and t.obs_clip != TaskConfig.obs_clip:  # it would be silently ignored
        bad("task.obs_clip", f"{TaskConfig.obs_clip} (the default) unless task.normalize_obs=true (it clips the "
            "normalised observation)", t.obs_clip)
    if not kind.control_keys:
        for key, default in CONTROL_ONLY.items():
            if t[key] != default:
                bad(f"task.{key}", f"{default!r} (the default) for task.family={family} (a control-task setting)",
                    t[key])


def check_logger(value: Any) -> None:
    """``logger`` is one of :data:`LOGGERS`, and only where the modules it needs import (checked
    here, before any run starts, not at the first metric row)."""
    if not isinstance(value, str) or value not in LOGGERS:
        bad_field("logger", f"one of {list(LOGGERS)}", value)
    import importlib.util

    missing = [m for m in LOGGERS[value] if importlib.util.find_spec(m) is None]
    if missing:
        bad_field("logger", f"'none' here: logger={value} needs the {' and '.join(missing)} package"
                  f"{'s' if len(missing) > 1 else ''} (pip install -c constraints.txt -e \".[{value}]\")", value)


def check_bounds(cfg: DictConfig) -> None:
    """Upper bounds and finiteness the lower-bound checks above leave open: a value
    past them is a typo that would overflow, hang or silently mean something else."""
    bad, finite = bad_field, is_finite
    counts = {"n_steps": cfg.n_steps, "group_size": cfg.group_size, "epochs": cfg.epochs,
              "minibatches": cfg.minibatches, "eval_every": cfg.eval_every,
              "eval_every_steps": cfg.eval_every_steps, "eval_episodes": cfg.eval_episodes,
              "checkpoint_every": cfg.get("checkpoint_every", 0), "budget.iterations": cfg.budget.iterations,
              "task.num_envs": cfg.task.num_envs, "task.rollout_steps": cfg.task.rollout_steps,
              "task.episodes_per_iter": cfg.task.episodes_per_iter,
              "task.max_episode_steps": cfg.task.max_episode_steps}
    for name, value in counts.items():
        if value is not None and value > COUNT_MAX:
            bad(name, f"at most {COUNT_MAX} (2**31 - 1)", value)
    for name in ("env_steps", "tokens"):
        value = cfg.budget[name]
        if value is not None and value > BUDGET_MAX:
            bad(f"budget.{name}", f"at most {BUDGET_MAX} (2**53) or null", value)
    if cfg.threads is not None and cfg.threads > threads_max():
        bad("threads", f"in [1, {threads_max()}] (4 per core of this machine) or null", cfg.threads)
    if cfg.population_workers is not None and cfg.population_workers > threads_max():
        bad("population_workers", f"in [1, {threads_max()}] (4 per core of this machine) or null",
            cfg.population_workers)
    if cfg.max_grad_norm is not None and not finite(cfg.max_grad_norm):
        bad("max_grad_norm", "a finite number > 0 or null (no clipping)", cfg.max_grad_norm)
    if not finite(cfg.kl.kl_target):
        bad("kl.kl_target", "a finite number", cfg.kl.kl_target)
    if not finite(cfg.task.init_log_std):
        bad("task.init_log_std", "a finite number", cfg.task.init_log_std)
    if cfg.task.get("worst_return") is not None and not finite(cfg.task.worst_return):
        bad("task.worst_return", "a finite number or null (unknown)", cfg.task.worst_return)
    hidden = cfg.task.hidden
    if hidden is not None and any(h > COUNT_MAX for h in hidden):
        bad("task.hidden", f"widths of at most {COUNT_MAX}", list(hidden))
