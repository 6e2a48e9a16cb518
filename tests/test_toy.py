"""Exact-gradient toy task: the enumerated truth, sampling, and the toy trainer."""
import math

import pandas as pd
import pytest
import torch

from harness.plan import RunPlan
from harness.app import run
from harness.estimators import ESTIMATORS
from harness.tasks.toy import DTYPE, PRESETS, PromptSpec, ToySpec, ToyTask, time_major
from tests.control_helpers import make_cfg, population_against_lone_runs

TOY_TINY = ["task=toy", "budget.iterations=3", "task.episodes_per_iter=8", "group_size=2", "progress=false",
            "lr=0.05"]


def _with_rewards(task: ToyTask, rewards) -> ToyTask:
    """Replace the reward table (leaves in the task's enumeration order)."""
    task.leaf_reward = torch.tensor(rewards, dtype=DTYPE)
    task.leaf_reward_sa = torch.where(task.leaf_of >= 0, task.leaf_reward[task.leaf_of.clamp(min=0)],
                                      torch.zeros((), dtype=DTYPE))
    return task


def test_exact_gradient_hand_computed_two_step_case():
    # V=2, L=2: root state 0; token 0 -> state 1, token 1 -> state 2; leaves (0,0),(0,1),(1,0),(1,1).
    task = _with_rewards(ToyTask(ToySpec(vocab=2, length=2, prompts=(PromptSpec("dense"),))), [1, 0, 0, 1])
    assert task.n_states == 3 and task.n_leaves == 4
    assert task.leaf_tokens.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    theta = torch.zeros(3, 2, dtype=DTYPE)
    theta[0, 1] = math.log(3.0)  # pi(root) = (1/4, 3/4); states 1 and 2 uniform
    # by hand: V(s1) = V(s2) = 1/2, so J = 1/2 and the root logits get no gradient;
    # dJ/dtheta[s, b] = P(reach s) pi(b|s) (R - V(s)): s1: 1/4 * 1/2 * (+-1/2), s2: 3/4 * 1/2 * (-+1/2)
    assert float(task.expected_reward(theta)) == pytest.approx(0.5)
    expected = torch.tensor([[0.0, 0.0], [1 / 16, -1 / 16], [-3 / 16, 3 / 16]], dtype=DTYPE)
    torch.testing.assert_close(task.exact_gradient(theta), expected)
    V, Q = task.values(theta)
    torch.testing.assert_close(V, torch.tensor([0.5, 0.5, 0.5], dtype=DTYPE))
    torch.testing.assert_close(Q[1], torch.tensor([1.0, 0.0], dtype=DTYPE))


def test_one_step_bandit_gradient_is_pi_times_advantage():
    task = _with_rewards(ToyTask(ToySpec(vocab=2, length=1, prompts=(PromptSpec("dense"),))), [1, 0])
    theta = torch.tensor([[0.0, math.log(3.0)]], dtype=DTYPE)
    # J = 1/4; dJ/dtheta_a = pi_a (R_a - J) = (1/4 * 3/4, 3/4 * (-1/4))
    torch.testing.assert_close(task.exact_gradient(theta), torch.tensor([[3 / 16, -3 / 16]], dtype=DTYPE))


@pytest.mark.parametrize("preset", ["mixed", "varlen"])
def test_exact_gradient_matches_finite_differences(preset):
    task = ToyTask(PRESETS[preset])
    theta = task.init_logits(scale=0.7, seed=3)
    grad = task.exact_gradient(theta)
    gen = torch.Generator().manual_seed(0)
    flat = torch.randperm(theta.numel(), generator=gen)[:12]
    eps = 1e-6
    for i in flat.tolist():
        r, c = divmod(i, theta.shape[1])
        up, down = theta.clone(), theta.clone()
        up[r, c] += eps
        down[r, c] -= eps
        fd = (task.expected_reward(up) - task.expected_reward(down)) / (2 * eps)
        assert float(grad[r, c]) == pytest.approx(float(fd), abs=1e-8)


