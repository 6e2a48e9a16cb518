"""Exact-gradient toy task: the enumerated truth, sampling, and the toy trainer."""
import math

import pandas as pd
import pytest
import torch

from harness.app import run
from harness.tasks.toy import DTYPE, PRESETS, PromptSpec, ToySpec, ToyTask, time_major
from tests.control_helpers import make_cfg

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
    member's trainer is gone: with population 3 no earlier source is alive at any later start."""
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
    counts = run(make_cfg(TOY_TINY + ["estimator=rloo", "population=3", f"results_dir={tmp_path}"]))
    assert counts.get("completed") == 3
    assert alive_at_start == [0, 0, 0]
