"""``validate(cfg)``: every check a config passes before any work starts, in one call.

It sits above the schema, the registries and the task families, and only puts their checks
together: the schema's per-field checks (:func:`harness.config.check_fields`), the names the
registries know (estimators, policy losses, loss aggregations, KL estimators), the task kind's
own checks (:data:`TASK_CHECKS`: :func:`check_control`, :func:`check_lm`, :func:`check_toy`
here) and, with ``mode=probe``, the probes' (:func:`harness.probes.validate_probe`).
``harness.app.run`` calls it first; it raises ``ValueError`` naming the first invalid field and what
it allows, or returns the run's plan (:class:`harness.plan.RunPlan`: the config with the task kind,
estimator and policy loss it names, looked up here once).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, open_dict

from . import config as schema
from .config import (PARAM_BYTES, ProbeSettings, bad_field, check_choice, check_fields, check_fits,
                     check_known_keys, length_problem, path_problem, refuse_unknown_keys, results_path, task_kind)
from .estimators import KL_ESTIMATORS, EstimatorSpec, get_estimator
from .io.rundir import CHECKPOINT_NAME, run_dir_for
from .io.trackers import check_tracker
from .losses import AGG_MODES, POLICY_LOSSES, PolicyLoss, get_policy_loss, knob_defaults, loss_settings
from .plan import RunPlan
from .plugins import try_callables
from .probes import validate_probe
from .reference import check_reference
from .tasks.control import env_info, time_limit, validate_control
from .tasks.lm import validate_lm
from .tasks.toy import PRESETS as TOY_PRESETS
from .tasks.toy import spec_from_config, validate_toy

__all__ = ["validate", "check_registered", "check_results_dir", "check_control", "check_lm", "check_toy", "TASK_CHECKS"]

ENVS_MAX = 65536  # gymnasium envs one control process holds at once (population x width)


def check_registered(cfg: DictConfig) -> tuple[EstimatorSpec, PolicyLoss, Any]:
    """Names the registries must know, and the estimator's own needs; returns the estimator's spec,
    the policy loss and its settings (:func:`check_loss_knobs`)."""
    spec = get_estimator(cfg.estimator)  # an unknown name: the registered ones, and plugins=
    if spec.needs_groups and cfg.group_size < 2 and not spec.needs_greedy:
        bad_field("group_size", f">= 2 for estimator {cfg.estimator}", cfg.group_size)
    loss = get_policy_loss(cfg["update"])
    settings = check_loss_knobs(cfg, loss)
    check_choice("loss_agg", cfg.loss_agg, AGG_MODES)
    if cfg.kl.estimator not in KL_ESTIMATORS:
        bad_field("kl.estimator", f"one of {sorted(KL_ESTIMATORS)}", cfg.kl.estimator)
    return spec, loss, settings


def check_loss_knobs(cfg: DictConfig, chosen: PolicyLoss) -> Any:
    """A policy loss's knob (:func:`harness.losses.knob_defaults`: ``clip_eps`` as much as
    ``clip_ratio_c``) set away from its default for a loss that does not read it would be silently
    ignored (and would change the run's hash): refused, naming the losses that read it. Then the
    ``chosen`` loss's settings are built and returned; their checks name the field out of range:
    one rule per knob."""
    for knob, default in knob_defaults().items():
        if knob in cfg and cfg[knob] != default and knob not in chosen.knobs:
            owners = "|".join(name for name, spec in POLICY_LOSSES.items() if knob in spec.knobs)
            bad_field(knob, f"{'null' if default is None else default} with update={cfg['update']} (it applies to "
                      f"update={owners})", cfg[knob])
    return loss_settings(cfg, chosen.name)


def validate(cfg: DictConfig) -> RunPlan:
    """Raise ``ValueError`` naming the first invalid field and what it allows; else return the
    run's plan: ``cfg`` with what it names (:class:`harness.plan.RunPlan`)."""
    check_known_keys(cfg)
    spec, loss, settings = check_registered(cfg)
    check_fields(cfg)
    kind = task_kind(cfg.task.family)
    check_reference(cfg)  # before the task's checks: a reference for another task family is named as such
    TASK_CHECKS[kind.name](cfg, spec)
    if cfg.mode == "probe":
        refuse_unknown_keys(cfg, "probe", ProbeSettings)  # names the key (probe.<key>) before the probe's checks
        validate_probe(cfg)
    plan = RunPlan(cfg, kind, spec, loss, settings)
    try_callables(plan)  # the estimator and loss once on a synthetic batch: a broken plugin refused here
    check_results_dir(cfg)
    check_tracker(cfg)  # last: it imports the tracker's package and asks its store or server
    return plan


# ----------------------------------------------------------------------------- each task kind's checks
# (TASK_CHECKS, below: one entry per harness.config.TASK_KINDS name)

def check_control(cfg: DictConfig, spec: EstimatorSpec) -> None:
    """``task.family=control``: the task's checks, sizes, no sampling-side options, the device."""
    validate_control(cfg, needs_groups=spec.needs_groups, full_episodes=spec.full_episodes)
    check_control_sizes(cfg, spec)
    check_sampling_options(cfg, None)
    check_device(cfg)


def check_lm(cfg: DictConfig, spec: EstimatorSpec) -> None:
    """``task.family=lm``: the ``lm`` node's checks (the device among them), minibatches, sampling options."""
    validate_lm(cfg)
    check_sequence_minibatches(cfg, int(cfg.lm.prompts_per_iter) * int(cfg.group_size),
                               f"{cfg.lm.prompts_per_iter} prompts x group_size {cfg.group_size}")
    check_sampling_options(cfg, int(cfg.lm.max_response_len))


def check_toy(cfg: DictConfig, spec: EstimatorSpec) -> None:
    """``task.family=toy``: the task's checks, minibatches, sampling options (EOS), the device."""
    validate_toy(cfg)
    check_sequence_minibatches(cfg, int(cfg.task.episodes_per_iter), "task.episodes_per_iter")
    toy = spec_from_config(cfg)
    eos = sorted(n for n, p in TOY_PRESETS.items() if p.eos)
    check_sampling_options(cfg, toy.length, None if toy.eos else
                           f"task.env_id={cfg.task.env_id}: every response has the full length, none is "
                           f"truncated; presets with EOS: {'|'.join(eos)}")
    check_device(cfg)


# each task kind's checks, ``(cfg, spec: EstimatorSpec) -> None``, run by validate()
TASK_CHECKS: dict[str, Callable[[DictConfig, EstimatorSpec], None]] = {
    "control": check_control,
    "lm": check_lm,
    "toy": check_toy,
}

SAMPLING_OPTIONS = {"dynamic_sampling": False, "mask_truncated": False, "overlong_cache": None}


def check_sampling_options(cfg: DictConfig, longest: int | None, no_eos: str | None = None) -> None:
    """The sampling-side options (:mod:`harness.train.sampling`) act on groups of responses to a
    prompt (``longest``: the maximal response length, in tokens); a task without responses
    (``longest=None``: control) refuses them by name; so does a task without EOS (``no_eos``: why)
    for the two that need one (every response there has the full length, none is truncated)."""
    for key, off in SAMPLING_OPTIONS.items():
        if cfg[key] == off:
            continue
        if longest is None:
            bad_field(key, f"{off if off is not None else 'null'} on control tasks (it applies to responses "
                           "sampled in groups: task families toy and lm)", cfg[key])
        if key == "overlong_cache" and cfg[key] > longest:
            bad_field(key, f"<= the maximal response length ({longest} tokens) or null (off)", cfg[key])
        if no_eos is not None and key != "dynamic_sampling":
            bad_field(key, f"{off if off is not None else 'null'} without EOS ({no_eos})", cfg[key])


def check_sequence_minibatches(cfg: DictConfig, sequences: int, what: str) -> None:
    """LM and toy minibatches are drawn over whole sequences: at most one per sequence (a
    one-sequence minibatch with normalize_advantages=minibatch whitens to advantage 0)."""
    if cfg.mode != "train":
        return
    one_each = cfg.normalize_advantages == "minibatch"
    if cfg.minibatches > sequences or (one_each and cfg.minibatches >= sequences and sequences > 1):
        allowed = (f"< the sequences an iteration samples ({what} = {sequences}): with "
                   "normalize_advantages=minibatch a one-sequence minibatch has advantage 0" if one_each
                   else f"<= the sequences an iteration samples ({what} = {sequences})")
        bad_field("minibatches", allowed, cfg.minibatches)


def check_device(cfg: DictConfig) -> None:
    """``device=cuda`` needs CUDA (the LM task checks it itself, with the same message)."""
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            bad_field("device", "'cpu' or 'auto' here: CUDA is not available", cfg.device)


def check_results_dir(cfg: DictConfig) -> None:
    """results_dir must be a directory, or creatable as one (nothing is created here), and short
    enough for the longest path a run writes under it: its last member's run folder
    (``<task>/<estimator>/seed<k>-<hash>``) and the temporary file of its checkpoint in it."""
    path = results_path(cfg)
    problem = path_problem(path)
    if not problem:
        last = cfg.copy()
        with open_dict(last):
            last.seed = int(cfg.seed) + max(int(cfg.population), 1) - 1  # the longest seed; not in the hash
        longest = os.path.join(os.path.abspath(str(run_dir_for(last))), f".{CHECKPOINT_NAME}.xxxxxxxx.tmp")
        problem = length_problem(longest)
    if problem:
        bad_field("results_dir", f"a folder the harness can create and write ({problem})", cfg.results_dir)


def check_control_sizes(cfg: DictConfig, spec: EstimatorSpec) -> None:
    """Sizes that only make sense together: minibatches within the samples an iteration gives
    (step-based: ``num_envs x rollout_steps`` steps; whole-episode: at most ``episodes_per_iter``
    x the time limit), no more gymnasium envs at once than :data:`ENVS_MAX`, and networks and samples
    that fit in this machine's memory (:func:`check_control_memory`)."""
    t = cfg.task
    P = int(cfg.population)
    if spec.full_episodes:
        width = int(t.episodes_per_iter) + (int(t.episodes_per_iter) // int(cfg.group_size) if spec.needs_greedy else 0)
        width_field = "task.episodes_per_iter"
    else:
        width, width_field = int(t.num_envs), "task.num_envs"
    for name, w in ((width_field, width), ("eval_episodes", int(cfg.eval_episodes))):
        if P * w > ENVS_MAX:
            bad_field(name, f"at most {ENVS_MAX // P} with population={P} (population x {w} gymnasium envs "
                      f"at once; at most {ENVS_MAX})", cfg[name] if name == "eval_episodes" else t[name.split('.')[1]])
    check_control_memory(cfg, spec)
    if cfg.mode != "train":
        return
    one_each = cfg.normalize_advantages == "minibatch"  # a one-sample minibatch whitens to advantage 0
    if spec.full_episodes:
        limit = time_limit(t.env_id, t.max_episode_steps)  # validate_control refused envs without one
        samples = int(t.episodes_per_iter) * int(limit)
        what = (f"the samples an iteration can give ({t.episodes_per_iter} episodes x at most {limit} steps "
                f"= {samples})")
    else:
        samples = int(t.num_envs) * int(t.rollout_steps)
        what = f"the samples an iteration gives ({t.num_envs} envs x {t.rollout_steps} steps = {samples})"
    if cfg.minibatches > samples or (one_each and cfg.minibatches >= samples and samples > 1):
        fewer = (f"< {what}: with normalize_advantages=minibatch a one-sample minibatch has advantage 0"
                 if one_each else f"<= {what}")
        bad_field("minibatches", fewer, cfg.minibatches)


def control_parameters(obs_dim: int, out: int, hidden: list[int]) -> int:
    """Weights and biases of one MLP ``obs_dim -> hidden... -> out`` (:class:`harness.models.mlp.PopulationMLP`)."""
    sizes = [obs_dim, *hidden, out]
    return sum((n_in + 1) * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))


def check_control_memory(cfg: DictConfig, spec: EstimatorSpec) -> None:
    """The least memory a control run holds at once fits in this machine
    (:func:`harness.config.memory_bytes`), or a size is refused by name with the largest value
    that fits: ``task.hidden`` when not even one member's networks fit (an actor, and a critic
    with the estimator's ``needs_critic``; :data:`~harness.config.PARAM_BYTES` a parameter), else
    the size at fault (:func:`harness.config.check_fits`) among ``population`` and, with
    ``mode=train``, what one iteration's samples hold per member (``task.num_envs x
    task.rollout_steps`` steps, or at least one step of each of ``task.episodes_per_iter``
    episodes; 4 bytes for each observation number, action number, reward, done flag,
    log-probability and value). A lower estimate: a config refused here cannot run; one that
    passes may still be more than the machine holds next to other work."""
    t = cfg.task
    info = env_info(t.env_id)
    P, per_member = int(cfg.population), 2 if spec.needs_critic else 1
    out = info.act_dim * (2 if not info.discrete and t.log_std == "state_dependent" else 1)
    n = control_parameters(info.obs_dim, out, list(t.hidden))
    budget = schema.memory_bytes()  # looked up on the module: one place to stand in for the machine
    if per_member * n * PARAM_BYTES > budget:  # not even one member's networks: the widths
        nets = "an actor and a critic" if per_member == 2 else "an actor"
        bad_field("task.hidden", f"layer widths whose networks fit in this machine's {budget / 2**30:.3g} GiB: "
                  f"at most {budget // (per_member * PARAM_BYTES)} parameters a network ({nets} per member, "
                  f"{PARAM_BYTES} bytes a parameter); these widths make {n}", list(t.hidden))
    sizes = {"population": (P, 1)}
    if cfg.mode == "train":
        sizes.update({"task.episodes_per_iter": (int(t.episodes_per_iter), 1)} if spec.full_episodes else
                     {"task.num_envs": (int(t.num_envs), 1), "task.rollout_steps": (int(t.rollout_steps), 1)})
    per_step = 4 * (info.obs_dim + (1 if info.discrete else info.act_dim) + 4)

    def need(v: dict) -> int:
        steps = v.get("task.episodes_per_iter", 0) + v.get("task.num_envs", 0) * v.get("task.rollout_steps", 0)
        return v["population"] * (per_member * n * PARAM_BYTES + steps * per_step)

    check_fits(sizes, need, f"the networks ({per_member} a member, {n} parameters each)"
               + (" and an iteration's samples" if cfg.mode == "train" else ""), budget)