@pytest.mark.parametrize("preset", ["mixed", "varlen", "bandit"])
def test_value_recursion_equals_enumeration(preset):
    task = ToyTask(PRESETS[preset])
    theta = task.init_logits(scale=1.0, seed=1)
    p = task.leaf_log_probs(theta).exp()
    per_prompt = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, p)
    torch.testing.assert_close(per_prompt, torch.ones(task.n_prompts, dtype=DTYPE))
    J_enum = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, p * task.leaf_reward)
    torch.testing.assert_close(task.prompt_rewards(theta), J_enum)


def test_mixed_preset_success_probabilities_at_uniform_policy():
    task = ToyTask(PRESETS["mixed"])
    J = task.prompt_rewards(task.init_logits())
    assert J[:3].tolist() == pytest.approx([3 / 64, 32 / 64, 61 / 64])


def test_sampling_matches_the_exact_distribution():
    task = ToyTask(PRESETS["varlen"])
    theta = task.init_logits(scale=0.8, seed=2)
    gen = torch.Generator().manual_seed(0)
    n = 60_000
    prompts = torch.zeros(n, dtype=torch.long)
    b = task.sample(theta, prompts, gen)
    freq = torch.bincount(b.leaf, minlength=task.n_leaves).to(DTYPE) / n
    p = task.leaf_log_probs(theta).exp() * (task.leaf_prompt == 0)
    assert float((freq - p).abs().max()) < 0.01
    assert torch.equal(b.length, task.leaf_len[b.leaf])
    assert torch.equal(b.tokens * b.mask.long(), task.leaf_tokens[b.leaf] * b.mask.long())


def test_time_major_puts_the_reward_on_the_last_token():
    task = ToyTask(PRESETS["varlen"])
    gen = torch.Generator().manual_seed(1)
    b = task.sample(task.init_logits(), torch.tensor([0, 1, 2, 0]), gen)
    V = torch.arange(task.n_states, dtype=DTYPE)
    tm = time_major(task, b, V)
    L, N = tm["rewards"].shape
    assert (L, N) == (4, 4)
    for i in range(N):
        last = int(b.length[i]) - 1
        assert float(tm["rewards"][last, i]) == float(b.reward[i])
        assert float(tm["terminated"][last, i]) == 1.0 and float(tm["terminated"][:, i].sum()) == 1.0
        assert float(tm["next_values"][last, i]) == 0.0
        if last > 0:
            assert float(tm["next_values"][0, i]) == float(V[b.states[i, 1]])
    assert float(tm["truncated"].abs().sum()) == 0.0


def test_toy_trainer_runs_every_estimator_and_logs_the_contract(tmp_path):
    from analysis.load import METRIC_COLUMNS

    from harness.estimators import estimator_names

    for est in estimator_names():
        cfg = make_cfg(TOY_TINY + [f"estimator={est}", f"results_dir={tmp_path}"])
        assert run(cfg).get("completed") == 1, est
    paths = sorted(tmp_path.glob("toy/*/*/metrics.parquet"))
    assert len(paths) == len(estimator_names())
    for p in paths:
        df = pd.read_parquet(p)
        missing = [c for c in METRIC_COLUMNS if c not in df.columns]
        assert not missing and len(df) == 3
        assert df["eval_return"].between(0, 1).all() and df["grad_cos"].notna().all()
        assert (p.parent / "policy.safetensors").is_file()
    remax = pd.read_parquet(next(tmp_path.glob("toy/remax/*/metrics.parquet")))
    # env_steps counts sampled sequences, the greedy one of each of the 4 prompts included
    assert remax["env_steps"].tolist() == [12, 24, 36]


