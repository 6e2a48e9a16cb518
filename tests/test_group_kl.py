"""Group baselines (GRPO, Dr. GRPO, RLOO, ReMax) and the k1/k2/k3 KL estimators."""
import math

import pytest
import torch

from harness.estimators import (
    AdvantageBatch, EstimatorParams, ESTIMATORS, estimator_names, get_estimator, grpo, kl_k1, kl_k2, kl_k3,
    remax, rloo,
)


def test_grpo_hand_computed():
    s = torch.tensor([[1.0, 2.0, 3.0]])  # mean 2, unbiased std 1
    assert grpo(s, eps=0.0).tolist() == [[-1.0, 0.0, 1.0]]
    s = torch.tensor([[0.0, 0.0, 1.0, 1.0]])  # mean .5, unbiased std sqrt(1/3)
    want = 0.5 / math.sqrt(1 / 3)
    assert grpo(s, eps=0.0).flatten().tolist() == pytest.approx([-want, -want, want, want])
    assert grpo(s, std_normalize=False).flatten().tolist() == pytest.approx([-0.5, -0.5, 0.5, 0.5])


def test_grpo_constant_group_is_exactly_zero():
    s = torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    a = grpo(s)
    assert torch.equal(a[:2], torch.zeros(2, 3, dtype=torch.float64))
    assert not torch.isnan(a).any()
    assert torch.equal(grpo(s, std_normalize=False)[:2], torch.zeros(2, 3, dtype=torch.float64))


def test_rloo_hand_computed():
    s = torch.tensor([[1.0, 2.0, 6.0]])
    # 1 - (2+6)/2 = -3 ; 2 - (1+6)/2 = -1.5 ; 6 - (1+2)/2 = 4.5
    assert rloo(s).flatten().tolist() == pytest.approx([-3.0, -1.5, 4.5])


@pytest.mark.claim("C16")
@pytest.mark.parametrize("k", [2, 4, 8])
def test_c16_group_mean_times_k_over_k_minus_1_equals_rloo(k):
    s = torch.randn(50, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    assert torch.allclose(grpo(s, std_normalize=False) * k / (k - 1), rloo(s), atol=1e-12)


def test_remax_hand_computed():
    s = torch.tensor([[1.0, 3.0], [0.0, 0.5]])
    g = torch.tensor([2.0, 1.0])
    assert remax(s, g).tolist() == [[-1.0, 1.0], [-1.0, -0.5]]


def test_group_bad_inputs():
    with pytest.raises(ValueError, match="group_size"):
        grpo(torch.ones(3, 1))
    with pytest.raises(ValueError, match="group_size"):
        rloo(torch.ones(3, 1))
    with pytest.raises(ValueError, match="scores must be finite"):
        rloo(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="scores must be finite"):
        grpo(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="greedy_scores"):
        remax(torch.ones(3, 2), torch.ones(2))
    with pytest.raises(ValueError, match="greedy_scores must be finite"):
        remax(torch.ones(1, 2), torch.tensor([float("nan")]))


# ------------------------------------------------------------- KL estimators, exact enumeration
P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)


def test_kl_estimators_against_analytic_kl():
    analytic = float((P * (P / Q).log()).sum())  # KL(P || Q), samples x ~ P
    logp, logq = P.log(), Q.log()
    expect = {name: float((P * fn(logp, logq)).sum()) for name, fn in
              (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3))}
    assert expect["k1"] == pytest.approx(analytic, abs=1e-12)
    assert expect["k3"] == pytest.approx(analytic, abs=1e-12)
    assert abs(expect["k2"] - analytic) > 1e-3  # k2 is biased
    # hand value of the analytic KL for these numbers
    by_hand = 0.5 * math.log(2.5) + 0.3 * math.log(1.5) + 0.2 * math.log(1 / 3)
    assert analytic == pytest.approx(by_hand)


