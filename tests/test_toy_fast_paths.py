"""The toy trainer's cheaper paths give the numbers of the straightforward ones, bit for bit.

Issue 40 (item 4) took per-iteration overhead out of the toy trainer without changing a number:
the exact statistics and the sequence KL read one enumeration of the policy's leaf log-probs (the
reference's once per member), the value recursion's per-level index tensors are built once, the
clipped losses build their zero-gradient mask only when ``clip_frac`` is logged, and the update
reads a lone run's loss and gradient norm as Python floats for its divergence guard. Each is
compared here with the form it replaced (transcribed below) with ``==`` / ``torch.equal``, and a
short run's last metric row is pinned to the values the trainer logged before the change
(main at 3ff29ab), as exact float hex."""
import math

import pandas as pd
import pytest
import torch

from harness.app import run
from harness.losses import PolicyInputs, PPOClipSettings, clipped_surrogate_loss, dual_clip_loss
from harness.tasks.toy import DTYPE, PRESETS, ToyTask
from harness.train.update import _all_finite
from tests.control_helpers import make_cfg
from harness.plan import RunPlan


def _reference_values(task: ToyTask, theta: torch.Tensor, gamma: float = 1.0):
    """ToyTask.values as it was (every index tensor rebuilt on every call)."""
    probs = torch.softmax(theta, dim=-1)
    V = torch.zeros(task.n_states, dtype=theta.dtype)
    Q = torch.zeros(task.param_shape, dtype=theta.dtype)
    ends = task.leaf_of >= 0
    for states in reversed(task.levels):
        cont = float(gamma) * V[task.child[states].clamp(min=0)]
        q = torch.where(ends[states], task.leaf_reward_sa[states].to(theta.dtype), cont)
        Q = Q.index_put((states,), q)
        V = V.index_put((states,), (probs[states] * q).sum(-1))
    return V, Q


def _reference_leaf_log_probs(task: ToyTask, theta: torch.Tensor) -> torch.Tensor:
    logpi = torch.log_softmax(theta, dim=-1)
    return (logpi[task.leaf_states, task.leaf_tokens] * task.leaf_mask).sum(-1)


@pytest.mark.parametrize("preset", ["mixed", "varlen"])
def test_value_recursion_with_levels_built_once_equals_the_plain_recursion(preset):
    task = ToyTask(PRESETS[preset])
    for seed in range(3):
        theta = task.init_logits(scale=1.5, seed=seed)
        for gamma in (1.0, 0.9):
            V, Q = task.values(theta, gamma)
            V0, Q0 = _reference_values(task, theta, gamma)
            assert torch.equal(V, V0) and torch.equal(Q, Q0)
        # the gradient through the recursion as well (grad_cos reads it every iteration)
        th = theta.clone().requires_grad_(True)
        (g0,) = torch.autograd.grad(_reference_values(task, th)[0][task.root].mean(), th)
        assert torch.equal(task.exact_gradient(theta), g0)
    # a reward table replaced after the levels were built: they are built again, from the new table
    task.leaf_reward = torch.rand(task.n_leaves, generator=torch.Generator().manual_seed(5), dtype=DTYPE)
    task.leaf_reward_sa = torch.where(task.leaf_of >= 0, task.leaf_reward[task.leaf_of.clamp(min=0)],
                                      torch.zeros((), dtype=DTYPE))
    theta = task.init_logits(scale=1.0, seed=7)
    assert torch.equal(task.values(theta)[0], _reference_values(task, theta)[0])
    J = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(
        0, task.leaf_prompt, _reference_leaf_log_probs(task, theta).exp() * task.leaf_reward)
    torch.testing.assert_close(task.prompt_rewards(theta), J)  # and it is the enumerated J


@pytest.mark.parametrize("preset", ["mixed", "varlen"])
def test_exact_stats_from_one_enumeration_equal_the_separate_functions(preset):
    task = ToyTask(PRESETS[preset])
    theta, ref = task.init_logits(scale=1.2, seed=1), task.init_logits(scale=0.5, seed=2)
    lp, lr = _reference_leaf_log_probs(task, theta), _reference_leaf_log_probs(task, ref)
    # the forms they replaced: each enumerated the leaf log-probs again
    entropy = float(torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, -lp.exp() * lp).mean())
    kl = float(torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, lp.exp() * (lp - lr)).mean())
    stats = task.exact_stats(theta, task.leaf_log_probs(ref))
    assert stats["entropy"] == entropy and stats["kl_ref"] == kl
    assert float(task.sequence_kl(theta, ref)) == kl and float(task.prompt_entropy(theta).mean()) == entropy
    alone = task.exact_stats(theta)
    assert "kl_ref" not in alone and {k: v for k, v in stats.items() if k != "kl_ref"} == alone
    # by enumeration in plain Python: KL = mean_x sum_y p log(p / q), H = mean_x -sum_y p log p
    p, q = lp.exp().tolist(), lr.exp().tolist()
    kl_py = sum(p[n] * math.log(p[n] / q[n]) for n in range(task.n_leaves)) / task.n_prompts
    h_py = -sum(p[n] * math.log(p[n]) for n in range(task.n_leaves)) / task.n_prompts
    assert kl == pytest.approx(kl_py, rel=1e-12) and entropy == pytest.approx(h_py, rel=1e-12)
    assert task.exact_stats(ref, task.leaf_log_probs(ref))["kl_ref"] == 0.0


