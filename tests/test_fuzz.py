"""Bad-input fuzzing (issues 7 and 12): invalid configurations and overrides fail before any training,
with a message that names the field, and leave no run directory behind.

Each case is ``(overrides, field, stage)``: ``stage`` is ``compose`` when Hydra/OmegaConf refuse
the override while composing (wrong type, unknown key, unknown group option) and ``validate``
when :func:`harness.validation.validate` refuses it (``harness.app.run`` calls it first). In-process
cases go through Hydra's compose API and ``harness.app.run``; the ``CLI_CASES`` run
``python -m harness`` as a subprocess: exit code 2 and one ``invalid config: ...`` line for a
value ``validate`` refuses, Hydra's own error (exit code 1) naming the key for composition errors.

What "no run directory" means here: in-process, nothing at all is created under the working
directory (results_dir is relative to it). Through the CLI, Hydra writes its job folder
(``results_dir/.hydra/runs/<time>/``: the composed config, the overrides and the job's log)
before the task function starts; that is Hydra's log of the invocation, not a run, and it is the
only thing allowed: no ``results_dir/<task>/<estimator>/seed<seed>-<hash>`` folder may appear.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import app
from harness.app import run

from .control_helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]
C, V = "compose", "validate"
LM = ["task=lm_summarize", "estimator=rloo"]
TOY = ["task=toy", "estimator=rloo"]
PROBE_TOY = ["mode=probe", "task=toy", "estimator=rloo"]

CASES: list[tuple[list[str], str, str]] = [
    # ---- wrong types (OmegaConf refuses the conversion while composing)
    (["gamma=abc"], "gamma", C),
    (["lr=fast"], "lr", C),
    (["epochs=1.5"], "epochs", C),
    (["population=two"], "population", C),
    (["seed=[1,2]"], "seed", C),
    (["anneal_lr=maybe"], "anneal_lr", C),
    (["std_normalize=sometimes"], "std_normalize", C),
    (["kl.beta=high"], "kl.beta", C),
    (["budget.env_steps=lots"], "budget.env_steps", C),
    (["task.num_envs=3.7"], "task.num_envs", C),
    (["task.hidden=64"], "task.hidden", C),
    (["task.hidden=[a]"], "task.hidden", C),
    # ---- unknown keys: refused by struct mode, or (force-added with +) by validate
    (["foo=1"], "foo", C),
    (["kl.foo=1"], "kl.foo", C),
    (["budget.steps=1"], "budget.steps", C),
    (["task.envid=CartPole-v1"], "task.envid", C),
    (["+foo=1"], "foo", V),
    (["+kl.foo=1"], "kl.foo", V),
    (["+task.foo=1"], "task.foo", V),
    (["+budget.steps=5"], "budget.steps", V),
    ([*TOY, "+toy.foo=1"], "toy.foo", V),
    ([*PROBE_TOY, "++probe.batchez=100"], "probe.batchez", V),
    # ---- unknown names of config groups
    (["estimator=ppo"], "estimator", C),
    (["task=atari"], "task", C),
    (["experiment=no_such_experiment"], "experiment", C),
    (["++estimator=ppo_gae"], "estimator", C),
    # ---- out-of-range values
    (["gamma=0"], "gamma", V),
    (["gamma=1.5"], "gamma", V),
    (["gamma=nan"], "gamma", V),
    (["gae_lambda=1.2"], "gae_lambda", V),
    (["gae_lambda=-0.1"], "gae_lambda", V),
    (["clip_eps=-0.1"], "clip_eps", V),
    (["clip_eps=0"], "clip_eps", V),
    (["clip_eps_high=0"], "clip_eps_high", V),
    (["vf_clip_eps=0"], "vf_clip_eps", V),
    (["lr=0"], "lr", V),
    (["lr=-1e-3"], "lr", V),
    (["lr=inf"], "lr", V),
    (["epochs=0"], "epochs", V),
    (["minibatches=0"], "minibatches", V),
    (["estimator=a2c", "n_steps=0"], "n_steps", V),
    (["population=0"], "population", V),
    (["seed=-1"], "seed", V),
    (["ent_coef=-0.01"], "ent_coef", V),
    (["ent_coef=nan"], "ent_coef", V),
    (["vf_coef=-1"], "vf_coef", V),
    (["kl.beta=-0.1"], "kl.beta", V),
    (["kl.beta=nan"], "kl.beta", V),
    (["kl.adaptive=true", "kl.kl_target=0"], "kl.kl_target", V),
    (["max_grad_norm=0"], "max_grad_norm", V),
    (["threads=0"], "threads", V),
    (["eval_every=-1"], "eval_every", V),
    (["eval_every_steps=0"], "eval_every_steps", V),
    (["eval_episodes=0"], "eval_episodes", V),
    (["budget.iterations=0"], "budget.iterations", V),
    (["budget.env_steps=10"], "budget.env_steps", V),  # less than one iteration
    (["task.num_envs=0"], "task.num_envs", V),
    (["task.rollout_steps=0"], "task.rollout_steps", V),
    (["estimator=reinforce", "task.episodes_per_iter=0"], "task.episodes_per_iter", V),
    (["task.max_episode_steps=0"], "task.max_episode_steps", V),
    (["task.hidden=[]"], "task.hidden", V),
    (["task.hidden=[64,0]"], "task.hidden", V),
    (["task.init_log_std=nan"], "task.init_log_std", V),
    (["task.name="], "task.name", V),
    (["task.name=a/b"], "task.name", V),
    (["results_dir="], "results_dir", V),
    # ---- unknown choices of string fields
    (["task.env_id=NoSuchEnv-v9"], "task.env_id", V),
    (["task.family=vision"], "task.family", V),
    (["task.activation=gelu"], "task.activation", V),
    (["mode=eval"], "mode", V),
    (["device=tpu"], "device", V),
    (["update=sgd"], "update", V),
    (["normalize_advantages=always"], "normalize_advantages", V),
    (["loss_agg=sum"], "loss_agg", V),
    (["kl.estimator=k4"], "kl.estimator", V),
    (["grad_clip=global"], "grad_clip", V),
    # ---- contradictory combinations
    (["budget.env_steps=null", "budget.iterations=null"], "budget.env_steps", V),  # no budget at all
    (["estimator=grpo", "group_size=1"], "group_size", V),
    (["estimator=rloo", "group_size=1"], "group_size", V),
    (["estimator=dr_grpo", "group_size=1"], "group_size", V),
    (["group_size=0"], "group_size", V),
    (["estimator=grpo", "group_size=3", "task.episodes_per_iter=8"], "task.episodes_per_iter", V),
    (["budget.tokens=1000"], "budget.tokens", V),  # an LM budget on a control task
    (["kl.target=ref"], "kl.target", V),  # control runs have no reference policy
    (["kl.in_reward=true"], "kl.in_reward", V),
    (["+lm.reward=gold"], "lm.reward", V),  # lm.* with a control task
    (["+toy.vocab=3"], "toy.vocab", V),  # toy.* with a control task
    (["mode=probe", "estimator=a2c"], "estimator", V),  # control probes need whole episodes
    (["mode=probe", "task=lm_summarize", "estimator=rloo"], "task.family", V),  # no LM probes
    ([*PROBE_TOY, "++probe.batches=3"], "probe.batches", V),
    ([*PROBE_TOY, "++probe.target=nope"], "probe.target", V),
    (["mode=probe", "estimator=reinforce", "++probe.target=kl"], "probe.target", V),
    # ---- the toy task
    (["task=toy", "task.env_id=nope"], "task.env_id", V),
    ([*TOY, "++toy.length=9"], "toy.length", V),
    ([*TOY, "++toy.vocab=1"], "toy.vocab", V),
    ([*TOY, "budget.env_steps=null", "budget.iterations=null"], "budget.env_steps", V),
    ([*TOY, "budget.env_steps=-5"], "budget.env_steps", V),
    ([*TOY, "task.episodes_per_iter=7"], "task.episodes_per_iter", V),
    ([*TOY, "kl.target=foo"], "kl.target", V),
    ([*TOY, "++toy.reward=bogus"], "toy.reward", V),
    ([*TOY, "++toy.reward=1"], "toy.reward", V),
    ([*TOY, "++toy.log_prompts=3"], "toy.log_prompts", V),
    ([*TOY, "++toy.log_prompts=true", "++toy.prompts=[dense,dense,dense,dense,dense,dense,dense,dense,dense]"],
     "toy.log_prompts", V),
    # ---- the LM task
    ([*LM, "lm.reward=human"], "lm.reward", V),
    ([*LM, "lm.critic=none"], "lm.critic", V),
    ([*LM, "lm.dtype=float16"], "lm.dtype", V),
    ([*LM, "lm.temperature=0"], "lm.temperature", V),
    ([*LM, "lm.max_response_len=0"], "lm.max_response_len", V),
    ([*LM, "lm.sft.steps=0"], "lm.sft.steps", V),
    ([*LM, "lm.rm.samples_per_prompt=1"], "lm.rm.samples_per_prompt", V),
    ([*LM, "lm.data.max_facts=20"], "lm.data.max_facts", V),
    ([*LM, "lm.model=/no/such/model"], "lm.model", V),
    ([*LM, "budget.tokens=null", "budget.iterations=null"], "budget.tokens", V),
    ([*LM, "budget.env_steps=1000"], "budget.env_steps", V),  # a control budget on the LM task
    ([*LM, "kl.in_reward=true", "kl.target=old"], "kl.target", V),
    # ==== issue 12: bounds for every numeric field (finite; positive where it must be; sane maxima)
    (["seed=4294967296"], "seed", V),  # 2**32: the generators' seeds are 32-bit
    (["seed=18446744073709551616"], "seed", V),  # 2**64 (a traceback before)
    (["seed=-100"], "seed", V),
    (["seed=4294967295", "population=2"], "seed", V),  # member 1 would get seed 2**32
    (["seed=4294967000", "population=400"], "seed", V),
    (["population=4097"], "population", V),
    (["population=10000"], "population", V),  # made 10,000 run directories before
    (["population=-5"], "population", V),
    (["threads=100000"], "threads", V),  # segfaulted before
    (["threads=-1"], "threads", V),
    (["threads=2147483648"], "threads", V),
    (["epochs=-3"], "epochs", V),
    (["epochs=2147483648"], "epochs", V),
    (["minibatches=-1"], "minibatches", V),
    (["minibatches=2147483648"], "minibatches", V),
    (["n_steps=-5"], "n_steps", V),
    (["n_steps=2147483648"], "n_steps", V),
    (["group_size=-2"], "group_size", V),
    (["group_size=2147483648"], "group_size", V),
    (["eval_every=2147483648"], "eval_every", V),
    (["eval_every_steps=-1"], "eval_every_steps", V),
    (["eval_every_steps=2147483648"], "eval_every_steps", V),
    (["eval_episodes=-1"], "eval_episodes", V),
    (["eval_episodes=70000"], "eval_episodes", V),  # 70,000 gymnasium envs at once
    (["population=100", "eval_episodes=1000"], "eval_episodes", V),
    (["checkpoint_every=-1"], "checkpoint_every", V),
    (["checkpoint_every=2147483648"], "checkpoint_every", V),
    (["logger=tb"], "logger", V),
    (["logger=null"], "logger", C),
    (["budget.iterations=-1"], "budget.iterations", V),
    (["budget.iterations=2147483648"], "budget.iterations", V),
    (["budget.env_steps=0"], "budget.env_steps", V),
    (["budget.env_steps=9007199254740993"], "budget.env_steps", V),  # 2**53 + 1
    (["budget.tokens=0"], "budget.tokens", V),
    (["task.num_envs=-1"], "task.num_envs", V),
    (["budget.env_steps=null", "budget.iterations=1", "task.num_envs=100000"], "task.num_envs", V),  # 100,000 envs
    (["task.num_envs=2147483648"], "task.num_envs", V),
    (["budget.env_steps=null", "budget.iterations=1", "population=2", "task.num_envs=40000"], "task.num_envs", V),
    (["task.rollout_steps=-8"], "task.rollout_steps", V),
    (["task.rollout_steps=2147483648"], "task.rollout_steps", V),
    (["estimator=reinforce", "task.episodes_per_iter=-4"], "task.episodes_per_iter", V),
    (["estimator=reinforce", "task.episodes_per_iter=100000"], "task.episodes_per_iter", V),
    (["estimator=remax", "group_size=2", "task.episodes_per_iter=60000"], "task.episodes_per_iter", V),
    (["task.max_episode_steps=-1"], "task.max_episode_steps", V),
    (["task.max_episode_steps=2147483648"], "task.max_episode_steps", V),
    (["task.hidden=[-1]"], "task.hidden", V),
    (["task.hidden=[64,2147483648]"], "task.hidden", V),
    (["task.init_log_std=inf"], "task.init_log_std", V),
    (["task.init_log_std=-inf"], "task.init_log_std", V),
    (["task.worst_return=nan"], "task.worst_return", V),
    (["task.worst_return=-inf"], "task.worst_return", V),
    (["gamma=-0.5"], "gamma", V),
    (["gamma=inf"], "gamma", V),
    (["gae_lambda=nan"], "gae_lambda", V),
    (["gae_lambda=inf"], "gae_lambda", V),
    (["lr=nan"], "lr", V),
    (["lr=-inf"], "lr", V),
    (["clip_eps=inf"], "clip_eps", V),
    (["clip_eps=nan"], "clip_eps", V),
    (["clip_eps_high=-1"], "clip_eps_high", V),
    (["clip_eps_high=nan"], "clip_eps_high", V),
    (["vf_clip_eps=inf"], "vf_clip_eps", V),
    (["vf_clip_eps=-0.5"], "vf_clip_eps", V),
    (["ent_coef=inf"], "ent_coef", V),
    (["vf_coef=nan"], "vf_coef", V),
    (["vf_coef=inf"], "vf_coef", V),
    (["kl.beta=inf"], "kl.beta", V),
    (["max_grad_norm=inf"], "max_grad_norm", V),  # "no clipping" is null, not inf
    (["max_grad_norm=nan"], "max_grad_norm", V),
    (["max_grad_norm=-1"], "max_grad_norm", V),
    (["kl.kl_target=nan"], "kl.kl_target", V),
    (["kl.adaptive=true", "kl.kl_target=-1"], "kl.kl_target", V),
    (["kl.adaptive=true", "kl.kl_target=inf"], "kl.kl_target", V),
    # ---- minibatches beyond the samples an iteration gives (a zero policy gradient before)
    (["minibatches=257"], "minibatches", V),  # cartpole: 8 envs x 32 steps = 256
    (["task.num_envs=2", "task.rollout_steps=8", "minibatches=100"], "minibatches", V),
    (["task.num_envs=2", "task.rollout_steps=8", "minibatches=16"], "minibatches", V),  # one sample each
    (["normalize_advantages=none", "task.num_envs=1", "task.rollout_steps=4", "minibatches=5"], "minibatches", V),
    (["estimator=a2c", "task.num_envs=1", "task.rollout_steps=1", "minibatches=2"], "minibatches", V),
    (["estimator=reinforce", "task.max_episode_steps=2", "task.episodes_per_iter=4", "minibatches=9"],
     "minibatches", V),  # whole episodes: at most 4 x 2 steps
    (["estimator=rloo", "task.max_episode_steps=1", "minibatches=9"], "minibatches", V),
    (["task.env_id=Pendulum-v1", "task.rollout_steps=4", "task.num_envs=1", "minibatches=8"], "minibatches", V),
    (TOY + ["task.episodes_per_iter=16", "minibatches=17"], "minibatches", V),  # toy: over sequences
    (TOY + ["task.episodes_per_iter=16", "normalize_advantages=minibatch", "minibatches=16"], "minibatches", V),
    (LM + ["lm.prompts_per_iter=2", "group_size=4", "minibatches=9"], "minibatches", V),  # LM: 2 x 4 responses
    # ---- names that cannot leave results_dir (or hide from the report)
    (["task.name=.."], "task.name", V),
    (["task.name=.hydra"], "task.name", V),
    (["task.name=.cache"], "task.name", V),
    (["task.name=.secret"], "task.name", V),
    (["task.name='a\\\\b'"], "task.name", V),
    (["task.name=..\\\\x"], "task.name", V),
    (["task.name='  '"], "task.name", V),
    ([f"task.name={'n' * 101}"], "task.name", V),
    ([f"task.name={'n' * 300}"], "task.name", V),  # a traceback before
    (["task.name=../../etc"], "task.name", V),
    (["task.name=/abs"], "task.name", V),
    (["task.name=[a,b]"], "task.name", C),
    (["results_dir=[a]"], "results_dir", C),
    (["results_dir='   '"], "results_dir", V),
    # ---- results_dir where no folder can be made (no file is needed: the OS provides them)
    (["results_dir=/dev/null"], "results_dir", V),  # an existing file
    (["results_dir=/dev/null/res"], "results_dir", V),  # under a file
    (["results_dir=/proc/harness-res"], "results_dir", V),  # read-only even for root
    (["results_dir=/proc/self/harness-res"], "results_dir", V),
    # ---- careless spellings of choices
    (["device=CUDA"], "device", V),
    (["device=gpu"], "device", V),
    (["mode=Train"], "mode", V),
    (["task.family=Control"], "task.family", V),
    (["update=CLIP"], "update", V),
    (["estimator=PPO_GAE"], "estimator", C),
    (["threads=many"], "threads", C),
    (["seed=1e3"], "seed", C),
    (["task.env_id=cartpole-v1"], "task.env_id", V),
    (["task.env_id='CartPole-v1 '"], "task.env_id", V),
    (["task.env_id=no_such_pkg.envs:MyEnv-v0"], "task.env_id", V),
    (["task.env_id=tests.scripted_env:NoSuch-v0"], "task.env_id", V),
    (["task.env_id=tests.scripted_env:ChainMultiDiscrete-v0"], "task.env_id", V),
    # ---- the probes' settings (++probe.* bypasses the schema)
    ([*PROBE_TOY, "++probe.batches=-2"], "probe.batches", V),
    ([*PROBE_TOY, "++probe.batches=2147483648"], "probe.batches", V),
    ([*PROBE_TOY, "++probe.reps=5"], "probe.reps", V),
    ([*PROBE_TOY, "++probe.reps=many"], "probe.reps", V),  # a TypeError traceback before
    ([*PROBE_TOY, "++probe.critic_noise=nan"], "probe.critic_noise", V),
    ([*PROBE_TOY, "++probe.init_scale=inf"], "probe.init_scale", V),
    ([*PROBE_TOY, "++probe.proposal_shift=nan"], "probe.proposal_shift", V),
    ([*PROBE_TOY, "++probe.control_scale=inf"], "probe.control_scale", V),
    ([*PROBE_TOY, "++probe.init_seed=-1"], "probe.init_seed", V),
    ([*PROBE_TOY, "++probe.critic_seed=4294967296"], "probe.critic_seed", V),
    ([*PROBE_TOY, "++probe.chunk=0"], "probe.chunk", V),
    ([*PROBE_TOY, "++probe.critic_episodes=0"], "probe.critic_episodes", V),
    ([*PROBE_TOY, "++probe.critic=none"], "probe.critic", V),
    ([*PROBE_TOY, "++probe.critic_samples=0"], "probe.critic_samples", V),
    ([*PROBE_TOY, "++probe.reference_batches=-1"], "probe.reference_batches", V),
    ([*PROBE_TOY, "++probe.negative_control=yes"], "probe.negative_control", V),
    ([*PROBE_TOY, "++probe.store_batches=1"], "probe.store_batches", V),
    ([*PROBE_TOY, "++probe.target=[1]"], "probe.target", V),
    ([*PROBE_TOY, "++probe.arcsin=yes"], "probe.arcsin", V),
    ([*PROBE_TOY, "++probe.arcsin=true"], "probe.arcsin", V),  # the mixed preset has a dense prompt
    ([*PROBE_TOY, "task.env_id=varlen", "++probe.arcsin=true", "++probe.target=kl"], "probe.arcsin", V),
    ([*PROBE_TOY, "task.env_id=varlen", "++probe.arcsin=true", "kl.beta=0.1"], "probe.arcsin", V),
    (["mode=probe", "estimator=reinforce", "++probe.arcsin=true"], "probe.arcsin", V),  # control task
    # ---- the toy and LM tasks take the same bounds
    ([*TOY, "seed=4294967296"], "seed", V),
    ([*TOY, "population=5000"], "population", V),
    ([*TOY, "device=cuda", "threads=100000"], "threads", V),
    ([*TOY, "task.name=.."], "task.name", V),
    ([*LM, "seed=4294967296"], "seed", V),
    ([*LM, "task.name=.hydra"], "task.name", V),
    ([*LM, "budget.tokens=9007199254740993"], "budget.tokens", V),
    ([*LM, "results_dir=/dev/null"], "results_dir", V),
]

# Through the real command line: (overrides, field, exit code).
CLI_CASES: list[tuple[list[str], str, int]] = [
    (["gamma=0"], "gamma", 2),
    (["estimator=grpo", "group_size=1"], "group_size", 2),
    (["budget.env_steps=null", "budget.iterations=null"], "budget.env_steps", 2),
    (["+foo=1"], "foo", 2),
    (["foo=1"], "foo", 1),
    (["estimator=ppo"], "estimator", 1),
    (["gamma=abc"], "gamma", 1),
    (["seed=18446744073709551616"], "seed", 2),
    (["threads=100000"], "threads", 2),
    (["population=10000"], "population", 2),
    (["task.num_envs=2", "task.rollout_steps=8", "minibatches=100"], "minibatches", 2),
    (["task.name=.."], "task.name", 2),
    (["mode=probe", "task=toy", "estimator=grpo", "++probe.arcsin=true"], "probe.arcsin", 2),
    (["task.name=.hydra"], "task.name", 2),
    ([f"task.name={'n' * 300}"], "task.name", 2),
    (["results_dir=/dev/null"], "results_dir", 2),  # before Hydra's job folder: a traceback before
    (["results_dir=/proc/harness-res"], "results_dir", 2),
    (["task.env_id=no_such_pkg.envs:MyEnv-v0"], "task.env_id", 2),
    (["task=toy", "estimator=rloo", "++toy.reward=bogus"], "toy.reward", 2),
    (["logger=neptune"], "logger", 2),  # wandb and mlflow are loggers now (docs/trackers.md)
]


def _case_id(case) -> str:
    return " ".join(case[0]) or "empty"


def names(message: str, field: str) -> bool:
    """``field`` appears in ``message`` as a name (not inside a longer dotted name or word)."""
    return re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", message) is not None


def full_message(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def with_defaults(overrides: list[str], results_dir: str) -> list[str]:
    base = [f"results_dir={results_dir}"]
    if not any(o.startswith(("task=", "+task=")) for o in overrides):
        base.append("task=cartpole")
    if not any(re.match(r"^\+*estimator=", o) for o in overrides):
        base.append("estimator=ppo_gae")
    return base + overrides  # the case's own overrides come last and win


def test_there_are_at_least_200_distinct_cases():
    keys = [tuple(c[0]) for c in CASES] + [tuple(c[0]) for c in CLI_CASES]
    assert len({tuple(c[0]) for c in CASES}) == len(CASES), "duplicate in-process case"
    assert len({tuple(c[0]) for c in CLI_CASES}) == len(CLI_CASES), "duplicate CLI case"
    assert len(CASES) >= 200 and len(CLI_CASES) >= 15 and len(keys) >= 215


@pytest.mark.parametrize("overrides,field,stage", CASES, ids=[_case_id(c) for c in CASES])
def test_invalid_config_fails_before_training(overrides, field, stage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths (results_dir=res) land here, so nothing may appear

    def no_training(cfg):
        pytest.fail(f"training started for invalid overrides {overrides}")

    monkeypatch.setattr(app, "get_worker", no_training)
    try:
        cfg = make_cfg(with_defaults(overrides, "res"))
    except Exception as exc:  # Hydra / OmegaConf refused it while composing
        got, message = C, full_message(exc)
    else:
        with pytest.raises(ValueError) as info:
            run(cfg)
        got, message = V, str(info.value)
    assert got == stage, f"expected a {stage} error, got a {got} error: {message}"
    assert names(message, field), f"{field!r} not named in: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written before the failure"


def _cli(overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", *overrides], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("overrides,field,code", CLI_CASES, ids=[_case_id(c) for c in CLI_CASES])
def test_invalid_config_through_the_cli(overrides, field, code, tmp_path):
    res = tmp_path / "res"
    out = _cli(with_defaults(overrides, str(res)), tmp_path)
    assert out.returncode == code, out.stdout + out.stderr
    if code == 2:  # harness's own refusal: one line on stdout, naming the field
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("invalid config:")]
        assert len(lines) == 1, out.stdout
        assert names(lines[0], field), lines[0]
        assert "Traceback" not in out.stderr, out.stderr
    else:  # Hydra's composition error names the key
        assert names(out.stdout + out.stderr, field), out.stdout + out.stderr
    # only Hydra's job folder (its log of this invocation) may exist; no run directory
    leftovers = sorted(p.name for p in res.iterdir()) if res.exists() else []
    assert leftovers in ([], [".hydra"]), leftovers
    assert not list(res.glob("*/*/seed*")), "a run directory was created"
    assert sorted(p.name for p in tmp_path.iterdir()) in (["res"], []), "something written outside results_dir"


# ---------------------------------------------------------------- issue 12: beyond the table
def _refused(cfg, field: str, tmp_path: Path) -> str:
    with pytest.raises(ValueError) as info:
        run(cfg)
    assert names(str(info.value), field), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("name", ["a\0b", "a\nb", "tab\there", "bell\x07", "del\x7f", "\0"])
def test_task_names_with_nul_or_control_characters_are_refused(name, tmp_path, monkeypatch):
    """Characters an override cannot easily carry, set on the composed config."""
    from omegaconf import open_dict

    monkeypatch.chdir(tmp_path)
    cfg = make_cfg(with_defaults([], "res"))
    with open_dict(cfg):
        cfg.task.name = name
    _refused(cfg, "task.name", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_results_dir_with_nul_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg(with_defaults([], "res"))
    cfg.results_dir = "res\0x"
    _refused(cfg, "results_dir", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_name_of_100_characters_is_fine(tmp_path, monkeypatch):
    from harness.validation import validate

    validate(make_cfg(with_defaults([f"task.name={'n' * 100}"], str(tmp_path / "res"))))


@pytest.mark.parametrize("family", [[], TOY, ["estimator=reinforce"]])
def test_device_cuda_without_cuda_is_refused(family, tmp_path, monkeypatch):
    """Control and toy runs (which train on the CPU) said cuda in config.yaml before."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = _refused(make_cfg(with_defaults([*family, "device=cuda"], "res")), "device", tmp_path)
    assert "CUDA is not available" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_through_the_cli(tmp_path):
    out = _cli(with_defaults(["device=cuda"], str(tmp_path / "res")), tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.count("invalid config: device must be") == 1, out.stdout
    assert not list((tmp_path / "res").glob("*/*/seed*"))


def _file_cases(tmp_path: Path) -> list[tuple[str, Path]]:
    """results_dir an existing file, under an existing file (how to test "read-only" as root:
    chmod does not stop root, a path under a file does), and under /proc (root cannot mkdir)."""
    f = tmp_path / "a_file"
    f.write_text("not a folder")
    return [(str(f), f), (str(f / "res"), f), (str(f / "deep" / "er"), f), ("/proc/harness-test-res", Path("/proc"))]


def test_unusable_results_dir_is_one_line_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for results_dir, culprit in _file_cases(tmp_path):
        message = _refused(make_cfg(with_defaults([], results_dir)), "results_dir", tmp_path)
        assert str(culprit) in message, message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_unusable_results_dir_through_the_cli(tmp_path):
    """Each kind of path through the real command line (an interpreter start each): a file, a
    path under one, a folder root cannot make; the test above runs every case in-process."""
    cases = _file_cases(tmp_path)
    for results_dir, culprit in (cases[0], cases[1], cases[3]):
        out = _cli(with_defaults([], results_dir), tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("invalid config:")]
        assert len(lines) == 1 and names(lines[0], "results_dir") and str(culprit) in lines[0], out.stdout
        assert "Traceback" not in out.stderr, out.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_read_only_results_dir(tmp_path, monkeypatch, capsys):
    """Root ignores chmod, so "read-only" is simulated where the harness asks: making a folder
    in it fails. The command line (which writes Hydra's job folder there) refuses it in one line
    with exit 2; in-process a read-only folder of finished runs still validates (each run that
    would write there is named by itself)."""
    import tempfile

    from omegaconf import OmegaConf

    from harness.callbacks import refuse_unusable_results_dir
    from harness.validation import validate

    res = tmp_path / "res"
    res.mkdir()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(res))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(SystemExit) as info:
        refuse_unusable_results_dir(OmegaConf.create({"results_dir": str(res)}))
    assert info.value.code == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("invalid config: results_dir must be") and str(res) in out[0], out
    validate(make_cfg(with_defaults([], str(res))))  # an existing folder: fine in-process
    message = _refused(make_cfg(with_defaults([], str(res / "new"))), "results_dir", tmp_path)
    assert str(res) in message and "Permission denied" in message


