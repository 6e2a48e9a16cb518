"""Control trainer: every task x estimator runs, the output contract, autoreset and
truncation handled by hand-worked values, identical group starts, resume, populations."""
import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from omegaconf import OmegaConf

import tests.scripted_env  # noqa: F401  (registers ChainTest-v0 & co.)
from harness.plan import RunPlan
from harness.app import run
from harness.config import TaskConfig
from harness.estimators import EstimatorParams, estimator_names, gae, get_estimator
from harness.io.rundir import METRIC_COLUMNS
from harness.tasks.control import EpisodeCollector, EpisodeLayout, MemberEnvs, StepCollector, env_info, missing_extra
from harness.testing import config_folders
from harness.train.control import ControlSource
from harness.train.loop import Loop
from harness.train.update import Members, update
from tests.control_helpers import TINY, make_cfg


def control_tasks() -> list[str]:
    """The control tasks of the task config group (``harness/conf/task/`` and the folders of
    ``--pg-searchpath``), but cartpole: harness/testing/test_registry_contract.py trains it with
    every estimator."""
    names: list[str] = []
    for _, folder in config_folders():
        for path in sorted((folder / "task").glob("*.yaml")):
            family = (OmegaConf.load(path).get("task") or {}).get("family", TaskConfig.family)
            if family == "control" and path.stem not in names and path.stem != "cartpole":
                names.append(path.stem)
    return names


TASKS = control_tasks()
ESTIMATORS = estimator_names()


def test_the_control_tasks_are_read_from_the_task_group():
    assert {"acrobot", "mountaincar", "pendulum", "halfcheetah", "lunarlander"} <= set(TASKS)
    assert not {"cartpole", "toy", "lm_arith"} & set(TASKS)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_task_and_estimator_runs_two_iterations(task, estimator, tmp_path):
    args = [f"task={task}", f"estimator={estimator}", f"results_dir={tmp_path}", *TINY]
    cfg = make_cfg(args)
    extra = missing_extra(cfg.task.env_id)
    if extra:
        pytest.skip(f"task={task} needs the {extra} extra, not installed here")
    if cfg.minibatches > 4:  # a task's own (mujoco: 32) within TINY's 16 samples an iteration
        cfg = make_cfg([*args, "minibatches=4"])
    counts = run(cfg)
    assert counts == {"skipped": 0, "completed": 1}
    (run_dir,) = [p.parent for p in tmp_path.rglob("summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["iterations"] == 2
    assert {"torch", "gymnasium", "python"} <= set(summary["versions"])
    table = pq.read_table(run_dir / "metrics.parquet")
    assert set(METRIC_COLUMNS) <= set(table.column_names)
    df = table.to_pandas()
    assert df["iteration"].tolist() == [1, 2]
    assert (df["estimator"] == estimator).all() and (df["seed"] == 0).all()
    assert df["env_steps"].is_monotonic_increasing and df["env_steps"].iloc[0] > 0
    assert df["eval_return"].notna().all()  # eval_every=1
    critic = get_estimator(estimator).needs_critic
    assert df["value_loss"].notna().all() == critic
    assert df["explained_variance"].isna().all() != critic or df["explained_variance"].isna().all()
    assert (run_dir / "config.yaml").exists()


# ----------------------------------------------------------------- collection, by hand
def agent_for(env_id, population=1, critic=True):
    from harness.models.control import AgentSpec, ControlAgent

    info = env_info(env_id)
    gens = [torch.Generator().manual_seed(i) for i in range(population)]
    spec = AgentSpec(info.obs_dim, info.act_dim, info.discrete, [8], "tanh")
    return ControlAgent(population, spec, critic, gens), info, gens


def test_autoreset_transition_is_masked_and_not_counted():
    # ChainTest: goal 3 -> steps 0,1,2 are an episode (terminated at 2); step 3 is the reset
    # transition of NEXT_STEP autoreset; steps 4,5,6 the next episode; T = 8.
    agent, info, gens = agent_for("ChainTest-v0")
    envs = MemberEnvs("ChainTest-v0", 1, 1, None, info, native=True)
    ro = StepCollector(envs, gens, rollout_steps=8).collect(agent)
    assert ro.mask[:, 0, 0].tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
    assert ro.terminated[:, 0, 0].tolist() == [0, 0, 1, 0, 0, 0, 1, 0]
    assert ro.rewards[:, 0, 0].tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
    assert int(ro.steps[0]) == 6
    assert ro.episode_returns == [[3.0, 3.0]]
    # the obs after the terminating step is the real final obs (position 3), not a reset obs
    assert ro.next_obs[2, 0, 0, 0].item() == 3.0
    assert ro.obs[4, 0, 0, 0].item() == 0.0  # the new episode starts at the reset obs


def test_truncation_bootstraps_from_the_real_final_observation():
    # ChainTrunc: TimeLimit 2 -> truncated at step 1 with final obs position 2.
    agent, info, gens = agent_for("ChainTrunc-v0")
    envs = MemberEnvs("ChainTrunc-v0", 1, 1, None, info, native=True)
    ro = StepCollector(envs, gens, rollout_steps=3).collect(agent)
    assert ro.truncated[:, 0, 0].tolist() == [0, 1, 0] and ro.terminated.sum() == 0
    assert ro.mask[:, 0, 0].tolist() == [1, 1, 0]
    assert ro.next_obs[1, 0, 0, 0].item() == 2.0  # real final observation
    # Through the trainer's advantage path with V(s) := position (a hand-set critic):
    source = ControlSource.__new__(ControlSource)
    source.P, source.spec, source.group_size = 1, get_estimator("ppo_gae"), None

    class PositionCritic:
        def value(self, obs):
            return obs[..., 0]

    source.agent = PositionCritic()
    batch = source.advantage_batch(ro)
    adv = source.spec(batch, EstimatorParams(gamma=0.5, gae_lambda=1.0)).advantages.reshape(3, 1, 1)
    # t=1: r=1, truncated, bootstrap 0.5 * V(final obs = 2) = 1 -> A = 1 + 1 - V(s1 = 1) = 1
    # t=0: r=1 + 0.5 * (A1 + V(s1)) = 1 + 0.5 * 2 = 2 -> A0 = 2 - 0 = 2
    assert adv[0, 0, 0].item() == pytest.approx(2.0)
    assert adv[1, 0, 0].item() == pytest.approx(1.0)
    # a wrong implementation that bootstraps from the reset obs (position 0) would give A1 = 0
    manual, _ = gae(torch.tensor([[1.0], [1.0]]), torch.tensor([[0.0], [1.0]]), torch.tensor([[1.0], [2.0]]),
                    torch.tensor([[0.0], [0.0]]), torch.tensor([[0.0], [1.0]]), 0.5, 1.0)
    assert manual.flatten().tolist() == pytest.approx([2.0, 1.0])


def test_group_members_start_from_identical_states_and_greedy_shares_them():
    agent, info, gens = agent_for("ChainTest-v0", critic=False)
    col = EpisodeCollector("ChainTest-v0", 1, EpisodeLayout(episodes=6, group_size=3, greedy=True),
                           max_episode_steps=None, info=info, gens=gens)
    ro = col.collect(agent)
    starts = ro.obs[0, 0, :, 1].tolist()  # start_offset of each of the 6 episodes
    assert starts[0] == starts[1] == starts[2] and starts[3] == starts[4] == starts[5]
    # every column runs exactly one episode of 3 steps; the greedy columns count too: 8 x 3
    assert int(ro.steps[0]) == 8 * 3
    assert ro.mask[:, 0].sum(0).tolist() == [3.0] * 6
    assert ro.greedy_returns.tolist() == [[3.0, 3.0]]
    col.close()


def test_unsupported_action_space_is_refused_by_name():
    with pytest.raises(ValueError, match="MultiDiscrete"):
        env_info("ChainMultiDiscrete-v0")


# ----------------------------------------------------------------- resume and invalid input
def test_rerun_skips_completed_and_redoes_killed(tmp_path):
    args = ["task=cartpole", "estimator=a2c", f"results_dir={tmp_path}", *TINY]
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}
    assert run(make_cfg(args)) == {"skipped": 1}
    (summary,) = tmp_path.rglob("summary.json")
    summary.unlink()  # as if killed before the end
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}