def _reference_exact_stats(task: ToyTask, theta: torch.Tensor, ref_log_probs: torch.Tensor) -> dict:
    """ToyTask.exact_stats as it was (one policy at a time, before 2026-12-07)."""
    J_x = task.prompt_rewards(theta)
    lp = task.leaf_log_probs(theta)
    p = lp.exp() / task.n_prompts
    length = task.leaf_len.to(DTYPE)
    out = {"J": float(J_x.mean()), "J_prompt": [float(j) for j in J_x], "response_len": float((p * length).sum()),
           "entropy": float(task._prompt_entropy(lp).mean()), "kl_ref": float(task._sequence_kl(lp, ref_log_probs))}
    has = torch.isfinite(task.leaf_correct)
    for name, sel in (("right_len", has & (task.leaf_correct == 1)), ("wrong_len", has & (task.leaf_correct == 0))):
        w = p * sel.to(DTYPE)
        out[name] = float((w * length).sum() / w.sum()) if float(w.sum()) > 0 else None
    out["success"] = (float((p * torch.nan_to_num(task.leaf_correct)).sum() / (p * has.to(DTYPE)).sum())
                      if bool(has.any()) else None)
    return out


@pytest.mark.parametrize("preset", ["mixed", "varlen", "bandit", "dense_only"])
def test_a_populations_exact_quantities_in_one_pass_are_each_members_own(preset):
    """A population's exact statistics and exact gradients come from one pass over the stacked
    logits (``torch.func.vmap``): each member's are the ones it gets alone, bit for bit, for
    members far apart (and for one member alone, a lone run's case); ``dense_only`` has no graded
    response (success and the right/wrong lengths None)."""
    from harness.tasks.toy import PromptSpec, ToySpec

    dense = ToySpec(vocab=3, length=2, eos=False, prompts=(PromptSpec("dense"), PromptSpec("dense")))
    task = ToyTask(dense if preset == "dense_only" else PRESETS[preset])
    ref = task.leaf_log_probs(task.init_logits(scale=0.3, seed=9))
    stack = torch.stack([task.init_logits(scale=0.5 * s, seed=s) for s in range(5)])
    for thetas in (stack, stack[2:3]):
        stats, grads = task.exact_stats_of(thetas, ref), task.exact_gradient(thetas)
        assert grads.shape == thetas.shape and len(stats) == len(thetas)
        for p, theta in enumerate(thetas):
            assert stats[p] == _reference_exact_stats(task, theta, ref), p
            assert torch.equal(grads[p], task.exact_gradient(theta)), p


def test_toy_source_exact_equals_the_task_functions():
    from harness.tasks.toy import build_task
    from harness.train.toy import ToySource

    cfg = make_cfg(["task=toy", "estimator=rloo", "++toy.init_scale=0.8"])
    src = ToySource(RunPlan.of(cfg), build_task(cfg))
    for step in range(2):
        with torch.no_grad():
            src.theta.add_(torch.randn(src.theta.shape, generator=torch.Generator().manual_seed(step), dtype=DTYPE))
        src._exact = None  # a new iteration
        ((stats, kl),) = src.exact()  # a lone source: one member
        theta = src.theta.detach()[0]
        assert kl == float(src.task.sequence_kl(theta, src.theta_ref[0])) and kl > 0
        assert {k: v for k, v in stats.items() if k != "kl_ref"} == src.task.exact_stats(theta)


def _reference_clip_frac(x: PolicyInputs, low: float, high: float) -> torch.Tensor:
    ratio, a = (x.logp - x.old_logp).exp(), x.advantages
    zeroed = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < low))
    return (zeroed.to(DTYPE) * x.mask).sum() / x.mask.sum()