def test_toy_trainer_learns_with_rloo(tmp_path):
    cfg = make_cfg(["task=toy", "estimator=rloo", "budget.iterations=40", "lr=0.1", "progress=false",
                    f"results_dir={tmp_path}"])
    run(cfg)
    df = pd.read_parquet(next(tmp_path.glob("toy/rloo/*/metrics.parquet")))
    assert df["eval_return"].iloc[-1] > df["eval_return"].iloc[0] + 0.1
    assert df["env_steps"].iloc[-1] == 40 * 64


def test_toy_config_errors_name_the_field(tmp_path):
    from harness.tasks.toy import validate_toy

    with pytest.raises(ValueError, match="episodes_per_iter"):
        validate_toy(make_cfg(["task=toy", "estimator=rloo", "task.episodes_per_iter=10", "group_size=4"]))
    with pytest.raises(ValueError, match="task.env_id"):
        validate_toy(make_cfg(["task=toy", "estimator=rloo", "task.env_id=nope"]))
    with pytest.raises(ValueError, match="toy.length"):
        validate_toy(make_cfg(["task=toy", "estimator=rloo", "++toy.length=9"]))


def test_members_trained_one_by_one_never_overlap(tmp_path, monkeypatch):
    """The next member's source (and the memory baseline it takes) is built only after the previous
    member's trainer is gone: with population 3 no earlier source is alive at any later start
    (dynamic sampling: members train one after another)."""
    import gc
    import weakref

    from harness.train import toy as toy_train

    built, alive_at_start = [], []

    class Tracked(toy_train.ToySource):
        def __init__(self, *args, **kwargs):
            gc.collect()
            alive_at_start.append(sum(ref() is not None for ref in built))
            super().__init__(*args, **kwargs)
            built.append(weakref.ref(self))

    monkeypatch.setattr(toy_train, "ToySource", Tracked)
    counts = run(make_cfg(TOY_TINY + ["estimator=rloo", "population=3", "dynamic_sampling=true",
                                      f"results_dir={tmp_path}"]))
    assert counts.get("completed") == 3
    assert alive_at_start == [0, 0, 0]


# ----------------------------------------------------------------- C26: random rewards, exact entropy
def test_exact_entropy_hand_worked_two_step_case():
    # V=2, L=2, one prompt: pi(root) = (1/4, 3/4), both second steps uniform. By the chain rule
    # H = H(1/4, 3/4) + log 2; by enumeration the four responses have probabilities
    # 1/8, 1/8, 3/8, 3/8: -(2/8 log 1/8 + 6/8 log 3/8) = the same number.
    task = ToyTask(ToySpec(vocab=2, length=2, prompts=(PromptSpec("dense"),)))
    theta = torch.zeros(3, 2, dtype=DTYPE)
    theta[0, 1] = math.log(3.0)
    by_hand = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) + math.log(2.0)
    assert float(task.prompt_entropy(theta)[0]) == pytest.approx(by_hand, abs=1e-12)
    assert by_hand == pytest.approx(-(2 / 8 * math.log(1 / 8) + 6 / 8 * math.log(3 / 8)))
    # the uniform policy of the mixed preset: 64 responses per prompt, log 64 each
    mixed = ToyTask(PRESETS["mixed"])
    assert mixed.exact_stats(mixed.init_logits())["entropy"] == pytest.approx(math.log(64.0), abs=1e-12)


def _source(overrides):
    from harness.train.toy import ToySource
    from harness.tasks.toy import build_task

    cfg = make_cfg(["task=toy", "estimator=rloo", "task.episodes_per_iter=64", "group_size=8"] + overrides)
    return ToySource(RunPlan.of(cfg), build_task(cfg))