@pytest.mark.parametrize("override,field", [
    ("gamma=0", "gamma"), ("gamma=1.5", "gamma"), ("gae_lambda=1.2", "gae_lambda"),
    ("clip_eps=-0.1", "clip_eps"), ("population=0", "population"), ("budget.env_steps=10", "budget.env_steps"),
    ("normalize_advantages=always", "normalize_advantages"), ("loss_agg=sum", "loss_agg"),
    ("kl.estimator=k4", "kl.estimator"), ("task.env_id=NoSuchEnv-v9", "task.env_id"),
    # issue 18's switches: unknown values, and values a Discrete action space or raw observations would ignore
    ("task.log_std=wide", "task.log_std"), ("task.action_bound=sigmoid", "task.action_bound"),
    ("task.log_std=state_dependent", "task.log_std"), ("task.action_bound=tanh", "task.action_bound"),
    ("task.obs_clip=5", "task.obs_clip"), ("task.obs_clip=-1", "task.obs_clip"),
])
def test_invalid_values_fail_before_training(override, field, tmp_path):
    cfg = make_cfg(["task=cartpole", "estimator=ppo_gae", f"results_dir={tmp_path}", override])
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        run(cfg)
    assert not any(tmp_path.rglob("config.yaml"))


def test_group_size_below_two_is_refused_for_group_estimators(tmp_path):
    cfg = make_cfg(["task=cartpole", "estimator=rloo", f"results_dir={tmp_path}", "group_size=1",
                    "task.episodes_per_iter=4"])
    with pytest.raises(ValueError, match="group_size"):
        run(cfg)


def test_unknown_estimator_is_refused_with_choices():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="ppo_gae"):
        make_cfg(["estimator=ppo"])


def test_diverging_run_is_recorded_as_diverged(tmp_path):
    cfg = make_cfg(["task=cartpole", "estimator=a2c", f"results_dir={tmp_path}", *TINY, "lr=1e30",
                    "max_grad_norm=null", "budget.iterations=5"])
    counts = run(cfg)
    (summary,) = tmp_path.rglob("summary.json")
    s = json.loads(summary.read_text())
    if counts.get("diverged"):
        assert s["status"] == "diverged" and "iteration" in s["reason"]
        df = pq.read_table(summary.parent / "metrics.parquet").to_pandas()
        assert len(df) == s["iterations"] >= 1
    else:  # lr=1e30 must blow up a2c within 5 iterations
        pytest.fail(f"expected a diverged run, got {counts}")


# ----------------------------------------------------------------- seeds as a batch axis
# normalised observations and rewards (issue 18) are the member's own statistics, with every
# continuous-action switch off its default
NORMALISED = ["task.normalize_obs=true", "task.normalize_reward=true", "task.obs_clip=2",
              "task.action_bound=tanh", "task.log_std=state_dependent", "task.ortho_init=false"]