def test_clipped_losses_build_the_clip_mask_only_for_their_metrics():
    g = torch.Generator().manual_seed(0)
    T, B = 3, 16
    old = torch.randn(T, B, generator=g, dtype=DTYPE)
    logp = old + 0.4 * torch.randn(T, B, generator=g, dtype=DTYPE)
    adv = torch.randn(T, B, generator=g, dtype=DTYPE)
    mask = (torch.rand(T, B, generator=g, dtype=DTYPE) > 0.2).to(DTYPE)
    s = PPOClipSettings(clip_eps=0.2, clip_eps_high=0.28)
    for loss_fn in (clipped_surrogate_loss, dual_clip_loss):
        out = {}
        for metrics in (False, True):
            th = logp.clone().requires_grad_(True)
            x = PolicyInputs(th, old, adv, mask, with_metrics=metrics)
            loss, m = loss_fn(x, s) if loss_fn is clipped_surrogate_loss else loss_fn(x)
            (grad,) = torch.autograd.grad(loss, th)
            out[metrics] = (loss.detach(), grad, m)
        assert torch.equal(out[False][0], out[True][0]) and torch.equal(out[False][1], out[True][1])
        assert "clip_frac" not in out[False][2]
        if loss_fn is clipped_surrogate_loss:
            expected = _reference_clip_frac(PolicyInputs(logp, old, adv, mask), 0.8, 1.28)
            assert 0 < float(expected) < 1 and torch.equal(out[True][2]["clip_frac"], expected)
        else:  # dual clip (c = 3, symmetric 0.2): PPO's regions plus A < 0 and r > c
            ratio = (logp - old).exp()
            zeroed = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8)) | ((adv < 0) & (ratio > 3.0))
            assert float(out[True][2]["clip_frac"]) == pytest.approx(float((zeroed * mask).sum() / mask.sum()))


def test_divergence_guard_reads_one_value_or_all():
    assert _all_finite(torch.tensor([1.5])) and _all_finite(torch.tensor([[2.0], [3.0]]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert not _all_finite(torch.tensor([bad]))
        assert not _all_finite(torch.tensor([[0.0], [bad]]))
    assert _all_finite(torch.tensor([1.0], requires_grad=True) * 2)


# The last metric row of two short runs as main at 3ff29ab logged them (float.hex), before the
# changes above: the trainer must reproduce them, to the last bits the CPU decides. The exact
# statistics (eval_return, grad_cos, kl_ref) sum over every enumerated response in torch's vectorized
# reductions, whose order follows the CPU's SIMD width: on another machine (AVX-512, 2026-12-05) they
# came out 1-5 ulp (about 1e-15 relative) from the pinned values, every other column bit for bit. So
# the check is to 1e-13 relative: above the reduction order's few ulp, below what a change to the
# numbers moves (the same runs with lr 1e-9 relative off: every column but clip_frac moved by 2e-12 to
# 2e-9 relative, 2026-12-05).
REL = 1e-13
PINNED = {
    "clip": (["estimator=grpo", "++toy.reward=random", "std_normalize=true", "update=clip", "clip_eps=0.2",
              "epochs=4", "minibatches=2", "lr=0.3", "normalize_advantages=none", "group_size=4",
              "task.episodes_per_iter=16", "budget.iterations=3", "seed=3"],
             {"eval_return": "0x1.0a53bd3847cb3p-1", "exact_entropy": "0x1.265c8b2fb7079p+1",
              "kl_ref": "0x1.dbf3796f7ccd4p+0", "grad_cos": "0x1.731f70ee1a49ep-3",
              "policy_loss": "-0x1.858c91918350bp-4", "clip_frac": "0x1.6aaaaaaaaaaaap-1",
              "entropy": "0x1.aff7915768110p-1", "grad_norm": "0x1.6a92136784da6p-6",
              "approx_kl": "0x1.e2f252f4c299ap-3"}),
    "pg": (["task.env_id=varlen", "estimator=grpo", "update=pg", "epochs=1", "minibatches=1", "lr=0.05",
            "loss_agg=seq_mean_token_mean", "++toy.log_prompts=true", "group_size=4", "task.episodes_per_iter=16",
            "budget.iterations=3", "seed=1"],
           {"eval_return": "0x1.2593594905f14p-2", "exact_entropy": "0x1.ead15552aa200p+1",
            "kl_ref": "0x1.0c92b093fa189p-7", "grad_cos": "0x1.27d598c5eb2d1p-1",
            "policy_loss": "-0x1.ef43fbdd590d8p-8", "clip_frac": "0x0.0p+0", "entropy": "0x1.62827814ae462p+0",
            "grad_norm": "0x1.a964a4094a053p-4", "approx_kl": "0x0.0p+0"}),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_short_toy_runs_log_the_numbers_they_logged_before(tmp_path, name):
    overrides, pinned = PINNED[name]
    cfg = make_cfg(["task=toy", "progress=false", f"results_dir={tmp_path}"] + overrides)
    assert run(cfg).get("completed") == 1
    (path,) = tmp_path.glob("toy/*/*/metrics.parquet")
    last = pd.read_parquet(path).iloc[-1]
    got = {k: float(last[k]) for k in pinned}
    off = {k: float.hex(v) for k, v in got.items() if not math.isclose(v, float.fromhex(pinned[k]), rel_tol=REL)}
    assert not off, f"moved from the pinned values: {off} (pinned: {pinned})"
