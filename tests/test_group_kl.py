"""Group baselines (GRPO, Dr. GRPO, RLOO, ReMax, REINFORCE++-baseline, OPO, GPG, pass@k) and the
KL estimators (k1/k2/k3, verl's low_var_kl and the straight-through "+" variants)."""
import math

import pytest
import torch

from harness.estimators import (
    KL_ESTIMATORS, AdvantageBatch, EstimatorParams, ESTIMATORS, estimator_names, get_estimator, gpg, grpo,
    grpo_passk, kl_k1, kl_k2, kl_k3, kl_low_var, opo, reinforce_pp_baseline, remax, rloo,
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
# The presets the shared DESIGN.md names (a spec check: the registry may hold more).
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
# Column lengths (mask sums): 2, 1, 2, 3. Default params: std_normalize=True.
HAND = {
    "grpo": [1 / math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2)],
    "dr_grpo": [1.0, -1.0, -1.0, 1.0],
    "rloo": [2.0, -2.0, -2.0, 2.0],
    "remax": [1.0, -1.0, 0.0, 2.0],
    "reinforce_pp_baseline": [1.0, -1.0, -1.0, 1.0],  # before the batch whitening of its config
    # b0 = (2*2 + 1*0) / 3 = 4/3 ; b1 = (2*1 + 3*3) / 5 = 11/5
    "opo": [2 / 3, -4 / 3, -1.2, 0.8],
    # both groups vary: alpha = 2/2 = 1; with the std: GRPO's numbers
    "gpg": [1 / math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 1 / math.sqrt(2)],
    # best of each group: gap 2, group std sqrt(2)
    "grpo_passk": [math.sqrt(2), 0.0, 0.0, math.sqrt(2)],
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


# ------------------------------------------------ issue 14: REINFORCE++-baseline, OPO, GPG, pass@k
def test_reinforce_pp_baseline_hand_computed():
    s = torch.tensor([[1.0, 2.0, 6.0], [4.0, 4.0, 4.0]])  # means 3 and 4
    assert reinforce_pp_baseline(s).tolist() == [[-2.0, -1.0, 3.0], [0.0, 0.0, 0.0]]


def _yaml(name):
    import yaml
    from pathlib import Path

    return yaml.safe_load((Path(__file__).resolve().parents[1] / "harness" / "conf" / "estimator" / f"{name}.yaml").read_text())


def _verl_masked_whiten(values, mask):
    """verl's ``masked_whiten`` written from its definition: token-weighted mean, Bessel-corrected
    variance over the N unmasked entries, ``(x - mean) * rsqrt(var + 1e-8)``."""
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n * n / (n - 1)
    return (values - mean) / torch.sqrt(var + 1e-8)


def _openrlhf_whiten(values, mask):
    """OpenRLHF's normalisation for ``reinforce_baseline``: biased variance, ``rsqrt(max(var, 1e-8))``."""
    n = mask.sum()
    mean = (values * mask).sum() / n
    var = (((values - mean) ** 2) * mask).sum() / n
    return (values - mean) / torch.sqrt(var.clamp(min=1e-8))


def test_reinforce_pp_baseline_whitening_is_its_config_axis_by_hand():
    """Groups (2, 0) and (1, 3), lengths 1, 1, 1, 3 tokens: group-mean advantages 1, -1, -1, 1 on
    N = 6 tokens 1 | -1 | -1 | 1 1 1. Mean 1/3; squared deviations 4/9 + 16/9 + 16/9 + 3*4/9 = 48/9;
    biased var 8/9 -> whitened 2/3 / sqrt(8/9) = 1/sqrt(2) and -4/3 / sqrt(8/9) = -sqrt(2); verl's
    unbiased var 48/45 = 16/15 -> 2/3 * sqrt(15)/4 = sqrt(15)/6."""
    from harness.losses import whiten

    cfg = _yaml("reinforce_pp_baseline")
    assert cfg["normalize_advantages"] == "batch"  # the whitening lives on the update step's axis
    mask = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1]], dtype=torch.float64)
    rewards = torch.tensor([[2.0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 3]], dtype=torch.float64)
    batch = AdvantageBatch(rewards=rewards, terminated=torch.zeros_like(rewards), truncated=torch.zeros_like(rewards),
                           mask=mask, group_size=2)
    adv = get_estimator("reinforce_pp_baseline")(batch, EstimatorParams()).advantages
    assert torch.equal(adv, torch.tensor([[1.0, -1, -1, 1], [0, 0, 0, 1], [0, 0, 0, 1]], dtype=torch.float64))
    ours = whiten(adv[None], mask[None])[0]  # what update() does with normalize_advantages=batch
    want = torch.tensor([[2**-0.5, -2**0.5, -2**0.5, 2**-0.5], [0, 0, 0, 2**-0.5], [0, 0, 0, 2**-0.5]],
                        dtype=torch.float64)
    assert torch.allclose(ours, want, atol=1e-7)
    verl = _verl_masked_whiten(adv, mask) * mask
    assert verl[0, 0].item() == pytest.approx(math.sqrt(15) / 6, rel=1e-7)
    assert torch.allclose(verl, ours * math.sqrt(5 / 6), atol=1e-7)  # verl = ours * sqrt((N-1)/N)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_pp_baseline_with_batch_whitening_against_verl_and_openrlhf(seed):
    """Random groups and lengths: the preset (estimator + the update's batch whitening) equals
    OpenRLHF's reinforce_baseline normalisation, and verl's masked_whiten times sqrt(N/(N-1))."""
    from harness.losses import whiten

    g = torch.Generator().manual_seed(seed)
    n_groups, k, T = 5, 4, 7
    B = n_groups * k
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[:, None] < lengths[None, :]).double()
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    rewards = torch.zeros(T, B, dtype=torch.float64)
    rewards[lengths - 1, torch.arange(B)] = scores
    batch = AdvantageBatch(rewards=rewards, terminated=torch.zeros_like(rewards), truncated=torch.zeros_like(rewards),
                           mask=mask, group_size=k)
    ours = whiten(get_estimator("reinforce_pp_baseline")(batch, EstimatorParams()).advantages[None], mask[None])[0]
    # independent: loop over groups for the group mean, then each framework's whitening
    centred = torch.zeros(B, dtype=torch.float64)
    for grp in range(n_groups):
        members = list(range(grp * k, (grp + 1) * k))
        m = sum(float(scores[j]) for j in members) / k
        for j in members:
            centred[j] = scores[j] - m
    per_token = centred[None, :].expand(T, B) * mask
    n = float(mask.sum())
    assert torch.allclose(ours, _openrlhf_whiten(per_token, mask) * mask, atol=1e-7)
    assert torch.allclose(ours * math.sqrt((n - 1) / n), _verl_masked_whiten(per_token, mask) * mask, atol=1e-7)