@pytest.mark.parametrize("task,estimator,extra", [
    ("cartpole", "ppo_gae", []), ("cartpole", "rloo", []),
    ("pendulum", "ppo_gae", NORMALISED), ("pendulum", "rloo", NORMALISED),
], ids=["cartpole-ppo_gae", "cartpole-rloo", "pendulum-ppo_gae-normalised", "pendulum-rloo-normalised"])
def test_population_member_equals_lone_run(task, estimator, extra, tmp_path):
    common = [f"task={task}", f"estimator={estimator}", *TINY, "budget.iterations=1", "eval_every=0", *extra]
    pop = make_cfg(common + ["seed=3", "population=3", f"results_dir={tmp_path}/pop"])
    lone = make_cfg(common + ["seed=4", f"results_dir={tmp_path}/lone"])
    s_pop, ro_pop, src_pop = one_update(pop)
    s_lone, ro_lone, src_lone = one_update(lone)
    assert torch.equal(ro_pop.actions[:, 1], ro_lone.actions[:, 0])
    assert torch.equal(ro_pop.obs[:, 1], ro_lone.obs[:, 0])
    assert torch.equal(ro_pop.rewards[:, 1], ro_lone.rewards[:, 0])
    norm_pop, norm_lone = src_pop.collector.envs.norm_state(), src_lone.collector.envs.norm_state()
    assert sorted(norm_pop) == sorted(norm_lone) and bool(norm_pop) == bool(extra)
    for key in norm_pop:
        assert torch.equal(norm_pop[key][1], norm_lone[key][0]), key
    for key in ("policy_loss", "loss", "grad_norm", "entropy"):
        assert float(s_pop[key][1]) == pytest.approx(float(s_lone[key][0]), abs=1e-5), key
    from harness.models.mlp import member_view

    for a, b in zip(src_pop.agent.parameters(), src_lone.agent.parameters()):
        assert torch.allclose(member_view(a.data, 3)[:, 1], member_view(b.data, 1)[:, 0], atol=1e-5)


def one_update(cfg):
    """Collect one rollout and make one update through the loop's pieces: ``(stats, rollout, source)``."""
    from harness.config import member_configs
    from harness.io import RunDir

    runs = [RunDir(m) for m in member_configs(cfg)]
    source = ControlSource(RunPlan.of(cfg), runs)
    loop = Loop(RunPlan.of(cfg), source, runs)
    ro = source.collect()
    batch = source.advantage_batch(ro)
    out = loop.spec(batch, loop.est_params)
    ub = source.update_batch(ro, out.advantages, out.returns, batch.values)
    stats = update(loop.learner, loop.opt, ub, loop.settings,
                   Members(source.gens, loop.active, loop.member_lr(), loop.kl_beta))
    return stats, ro, source


def test_population_writes_the_same_run_directories_as_lone_runs(tmp_path):
    common = ["task=cartpole", "estimator=ppo_gae", *TINY, f"results_dir={tmp_path}"]
    run(make_cfg(common + ["seed=0", "population=2"]))
    dirs = sorted(p.parent.name for p in tmp_path.rglob("summary.json"))
    assert len(dirs) == 2 and dirs[0].startswith("seed0-") and dirs[1].startswith("seed1-")
    assert run(make_cfg(common + ["seed=1"])) == {"skipped": 1}


def clip_per_member(params, max_norm, population, per_network):
    """The control learner's clipping (:meth:`harness.train.control.ControlLearner.clip_grads`) of
    ``params`` stacking actor and critic blocks of ``population`` rows."""
    from types import SimpleNamespace

    from harness.train.control import ControlLearner

    return ControlLearner.clip_grads(SimpleNamespace(params=params, population=population), max_norm, per_network)

@pytest.mark.parametrize("value, member, expected", [
    (float("nan"), 1, [True, False, True]), (float("inf"), 2, [True, True, False]),
    (float("-inf"), 0, [False, True, True]), (3e38, 1, [True, True, True]), (None, None, [True, True, True])],
    ids=["nan", "inf", "-inf", "huge-finite", "all-finite"])
def test_finite_members_names_the_members_with_a_non_finite_weight(value, member, expected):
    """:meth:`~harness.train.control.ControlLearner.finite_members`: a member is finite when every
    weight of its actor and critic rows is. Huge finite weights (3e38: their norm overflows to inf,
    which the fast check reads as "look member by member") still count as finite."""
    from harness.train.control import ControlLearner

    agent, _, _ = agent_for("CartPole-v1", population=3)
    learner = ControlLearner(agent)
    if value is not None:
        with torch.no_grad():  # a weight of member p's critic (rows P..2P-1) in the output layer
            agent.net.weights[1][3 + member, 5, 1] = value
    assert learner.finite_members().tolist() == expected


def test_grad_clipping_is_per_member_and_per_network():
    """Hand-set gradients: member 0 actor norm 5 (clipped to 1), critic norm 0.6 (kept);
    member 1 actor norm 0.5 (kept), critic norm 10 (clipped to 1)."""

    w = torch.zeros(4, 2, requires_grad=True)  # rows: actor p0, actor p1, critic p0, critic p1
    log_std = torch.zeros(2, 1, requires_grad=True)  # actor-only parameter, one row per member
    w.grad = torch.tensor([[3.0, 0.0], [0.3, 0.0], [0.6, 0.0], [6.0, 0.0]])
    log_std.grad = torch.tensor([[4.0], [0.4]])
    norms = clip_per_member([w, log_std], 1.0, 2, True)
    assert norms.flatten().tolist() == pytest.approx([5.0, 0.5, 0.6, 6.0])
    assert w.grad[:, 0].tolist() == pytest.approx([0.6, 0.3, 0.6, 1.0], abs=1e-5)
    assert log_std.grad.flatten().tolist() == pytest.approx([0.8, 0.4], abs=1e-5)
    # population of one takes the fused path: same rule
    w1 = torch.zeros(2, 2, requires_grad=True)
    w1.grad = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    norms = clip_per_member([w1], 1.0, 1, True)
    assert norms.flatten().tolist() == pytest.approx([5.0, 0.5])
    assert w1.grad.flatten().tolist() == pytest.approx([0.6, 0.8, 0.3, 0.4], abs=1e-5)