# ---------------------------------------------------------------- crafted entries in a results folder
TINY_RUN = ["task=cartpole", "estimator=a2c", "budget.iterations=1", "task.num_envs=2", "task.rollout_steps=8",
            "eval_every=0", "progress=false", "task.hidden=[8]", "minibatches=1"]


def _craft(kind: str, run_dir: Path, outside: Path) -> Path:
    """Make the crafted entry ``kind`` for ``run_dir``; returns its path."""
    if kind == "run_dir_is_a_file":
        run_dir.parent.mkdir(parents=True)
        run_dir.write_text("x")
        return run_dir
    if kind == "run_dir_is_a_symlink":  # issue 36: to a folder outside results_dir
        run_dir.parent.mkdir(parents=True)
        (outside.parent / "outside_dir").mkdir()
        run_dir.symlink_to(outside.parent / "outside_dir", target_is_directory=True)
        return run_dir
    run_dir.mkdir(parents=True)
    name, what = kind.rsplit("=", 1)
    p = run_dir / name
    if what == "dir":
        p.mkdir()
        (p / "inside").write_text("keep me")
    elif what == "fifo":
        os.mkfifo(p)  # reading it would block forever
    elif what == "symlink":
        p.symlink_to(outside)
    return p


BLOCKERS = ["run_dir_is_a_file", "run_dir_is_a_symlink", "summary.json=dir", ".lock=dir", "metrics.parquet=dir", "config.yaml=dir",
            "checkpoint.safetensors=dir", "metrics.parquet=fifo", "summary.json=fifo", ".lock=symlink",
            "summary.json=symlink", "metrics.parquet=symlink"]


