"""Continuous control as it is benchmarked (issue 18): observation and reward normalisation per
member against gymnasium's own wrappers and against statistics worked out in numpy, frozen for
evaluation; the continuous-action switches (tanh squashing against torch's
TransformedDistribution, state-dependent log-std, orthogonal init against torch.nn.Linear);
the MuJoCo / Box2D presets, which skip with a reason where their extra is missing, and the
one-line refusal when it is."""
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from harness.app import run
from harness.models.control import AgentSpec, ControlAgent
from harness.models.mlp import PopulationMLP
from harness.tasks.control import EvalEpisodes, MemberEnvs, Normalization, env_info, evaluate, make_vector_env
from harness.validation import validate
from tests.control_helpers import TINY, make_cfg

ROOT = Path(__file__).resolve().parents[1]
# The test extra installs both simulators and CI sets PG_HARNESS_REQUIRE_SIMULATORS: there the tests
# run (and fail if a simulator is missing); elsewhere they skip, naming the extra.
REQUIRED = bool(os.environ.get("PG_HARNESS_REQUIRE_SIMULATORS"))
HAS_MUJOCO = REQUIRED or importlib.util.find_spec("mujoco") is not None
HAS_BOX2D = REQUIRED or importlib.util.find_spec("Box2D") is not None
needs_mujoco = pytest.mark.skipif(not HAS_MUJOCO, reason='the mujoco extra is not installed '
                                  '(pip install -c constraints.txt -e ".[mujoco]")')
needs_box2d = pytest.mark.skipif(not HAS_BOX2D, reason='the box2d extra is not installed '
                                 '(pip install -c constraints.txt -e ".[box2d]")')
EPS = 1e-8  # gymnasium's epsilon under the square root (both wrappers)