@pytest.mark.parametrize("population", [1, 2])
def test_joint_grad_clipping_uses_one_norm_per_member(population):
    """Joint: actor (3, 4) and critic (0, 12) of a member share the norm 13 -> all scaled by 1/13."""

    rows = [[3.0, 4.0]] * population + [[0.0, 12.0]] * population
    w = torch.zeros(2 * population, 2, requires_grad=True)
    w.grad = torch.tensor(rows)
    norms = clip_per_member([w], 1.0, population, False)
    assert norms[:, 0].tolist() == pytest.approx([5.0, 12.0])  # reported per block
    assert w.grad[0].tolist() == pytest.approx([3 / 13, 4 / 13], abs=1e-5)
    assert w.grad[population].tolist() == pytest.approx([0.0, 12 / 13], abs=1e-5)


def test_population_members_stopping_at_different_iterations_match_lone_runs(tmp_path):
    """Whole-episode collection: members reach the step budget at different iterations; the
    ones that stop are frozen, and every member's metrics equal its lone run's."""
    import pandas as pd

    common = ["task=cartpole", "estimator=rloo", "task.episodes_per_iter=4", "group_size=2", "task.hidden=[16]",
              "budget.env_steps=1500", "eval_every=2", "eval_episodes=2", "progress=false"]
    run(make_cfg(common + ["seed=0", "population=3", f"results_dir={tmp_path}/pop"]))
    frames = {}
    for seed in range(3):
        run(make_cfg(common + [f"seed={seed}", f"results_dir={tmp_path}/lone"]))
    iterations = set()
    for seed in range(3):
        (p_pop,) = (tmp_path / "pop").rglob(f"seed{seed}-*/metrics.parquet")
        (p_lone,) = (tmp_path / "lone").rglob(f"seed{seed}-*/metrics.parquet")
        a = pd.read_parquet(p_pop).drop(columns=["wall_time_s"])
        b = pd.read_parquet(p_lone).drop(columns=["wall_time_s"])
        assert p_pop.parent.name == p_lone.parent.name  # same run directory name
        pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=1e-5)
        iterations.add(len(a))
        frames[seed] = a
    assert len(iterations) > 1, "members should stop at different iterations for this test to bite"


# ----------------------------------------------------------------- population worker processes
WORKER_CASES = {
    # persistent envs, per-member annealed learning rates
    "ppo_gae": ["task=cartpole", "estimator=ppo_gae", "budget.iterations=5", "anneal_lr=true"],
    # whole episodes: the members reach the step budget at different iterations; adaptive KL betas
    "grpo": ["task=cartpole", "estimator=grpo", "budget.iterations=null", "budget.env_steps=700",
             "task.max_episode_steps=60", "kl.adaptive=true", "kl.beta=0.01"],
}


@pytest.mark.parametrize("case", sorted(WORKER_CASES))
def test_population_split_across_worker_processes_gives_the_one_process_metrics(case, tmp_path, caplog):
    """population_workers=2 trains seeds 0-1 and 2 in two forked processes; each member's metrics
    and status equal those of the population trained in one process, up to float rounding (the
    batched kernels' shapes differ, as between a member and its lone run)."""
    import pandas as pd

    from tests.test_checkpoint import metrics_by_run, statuses

    args = ["seed=0", "population=3", *TINY, "eval_every=2", "threads=1", *WORKER_CASES[case]]
    run(make_cfg(args + ["population_workers=1", f"results_dir={tmp_path}/one"]))
    caplog.set_level(logging.INFO, logger="harness")
    counts = run(make_cfg(args + ["population_workers=2", f"results_dir={tmp_path}/two"]))
    assert counts == {"skipped": 0, "completed": 3}
    assert "population of 3: 2 worker processes (seeds 0-1, 2-2)" in caplog.text
    one, two = metrics_by_run(tmp_path / "one"), metrics_by_run(tmp_path / "two")
    assert sorted(one) == sorted(two) and len(one) == 3
    for key in one:
        pd.testing.assert_frame_equal(one[key], two[key], atol=1e-5, rtol=1e-5, obj=key)
    assert statuses(tmp_path / "one") == statuses(tmp_path / "two")
    if case == "grpo":
        assert len({len(df) for df in one.values()}) > 1, "members should stop at different iterations"