def test_opo_hand_computed():
    s = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [2.0, 2.0, 2.0]])
    lengths = torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0], [1.0, 5.0, 9.0]])
    # g0: b = 1*1 / 6 = 1/6 ; g1: equal lengths, b = mean = 2/3 ; g2: constant -> 0
    want = [[5 / 6, -1 / 6, -1 / 6], [1 / 3, -2 / 3, 1 / 3], [0.0, 0.0, 0.0]]
    assert opo(s, lengths).flatten().tolist() == pytest.approx(sum(want, []))
    # all-empty group: equal weights (the plain mean) rather than 0/0
    assert opo(torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2)).tolist() == [[-1.0, 1.0]]
    with pytest.raises(ValueError, match="lengths must be"):
        opo(s, lengths[:, :2])


def test_gpg_hand_computed():
    s = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 3.0, 0.0]])
    # 3 groups, 2 with a non-zero std: alpha = 3/2. Centred: g0 (.5, -.5, -.5, .5), g2 mean 1.5
    want = [[0.75, -0.75, -0.75, 0.75], [0.0] * 4, [0.75, -0.75, 2.25, -2.25]]
    assert gpg(s).tolist() == want
    # f_norm = group std: g0 unbiased std sqrt(1/3) -> 1.5 * .5 * sqrt(3)
    assert gpg(s, std_normalize=True, eps=0.0)[0, 0].item() == pytest.approx(0.75 * math.sqrt(3))
    # verl's alpha would be bsz / count_nonzero(scores) = 12 / 5 = 2.4: a different number
    assert gpg(s)[0, 0].item() != pytest.approx(2.4 * 0.5)
    assert gpg(torch.zeros(2, 3)).tolist() == [[0.0] * 3] * 2  # no valid group: alpha = 2 / max(1, 0), A = 0


