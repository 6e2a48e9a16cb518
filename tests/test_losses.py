"""C7 clipped-objective regions by autograd, loss aggregation and the value loss, by hand."""
import pytest
import torch

from harness.losses import (
    KLTerm, adaptive_kl_beta, aggregate, clipped_surrogate_loss, entropy_bonus, explained_variance,
    get_policy_loss, kl_penalty, pg_loss, value_loss, whitening_plan,
)

from .loss_helpers import call_loss

EPS = 0.2


def grad_at(ratio: float, adv: float, clip_eps=EPS):
    logp = torch.tensor([[torch.log(torch.tensor(ratio)).item()]], requires_grad=True)
    old = torch.zeros(1, 1)
    loss, m = call_loss(clipped_surrogate_loss, logp, old, torch.tensor([[adv]]), torch.ones(1, 1), clip_eps=clip_eps)
    loss.backward()
    return logp.grad.item(), loss.item(), {k: float(v) for k, v in m.items()}


@pytest.mark.claim("C7")
def test_c7_positive_advantage_above_band_has_zero_gradient():
    g, loss, m = grad_at(1.5, 2.0)
    assert g == 0.0 and loss == pytest.approx(-1.2 * 2.0) and m["clip_frac"] == 1.0


@pytest.mark.claim("C7")
def test_c7_negative_advantage_below_band_has_zero_gradient():
    g, loss, m = grad_at(0.5, -1.0)
    assert g == 0.0 and loss == pytest.approx(0.8) and m["clip_frac"] == 1.0


@pytest.mark.claim("C7")
def test_c7_negative_advantage_above_band_is_not_cut_off():
    g, loss, m = grad_at(1.5, -1.0)
    # loss = -(r * A) = 1.5 ; d loss / d logp = -A * r = 1.5
    assert g == pytest.approx(1.5) and loss == pytest.approx(1.5) and m["clip_frac"] == 0.0


@pytest.mark.claim("C7")
@pytest.mark.parametrize("ratio,adv", [(1.1, 2.0), (0.9, -1.0), (1.0, 3.0), (0.85, 0.5)])
def test_c7_inside_band_is_unclipped_gradient(ratio, adv):
    g, _, _ = grad_at(ratio, adv)
    assert g == pytest.approx(-adv * ratio)  # d(-r A)/d logp = -A r


@pytest.mark.claim("C7")
def test_c7_clipped_objective_is_lower_bound_everywhere():
    ratios = torch.linspace(0.01, 3.0, 301)
    advs = torch.linspace(-3, 3, 61)
    r, a = torch.meshgrid(ratios, advs, indexing="ij")
    mask = torch.ones_like(r)
    for i in range(r.shape[0]):
        for j in range(0, r.shape[1], 6):
            lr = r[i:i + 1, j:j + 1].log()
            clipped, _ = call_loss(clipped_surrogate_loss, lr, torch.zeros(1, 1), a[i:i + 1, j:j + 1], mask[:1, :1])
            unclipped, _ = call_loss(clipped_surrogate_loss, lr, torch.zeros(1, 1), a[i:i + 1, j:j + 1], mask[:1, :1], clip_eps=None)
            assert -clipped.item() <= -unclipped.item() + 1e-6


def test_asymmetric_clip_high():
    _, loss, m = grad_at(1.25, 1.0)  # symmetric 0.2: capped at 1.2
    assert loss == pytest.approx(-1.2)
    logp = torch.tensor([[torch.log(torch.tensor(1.25)).item()]], requires_grad=True)
    loss, m = call_loss(clipped_surrogate_loss, logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                     clip_eps=0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and float(m["clip_frac"]) == 0.0


def test_pg_loss_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    loss, m = call_loss(pg_loss, logp, logp.detach(), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-((-1.0 * 2.0) + (-2.0 * -1.0)) / 2)
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, 0.5]]
    assert float(m["approx_kl"]) == 0.0 and float(m["ratio_mean"]) == 1.0
    assert get_policy_loss("pg").fn is pg_loss
    with pytest.raises(ValueError, match="update must be one of"):
        get_policy_loss("trpo")


def test_approx_kl_metric_by_hand():
    # one token with ratio 2: k3 = 2 - 1 - log 2
    logp = torch.tensor([[torch.log(torch.tensor(2.0)).item()]])
    _, m = call_loss(clipped_surrogate_loss, logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert float(m["approx_kl"]) == pytest.approx(1 - torch.log(torch.tensor(2.0)).item(), abs=1e-6)
    assert float(m["ratio_max"]) == pytest.approx(2.0)


# Two sequences (columns): lengths 1 and 3 in T = 4.
X = torch.tensor([[4.0, 1.0], [9.0, 2.0], [9.0, 3.0], [9.0, 9.0]])
M = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])