def test_a_failing_population_worker_records_its_members_and_the_other_worker_finishes(tmp_path, monkeypatch):
    """The worker training seed 2 raises (patched before the fork): seed 2 is recorded as failed
    with the exception, seeds 0 and 1 (the other worker) complete."""
    real = ControlSource.collect

    def collect(self):
        if 2 in self.seeds:
            raise RuntimeError("boom in seed 2")
        return real(self)

    monkeypatch.setattr(ControlSource, "collect", collect)
    counts = run(make_cfg(["task=cartpole", "estimator=ppo_gae", "seed=0", "population=3", *TINY,
                           "population_workers=2", "threads=1", f"results_dir={tmp_path}"]))
    assert counts == {"skipped": 0, "completed": 2, "failed": 1}
    summaries = {p.parent.name.split("-")[0]: json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")}
    assert summaries["seed2"]["status"] == "failed" and summaries["seed2"]["reason"] == "RuntimeError: boom in seed 2"
    assert summaries["seed0"]["status"] == summaries["seed1"]["status"] == "completed"


@pytest.mark.parametrize("population,workers,threads,cores,want", [
    (16, None, None, 2, (2, 1)),   # default: one worker per core, one thread each
    (16, None, None, 8, (8, 1)),
    (3, None, None, 8, (3, 2)),    # fewer members than cores: the spare cores become threads
    (1, None, None, 8, (1, 1)),    # a lone run: one thread
    (16, 1, None, 2, (1, 2)),      # one process: every core as a thread
    (16, 4, 3, 2, (4, 3)),         # as set
    (2, 8, None, 2, (2, 1)),       # never more workers than members
])
def test_population_layout(population, workers, threads, cores, want, monkeypatch):
    import harness.train.control as control

    monkeypatch.setattr(control, "cores_available", lambda: cores)
    cfg = make_cfg(["task=cartpole", "estimator=ppo_gae", f"population={population}",
                    f"population_workers={'null' if workers is None else workers}",
                    f"threads={'null' if threads is None else threads}"])
    assert control.layout(cfg, population) == want


@pytest.mark.parametrize("estimator", ["ppo_gae", "grpo"])
def test_same_config_and_seed_give_identical_metrics(estimator, tmp_path):
    """Determinism on CPU (same thread count): metrics equal bit for bit, wall clock aside."""
    import pandas as pd

    args = ["task=cartpole", f"estimator={estimator}", *TINY, "budget.iterations=3", "seed=7"]
    run(make_cfg(args + [f"results_dir={tmp_path}/a"]))
    run(make_cfg(args + [f"results_dir={tmp_path}/b"]))
    (pa_,) = (tmp_path / "a").rglob("metrics.parquet")
    (pb_,) = (tmp_path / "b").rglob("metrics.parquet")
    a = pd.read_parquet(pa_).drop(columns=["wall_time_s"])
    b = pd.read_parquet(pb_).drop(columns=["wall_time_s"])
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.parametrize("population", [1, 3])
@pytest.mark.parametrize("per_network", [False, True])
def test_grad_clipping_of_each_member_is_torch_clip_grad_norm(population, per_network):
    """Random gradients of a population (actor and critic blocks, an actor-only parameter): member
    p's clipped gradients and pre-clip norms are those of ``torch.nn.utils.clip_grad_norm_`` on
    member p's own gradients, over actor and critic together (joint) or over each network
    (per_network); bit for bit where the op order is torch's (a lone run, per network). The LM and
    toy learners' entry (:func:`clip_grad_groups`, parameter groups) gives the same."""
    from harness.models.mlp import member_view
    from harness.train.update import clip_grad_groups

    P, max_norm = population, 0.7
    g = torch.Generator().manual_seed(11)
    shapes = [(2 * P, 4, 8), (2 * P, 1, 8), (2 * P, 8, 1), (P, 1, 3)]  # last: actor only (log-std)
    grads = [torch.randn(s, generator=g) * torch.rand(1, generator=g) for s in shapes]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for prm, gr in zip(params, grads):
        prm.grad = gr.clone()
    norms = clip_per_member(params, max_norm, P, per_network)
    assert norms.shape == (2, P)

    def leaves(p):  # member p's actor and critic gradients on leaf tensors of their own
        nets = [[], []]
        for gr in grads:
            for k, block in enumerate(member_view(gr, P)[:, p]):
                leaf = torch.zeros_like(block, requires_grad=True)
                leaf.grad = block.clone()
                nets[k].append(leaf)
        return nets

    exact = P == 1 and per_network
    same = (lambda a, b: torch.equal(a, b)) if exact else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-7))
    for p in range(P):
        nets = leaves(p)
        want_norms = [torch.nn.utils.clip_grad_norm_(net, float("inf")) for net in nets]  # measures only
        for net in (nets if per_network else [nets[0] + nets[1]]):
            torch.nn.utils.clip_grad_norm_(net, max_norm)
        for k, net in enumerate(nets):
            assert same(norms[k, p], want_norms[k])
            blocks = [member_view(prm.grad, P)[k, p] for prm in params if prm.shape[0] > k * P]
            assert len(blocks) == len(net) and all(same(got, leaf.grad) for got, leaf in zip(blocks, net))
        if P == 1:  # the parameter-group entry of the LM and toy learners: the same numbers
            groups = leaves(p)
            assert torch.equal(clip_grad_groups(groups, max_norm, per_network), norms)
            for group, net in zip(groups, nets):
                assert all(same(a.grad, b.grad) for a, b in zip(group, net))

@pytest.mark.parametrize("per_network", [False, True])
def test_lone_grad_clipping_gives_the_bits_of_blockwise_clipping(per_network):
    """The population-of-one path against the rule written out block by block (views of each
    gradient's actor and critic rows, norms of norms, one scale per block)."""

    g = torch.Generator().manual_seed(3)
    shapes = [(2, 4, 8), (2, 1, 8), (2, 8, 2), (1, 1, 2)]  # last: an actor-only parameter (log-std)
    grads = [torch.randn(s, generator=g) * 3 for s in shapes]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p, gr in zip(params, grads):
        p.grad = gr.clone()
    blocks = [[gr[0] for gr in grads], [gr[1] for gr in grads if gr.shape[0] > 1]]
    want = torch.stack([torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in b])) for b in blocks])
    totals = want if per_network else torch.linalg.vector_norm(want).expand(2)
    for b, n in zip(blocks, totals):
        for x in b:
            x.mul_((0.5 / (n + 1e-6)).clamp(max=1.0))
    norms = clip_per_member(params, 0.5, 1, per_network)
    assert torch.equal(norms, want.view(2, 1))
    for p, gr in zip(params, grads):
        assert torch.equal(p.grad, gr)