# ----------------------------------------------------------------- normalisation
def pooled_var(batches: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of all rows of ``batches`` pooled with gymnasium's prior (a pseudo-sample
    of weight 1e-4, mean 0, variance 1: RunningMeanStd's start), by the textbook formula."""
    x = np.concatenate(batches).astype(np.float64)
    w = 1e-4
    mean = x.sum(0) / (len(x) + w)
    m2 = w * (1.0 + mean ** 2) + ((x - mean) ** 2).sum(0)
    return mean, m2 / (len(x) + w)


def drive(env_id: str, P: int, N: int, steps: int, norm: Normalization | None, seed: int = 0):
    """Step a population's envs with seeded uniform actions; returns the envs and the per-step
    ``(obs, reward, terminated, truncated, env_reward)`` list (reset obs first)."""
    info = env_info(env_id)
    envs = MemberEnvs(env_id, P, N, None, info, native=True, norm=norm)
    rng = np.random.default_rng(seed)
    first = envs.reset([100 + p for p in range(P)])
    out = []
    for _ in range(steps):
        a = rng.uniform(info.low, info.high, size=(P, N, info.act_dim)).astype(np.float32)
        out.append(envs.step_numpy(a) + (a,))
    return envs, first, out


@pytest.mark.parametrize("env_id", ["Pendulum-v1", pytest.param("Hopper-v5", marks=needs_mujoco)])
def test_normalisation_equals_gymnasium_wrappers_on_each_member_alone(env_id):
    """Each member of a population of 2 sees exactly what gymnasium's vector NormalizeObservation,
    an observation clip and NormalizeReward give on that member's env alone, fed the same
    actions; training rewards are scaled, the reported ones are the env's own."""
    P, N, T, clip, gamma = 2, 3, 260, 1.5, 0.9  # Pendulum truncates at 200: autoreset steps included
    norm = Normalization(obs=True, reward=True, obs_clip=clip, gamma=gamma)
    envs, first, steps = drive(env_id, P, N, T, norm)
    clipped = 0
    for p in range(P):
        ref = make_vector_env(env_id, N, None)
        ref = gym.wrappers.vector.NormalizeObservation(ref)
        ref = gym.wrappers.vector.TransformObservation(ref, lambda o: np.clip(o, -clip, clip))
        ref = gym.wrappers.vector.NormalizeReward(ref, gamma=gamma)
        raw = make_vector_env(env_id, N, None)
        o_ref, _ = ref.reset(seed=100 + p)
        raw.reset(seed=100 + p)
        assert np.array_equal(first[p], o_ref.astype(np.float32))
        for obs, rew, term, trunc, env_rew, a in steps:
            o_ref, r_ref, te_ref, tr_ref, _ = ref.step(a[p])
            _, r_raw, *_ = raw.step(a[p])
            assert np.array_equal(obs[p], o_ref.astype(np.float32))
            assert np.array_equal(rew[p], r_ref.astype(np.float32))
            assert np.array_equal(env_rew[p], r_raw.astype(np.float32))
            assert np.array_equal(term[p], te_ref) and np.array_equal(trunc[p], tr_ref)
            clipped += int((np.abs(obs[p]) == clip).sum())
        ref.close(); raw.close()  # noqa: E702
    assert clipped > 0, "the clip should bite for this test to mean anything"
    assert any(s[3].any() for s in steps) or env_id != "Pendulum-v1"  # a truncation happened
    envs.close()


def test_normalisation_statistics_equal_numpy_over_the_raw_stream():
    """The running statistics, worked out independently: the observation mean/variance of every
    raw observation a member's envs returned (reset ones included), and the variance of the
    discounted return R <- gamma (1 - terminated) R + r accumulated per env, skipping the
    autoreset step after each episode end (gymnasium 1.x NEXT_STEP)."""
    P, N, T, gamma = 2, 3, 230, 0.9
    norm = Normalization(obs=True, reward=True, obs_clip=None, gamma=gamma)
    envs, _, steps = drive("Pendulum-v1", P, N, T, norm)
    state = envs.norm_state()
    for p in range(P):
        raw = make_vector_env("Pendulum-v1", N, None)
        obs_batches = [raw.reset(seed=100 + p)[0]]
        acc, prev_done, returns = np.zeros(N), np.zeros(N, bool), []
        for *_, a in steps:
            o, r, te, tr, _ = raw.step(a[p])
            obs_batches.append(o)
            active = ~prev_done
            acc[active] = acc[active] * gamma * (1 - te[active]) + r[active]
            returns.append(acc[active].copy())
            prev_done = te | tr
        raw.close()
        mean, var = pooled_var(obs_batches)
        np.testing.assert_allclose(state["obs_mean"][p].numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state["obs_var"][p].numpy(), var, rtol=1e-5)
        assert float(state["obs_count"][p]) == pytest.approx(N * (T + 1) + 1e-4)
        r_mean, r_var = pooled_var([x[:, None] for x in returns])
        assert float(state["reward_mean"][p]) == pytest.approx(float(r_mean[0]), rel=1e-5)
        assert float(state["reward_var"][p]) == pytest.approx(float(r_var[0]), rel=1e-5)
        # the last training reward is the env's divided by sqrt(var + eps) of the statistics after it
        *_, (obs, rew, term, trunc, env_rew, a) = steps
        np.testing.assert_allclose(rew[p], env_rew[p] / math.sqrt(float(state["reward_var"][p]) + EPS), rtol=1e-5)
    assert not torch.equal(state["obs_mean"][0], state["obs_mean"][1])  # each member its own
    envs.close()


def test_evaluation_uses_frozen_copies_of_each_members_statistics():
    """Evaluation normalises with the member's training statistics and changes nothing: the
    training statistics stay as they were, and two evaluations in a row agree exactly."""
    P, N = 2, 2
    norm = Normalization(obs=True, reward=True, obs_clip=10.0, gamma=0.99)
    envs, _, _ = drive("Pendulum-v1", P, N, 40, norm)
    before = {k: v.clone() for k, v in envs.norm_state().items()}
    info = env_info("Pendulum-v1")
    agent = ControlAgent(P, AgentSpec(info.obs_dim, info.act_dim, False, [8], "tanh"), False,
                         [torch.Generator().manual_seed(i) for i in range(P)])
    spec = EvalEpisodes("Pendulum-v1", 2, 20, info, [5, 6])
    first = evaluate(agent, spec, train_envs=envs)
    second = evaluate(agent, spec, train_envs=envs)
    assert first == second
    # one member evaluated alone: its return as evaluated beside the other, None for the other
    assert evaluate(agent, spec, train_envs=envs, members=[False, True]) == [
        None, first[1]]
    after = envs.norm_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # what a frozen copy returns: (o - mean) / sqrt(var + eps), clipped, with the member's statistics
    ev = MemberEnvs("Pendulum-v1", P, 2, 20, info, native=False, norm=Normalization(obs=True, obs_clip=10.0))
    ev.freeze_observation_statistics(envs)
    raw = MemberEnvs("Pendulum-v1", P, 2, 20, info, native=False)
    o, o_raw = ev.reset([[5, 6], [7, 8]]), raw.reset([[5, 6], [7, 8]])
    for _ in range(3):
        for p in range(P):
            m, v = before["obs_mean"][p].numpy(), before["obs_var"][p].numpy()
            np.testing.assert_allclose(o[p], np.clip((o_raw[p] - m) / np.sqrt(v + EPS), -10, 10), rtol=1e-5, atol=1e-6)
        a = np.ones((P, 2, 1), np.float32)
        o, o_raw = ev.step_numpy(a)[0], raw.step_numpy(a)[0]
    assert all(torch.equal(before[k], v) for k, v in ev.norm_state().items() if k.startswith("obs"))
    for e in (ev, raw, envs):
        e.close()


# ----------------------------------------------------------------- continuous-action switches
def gaussian_agent(**kw) -> ControlAgent:
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    low, high = np.array([-2.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32)
    return ControlAgent(2, AgentSpec(3, 2, False, [8], "tanh", low=low, high=high, **kw), True, gens)


def test_tanh_log_prob_equals_torch_transformed_distribution():
    """log pi(a) of the squashed action a = c + s tanh(u) equals torch's TransformedDistribution
    (Normal -> TanhTransform -> AffineTransform(c, s)) at a, summed over action dimensions;
    actions reach the env inside the bounds, greedy ones at c + s tanh(mean)."""
    agent = gaussian_agent(action_bound="tanh", init_log_std=-0.5)
    obs = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    params = agent.dist_params(obs)
    u = agent.sample(params, torch.randn(2, 5, 2, generator=torch.Generator().manual_seed(1)))
    a = agent.env_actions(u)
    c, s = torch.tensor([-0.5, 2.0]), torch.tensor([1.5, 2.0])
    ref = TransformedDistribution(Normal(params, agent.log_std.exp().expand_as(params)),
                                  [TanhTransform(), AffineTransform(c, s)])
    expected = ref.log_prob(a).sum(-1)
    torch.testing.assert_close(agent.log_prob(params, u), expected, rtol=1e-4, atol=1e-4)
    assert (a > torch.tensor([-2.0, 0.0])).all() and (a < torch.tensor([1.0, 4.0])).all()
    torch.testing.assert_close(agent.env_actions(agent.greedy(params)), c + s * torch.tanh(params))
    clip = gaussian_agent(action_bound="clip", init_log_std=-0.5)
    assert torch.equal(clip.env_actions(u), u)  # clipping happens at the env (MemberEnvs)


def test_state_dependent_log_std_is_the_second_half_of_the_actor_output():
    agent = gaussian_agent(log_std="state_dependent", init_log_std=-1.0)
    assert agent.log_std is None and agent.net.weights[-1].shape[-1] == 4  # mean and log-std heads
    obs = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    params = agent.dist_params(obs)
    u = torch.randn(2, 5, 2, generator=torch.Generator().manual_seed(2))
    ref = Normal(params[..., :2], (params[..., 2:] - 1.0).exp())
    logp, entropy = agent.log_prob_entropy(params, u)
    torch.testing.assert_close(logp, ref.log_prob(u).sum(-1))
    torch.testing.assert_close(entropy, ref.entropy().sum(-1))
    assert entropy.std() > 0  # it varies with the state
    logp.sum().backward()
    assert agent.net.weights[-1].grad[:2, :, 2:].abs().sum() > 0  # the log-std head learns
    indep = gaussian_agent(init_log_std=-1.0)
    p2 = indep.dist_params(obs)
    torch.testing.assert_close(indep.log_prob(p2, u), Normal(p2, torch.full_like(p2, math.exp(-1.0))).log_prob(u).sum(-1))


def test_orthogonal_init_and_torch_default_init():
    """ortho_init: W^T W = gain^2 I per member and layer (sqrt 2 hidden; 0.01 policy head, 1 value
    head), zero biases. Off: exactly torch.nn.Linear's own init from the same seed."""
    gens = [torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    net = PopulationMLP(2, [5, 16, 3], "tanh", [0.01, 1.0], gens, ortho_init=True)
    for layer, gains in ((0, [math.sqrt(2), math.sqrt(2)]), (1, [0.01, 1.0])):
        for p, g in enumerate(gains):
            w = net.weights[layer][p].detach()  # [in, out]
            small = w.T @ w if w.shape[1] <= w.shape[0] else w @ w.T
            torch.testing.assert_close(small, g * g * torch.eye(min(w.shape)), atol=1e-5, rtol=1e-4)
        assert not net.biases[layer].detach().any()
    plain = PopulationMLP(1, [5, 3], "tanh", [0.01], [torch.Generator().manual_seed(7)], ortho_init=False)
    torch.manual_seed(7)
    linear = torch.nn.Linear(5, 3)
    torch.testing.assert_close(plain.weights[0][0].detach(), linear.weight.detach().T)
    torch.testing.assert_close(plain.biases[0][0, 0].detach(), linear.bias.detach())


# ----------------------------------------------------------------- presets, extras
def test_the_switches_and_normalisation_train_through_the_one_path(tmp_path):
    """Every switch off its default at once, on a continuous task, completes through the control
    trainer with finite losses; the reported returns are the env's own (Pendulum: <= 0)."""
    import pandas as pd

    overrides = ["task=pendulum", "estimator=ppo_gae", *TINY, f"results_dir={tmp_path}", "task.normalize_obs=true",
                 "task.normalize_reward=true", "task.obs_clip=5", "task.action_bound=tanh",
                 "task.log_std=state_dependent", "task.ortho_init=false"]
    assert run(make_cfg(overrides)) == {"skipped": 0, "completed": 1}
    (p,) = tmp_path.rglob("metrics.parquet")
    df = pd.read_parquet(p)
    assert df["policy_loss"].notna().all() and df["value_loss"].notna().all()
    assert (df["episode_return"].dropna() <= 0).all() and (df["eval_return"] <= 0).all()


@pytest.mark.parametrize("overrides,field", [
    (["task=pendulum", "mode=probe", "task.normalize_obs=true"], "task.normalize_obs"),
    (["task=pendulum", "mode=probe", "task.normalize_reward=true"], "task.normalize_reward"),
    (["task=toy", "estimator=grpo", "task.normalize_obs=true"], "task.normalize_obs"),
    (["task=toy", "estimator=grpo", "task.ortho_init=false"], "task.ortho_init"),
    (["task=pendulum", "task.normalize_obs=true", "task.obs_clip=0"], "task.obs_clip"),
])
def test_normalisation_and_switches_are_refused_where_they_would_be_ignored(overrides, field):
    """The probes measure gradients on raw observations; the toy and LM families have no gymnasium
    env and no Gaussian policy: refused by name rather than silently ignored."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(make_cfg(overrides))


@pytest.mark.parametrize("task,extra,module", [("hopper", "mujoco", "mujoco"), ("halfcheetah", "mujoco", "mujoco"),
                                               ("walker2d", "mujoco", "mujoco"), ("lunarlander", "box2d", "Box2D"),
                                               ("lunarlander_continuous", "box2d", "Box2D")])
def test_a_task_whose_extra_is_missing_is_refused_in_one_line_naming_it(task, extra, module, monkeypatch):
    import harness.tasks.control as control

    real = control.importlib.import_module

    def hide(name, *args):
        if name == module:
            raise ImportError(f"No module named {module!r}")
        return real(name, *args)

    monkeypatch.setattr(control.importlib, "import_module", hide)
    with pytest.raises(ValueError) as err:
        validate(make_cfg([f"task={task}", "estimator=ppo_gae"]))
    msg = str(err.value)
    assert "\n" not in msg and f"task={task}" in msg and f'pip install -c constraints.txt -e ".[{extra}]"' in msg


def test_the_command_line_exits_2_before_any_run_directory_without_the_extra(tmp_path):
    """The real command line, with ``mujoco`` unimportable (a stand-in package that raises):
    one line on stdout, exit code 2, no run directory."""
    fake = tmp_path / "fake" / "mujoco"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    r = subprocess.run([sys.executable, "-m", "harness", "task=hopper", "estimator=ppo_gae",
                        f"results_dir={tmp_path / 'out'}"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stdout.splitlines() == ['invalid config: task=hopper (task.env_id=Hopper-v5) needs the mujoco extra, '
                                     'not installed here: pip install -c constraints.txt -e ".[mujoco]"']
    assert not (tmp_path / "out" / "hopper").exists()


@pytest.mark.parametrize("task", [pytest.param(t, marks=needs_mujoco) for t in ("hopper", "halfcheetah", "walker2d")]
                         + [pytest.param(t, marks=needs_box2d) for t in ("lunarlander", "lunarlander_continuous")])
@pytest.mark.parametrize("estimator", ["ppo_gae", "rloo"])
def test_new_tasks_run_two_iterations(task, estimator, tmp_path):
    """Each new preset (with its tuned ppo_gae file where there is one) trains through the one
    control path; checkpoints on, so the normalisation state is saved too."""
    import json

    cfg = make_cfg([f"task={task}", f"estimator={estimator}", f"results_dir={tmp_path}", *TINY, "checkpoint_every=1",
                    "minibatches=2"])  # the tuned files draw 8-16 minibatches from 512 steps
    assert run(cfg) == {"skipped": 0, "completed": 1}
    (summary,) = tmp_path.rglob("summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"


@needs_mujoco
@pytest.mark.parametrize("estimator", ["ppo_gae", "rloo"])
def test_hopper_killed_and_resumed_equals_uninterrupted(estimator, tmp_path, monkeypatch, caplog):
    """MuJoCo observations are float64, so the statistics are too (Pendulum's are float32): a
    population of 2 killed after its checkpoint and resumed ends with exactly the uninterrupted
    run's metrics (tests/test_checkpoint.py's helpers)."""
    import logging

    from tests.test_checkpoint import Killed, assert_same_runs, kill_at

    caplog.set_level(logging.INFO, logger="harness")

    args = ["task=hopper", f"estimator={estimator}", *TINY, "minibatches=2", "population=2", "budget.iterations=6",
            "eval_every=2", "checkpoint_every=2", "threads=1"]
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    kill_at(monkeypatch, 5)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/killed"]))
    monkeypatch.undo()
    assert run(make_cfg(args + [f"results_dir={tmp_path}/killed"])) == {"skipped": 0, "completed": 2}
    assert any("resume" in r.message and "at iteration 4" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", tmp_path / "killed")