def test_random_rewards_are_the_same_stream_whatever_the_policy():
    """toy.reward=random: the same seed gives the same rewards under a uniform and a peaked
    policy, although the responses differ; under the reward table the rewards follow the
    responses (a lone source's batch: member 0 of ``[1, N]``)."""
    uniform, peaked = _source(["++toy.reward=random"]), _source(["++toy.reward=random"])
    with torch.no_grad():
        peaked.theta[..., 0] = 5.0  # almost always token 0: other responses than the uniform policy's
    for _ in range(3):
        a, b = uniform.collect(), peaked.collect()
        assert not torch.equal(a.leaf, b.leaf)
        assert torch.equal(a.reward, b.reward)
        assert set(a.reward.flatten().tolist()) == {0.0, 1.0}
    table = _source([])
    t = table.collect()
    assert torch.equal(t.reward, table.task.leaf_reward[t.leaf])
    # Bernoulli(1/2): over 200 batches of 64 the share of ones is 1/2 within 4 standard errors
    many = torch.cat([uniform.collect().reward[0] for _ in range(200)])
    assert abs(float(many.mean()) - 0.5) < 4 * 0.5 / math.sqrt(len(many))
    # and it does not follow the reward table: the rewarded share of the 61/64 prompt is 1/2 too
    src = _source(["++toy.reward=random"])
    ok = []
    for _ in range(200):
        bt = src.collect()
        ok.append(bt.reward[bt.prompts == 2])
    ok = torch.cat(ok)
    assert abs(float(ok.mean()) - 0.5) < 4 * 0.5 / math.sqrt(len(ok))


def test_random_reward_runs_log_the_true_j_and_the_exact_entropy(tmp_path):
    """Two learning rates: the same training rewards (they ignore the responses), different
    policies; eval_return is the reward TABLE's exact J of the final policy, exact_entropy its
    exact response entropy."""
    from harness.io import checkpoint as ckpt
    from harness.tasks.toy import build_task

    frames = {}
    for lr in ("0.05", "0.2"):
        cfg = make_cfg(TOY_TINY + ["estimator=rloo", "++toy.reward=random", f"lr={lr}",
                                   f"results_dir={tmp_path}/{lr}"])
        run(cfg)
        (p,) = (tmp_path / lr).rglob("metrics.parquet")
        frames[lr] = pd.read_parquet(p)
        tensors, _ = ckpt.load(p.parent / "policy.safetensors")
        task = build_task(cfg)
        last = frames[lr].iloc[-1]
        assert last["eval_return"] == pytest.approx(float(task.expected_reward(tensors["theta"])), abs=1e-12)
        H = -(task.leaf_log_probs(tensors["theta"]).exp() * task.leaf_log_probs(tensors["theta"])).sum()
        assert last["exact_entropy"] == pytest.approx(float(H) / task.n_prompts, abs=1e-12)
    a, b = frames["0.05"], frames["0.2"]
    assert a["reward"].tolist() == b["reward"].tolist()
    assert a["exact_entropy"].tolist() != b["exact_entropy"].tolist()


# ----------------------------------------------------------------- C28: per-prompt update sizes
def test_prompt_update_norms_hand_computed():
    # two prompts of V=2, L=2: states 0-2 belong to prompt 0, states 3-5 to prompt 1
    task = ToyTask(ToySpec(vocab=2, length=2, prompts=(PromptSpec("dense"), PromptSpec("binary", 0.5))))
    assert task.prompt_rows(0).tolist() == [0, 1, 2] and task.prompt_rows(1).tolist() == [3, 4, 5]
    before = torch.zeros(6, 2, dtype=DTYPE)
    after = before.clone()
    after[0] = torch.tensor([3.0, 0.0])
    after[2] = torch.tensor([0.0, -4.0])  # prompt 0: sqrt(9 + 16) = 5
    after[4] = torch.tensor([1.0, 2.0])  # prompt 1: sqrt(1 + 4 + 4) = 3
    after[5] = torch.tensor([2.0, 0.0])
    assert task.prompt_update_norms(before, after).tolist() == pytest.approx([5.0, 3.0])
    # success: None for the dense prompt, 1/2 for the binary one at the uniform policy
    assert task.prompt_success(before) == [None, pytest.approx(0.5)]