class _LinearGreedy:
    """A population of fixed greedy policies, one weight row per member: Discrete: the last
    category where ``obs @ w > 0``, else the first; Box: ``scale * obs @ w`` (members with a large scale ask for actions out of
    bounds, one member's are NaN: :meth:`EnvInfo.to_space`'s clipping and zeroing are exercised)."""

    def __init__(self, weights: torch.Tensor, info, scale: torch.Tensor | None = None):
        self.w, self.discrete, self.categories, self.scale = weights, info.discrete, info.act_dim, scale
        self.population = weights.shape[0]

    def dist_params(self, obs):  # [P, E, D] -> [P, E, 1]
        return torch.einsum("ped,pd->pe", obs.double(), self.w).unsqueeze(-1)

    def policy(self):  # what evaluate steps with (ControlAgent.policy)
        return self.dist_params

    def greedy(self, params):
        if self.discrete:  # the first or the last category (Acrobot: torque -1 or +1)
            return (params[..., 0] > 0).long() * (self.categories - 1)
        a = params * self.scale.view(-1, 1, 1)
        a[-1] = float("nan")
        return a.float()

    def env_actions(self, actions):
        return actions


def _vector_env_evaluation(agent, env_id, episodes, max_steps, info, seeds):
    """Evaluation as it ran before :class:`EpisodeEnvs`: every member's episodes as the sub-envs
    of one SyncVectorEnv (MemberEnvs), every sub-env stepped (autoreset) until all have ended."""
    envs = MemberEnvs(env_id, agent.population, episodes, max_steps, info, native=False)
    obs = torch.from_numpy(envs.reset([[s + i for i in range(episodes)] for s in seeds]))
    alive = torch.ones(agent.population, episodes, dtype=torch.bool)
    total, steps = torch.zeros(agent.population, episodes), torch.zeros(agent.population, episodes)
    while alive.any():
        actions = agent.greedy(agent.dist_params(obs))
        if not info.discrete:
            actions = torch.nan_to_num(actions)
        o, r, te, tr, _ = envs.step(actions)
        total += torch.from_numpy(r) * alive
        steps += alive
        alive &= ~torch.from_numpy(te | tr)
        obs = torch.from_numpy(o)
    envs.close()
    return total.mean(dim=1).tolist(), steps


# (env, time limit, the observation the policies mostly follow: Acrobot: the second joint's velocity pumps
# energy, MountainCar's velocity pushes it up; CartPole: none, random weights)
@pytest.mark.parametrize("env_id, max_steps, follow", [("CartPole-v1", 200, None), ("Acrobot-v1", 300, 5),
                                                        ("MountainCarContinuous-v0", 300, 1)])
def test_evaluation_gives_the_vector_env_returns_stepping_only_running_episodes(env_id, max_steps, follow):
    from harness.tasks.control import EvalEpisodes, env_info, evaluate

    info = env_info(env_id)
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(4, info.obs_dim, generator=gen, dtype=torch.float64)
    if follow is not None:
        weights = 0.1 * weights + torch.nn.functional.one_hot(torch.tensor(follow), info.obs_dim)
    agent = _LinearGreedy(weights, info, scale=torch.tensor([0.5, 3.0, 40.0, 1.0]))
    seeds = [11, 50, 90, 130]
    expected, steps = _vector_env_evaluation(agent, env_id, 5, max_steps, info, seeds)
    assert len(set(steps.flatten().tolist())) > 1  # episodes end at different times: ended ones sit out
    spec = EvalEpisodes(env_id, 5, max_steps, info, seeds)
    assert evaluate(agent, spec) == expected  # exactly: the same episodes
    # members left out are not run (None); the others' returns as when all are evaluated
    assert evaluate(agent, spec, members=[True, False, False, True]) == [
        expected[0], None, None, expected[3]]
    assert evaluate(agent, spec, members=[False, True, False, False]) == [
        None, expected[1], None, None]


@pytest.mark.parametrize("population", [1, 3])
def test_stacked_cartpole_is_each_members_own_vector_env(population):
    """MemberEnvs steps CartPole's native vector env once for all members (``_MemberDraws`` gives
    each member its own reset draws): every observation, reward, termination and truncation must be
    what each member's own gymnasium ``CartPoleVectorEnv``, seeded alike, returns, bit for bit, over
    terminations, 25-step truncations and envs ending at once; and a replay from the seeds and the
    logged actions must land on the same state."""
    import gymnasium as gym

    P, N, steps = population, 4, 600
    info = env_info("CartPole-v1")
    envs = MemberEnvs("CartPole-v1", P, N, 25, info, native=True)
    assert envs.stacked is not None  # the stacked path is the one under test
    own = [gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point", max_episode_steps=25)
           for _ in range(P)]
    seeds = [11 + 7 * p for p in range(P)]
    obs = envs.reset(seeds)
    ref = np.stack([e.reset(seed=s)[0] for e, s in zip(own, seeds)])
    assert obs.dtype == np.float32 and np.array_equal(obs, ref)
    rng = np.random.default_rng(0)
    envs.action_log, ends, at_once, all_at_once = [], 0, 0, 0
    for t in range(steps):
        # balance most of the time (episodes reach the time limit), act at random otherwise
        a = (ref[..., 2] + 0.5 * ref[..., 3] > 0).astype(np.int64)
        a = np.where(rng.random((P, N)) < (0.05 if t < 300 else 0.5), 1 - a, a)
        got = envs.step(torch.from_numpy(a))
        outs = [e.step(x) for e, x in zip(own, a)]
        ref = np.stack([o[0] for o in outs])
        for i, name in enumerate(["obs", "reward", "terminated", "truncated"]):
            assert np.array_equal(got[i], np.stack([o[i] for o in outs])), (t, name)
        assert np.array_equal(got[4], got[1])  # no reward scaling: training sees the env's reward
        done = np.stack([o[2] | o[3] for o in outs])
        ends += int(done.sum())
        at_once += int(done.all(axis=1).any())
        all_at_once += int(done.all())
    # resets of some envs, of a whole member, and of every env at once (the draw of all P * N) happened
    assert ends > 10 * P * N and at_once > 0 and all_at_once > 0
    last = envs.replay(seeds, np.concatenate(envs.action_log))
    assert np.array_equal(last, ref)