def test_k3_is_nonnegative_pointwise_and_k1_can_be_negative():
    logp = torch.randn(1000, dtype=torch.float64)
    logq = torch.randn(1000, dtype=torch.float64)
    assert (kl_k3(logp, logq) >= 0).all()
    assert (kl_k2(logp, logq) >= 0).all()
    assert (kl_k1(logp, logq) < 0).any()
    assert kl_k1(torch.tensor([0.0]), torch.tensor([math.log(2.0)])).item() == pytest.approx(-math.log(2.0))
    # k3 at ratio ref/pi = 2: 2 - 1 - log 2
    assert kl_k3(torch.tensor([0.0]), torch.tensor([math.log(2.0)])).item() == pytest.approx(1 - math.log(2))


# ------------------------------------------------------------------------------- registry
# The presets DESIGN.md requires (a spec check: the registry may hold more).
DESIGN_PRESETS = ["reinforce", "baseline", "a2c", "ppo_gae", "grpo", "rloo", "remax", "dr_grpo", "reinforce_pp"]
# Hand-checked below with V = 0, gamma = lambda = 1, n_steps >= T: advantages = reward-to-go.
REWARD_TO_GO_FAMILY = {"reinforce", "baseline", "a2c", "ppo_gae", "reinforce_pp"}


def test_registry_has_all_presets_and_lists_names_on_a_miss():
    assert set(DESIGN_PRESETS) <= set(ESTIMATORS)
    with pytest.raises(ValueError) as e:
        get_estimator("ppo")
    for name in ESTIMATORS:
        assert name in str(e.value)


def _two_groups_batch() -> AdvantageBatch:
    """Two groups of two one-column episodes (returns: group 0 = (2, 0), group 1 = (1, 3))."""
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 1], [0, 0, 0, 1]])
    terminated = torch.tensor([[0.0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    return AdvantageBatch(
        rewards=rewards * mask, terminated=terminated, truncated=torch.zeros(3, 4), mask=mask,
        values=torch.zeros(3, 4), next_values=torch.zeros(3, 4),
        greedy_scores=torch.tensor([1.0, 1.0]), group_size=2,
    )


@pytest.mark.parametrize("name", estimator_names())
def test_every_registered_estimator_runs_through_one_signature(name):
    """The contract every estimator keeps: [T, B] advantages, finite where the mask is 1,
    critic targets exactly when it needs a critic."""
    spec = get_estimator(name)
    batch = _two_groups_batch()
    out = spec(batch, EstimatorParams(gamma=1.0, gae_lambda=1.0, n_steps=10))
    assert out.advantages.shape == (3, 4)
    assert torch.isfinite(out.advantages[batch.mask.bool()]).all()
    assert (out.returns is not None) == spec.needs_critic


# Hand-computed on _two_groups_batch (V = 0, gamma = lambda = 1, n_steps >= T).
HAND = {
    "grpo": [1 / math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2)],
    "dr_grpo": [1.0, -1.0, -1.0, 1.0],
    "rloo": [2.0, -2.0, -2.0, 2.0],
    "remax": [1.0, -1.0, 0.0, 2.0],
}


def test_every_shipped_preset_has_hand_computed_advantages():
    assert set(DESIGN_PRESETS) <= set(HAND) | REWARD_TO_GO_FAMILY


@pytest.mark.parametrize("name", sorted(set(HAND) | REWARD_TO_GO_FAMILY))
def test_presets_give_the_hand_computed_advantages(name):
    spec = get_estimator(name)
    batch = _two_groups_batch()
    mask = batch.mask
    out = spec(batch, EstimatorParams(gamma=1.0, gae_lambda=1.0, n_steps=10))
    if name in HAND:
        want = torch.tensor(HAND[name]).expand(3, 4) * mask
        assert torch.allclose(out.advantages, want, atol=1e-5)
        assert out.returns is None
    else:  # reward-to-go family with V = 0: advantages are the returns-to-go
        want = torch.tensor([[2.0, 0.0, 1.0, 3.0], [1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 1.0]])
        assert torch.allclose(out.advantages * mask, want * mask)
        if spec.needs_critic:
            assert torch.allclose(out.returns * mask, want * mask)
