"""Probe evidence for claims C23-C27 on the exact-gradient toy task: each expected value is worked
out here independently of the code under test (by hand, by enumerating every response, or from a
closed form), then the probe or the task is checked against it."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from harness.estimators import EstimatorParams, get_estimator, kl_estimate
from harness.probes import ProbeSettings, probe_toy, validate_probe
from harness.probes import stats as pstats
from harness.probes.toy import ProbeTraining, ToyProbe, estimator_advantages
from harness.tasks.toy import DTYPE, PRESETS, PromptSpec, ToyBatch, ToyTask
from tests.control_helpers import make_cfg

torch.set_num_threads(1)

BINARY = replace(PRESETS["mixed"], prompts=(PromptSpec("binary", 0.05), PromptSpec("binary", 0.5),
                                             PromptSpec("binary", 0.95), PromptSpec("binary", 0.2)))


def _all(res):
    return next(r for r in res.rows if r["scope"] == "all")


def _probe(task, theta, name="reinforce", M=1000, B=64, k=4, gamma=1.0, lam=0.95, normalize="none", kl_name="k3",
           kl_beta=0.0, kl_in_reward=False, **kw):
    s = ProbeSettings(batches=M, reps=400, **kw)
    return probe_toy(task, theta, get_estimator(name), EstimatorParams(gamma=gamma, gae_lambda=lam), settings=s,
                     training=ProbeTraining(batch_size=B, group_size=k, seed=0, normalize=normalize, kl_name=kl_name,
                                            kl_beta=kl_beta, kl_in_reward=kl_in_reward))


# ----------------------------------------------------------------------------- discounted values (C27)

def test_discounted_values_by_hand_on_the_tiny_task():
    """tiny: 2 tokens of 2, reward after the second. Root policy (1/4, 3/4), children uniform, gamma = 0.5:
    V(child a) = (R(a,0) + R(a,1)) / 2 (the reward comes on that step, undiscounted),
    Q(root, a) = 0.5 V(child a), V(root) = 1/4 Q(root, 0) + 3/4 Q(root, 1)."""
    task = ToyTask(PRESETS["tiny"])
    theta = torch.zeros(task.param_shape, dtype=DTYPE)
    root = int(task.root[0])
    theta[root] = torch.tensor([0.0, math.log(3.0)], dtype=DTYPE)
    R = {tuple(task.leaf_tokens[n].tolist()): float(task.leaf_reward[n]) for n in range(task.n_leaves)}
    V, Q = task.values(theta, gamma=0.5)
    for a in (0, 1):
        child = int(task.child[root, a])
        assert float(V[child]) == pytest.approx((R[(a, 0)] + R[(a, 1)]) / 2, abs=1e-12)
        assert float(Q[root, a]) == pytest.approx(0.5 * (R[(a, 0)] + R[(a, 1)]) / 2, abs=1e-12)
    by_hand = 0.25 * 0.5 * (R[(0, 0)] + R[(0, 1)]) / 2 + 0.75 * 0.5 * (R[(1, 0)] + R[(1, 1)]) / 2
    assert float(V[root]) == pytest.approx(by_hand, abs=1e-12)
    assert float(task.values(theta)[0][root]) == pytest.approx(2 * by_hand, abs=1e-12)  # gamma = 1: no discount


def test_discounted_root_value_is_the_enumerated_discounted_return_with_eos():
    """varlen (EOS: responses of 1 to 4 tokens): V_gamma(root x) = sum_y pi(y | x) gamma^(len(y) - 1) R(x, y)."""
    task = ToyTask(PRESETS["varlen"])
    theta = task.init_logits(scale=1.0, seed=3)
    gamma = 0.8
    w = task.leaf_log_probs(theta).exp() * gamma ** (task.leaf_len.to(DTYPE) - 1) * task.leaf_reward
    enumerated = torch.zeros(task.n_prompts, dtype=DTYPE).index_add(0, task.leaf_prompt, w)
    assert torch.allclose(task.values(theta, gamma)[0][task.root], enumerated, atol=1e-12)


def test_c27_gamma_biases_gae_even_with_the_exact_critic_lambda_only_with_a_wrong_one():
    """Fixed length L, reward on the last token, exact V_gamma: E[A_t | s_t, a_t] = gamma^(L-1-t) (Q - V)
    whatever lambda, and the rows of depth t get gradient from step t only, so
    E g = gamma^(L-1-depth(row)) * grad J row by row (a closed form, not the probe's)."""
    task = ToyTask(PRESETS["mixed"])
    theta = task.init_logits()
    g = task.exact_gradient(theta)
    pred = g * (0.9 ** (task.spec.length - 1 - task.state_depth.to(DTYPE)))[:, None]
    pred_rel_bias_sq = float(((pred - g) ** 2).sum() / (g ** 2).sum())
    assert pred_rel_bias_sq > 0.01
    for lam in (0.5, 1.0):
        r = _all(_probe(task, theta, "ppo_gae", M=2000, gamma=0.9, lam=lam, critic="exact"))
        assert r["critic_rmse"] == 0.0  # the exact critic is V^pi_gamma of the probed gamma
        assert r["rel_bias_sq_low"] < pred_rel_bias_sq < r["rel_bias_sq_high"], (lam, r["rel_bias_sq_low"],
                                                                               r["rel_bias_sq_high"])
        assert r["rel_bias_sq_low"] > 0
    for lam, biased in ((0.5, True), (1.0, False)):  # gamma = 1: lambda < 1 is biased only with a wrong critic
        exact = _all(_probe(task, theta, "ppo_gae", gamma=1.0, lam=lam, critic="exact"))
        assert exact["rel_bias_sq_low"] < 0 < exact["rel_bias_sq_high"], lam
        noisy = _all(_probe(task, theta, "ppo_gae", gamma=1.0, lam=lam, critic="noisy", critic_noise=0.3))
        assert (noisy["rel_bias_sq_low"] > 0) == biased, (lam, noisy["rel_bias_sq_low"])


# ----------------------------------------------------------------------------- KL placements (C23)

def _all_leaves(task):
    """Every complete response once, as a batch (weights pi(y | x) / X applied by the caller)."""
    n = task.n_leaves
    return ToyBatch(task.leaf_prompt, task.leaf_tokens, task.leaf_states, task.leaf_mask, task.leaf_len,
                    torch.arange(n), task.leaf_reward)


def _enumerated_expectation(task, theta, theta_ref, per_token_loss):
    """``E_y [grad sum_t loss_t(y)]`` by enumeration: ``sum_y pi(y)/X grad(...)`` with pi(y) held fixed."""
    th = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(th, -1)[task.leaf_states, task.leaf_tokens]  # [N, L]
    ref = torch.log_softmax(theta_ref, -1)[task.leaf_states, task.leaf_tokens]
    weight = task.leaf_log_probs(theta).exp().detach() / task.n_prompts
    loss = (weight[:, None] * per_token_loss(logp, ref) * task.leaf_mask).sum()
    (grad,) = torch.autograd.grad(loss, th)
    return grad


def _grad_kl(task, theta, theta_ref):
    th = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(task.sequence_kl(th, theta_ref), th)
    return grad


@pytest.mark.parametrize("preset", ["mixed", "bandit"])
def test_c23_loss_placements_by_enumeration(preset):
    """k1 in the loss: E grad = sum_y pi(y) grad log pi(y) = 0. k2 in the loss: exact grad KL for one-token
    responses (bandit) only. k3 in the loss: not grad KL."""
    task = ToyTask(PRESETS[preset])
    theta, ref = task.init_logits(scale=0.5, seed=0), task.init_logits()
    gkl = _grad_kl(task, theta, ref)
    e = {k: _enumerated_expectation(task, theta, ref, lambda lp, lr, k=k: kl_estimate(k, lp, lr))
         for k in ("k1", "k2", "k3")}
    assert float(e["k1"].abs().max()) < 1e-12
    k2_err = float((e["k2"] - gkl).norm() / gkl.norm())
    assert (k2_err < 1e-10) == (preset == "bandit"), k2_err
    assert float((e["k3"] - gkl).norm() / gkl.norm()) > 0.1


@pytest.mark.parametrize("preset", ["mixed", "bandit"])
def test_c23_k1_in_the_reward_is_exactly_unbiased_for_the_regularised_objective(preset):
    """The probe's in-reward path (advantage_batch's reward_penalty -> the registered reinforce estimator) on
    every response, weighted by pi(y)/X: sum_y pi(y) sum_t A_t grad log pi_t equals grad (J - beta KL)."""
    task = ToyTask(PRESETS[preset])
    theta, ref = task.init_logits(scale=0.5, seed=0), task.init_logits()
    beta = 0.5
    batch = _all_leaves(task)
    logp = torch.log_softmax(theta, -1)[batch.states, batch.tokens].T
    lref = torch.log_softmax(ref, -1)[batch.states, batch.tokens].T
    probe = ToyProbe(task, theta, ref, get_estimator("reinforce"), EstimatorParams(gamma=1.0), ProbeSettings(batches=1),
                     ProbeTraining(batch_size=batch.tokens.shape[0], group_size=1, seed=0), batch=batch)
    adv = estimator_advantages(probe, reward_penalty=beta * kl_estimate("k1", logp, lref))  # [L, N]
    eg = _enumerated_expectation(task, theta, ref, lambda lp, lr: adv.T * lp)
    th = theta.clone().requires_grad_(True)
    (truth,) = torch.autograd.grad(task.expected_reward(th) - beta * task.sequence_kl(th, ref), th)
    assert torch.allclose(eg, truth, atol=1e-12)
    assert float((eg - task.exact_gradient(theta)).norm()) > 0.01  # the KL part is there


def test_c23_probe_finds_each_placement():
    """Sampled probes agree with the enumeration above: k1 loss E g = 0 (rel_mean_sq interval holds 0), k2 loss
    unbiased for one token and biased for three, k3 loss biased, k1 reward unbiased for J - beta KL."""
    for preset in ("mixed", "bandit"):
        task = ToyTask(PRESETS[preset])
        theta = task.init_logits(scale=0.5, seed=0)
        kl = {k: _all(_probe(task, theta, target="kl", kl_name=k)) for k in ("k1", "k2", "k3")}
        assert kl["k1"]["rel_mean_sq_low"] < 0 < kl["k1"]["rel_mean_sq_high"]
        assert kl["k1"]["kl_placement"] == "loss"
        k2_null = kl["k2"]["rel_bias_sq_low"] < 0 < kl["k2"]["rel_bias_sq_high"]
        assert k2_null == (preset == "bandit"), (preset, kl["k2"]["rel_bias_sq_low"])
        assert kl["k3"]["rel_bias_sq_low"] > 0
        rw = _all(_probe(task, theta, kl_name="k1", kl_beta=0.5, kl_in_reward=True))
        assert rw["label"] == "reinforce+k1_reward" and rw["kl_placement"] == "reward"
        assert rw["rel_bias_sq_low"] < 0 < rw["rel_bias_sq_high"]
        J_minus = float(task.expected_reward(theta) - 0.5 * task.sequence_kl(theta, task.init_logits()))
        assert rw["value_true"] == pytest.approx(J_minus)
        assert rw["value_bias_low"] < 0 < rw["value_bias_high"]
        # the loss placement of k1 next to the policy gradient: E g = grad J, off grad (J - beta KL) by beta grad KL
        lo = _all(_probe(task, theta, kl_name="k1", kl_beta=0.5, kl_in_reward=False))
        assert lo["label"] == "reinforce+k1_loss" and lo["rel_bias_sq_low"] > 0
        # k2 in the loss next to the policy gradient: unbiased for J - beta KL with one-token responses only
        k2 = _all(_probe(task, theta, kl_name="k2", kl_beta=0.5, kl_in_reward=False))
        assert (k2["rel_bias_sq_low"] < 0 < k2["rel_bias_sq_high"]) == (preset == "bandit"), k2["rel_bias_sq_low"]


# ----------------------------------------------------------------------------- arcsin (C25)

def test_arcsin_gradient_is_the_analytic_one():
    """grad (1/X) sum_x arcsin sqrt(p_x) = (1/X) sum_x grad p_x / (2 sqrt(p_x (1 - p_x)))."""
    task = ToyTask(BINARY)
    theta = task.init_logits(scale=0.7, seed=5)
    th = theta.clone().requires_grad_(True)
    (got,) = torch.autograd.grad(task.arcsin_objective(th), th)
    want = torch.zeros_like(theta)
    for x in range(task.n_prompts):
        th = theta.clone().requires_grad_(True)
        p = task.prompt_rewards(th)[x]
        (dp,) = torch.autograd.grad(p, th)
        p = float(p.detach())
        want += dp / (2 * math.sqrt(p * (1 - p))) / task.n_prompts
    assert torch.allclose(got, want, atol=1e-12)
    assert ToyTask(PRESETS["varlen"]).binary_rewards and not ToyTask(PRESETS["mixed"]).binary_rewards
    with pytest.raises(ValueError, match="binary"):
        ToyTask(PRESETS["mixed"]).arcsin_objective(ToyTask(PRESETS["mixed"]).init_logits())


def test_direction_cosine_recovers_a_known_cosine_despite_noise():
    """E g = (1, 1, 0, ...), u = (1, 0, 0, ...): cos = 1/sqrt 2; heavy noise would pull cos(gbar, u) down."""
    rng = np.random.default_rng(0)
    M, D = 4000, 400  # tr Sigma / M = 0.9 next to ||E g||^2 = 2
    mu = np.zeros(D)
    mu[:2] = 1.0
    G = mu + 3.0 * rng.standard_normal((M, D))
    u = np.zeros(D)
    u[0] = 1.0
    out = pstats.gradient_summary(G, mu, pstats.resample_weights(M, 500, 1), directions={"u": u})
    assert out["cos_u_low"] < 1 / math.sqrt(2) < out["cos_u_high"]
    assert out["cos_u"] == pytest.approx(1 / math.sqrt(2), abs=0.03)
    assert out["cos_exp_low"] < 1.0 <= out["cos_exp_high"] + 1e-9
    naive = float(G.mean(0) @ u / np.linalg.norm(G.mean(0)))
    assert naive < out["cos_u_low"]  # the noise in gbar biases the plain cosine down
    assert out["cos_u_gap"] == pytest.approx(out["cos_u"] - out["cos_exp"])
    assert out["rel_mean_sq_low"] < 1.0 < out["rel_mean_sq_high"]  # ||E g||^2 = ||t||^2 here


def test_c25_large_groups_follow_arcsin_small_groups_the_linear_objective():
    task = ToyTask(BINARY)
    theta = task.init_logits()
    big = _all(_probe(task, theta, "grpo", M=1000, B=64, k=64, arcsin=True))
    assert big["cos_arcsin_gap_low"] > 0 and big["cos_arcsin_high"] > 0.995
    assert big["cos_linear"] == big["cos_exp"]
    small = _all(_probe(task, theta, "grpo", M=1000, B=64, k=4, arcsin=True))
    assert small["cos_arcsin_gap_high"] < 0


def test_arcsin_settings_are_refused_where_they_mean_nothing():
    base = ["task=toy", "estimator=grpo", "mode=probe", "++probe.arcsin=true"]
    validate_probe(make_cfg(base + ["task.env_id=varlen"]))  # first_token prompts: binary rewards
    for extra, match in ((["task.env_id=mixed"], "every reward is 0 or 1"),
                         (["task.env_id=varlen", "++probe.target=kl"], "probe.target"),
                         (["task.env_id=varlen", "kl.beta=0.1"], "kl.beta")):
        with pytest.raises(ValueError, match=match):
            validate_probe(make_cfg(base + extra))


# ----------------------------------------------------------------------------- batch vs group normalisation (C24)

def test_c24_a_one_group_batch_whitens_like_grpo_and_larger_batches_lose_the_direction_bias():
    """A batch that is one group: batch whitening = group whitening up to a scale (population vs sample std),
    so the two expected directions coincide; grpo's direction bias stays at every batch size."""
    task = ToyTask(PRESETS["mixed"])
    theta = task.init_logits()
    one_pp = _all(_probe(task, theta, "reinforce_pp", M=2000, B=4, k=4, normalize="batch"))
    one_grpo = _all(_probe(task, theta, "grpo", M=2000, B=4, k=4))
    assert one_pp["cos_exp"] == pytest.approx(one_grpo["cos_exp"], abs=1e-6)
    assert one_pp["weight"] / one_grpo["weight"] == pytest.approx(math.sqrt(4 / 3), rel=1e-4)
    assert one_grpo["cos_exp_high"] < 0.99
    big_pp = _all(_probe(task, theta, "reinforce_pp", M=1000, B=64, k=4, normalize="batch"))
    assert big_pp["cos_exp_low"] > one_pp["cos_exp_high"]
    assert big_pp["rel_bias_sq_low"] > 1.0  # whitening scales E g by ~1/std R: rel_bias_sq cannot go to 0
    big_grpo = _all(_probe(task, theta, "grpo", M=1000, B=64, k=4))
    assert big_grpo["cos_exp_high"] < 0.99