def test_log_prompts_columns_match_the_policy_by_hand(tmp_path):
    """One iteration from theta = 0: success_prompt<x> is the uniform policy's 3/64, 1/2, 61/64
    (None for the dense prompt) and update_prompt<x> the norm of x's rows of the saved policy."""
    from harness.io import checkpoint as ckpt
    from harness.tasks.toy import build_task

    cfg = make_cfg(["task=toy", "estimator=grpo", "budget.iterations=2", "progress=false", "lr=0.05",
                    "++toy.log_prompts=true", f"results_dir={tmp_path}/a"])
    run(cfg)
    (p,) = (tmp_path / "a").rglob("metrics.parquet")
    df = pd.read_parquet(p)
    first = df.iloc[0]
    assert [first[f"success_prompt{x}"] for x in range(3)] == pytest.approx([3 / 64, 1 / 2, 61 / 64])
    assert pd.isna(first["success_prompt3"])
    for x in range(3):  # before iteration 2's update: the policy iteration 1 left, its exact J_x
        assert df.iloc[1][f"success_prompt{x}"] == pytest.approx(first[f"J_prompt{x}"], abs=1e-12)
    # run 1 iteration only: its update moved theta from 0 to the saved policy
    cfg1 = make_cfg(["task=toy", "estimator=grpo", "budget.iterations=1", "progress=false", "lr=0.05",
                     "++toy.log_prompts=true", f"results_dir={tmp_path}/b"])
    run(cfg1)
    (p1,) = (tmp_path / "b").rglob("metrics.parquet")
    row = pd.read_parquet(p1).iloc[0]
    tensors, _ = ckpt.load(p1.parent / "policy.safetensors")
    task = build_task(cfg1)
    for x in range(task.n_prompts):
        rows = task.prompt_rows(x)
        by_hand = math.sqrt(sum(float(v) ** 2 for v in tensors["theta"][rows].flatten()))
        assert row[f"update_prompt{x}"] == pytest.approx(by_hand, abs=1e-12)
    assert sum(row[f"update_prompt{x}"] for x in range(4)) > 0
    # off by default: no per-prompt columns
    run(make_cfg(["task=toy", "estimator=grpo", "budget.iterations=1", "progress=false",
                  f"results_dir={tmp_path}/c"]))
    (p2,) = (tmp_path / "c").rglob("metrics.parquet")
    assert not [c for c in pd.read_parquet(p2).columns if c.startswith(("success_prompt", "update_prompt"))]


def test_toy_settings_errors_name_the_field():
    from harness.tasks.toy import validate_toy

    base = ["task=toy", "estimator=rloo"]
    for extra, message in ((["++toy.reward=bogus"], "toy.reward must be one of"),
                           (["++toy.reward=1"], "toy.reward must be a string"),
                           (["++toy.log_prompts=3"], "toy.log_prompts must be true or false"),
                           (["++toy.log_prompts=true", "++toy.prompts=[" + ",".join(["dense"] * 9) + "]"],
                            "toy.log_prompts must be false for tasks of more than 8 prompts")):
        with pytest.raises(ValueError, match=message):
            validate_toy(make_cfg(base + extra))
    validate_toy(make_cfg(base + ["++toy.log_prompts=true", "++toy.prompts=[" + ",".join(["dense"] * 8) + "]"]))


def test_toy_population_with_random_rewards_and_prompt_columns_equals_lone_runs(tmp_path):
    common = TOY_TINY + ["estimator=grpo", "++toy.reward=random", "++toy.log_prompts=true", "epochs=2",
                         "minibatches=2"]
    population_against_lone_runs(common, tmp_path)  # pandas' default tolerance (rtol 1e-5, atol 1e-8)