def test_aggregation_modes_by_hand():
    assert aggregate(X, M, "token_mean").item() == pytest.approx((4 + 1 + 2 + 3) / 4)
    assert aggregate(X, M, "seq_mean_token_mean").item() == pytest.approx((4 / 1 + 6 / 3) / 2)
    assert aggregate(X, M, "seq_mean_token_sum_norm").item() == pytest.approx((4 / 4 + 6 / 4) / 2)
    assert aggregate(X, M, "seq_mean_token_sum_norm", norm_len=10).item() == pytest.approx((0.4 + 0.6) / 2)
    with pytest.raises(ValueError, match="loss_agg must be one of"):
        aggregate(X, M, "sum")


def test_value_loss_and_clipping_by_hand():
    v = torch.tensor([[3.0]])
    ret = torch.tensor([[1.0]])
    loss, _ = value_loss(v, ret, torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.5 * 4.0)
    # old value 1.5, clip 0.5 -> clipped prediction 2.0 ; max((3-1)^2, (2-1)^2) = 4
    loss, _ = value_loss(v, ret, torch.ones(1, 1), old_values=torch.tensor([[1.5]]), clip_eps=0.5)
    assert loss.item() == pytest.approx(2.0)
    # prediction moved toward target past the clip: v=0.9 from old 2.0 -> clipped 1.5: max(.01, .25)
    loss, _ = value_loss(torch.tensor([[0.9]]), ret, torch.ones(1, 1), old_values=torch.tensor([[2.0]]), clip_eps=0.5)
    assert loss.item() == pytest.approx(0.5 * 0.25)


def test_entropy_kl_and_adaptive_beta():
    loss, m = entropy_bonus(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2))
    assert loss.item() == -2.0 and float(m["entropy"]) == 2.0
    loss, m = kl_penalty(torch.zeros(1, 1), torch.tensor([[torch.log(torch.tensor(2.0)).item()]]), torch.ones(1, 1), KLTerm("k1"))
    assert loss.item() == pytest.approx(-0.6931471805599453, rel=1e-6)
    with pytest.raises(ValueError, match="kl.estimator"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), KLTerm("k4"))
    assert adaptive_kl_beta(1.0, 0.001, 0.01) == 0.5
    assert adaptive_kl_beta(1.0, 0.1, 0.01) == 2.0
    assert adaptive_kl_beta(1.0, 0.01, 0.01) == 1.0


def test_explained_variance_by_hand():
    ret = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(ret, ret) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), ret) == pytest.approx(0.0)
    # residual var of (0, 0, 0, 2) is .75; var of ret is 1.25 -> 1 - .6 = .4
    assert explained_variance(torch.tensor([1.0, 2.0, 3.0, 2.0]), ret) == pytest.approx(0.4)


def test_population_dim_keeps_members_apart():
    """A leading population dim gives one loss per member, equal to each member's own loss."""
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, 2, generator=gen)
    old = torch.randn(3, 5, 2, generator=gen)
    adv = torch.randn(3, 5, 2, generator=gen)
    mask = (torch.rand(3, 5, 2, generator=gen) > 0.3).float()
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        batched, m = call_loss(clipped_surrogate_loss, logp, old, adv, mask, agg=agg)
        assert batched.shape == (3,)
        for p in range(3):
            single, ms = call_loss(clipped_surrogate_loss, logp[p], old[p], adv[p], mask[p], agg=agg)
            assert batched[p].item() == pytest.approx(single.item(), abs=1e-6)
            assert float(m["clip_frac"][p]) == pytest.approx(float(ms["clip_frac"]))
            assert float(m["ratio_max"][p]) == pytest.approx(float(ms["ratio_max"]))


@pytest.mark.parametrize("normalize, minibatches, expected", [
    ("none", 1, (False, False)), ("none", 4, (False, False)),
    ("batch", 1, (True, False)), ("batch", 4, (True, False)),
    ("minibatch", 1, (True, False)),  # one minibatch: its whitening is the batch's, done once
    ("minibatch", 4, (False, True)),
])
def test_whitening_plan_by_hand(normalize, minibatches, expected):
    """(whiten the whole batch once, whiten each minibatch): the rule the update step and the probes share."""
    assert whitening_plan(normalize, minibatches) == expected


def test_check_choice_names_the_field_and_the_choices():
    from harness.config import check_choice

    check_choice("device", "cpu", ("auto", "cpu", "cuda"))  # allowed: no error
    with pytest.raises(ValueError) as err:
        check_choice("device", "tpu", ("auto", "cpu", "cuda"))
    assert str(err.value) == "device must be one of ['auto', 'cpu', 'cuda'], got 'tpu'"
