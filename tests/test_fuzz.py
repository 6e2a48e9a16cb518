"""Bad-input fuzzing (issue 7): invalid configurations and overrides fail before any training,
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


def test_there_are_at_least_50_distinct_cases():
    keys = [tuple(c[0]) for c in CASES] + [tuple(c[0]) for c in CLI_CASES]
    assert len({tuple(c[0]) for c in CASES}) == len(CASES), "duplicate in-process case"
    assert len(CASES) >= 50 and len(CLI_CASES) >= 5 and len(keys) >= 55


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