def test_numpy_tanh_is_tanh_and_its_gradient_is_one_minus_the_square():
    """The control networks' tanh (numpy's on CPU): values as torch.tanh's to a float32 ulp near 1,
    and the gradient of sum(w * tanh(x)) is w * (1 - tanh(x)^2) (worked out in float64 from
    math.tanh); without autograd (no_grad, or an input that needs no gradient) the same values,
    also for a strided view."""
    import math

    from harness.models.mlp import tanh as numpy_tanh

    x = (torch.linspace(-6, 6, 241, dtype=torch.float64) + 0.013).float().requires_grad_()
    w = torch.linspace(-1, 2, 241)
    y = numpy_tanh(x)
    assert torch.equal(y, torch.from_numpy(np.tanh(x.detach().numpy())))  # numpy's, bit for bit
    exact = torch.tensor([math.tanh(v) for v in x.detach().double().tolist()], dtype=torch.float64)
    assert (y.double() - exact).abs().max() <= 2 ** -24 * 1.5
    assert (y - torch.tanh(x)).abs().max() <= 2 ** -23
    (g,) = torch.autograd.grad((w * y).sum(), x)
    expected = w.double() * (1 - y.detach().double() ** 2)
    assert torch.allclose(g.double(), expected, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        assert torch.equal(numpy_tanh(x), y.detach())
    assert torch.equal(numpy_tanh(x.detach()[::2]), y.detach()[::2])


@pytest.mark.parametrize("population", [1, 3])
def test_a_frozen_forward_is_the_forward_bit_for_bit(population):
    """ControlAgent.policy() (PopulationMLP.frozen), what the collectors and evaluation call at
    every step, against dist_params (the module's forward) under no_grad: equal bit for bit for
    a narrow output layer (CartPole's 64 -> 2, computed transposed) and a wide one, tanh and relu,
    records no graph when grad is on, and a policy made after the weights change (an optimizer
    step) is the new weights' forward (nothing of the old weights kept across policies)."""
    from harness.models.control import AgentSpec, ControlAgent

    cases = [(4, 2, True, [64, 64], "tanh", "state_independent"),  # narrow output layer (64 -> 2)
             (5, 3, False, [64, 64], "relu", "state_dependent"),  # narrow (64 -> 6)
             (5, 6, False, [8], "tanh", "state_dependent")]  # wide (8 -> 12)
    for obs_dim, act_dim, discrete, hidden, activation, log_std in cases:
        gens = [torch.Generator().manual_seed(11 + p) for p in range(population)]
        agent = ControlAgent(population, AgentSpec(obs_dim, act_dim, discrete, hidden, activation, log_std=log_std),
                             True, gens)
        obs = torch.randn(population, 7, obs_dim, generator=torch.Generator().manual_seed(2))
        for step in range(2):
            if step:  # an optimizer step's in-place change of every weight
                with torch.no_grad():
                    for prm in agent.parameters():
                        prm.add_(0.05 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(5)))
            policy = agent.policy()
            with torch.no_grad():
                expected = agent.dist_params(obs)
                assert torch.equal(policy(obs), expected), (hidden, activation, step)
            out = policy(obs)  # grad on: still no graph, the same values
            assert not out.requires_grad and torch.equal(out, expected)