@pytest.mark.parametrize("dynamic", [False, True])
def test_toy_population_split_over_workers_equals_lone_runs(dynamic, tmp_path, caplog):
    """``population_workers=2``: the members are split over two forked processes (a batched
    population each, or one after another with ``dynamic_sampling``), and each member still equals
    the lone run of its seed."""
    import logging

    caplog.set_level(logging.INFO, logger="harness")
    common = TOY_TINY + ["estimator=grpo", "epochs=2", "minibatches=2", "population_workers=2"]
    if dynamic:
        common += ["dynamic_sampling=true", "dynamic_sampling_max_draws=2"]
    population_against_lone_runs(common, tmp_path, atol=1e-9, rtol=1e-7)
    assert "population of 3: 2 worker processes (seeds 0-1, 2-2)" in caplog.text


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_toy_population_member_equals_its_lone_run_with_schedules(estimator, tmp_path):
    """A batched toy population of 3 with annealed learning rates (by each member's sequence
    budget), adaptive KL betas (from each member's exact KL to the reference), several epochs of
    shuffled minibatches and an exact evaluation every iteration: each member equals the lone run
    of its seed (the same samples; losses and diagnostics to float rounding); the logged lr is
    lr0 * (1 - sequences before the iteration / budget)."""
    budget = 60
    common = TOY_TINY + [f"estimator={estimator}", "anneal_lr=true", "lr=0.1", "kl.adaptive=true", "kl.beta=0.05",
                         "kl.kl_target=0.002", "epochs=2", "minibatches=2", f"budget.env_steps={budget}",
                         "budget.iterations=null"]
    for a in (frame for _, frame in population_against_lone_runs(common, tmp_path, atol=1e-9, rtol=1e-7).values()):
        before = [0] + a["env_steps"].tolist()[:-1]
        assert a["lr"].tolist() == pytest.approx([0.1 * max(1 - s / budget, 0.0) for s in before], rel=1e-12)
        assert a["kl_beta"].nunique() > 1  # the adaptive beta moved
        assert a["eval_return"].notna().all()


def test_a_diverging_toy_member_stops_alone_and_its_neighbours_equal_their_lone_runs(tmp_path, monkeypatch):
    """Seed 1's advantages turn non-finite from its third update on (the same in its lone run):
    in a population it is recorded as diverged at iteration 3, as its lone run is, its weights
    frozen, and seeds 0 and 2 go on to the end exactly as their lone runs."""
    from harness.train import toy as toy_train

    original = toy_train.ToySource.update_batch

    def poisoned(self, batch, adv, returns, values):
        ub = original(self, batch, adv, returns, values)
        self.updates = getattr(self, "updates", 0) + 1
        for p, seed in enumerate(self.seeds):
            if seed == 1 and self.updates >= 3:
                ub.adv[p] = float("nan")
        return ub

    monkeypatch.setattr(toy_train.ToySource, "update_batch", poisoned)
    common = TOY_TINY + ["estimator=rloo", "budget.iterations=6", "epochs=2", "minibatches=2"]
    outcome = {seed: o for seed, (o, _) in population_against_lone_runs(common, tmp_path, atol=1e-9, rtol=1e-7).items()}
    assert outcome[1] == {"status": "diverged", "reason": "non-finite loss at iteration 3", "iterations": 3}
    assert outcome[0] == outcome[2] == {"status": "completed", "reason": None, "iterations": 6}


@pytest.mark.parametrize("estimator", ["rloo", "ppo_gae", "remax"])
def test_toy_population_with_in_reward_kl_and_sampling_options_equals_lone_runs(estimator, tmp_path):
    """The in-reward KL penalty at each member's own adaptive beta, TRL's truncated-response mask
    and DAPO's overlong penalty on the EOS preset, the per-prompt columns: a batched population of
    3 equals its members' lone runs."""
    common = TOY_TINY + [f"estimator={estimator}", "task.env_id=varlen", "kl.in_reward=true", "kl.adaptive=true",
                         "kl.beta=0.1", "kl.kl_target=0.001", "mask_truncated=true", "overlong_cache=2",
                         "++toy.log_prompts=true", "epochs=2", "minibatches=2", "budget.iterations=5"]
    for _, a in population_against_lone_runs(common, tmp_path, atol=1e-9, rtol=1e-7).values():
        assert a["kl_beta"].nunique() > 1 and (a["truncated_frac"] > 0).any()