@pytest.mark.parametrize("kind", BLOCKERS)
def test_a_crafted_entry_fails_its_run_with_one_line_and_the_others_run(kind, tmp_path, caplog):
    """Member 0's folder holds a crafted entry: it is named in one log line, counted failed,
    left as it was (never read, followed, truncated or removed); member 1 trains."""
    from harness.config import member_configs
    from harness.io.rundir import run_dir_for

    cfg = make_cfg([*TINY_RUN, "population=2", f"results_dir={tmp_path / 'res'}"])
    outside = tmp_path / "outside.json"
    outside.write_text('{"status": "completed", "iterations": 1}')
    crafted = _craft(kind, run_dir_for(member_configs(cfg)[0]), outside)
    before = os.lstat(crafted)
    with caplog.at_level("ERROR", logger="harness"):
        counts = run(cfg)
    assert counts.get("failed") == 1 and counts.get("completed") == 1, counts
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and str(crafted) in lines[0], lines
    assert "Traceback" not in lines[0]
    after = os.lstat(crafted)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), "the crafted entry was changed"
    assert outside.read_text() == '{"status": "completed", "iterations": 1}', "a symlink's target was written"
    assert not (tmp_path / "outside_dir").exists() or not any((tmp_path / "outside_dir").iterdir()), \
        "a run was written outside results_dir"
    counts = run(cfg)  # a rerun: the same one line, never "finished"
    assert counts.get("failed") == 1 and counts.get("skipped") == 1, counts