def _update_moves_only_in_last_digits(estimator, tmp_path, monkeypatch, kernel: str, swap) -> None:
    """One rollout and update of a 64-64 CartPole network from one seed, as the harness computes it
    and again after ``swap()`` puts the plain torch kernel back: the same actions and rewards, and
    the same losses and weights to 1e-5 relative (float32 round-off through two 64-unit layers, a
    loss and Adam). ``kernel`` names the function of harness.models.mlp that the first run must
    call and the second must not (the swap happened; whether the two runs' bits differ depends on
    the shapes and the thread count)."""
    from harness.models import mlp

    calls = []
    real = getattr(mlp, kernel)
    monkeypatch.setattr(mlp, kernel, lambda *a: calls.append(1) or real(*a))
    common = ["task=cartpole", f"estimator={estimator}", *TINY, "task.hidden=[64,64]",
              "budget.iterations=1", "eval_every=0", "seed=5"]
    s_np, ro_np, src_np = one_update(make_cfg(common + [f"results_dir={tmp_path}/harness"]))
    used = len(calls)
    swap()
    s_t, ro_t, src_t = one_update(make_cfg(common + [f"results_dir={tmp_path}/torch"]))
    assert used > 0 and len(calls) == used
    assert torch.equal(ro_np.actions, ro_t.actions) and torch.equal(ro_np.rewards, ro_t.rewards)
    for key in ("policy_loss", "loss", "grad_norm", "entropy"):
        assert float(s_np[key][0]) == pytest.approx(float(s_t[key][0]), rel=1e-5, abs=1e-7), key
    pairs = list(zip(src_np.agent.parameters(), src_t.agent.parameters()))
    for a, b in pairs:
        torch.testing.assert_close(a.data, b.data, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("estimator", ["ppo_gae", "a2c", "reinforce"])
def test_numpy_tanh_moves_an_update_only_in_float32s_last_digits(estimator, tmp_path, monkeypatch):
    """The control networks' tanh is numpy's (speed: benchmarks/tanh_floor.py), torch.tanh before.
    The tolerance and its reason: the two differ by at most a float32 ulp per element."""
    from harness.models import mlp

    _update_moves_only_in_last_digits(estimator, tmp_path, monkeypatch, "_np_tanh",
                                      lambda: monkeypatch.setitem(mlp.ACTIVATIONS, "tanh", torch.tanh))


@pytest.mark.parametrize("estimator", ["ppo_gae", "a2c", "reinforce"])
def test_narrow_layer_moves_an_update_only_in_float32s_last_digits(estimator, tmp_path, monkeypatch):
    """The control networks' output layer (64 -> 2) is computed transposed (narrow_baddbmm, speed),
    torch.baddbmm before. The tolerance and its reason: the same sums of 64 (256 for the weight's
    gradient) products in another order, so they differ in float32's last digits."""
    from harness.models import mlp

    _update_moves_only_in_last_digits(estimator, tmp_path, monkeypatch, "_narrow",
                                      lambda: monkeypatch.setattr(mlp, "NARROW_OUT", -1.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_narrow_baddbmm_is_baddbmm_with_its_gradients(dtype):
    """narrow_baddbmm(b, x, w) against torch.baddbmm and torch's own autograd of it (the reference):
    values and the gradients of b, x and w (to float64 round-off in float64, 1e-5 relative in
    float32), for three subsets of the inputs needing a gradient, for rows sliced out of a stacked
    weight (the actor rows), and without autograd; torch's gradcheck in float64."""
    from harness.models.mlp import narrow_baddbmm

    gen = torch.Generator().manual_seed(3)
    R, N, n_in, n_out = 6, 37, 64, 2
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    W = torch.randn(2 * R, n_in, n_out, generator=gen, dtype=dtype)
    B = torch.randn(2 * R, 1, n_out, generator=gen, dtype=dtype)
    X = torch.randn(R, N, n_in, generator=gen, dtype=dtype)
    G = torch.randn(R, N, n_out, generator=gen, dtype=dtype)
    for needs in [(True, True, True), (True, False, True), (False, True, False)]:
        ins = [t.clone().requires_grad_(n) for t, n in zip((B, X, W), needs)]
        ref = [t.clone().requires_grad_(n) for t, n in zip((B, X, W), needs)]
        rows = slice(0, R)  # the actor rows of a stacked actor-critic weight: a view
        y = narrow_baddbmm(ins[0][rows], ins[1], ins[2][rows])
        y_ref = torch.baddbmm(ref[0][rows], ref[1], ref[2][rows])
        torch.testing.assert_close(y, y_ref, **tol)
        (y * G).sum().backward()
        (y_ref * G).sum().backward()
        for a, b, n in zip(ins, ref, needs):
            assert (a.grad is None) == (not n)
            if n:
                torch.testing.assert_close(a.grad, b.grad, **tol)
        with torch.no_grad():
            assert torch.equal(narrow_baddbmm(B[rows], X, W[rows]), y.detach())
    if dtype == torch.float64:
        args = (B[:2, :, :].clone().requires_grad_(), X[:2, :5].clone().requires_grad_(), W[:2].clone().requires_grad_())
        assert torch.autograd.gradcheck(narrow_baddbmm, args)


def test_row_views_follow_the_parameters_through_steps_restores_and_conversions():
    """PopulationMLP keeps the row views of a no-grad forward (:meth:`PopulationMLP._rows`): it
    must give what slicing the parameters afresh gives, after in-place optimizer steps, a
    checkpoint-style ``copy_`` and a conversion (``.double()``: new tensors), and a forward with
    grad must still reach the parameters."""
    from harness.models.mlp import PopulationMLP, population_layer, tanh

    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 1, 2)]
    net = PopulationMLP(4, [3, 16, 16, 2], "tanh", [0.01, 0.01, 1.0, 1.0], gens)
    x = torch.randn(2, 5, 3)
    rows = slice(0, 2)

    def fresh(x):  # the rows sliced now, the layers as forward applies them
        ws, bs = list(net.weights), list(net.biases)
        for i, (w, b) in enumerate(zip(ws, bs)):
            x = population_layer(b[rows], x, w[rows])
            x = tanh(x) if i < len(ws) - 1 else x
        return x

    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    with torch.no_grad():
        assert torch.equal(net(x, rows), fresh(x))
    for _ in range(2):  # in-place steps (the critic rows 2:4 move too)
        net(x, rows).sum().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            assert torch.equal(net(x, rows), fresh(x))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p))
        assert torch.equal(net(x, rows), fresh(x))
    net.double()
    with torch.no_grad():
        out = net(x.double(), rows)
        assert out.dtype == torch.float64 and torch.equal(out, fresh(x.double()))
    net(x.double(), rows).sum().backward()
    assert all(p.grad is not None and p.grad[rows].abs().sum() > 0 for p in net.weights)


def test_discrete_sampling_is_gumbel_max_on_the_pre_drawn_uniforms():
    """A discrete action is ``argmax(logits + g)``, ``g = -log(-log u)`` on the pre-drawn uniform
    ``u`` (clamped away from 0 and 1), written here as the textbook formula: the same actions for
    every draw, including near-ties; and its frequencies are the softmax's."""
    from harness.models.control import AgentSpec, ControlAgent

    agent = ControlAgent(1, AgentSpec(3, 4, True, [8], "tanh"), False, [torch.Generator().manual_seed(0)])
    gen = torch.Generator().manual_seed(1)
    logits = torch.tensor([[[0.0, 1.0, -1.0, 0.5]]]).expand(1, 50_000, 4).contiguous()
    logits[0, :100] = 0.25  # four-way ties: decided by the noise alone
    u = torch.rand(1, 50_000, 4, generator=gen)
    u[0, :5] = 0.0  # the clamp's ends
    u[0, 5:10] = 1.0
    want = (logits + -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))).argmax(dim=-1)
    got = agent.sample(logits, u)
    assert torch.equal(got, want)
    freq = torch.bincount(got[0, 100:], minlength=4).double() / got[0, 100:].numel()
    assert torch.allclose(freq, torch.softmax(logits[0, 100].double(), -1), atol=0.01)
