"""Estimator presets by name, all behind one signature.

An estimator is a pure function over tensors, registered by name with :func:`register_estimator`;
its parameter names say what it needs (:data:`INPUTS`): ``scores`` (``[n_groups, group_size]``
episode returns: a group estimator, whole episodes), ``lengths``, ``greedy_scores`` (a greedy
rollout), ``rewards``/``terminated``/``truncated``/``mask`` (step-level), ``values``/``next_values``
(a critic) and the knobs ``gamma``, ``lam``/``gae_lambda``, ``n``/``n_steps``, ``std_normalize``,
``eps``. The registry builds the :class:`EstimatorSpec` from them: what the batch must carry
(``needs_critic``, ``needs_groups``, ``needs_greedy``, ``full_episodes``) and the call
``spec(batch, params)``: no adapter is written by hand. A trainer looks a preset up with
:func:`get_estimator` and never branches on the name (verl's ``core_algos`` registers by name but
its caller still branches on it; we don't).

Every call is checked where the function's output enters (:meth:`EstimatorSpec.__call__`, and a
group function's rows before they are spread over the steps): ``[T, B]`` tensors of the rewards'
dtype and device, the critic targets too when it reads a critic. A result that breaks it, or a
function that raises, is a :class:`ContractError` naming the estimator and its module;
:meth:`EstimatorSpec.trial` makes one such call on a small synthetic batch, which validation runs
before any run folder exists. The checks compare attributes only: no copy, no device sync.

Normalisation, clipping and loss aggregation are *not* done here: they are separate config
axes applied by the trainer, so an ablation cannot silently credit whitening to GAE. A
preset's defaults for those axes (``update``, ``epochs``, whitening, ``loss_agg``, ...) live
in its Hydra file ``harness/conf/estimator/<name>.yaml`` and nowhere else, e.g. ``reinforce_pp.yaml``
sets batch whitening and ``dr_grpo.yaml`` the token-sum aggregation. Adding an estimator is
its function under ``@register_estimator("name")`` and that one YAML file.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NoReturn

import torch

from ..config import bad_field, error_line, first_sentence, name_problem
from . import group as _group
from . import returns as _returns


@dataclass
class AdvantageBatch:
    """What every estimator receives; time-major ``[T, B]``.

    ``mask[t, b]`` is 1 on steps that belong to a trajectory (0 on padding after an
    episode ended, for estimators that collect whole episodes). For group estimators the
    ``B`` columns are ``n_groups * group_size`` whole episodes laid out group-major
    (column ``g * group_size + j`` is member ``j`` of group ``g``), one episode per column.
    ``values``/``next_values`` are present when the spec needs a critic; ``greedy_scores``
    ``[n_groups]`` when it needs a greedy rollout.

    ``members``: the ``B`` columns are that many independent population members side by side,
    member-major, in equal blocks (a control population, or a probe's batches). An estimator
    with a batch-wide statistic (``gpg``'s alpha) computes it per block, so members never share
    statistics; the loop sets it from the source's ``P``.
    """

    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    mask: torch.Tensor | None = None
    values: torch.Tensor | None = None
    next_values: torch.Tensor | None = None
    greedy_scores: torch.Tensor | None = None
    group_size: int | None = None
    members: int = 1


@dataclass
class EstimatorParams:
    gamma: float = 0.99
    gae_lambda: float = 0.95
    n_steps: int = 5
    std_normalize: bool = True
    group_eps: float = 1e-6

    @classmethod
    def from_cfg(cls, cfg) -> "EstimatorParams":
        """The estimator knobs of a run's config (``gamma, gae_lambda, n_steps, std_normalize, group_std_eps``)."""
        return cls(gamma=float(cfg.gamma), gae_lambda=float(cfg.gae_lambda), n_steps=int(cfg.n_steps),
                   std_normalize=bool(cfg.std_normalize), group_eps=float(cfg.get("group_std_eps", 1e-6)))


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [T, B]
    returns: torch.Tensor | None  # [T, B] critic targets, None without a critic


EstimatorFn = Callable[[AdvantageBatch, EstimatorParams], AdvantageResult]


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    fn: EstimatorFn
    needs_critic: bool
    needs_groups: bool = False
    needs_greedy: bool = False
    full_episodes: bool = False  # Monte Carlo: collect whole episodes, no bootstrap
    summary: str = ""  # one line for the tables of README and docs (register_estimator: the docstring's first sentence)

    def __call__(self, batch: AdvantageBatch, params: EstimatorParams) -> AdvantageResult:
        if self.needs_critic and (batch.values is None or batch.next_values is None):
            raise ValueError(f"estimator {self.name!r} needs batch.values and batch.next_values")
        if self.needs_groups and not batch.group_size:
            raise ValueError(f"estimator {self.name!r} needs batch.group_size")
        if self.needs_greedy and batch.greedy_scores is None:
            raise ValueError(f"estimator {self.name!r} needs batch.greedy_scores")
        out = called("estimator", self.name, self.fn, batch, params)
        r = batch.rewards
        # what was expected, built only for a message
        want = lambda: f"[T, B] = {tuple(r.shape)} tensors, {r.dtype} on {r.device} (like rewards)"  # noqa: E731
        if not isinstance(out, AdvantageResult):
            raise contract_error("estimator", self.name, self.fn, f"returned {described(out)}; expected an "
                                 f"AdvantageResult of {want()}")
        if tensor_mismatch(out.advantages, r.shape, r.dtype, r.device):
            raise contract_error("estimator", self.name, self.fn,
                                 f"returned advantages: {described(out.advantages)}; expected {want()}")
        if (out.returns is None and self.needs_critic) or \
                (out.returns is not None and tensor_mismatch(out.returns, r.shape, r.dtype, r.device)):
            raise contract_error("estimator", self.name, self.fn, f"returned critic targets: {described(out.returns)}; "
                                 f"expected {want()}{' (it reads a critic)' if self.needs_critic else ' or None'}")
        return out

    def trial(self, params: EstimatorParams, group_size: int | None = None) -> None:
        """One call on a small synthetic batch, checked as every call is: ``T = 3`` steps of 2 groups
        of ``group_size`` columns (4 columns without groups), random rewards and values, each column
        one whole episode. Validation runs it before any run folder exists, so a function that breaks
        its contract is refused with exit 2; the global RNG is restored after it, so a function that
        draws leaves the run's draws as they were."""
        g = torch.Generator().manual_seed(0)
        k = int(group_size or 2) if self.needs_groups else None
        steps, cols = 3, 2 * k if k else 4
        rand = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
        done = torch.zeros(steps, cols)
        done[-1] = 1.0
        batch = AdvantageBatch(rand(steps, cols), done, torch.zeros(steps, cols), torch.ones(steps, cols),
                               values=rand(steps, cols) if self.needs_critic else None,
                               next_values=rand(steps, cols) if self.needs_critic else None,
                               greedy_scores=rand(2) if self.needs_greedy else None, group_size=k)
        with torch.random.fork_rng(devices=[]):
            self(batch, params)


ESTIMATORS: dict[str, EstimatorSpec] = {}


class ContractError(ValueError):
    """A registered estimator's or policy loss's function returned what its contract rules out (a
    list, another shape, dtype or device) or raised; the message names it, its module and what was
    expected. A ``ValueError``: met in the trial call of validation it refuses the config (exit 2);
    met in a run it fails that run, with the message as its reason."""


def contract_error(kind: str, name: str, fn: Callable, problem: str) -> ContractError:
    """``<kind> '<name>' (module <fn's module>) <problem>``: the one message of a broken contract."""
    return ContractError(f"{kind} {name!r} (module {getattr(fn, '__module__', None)}) {problem}")


def called(kind: str, name: str, fn: Callable, *args: Any) -> Any:
    """``fn(*args)``; an exception it raises becomes a :class:`ContractError` naming the function
    (its own message kept, the original chained for the traceback)."""
    try:
        return fn(*args)
    except ContractError:
        raise
    except Exception as exc:
        raise contract_error(kind, name, fn, f"raised {type(exc).__name__}: {error_line(exc)}") from exc


def described(x: Any) -> str:
    """What ``x`` is, for a broken contract's message: a tensor's shape, dtype and device, else its type."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}, {x.dtype} on {x.device}"
    return "None" if x is None else f"an object of type {type(x).__name__}"


def tensor_mismatch(x: Any, shape: tuple[int, ...], dtype: torch.dtype | None, device: torch.device) -> bool:
    """Whether ``x`` is not a tensor of ``shape`` and ``dtype`` (None: any floating dtype) on ``device``;
    attributes only (no copy, no sync)."""
    return not isinstance(x, torch.Tensor) or x.shape != shape or x.device != device or \
        (x.dtype != dtype if dtype is not None else not x.is_floating_point())


def register(spec: EstimatorSpec) -> EstimatorSpec:
    """Add ``spec`` to the registry. Its name becomes a folder of every run's path
    (:func:`harness.io.rundir.run_dir_for`), so it must be one folder name inside results_dir
    (:func:`harness.config.name_problem`): a plugin's ``../x`` would write outside it."""
    problem = name_problem(spec.name) if isinstance(spec.name, str) else "not a string"
    if problem:
        raise ValueError(f"estimator name {spec.name!r}: {problem}; allowed: one folder name (no '/', '\\', "
                         "leading '.' or control characters)")
    if spec.name in ESTIMATORS:
        raise ValueError(f"estimator {spec.name!r} is already registered")
    ESTIMATORS[spec.name] = spec
    return spec


def refuse_unknown(field_name: str, registered: Iterable[str], value: Any, what: str) -> NoReturn:
    """``value`` names nothing registered: :func:`harness.config.bad_field` listing the ``registered``
    names, and the config key that imports a user's module registering its own ``what``
    (:mod:`harness.plugins`). The one message of the estimator and policy loss registries."""
    bad_field(field_name, f"one of {sorted(registered)} (a plugin's {what}: plugins=[your.module])", value)


def estimator_names() -> list[str]:
    """Every registered estimator name, in registration order (stable): what tests,
    benchmarks and validation enumerate instead of keeping their own list."""
    return list(ESTIMATORS)


def get_estimator(name: str) -> EstimatorSpec:
    """The estimator registered as ``name``; another name is refused, listing the registered ones
    and ``plugins=``, which imports a user's module that registers its own."""
    if name not in ESTIMATORS:
        refuse_unknown("estimator", ESTIMATORS, name, "estimator")
    return ESTIMATORS[name]


# ---------------------------------------------------------------------------------------
# What an estimator function's parameters may name. Scores of whole-episode estimators are
# undiscounted episode returns R_i = sum_t r_t over the trajectory (docs/design.md, Estimators).


def episode_scores(batch: AdvantageBatch) -> torch.Tensor:
    """``R_i = sum_t mask * r_t`` per column, shaped ``[n_groups, group_size]``."""
    mask = batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)
    totals = (batch.rewards * mask).sum(dim=0)
    return totals.view(-1, batch.group_size)


def episode_lengths(batch: AdvantageBatch) -> torch.Tensor:
    """``l_i = sum_t mask``: unmasked steps (tokens) per column, ``[n_groups, group_size]``."""
    mask = batch.mask if batch.mask is not None else torch.ones_like(batch.rewards)
    return mask.sum(dim=0).view(-1, batch.group_size)


# group-level inputs (one row per group): the function returns [n_groups, group_size] advantages,
# the same for every step of an episode
GROUP_INPUTS: dict[str, Callable[[AdvantageBatch], torch.Tensor]] = {
    "scores": episode_scores,
    "lengths": episode_lengths,
    "greedy_scores": lambda b: b.greedy_scores,
}
# step-level inputs ([T, B]): the function returns the advantages, or (advantages, critic targets)
STEP_INPUTS: dict[str, Callable[[AdvantageBatch], torch.Tensor]] = {
    "rewards": lambda b: b.rewards,
    "terminated": lambda b: b.terminated,
    "truncated": lambda b: b.truncated,
    "mask": lambda b: b.mask if b.mask is not None else torch.ones_like(b.rewards),
    "values": lambda b: b.values,
    "next_values": lambda b: b.next_values,
}
# knobs, from the run's config (EstimatorParams)
KNOB_INPUTS: dict[str, Callable[[EstimatorParams], Any]] = {
    "gamma": lambda p: p.gamma,
    "lam": lambda p: p.gae_lambda,
    "gae_lambda": lambda p: p.gae_lambda,
    "n": lambda p: p.n_steps,
    "n_steps": lambda p: p.n_steps,
    "std_normalize": lambda p: p.std_normalize,
    "eps": lambda p: p.group_eps,
}
INPUTS = (*GROUP_INPUTS, *STEP_INPUTS, *KNOB_INPUTS)


def _per_member(fn, inputs: dict[str, torch.Tensor], members: int) -> torch.Tensor:
    """``fn`` on each member's block of groups (rows of every group input, member-major)."""
    if members <= 1:
        return fn(**inputs)
    rows = next(iter(inputs.values())).shape[0]
    if rows % members:
        raise ValueError(f"{rows} groups do not split into members={members} equal blocks")
    blocks = {k: v.chunk(members, dim=0) for k, v in inputs.items()}
    return torch.cat([fn(**{k: v[i] for k, v in blocks.items()}) for i in range(members)], dim=0)


def _broadcast(per_traj: torch.Tensor, batch: AdvantageBatch) -> torch.Tensor:
    adv = per_traj.reshape(1, -1).expand_as(batch.rewards)
    return adv * batch.mask if batch.mask is not None else adv.clone()


def register_estimator(name: str, fn: Callable | None = None, *, full_episodes: bool = False,
                       per_member: bool = False, summary: str | None = None, **fixed: Any):
    """Register the pure function ``fn`` as estimator ``name``; usable as a decorator,
    ``@register_estimator("median_baseline")``, or a call; returns ``fn``.

    ``fn``'s parameters are named from :data:`INPUTS` (a parameter with a default that is not
    there keeps its default; ``fixed`` gives values of its own, e.g. ``std_normalize=False``).
    Group inputs (``scores``, ``lengths``, ``greedy_scores``) make a group estimator over whole
    episodes whose ``[n_groups, group_size]`` result is spread over each episode's steps; with
    ``per_member`` it is computed on each population member's block of groups apart (a batch-wide
    statistic). Otherwise ``fn`` returns ``[T, B]`` advantages or ``(advantages, critic targets)``;
    ``full_episodes`` asks for whole episodes (Monte Carlo, no bootstrap). ``summary``: the line of
    the docs' tables (default: the first sentence of ``fn``'s docstring)."""
    def _register(f: Callable) -> Callable:
        names = [n for n, prm in inspect.signature(f).parameters.items()
                 if n not in fixed and (n in INPUTS or prm.default is inspect.Parameter.empty)]
        unknown = [n for n in names if n not in INPUTS]
        if unknown:
            raise ValueError(f"estimator {name!r}: parameters {unknown} are none of {list(INPUTS)}")
        group = [n for n in names if n in GROUP_INPUTS]
        step = [n for n in names if n in STEP_INPUTS]
        knobs = [n for n in names if n in KNOB_INPUTS]
        if group and step:
            raise ValueError(f"estimator {name!r}: group inputs {group} and step inputs {step} together")
        if not (group or step):
            raise ValueError(f"estimator {name!r}: takes none of {list(GROUP_INPUTS) + list(STEP_INPUTS)}")

        @functools.wraps(f)  # the spec's function is named by f's (module, in a broken contract's message)
        def call(batch: AdvantageBatch, p: EstimatorParams) -> AdvantageResult:
            kw = {**fixed, **{n: KNOB_INPUTS[n](p) for n in knobs}}
            if group:
                def bound(**t: torch.Tensor) -> torch.Tensor:  # one row per group, checked before the spread
                    adv, r = f(**t, **kw), batch.rewards
                    shape = (next(iter(t.values())).shape[0], batch.group_size)
                    if tensor_mismatch(adv, shape, r.dtype, r.device):
                        raise contract_error("estimator", name, f, f"returned advantages: {described(adv)}; expected "
                                             f"[n_groups, group_size] = {shape} tensors, {r.dtype} on {r.device} "
                                             "(like rewards)")
                    return adv

                adv = _per_member(bound, {n: GROUP_INPUTS[n](batch) for n in group},
                                  batch.members if per_member else 1)
                return AdvantageResult(_broadcast(adv, batch), None)
            out = f(**{n: STEP_INPUTS[n](batch) for n in step}, **kw)
            return AdvantageResult(*out) if isinstance(out, tuple) else AdvantageResult(out, None)

        register(EstimatorSpec(name, call, needs_critic=bool({"values", "next_values"} & set(step)),
                               needs_groups=bool(group), needs_greedy="greedy_scores" in group,
                               full_episodes=bool(group) or full_episodes,
                               summary=first_sentence(f) if summary is None else summary))
        return f

    return _register if fn is None else _register(fn)


# The only list of the harness's estimators, on their pure functions (harness.estimators.returns,
# .group), in the order estimator_names() gives them (the figures' colours). Each name has its defaults
# in harness/conf/estimator/<name>.yaml. returns.py and group.py import nothing from this module, which
# imports them; an estimator registered with the decorator lives in a module of its own.
register_estimator("reinforce", _returns.reward_to_go, full_episodes=True,
                   summary="REINFORCE: A_t = G_t, the reward-to-go (Williams 1992)")
register_estimator("baseline", _returns.reward_to_go_baseline, full_episodes=True,
                   summary="REINFORCE with a learned baseline: A_t = G_t - V(s_t), V regressed on G_t (Sutton & Barto)")
register_estimator("a2c", _returns.n_step,
                   summary="A2C's n-step TD advantage: sum_{l<n} gamma^l r_{t+l} + gamma^n V(s_{t+n}) - V(s_t) "
                           "(Mnih et al. 2016)")
register_estimator("ppo_gae", _returns.gae, summary="GAE(gamma, lambda) (Schulman et al. 2016, 2017); returns = A + V_old")
register_estimator("grpo", _group.grpo, summary="GRPO: (R_i - group mean) / (group std + eps) (Shao et al. 2024)")
register_estimator("rloo", _group.rloo,
                   summary="RLOO: R_i - mean of the other k-1 group members (Kool et al. 2019; Ahmadian et al. 2024)")
register_estimator("remax", _group.remax,
                   summary="ReMax: R_i - R_greedy, the greedy rollout's return from the same start (Li et al. 2023)")
register_estimator("dr_grpo", _group.grpo, std_normalize=False,
                   summary="Dr. GRPO: R_i - group mean, no std (Liu et al. 2025); its YAML adds the token-sum aggregation")
register_estimator("reinforce_pp", _returns.reward_to_go, full_episodes=True,
                   summary="REINFORCE++: the reward-to-go, whitened over the batch by its YAML (Hu et al. 2025)")
register_estimator("reinforce_pp_baseline", _group.reinforce_pp_baseline,
                   summary="REINFORCE++-baseline: R_i - group mean, then batch whitening by its YAML (Hu et al. 2025)")
register_estimator("opo", _group.opo, summary="OPO: R_i - the length-weighted group mean of R (Hao et al. 2025)")
register_estimator("gpg", _group.gpg, per_member=True,
                   summary="GPG: alpha (R_i - group mean) [/ group std], alpha = groups / groups with a non-zero std, "
                           "per member (Chu et al. 2025)")
register_estimator("grpo_passk", _group.grpo_passk,
                   summary="Pass@k GRPO: (R_max - R_second) [/ group std] for the group's best member, 0 elsewhere "
                           "(Chen et al. 2025)")