def test_grpo_passk_hand_computed():
    s = torch.tensor([[0.5, 0.2, 0.1], [0.0, 1.0, 0.0]])
    # only the best gets R_max - R_second: 0.3 ; 1.0
    assert grpo_passk(s, std_normalize=False).flatten().tolist() == pytest.approx([0.3, 0, 0, 0, 1.0, 0])
    # group 1 std: mean 1/3, unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3
    assert grpo_passk(s, eps=0.0)[1, 1].item() == pytest.approx(1.0 / math.sqrt(1 / 3))
    tie = torch.tensor([[1.0, 0.0, 1.0], [2.0, 2.0, 2.0]])
    assert torch.equal(grpo_passk(tie), torch.zeros(2, 3))  # ties at the top: every advantage 0


def _opo_loop(scores, lengths):
    out = torch.zeros_like(scores)
    for gi in range(scores.shape[0]):
        r, l = scores[gi].tolist(), lengths[gi].tolist()
        b = sum(a * w for a, w in zip(r, l)) / sum(l)
        for j in range(len(r)):
            out[gi, j] = 0.0 if len(set(r)) == 1 else r[j] - b
    return out


def _gpg_loop(scores, std_normalize, eps):
    groups = scores.tolist()
    valid = sum(1 for r in groups if len(set(r)) > 1)
    alpha = len(groups) / max(1, valid)
    out = torch.zeros_like(scores)
    for gi, r in enumerate(groups):
        k = len(r)
        m = sum(r) / k
        sd = math.sqrt(sum((x - m) ** 2 for x in r) / (k - 1))
        for j, x in enumerate(r):
            a = 0.0 if len(set(r)) == 1 else x - m
            out[gi, j] = alpha * (a / (sd + eps) if std_normalize else a)
    return out


def _passk_loop(scores, std_normalize, eps):
    out = torch.zeros_like(scores)
    for gi, r in enumerate(scores.tolist()):
        best = max(range(len(r)), key=lambda j: r[j])
        second = max(r[j] for j in range(len(r)) if j != best)
        k = len(r)
        m = sum(r) / k
        sd = math.sqrt(sum((x - m) ** 2 for x in r) / (k - 1))
        gap = r[best] - second  # max_j R_j - max_{j != best} R_j; every other member: 0
        out[gi, best] = gap / (sd + eps) if std_normalize else gap
    return out


@pytest.mark.parametrize("seed", range(4))
def test_new_group_estimators_against_loop_rederivations(seed):
    g = torch.Generator().manual_seed(seed)
    n_groups, k = 12, 5
    scores = torch.randint(0, 4, (n_groups, k), generator=g).double()  # ties and constant groups
    scores[0] = 2.0
    cont = torch.randn(n_groups, k, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, 20, (n_groups, k), generator=g).double()
    for s in (scores, cont):
        assert torch.allclose(opo(s, lengths), _opo_loop(s, lengths), atol=1e-12)
        want = torch.tensor([[x - sum(r) / k for x in r] for r in s.tolist()], dtype=torch.float64)
        assert torch.allclose(reinforce_pp_baseline(s), want, atol=1e-12)
        for std_normalize in (False, True):
            assert torch.allclose(gpg(s, std_normalize, 1e-6), _gpg_loop(s, std_normalize, 1e-6), atol=1e-10)
            assert torch.allclose(grpo_passk(s, std_normalize, 1e-6), _passk_loop(s, std_normalize, 1e-6),
                                  atol=1e-10)


def test_gpg_alpha_is_per_member():
    """Two members side by side (member-major): member 0 has one constant group of two, member 1
    none. Each member's alpha is its own (2 and 1), as in its lone run."""
    k = 2
    scores = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0], [3.0, 1.0]])  # rows: m0 g0, m0 g1, m1 g0, m1 g1
    T, B = 1, scores.numel()
    rewards = scores.reshape(1, B)
    batch = AdvantageBatch(rewards=rewards, terminated=torch.ones(T, B), truncated=torch.zeros(T, B),
                           mask=torch.ones(T, B), group_size=k, members=2)
    p = EstimatorParams(std_normalize=False)
    adv = get_estimator("gpg")(batch, p).advantages.reshape(4, 2)
    assert adv.tolist() == [[1.0, -1.0], [0.0, 0.0], [-1.0, 1.0], [1.0, -1.0]]
    lone = [get_estimator("gpg")(AdvantageBatch(rewards=rewards[:, 4 * m:4 * m + 4], terminated=torch.ones(T, 4),
                                                truncated=torch.zeros(T, 4), mask=torch.ones(T, 4), group_size=k),
                                  p).advantages for m in range(2)]
    assert torch.equal(adv.reshape(1, B), torch.cat(lone, dim=1))
    batch.members = 1  # pooled: alpha = 4/3 for everyone, which is not what either lone run sees
    assert get_estimator("gpg")(batch, p).advantages[0, 0].item() == pytest.approx(0.5 * 4 / 3)