def test_a_crafted_entry_through_the_cli_exits_1_with_one_line(tmp_path):
    from harness.io.rundir import run_dir_for

    res = tmp_path / "res"
    overrides = [*TINY_RUN, f"results_dir={res}"]
    crafted = _craft("summary.json=dir", run_dir_for(make_cfg(overrides)), tmp_path / "unused")
    out = _cli(overrides, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text
    assert sum(str(crafted) in ln for ln in text.splitlines()) == 1, text
    assert "1 failed" in out.stdout
    assert crafted.is_dir() and (crafted / "inside").read_text() == "keep me"


def test_a_leftover_temp_folder_does_not_stop_a_run(tmp_path):
    from harness.io.rundir import run_dir_for

    cfg = make_cfg([*TINY_RUN, f"results_dir={tmp_path}"])
    tmp_dir = run_dir_for(cfg) / ".metrics.parquet.abc.tmp"
    tmp_dir.mkdir(parents=True)
    assert run(cfg).get("completed") == 1
    assert tmp_dir.is_dir()


def test_an_os_error_after_validation_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    """A run-time failure (issue 36): exit code 1, not the bad-input code 2."""
    def unwritable(cfg, on_start=None):
        raise PermissionError(13, "Permission denied", str(tmp_path / "res" / "cartpole"))

    monkeypatch.setattr(app, "run", unwritable)
    with pytest.raises(SystemExit) as info:
        app.main_entry(make_cfg([*TINY_RUN, f"results_dir={tmp_path / 'res'}"]))
    assert info.value.code == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and str(tmp_path / "res" / "cartpole") in out[0] and "Permission denied" in out[0], out


# ---------------------------------------------------------------- one rule for ~ in results_dir
def test_tilde_in_results_dir_is_the_home_folder_everywhere(tmp_path, monkeypatch):
    """Run directories (harness.io.rundir.run_dir_for) and the LM cache (${results_dir}/.cache/lm,
    expanded by the LM pipeline) land under the same $HOME/x; nothing under ./~."""
    from harness.config import expand_path, results_path
    from harness.io.rundir import run_dir_for

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg([*TINY_RUN, "results_dir='~/x'"])  # Hydra's grammar wants ~ quoted
    assert results_path(cfg) == str(home / "x")
    assert run_dir_for(cfg).is_relative_to(home / "x")
    lm = make_cfg(["task=lm_summarize", "estimator=rloo", "results_dir='~/x'"])
    assert Path(expand_path(lm.lm.cache_dir)) == home / "x" / ".cache" / "lm"
    assert run(cfg).get("completed") == 1
    assert list((home / "x").glob("cartpole/a2c/seed0-*/summary.json"))
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("override", ["results_dir=~/x", "results_dir='~/x'", '++results_dir="~/x"'])
def test_tilde_in_results_dir_through_the_cli(override, tmp_path):
    """Unquoted (Hydra alone refuses it) or quoted: $HOME/x, as a shell would expand it."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "harness", *TINY_RUN, override], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list((home / "x").glob("cartpole/a2c/seed0-*/summary.json")), out.stdout
    assert str(home / "x") in out.stdout  # "-> <results_dir>" names the expanded folder
    assert (home / "x" / ".hydra").is_dir()  # Hydra's job folder follows the same rule
    assert not (tmp_path / "~").exists()