# ------------------------------------------------------------- issue 14: low_var_kl and "+" variants
def test_low_var_kl_is_k3_in_range_and_clamped_outside():
    logp = torch.tensor([0.0, 0.0, -0.5])
    ref = torch.tensor([math.log(2.0), 0.0, 0.0])
    assert kl_low_var(logp, ref)[0].item() == pytest.approx(1 - math.log(2))  # 2 - 1 - log 2, as k3
    assert torch.allclose(kl_low_var(logp, ref), kl_k3(logp, ref))
    # l = log ref - log pi = 3: k3 = e^3 - 4 = 16.09 > 10 -> 10 ; l = -30: k3 = 29 + e^-30 -> 10
    # l = 1000: exp would overflow; the log-ratio clamp at 20 keeps value and gradient finite
    lp = torch.tensor([-3.0, 30.0, -1000.0], requires_grad=True)
    v = kl_low_var(lp, torch.zeros(3))
    assert v.tolist() == [10.0, 10.0, 10.0]
    assert kl_k3(lp, torch.zeros(3))[0].item() == pytest.approx(math.exp(3) - 4, rel=1e-6)
    (grad,) = torch.autograd.grad(v.sum(), lp)
    assert grad.tolist() == [0.0, 0.0, 0.0]  # the clamp engaged: no pull back
    lp2 = torch.tensor([-1000.0], requires_grad=True)
    (g3,) = torch.autograd.grad(kl_k3(lp2, torch.zeros(1)).sum(), lp2)
    assert not torch.isfinite(g3).all()  # unclamped k3 overflows there


PLUS = [name for name in KL_ESTIMATORS if name.endswith("+")]


def test_the_plus_variants_registered():
    assert set(PLUS) == {"k1+", "k3+", "low_var_kl+"}
    assert {"k1", "k2", "k3", "low_var_kl"} <= set(KL_ESTIMATORS)


@pytest.mark.parametrize("name", PLUS)
def test_plus_variant_value_is_the_estimator_and_gradient_is_k2s(name):
    g = torch.Generator().manual_seed(3)
    logp0 = torch.randn(50, generator=g, dtype=torch.float64) * 2
    ref = torch.randn(50, generator=g, dtype=torch.float64) * 2
    ref[:3] = logp0[:3] + torch.tensor([4.0, -15.0, 25.0], dtype=torch.float64)  # low_var_kl's clamps engage
    base = KL_ESTIMATORS[name[:-1]]
    lp = logp0.clone().requires_grad_(True)
    value = KL_ESTIMATORS[name](lp, ref)
    assert torch.equal(value.detach(), base(logp0, ref))  # exactly the named estimator's value
    (grad,) = torch.autograd.grad(value.sum(), lp)
    lp2 = logp0.clone().requires_grad_(True)
    (grad_k2,) = torch.autograd.grad(kl_k2(lp2, ref).sum(), lp2)
    assert torch.allclose(grad, grad_k2, atol=1e-12)
    assert torch.allclose(grad, logp0 - ref, atol=1e-12)  # by hand: d/dlogp (logp - ref)^2 / 2
    lp3 = logp0.clone().requires_grad_(True)
    (grad_base,) = torch.autograd.grad(base(lp3, ref).sum(), lp3)
    assert not torch.allclose(grad, grad_base)  # the variant changes the gradient, not the value


def test_kl_penalty_takes_every_registered_estimator():
    from harness.losses import KLTerm, kl_penalty

    logp, ref, mask = torch.zeros(2, 3), torch.full((2, 3), math.log(2.0)), torch.ones(2, 3)
    for name in KL_ESTIMATORS:
        loss, _ = kl_penalty(logp, ref, mask, KLTerm(name))
        assert loss.item() == pytest.approx(KL_ESTIMATORS[name](logp, ref).mean().item())
