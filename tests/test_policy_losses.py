"""The policy losses of issue 14 (dual_clip, gspo, cispo, gmpo, sapo) and TRL's delta cap,
against re-derivations written here from the papers' formulas (plain per-sequence loops, not the
harness's helpers), hand-worked cases, population dims and the config knobs."""
import math

import pytest
import torch

from harness.plan import RunPlan
from harness.losses import (POLICY_LOSSES, ClipSettings, DualClipSettings, PPOClipSettings, SapoSettings, clipped_surrogate_loss, cispo_loss, dual_clip_loss,
                            get_policy_loss, gmpo_loss, gspo_loss, sapo_loss, sequence_mean)

from .control_helpers import make_cfg
from .loss_helpers import call_loss

NEW = ("dual_clip", "gspo", "cispo", "gmpo", "sapo")
AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
EPS, EPS_HIGH, C, TAU_POS, TAU_NEG = 0.2, 0.28, 3.0, 1.0, 1.05
DT = torch.float64


# ----------------------------------------------------------------------- independent references
def columns(mask):
    """[(b, [t, ...]), ...]: each column's unmasked steps (a column is one sequence)."""
    return [(b, [t for t in range(mask.shape[0]) if mask[t, b] > 0]) for b in range(mask.shape[1])]


def reduce(per_token, mask, agg, norm_len=None):
    """The aggregation modes from their definitions, by loops over [T, B] columns."""
    seqs = [(b, ts) for b, ts in columns(mask) if ts]
    if agg == "token_mean":
        n = sum(len(ts) for _, ts in seqs)
        return sum(per_token[t, b] for b, ts in seqs for t in ts) / n
    length = norm_len if norm_len is not None else mask.shape[0]
    total = 0.0
    for b, ts in seqs:
        s = sum(per_token[t, b] for t in ts)
        total = total + (s / len(ts) if agg == "seq_mean_token_mean" else s / length)
    return total / len(seqs)


def ref_dual_clip(lp, old, adv, mask, agg):
    """Ye et al. 2020 eq. 5, token by token."""
    out = {}
    for t in range(lp.shape[0]):
        for b in range(lp.shape[1]):
            r = torch.exp(lp[t, b] - old[t, b])
            a = adv[t, b]
            ppo = torch.minimum(r * a, torch.clamp(r, 1 - EPS, 1 + EPS_HIGH) * a)
            out[t, b] = torch.maximum(ppo, C * a) if a < 0 else ppo
    return -reduce(out, mask, agg)


def ref_gspo(lp, old, adv, mask, agg):
    """GSPO-token (arXiv:2507.18071 eq. for s_{i,t}): value s_i, gradient s_i * grad log pi_t."""
    out = {}
    for b, ts in columns(mask):
        if not ts:
            continue
        s_i = torch.exp(sum(lp[t, b] - old[t, b] for t in ts) / len(ts)).detach()
        for t in ts:
            s = s_i * torch.exp(lp[t, b] - lp[t, b].detach())
            a = adv[t, b]
            out[t, b] = torch.minimum(s * a, torch.clamp(s, 1 - EPS, 1 + EPS_HIGH) * a)
    return -reduce(out, mask, agg)


def ref_cispo(lp, old, adv, mask, agg):
    """MiniMax-M1 eq. 4: sg(clip(r)) * A * log pi."""
    out = {}
    for t in range(lp.shape[0]):
        for b in range(lp.shape[1]):
            w = torch.clamp(torch.exp(lp[t, b] - old[t, b]), 1 - EPS, 1 + EPS_HIGH).detach()
            out[t, b] = w * adv[t, b] * lp[t, b]
    return -reduce(out, mask, agg)


def ref_gmpo(lp, old, adv, mask, agg):
    """GMPO (arXiv:2507.20673) as verl's geo_mean: per sequence the mean advantage times the
    geometric mean of the token ratios, each clipped in log space on its advantage's side."""
    out = {}
    for b, ts in columns(mask):
        if not ts:
            continue
        logs = []
        for t in ts:
            x = lp[t, b] - old[t, b]
            a = adv[t, b]
            if a > 0:
                logs.append(torch.minimum(x, torch.clamp(x, -EPS, EPS_HIGH)))
            elif a < 0:
                logs.append(torch.maximum(x, torch.clamp(x, -EPS, EPS_HIGH)))
            else:
                logs.append(0.0 * x)
        j = sum(adv[t, b] for t in ts) / len(ts) * torch.exp(sum(logs) / len(ts))
        for t in ts:
            out[t, b] = j
    return -reduce(out, mask, agg)


def ref_sapo(lp, old, adv, mask, agg):
    """SAPO: sigmoid(tau (r - 1)) * 4 / tau * A, tau_pos for A > 0, tau_neg otherwise."""
    out = {}
    for t in range(lp.shape[0]):
        for b in range(lp.shape[1]):
            r = torch.exp(lp[t, b] - old[t, b])
            tau = TAU_POS if adv[t, b] > 0 else TAU_NEG
            out[t, b] = torch.sigmoid(tau * (r - 1)) * 4 / tau * adv[t, b]
    return -reduce(out, mask, agg)


def ref_pg(lp, old, adv, mask, agg):
    """REINFORCE: log pi * A, token by token."""
    return -reduce({(t, b): lp[t, b] * adv[t, b] for t in range(lp.shape[0]) for b in range(lp.shape[1])}, mask, agg)


def ref_clip(lp, old, adv, mask, agg):
    """PPO (arXiv:1707.06347 eq. 7): min(r A, clip(r, 1 - eps, 1 + eps_high) A), token by token."""
    out = {}
    for t in range(lp.shape[0]):
        for b in range(lp.shape[1]):
            r = torch.exp(lp[t, b] - old[t, b])
            out[t, b] = torch.minimum(r * adv[t, b], torch.clamp(r, 1 - EPS, 1 + EPS_HIGH) * adv[t, b])
    return -reduce(out, mask, agg)


REFS = {"pg": ref_pg, "clip": ref_clip, "dual_clip": ref_dual_clip, "gspo": ref_gspo, "cispo": ref_cispo, "gmpo": ref_gmpo, "sapo": ref_sapo}
KNOBS = dict(clip_eps=EPS, clip_eps_high=EPS_HIGH, clip_ratio_c=C, sapo_tau_pos=TAU_POS, sapo_tau_neg=TAU_NEG)


def batch(seed, T=5, B=4, spread=0.35):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(T, B, generator=g, dtype=DT) * 3 - 0.1
    lp = old + spread * torch.randn(T, B, generator=g, dtype=DT)
    adv = torch.randn(T, B, generator=g, dtype=DT)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T).unsqueeze(1) < lengths.unsqueeze(0)).to(DT)
    return lp, old, adv, mask


def loss_and_grad(fn, lp, *args, **kw):
    x = lp.clone().requires_grad_(True)
    loss, metrics = call_loss(fn, x, *args, **kw)
    loss.sum().backward()
    return loss.detach(), x.grad, metrics


# ------------------------------------------------------------------ every loss vs its re-derivation
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_loss_and_gradient_match_the_independent_derivation(name, agg):
    """Every registered loss (a plugin's too) must have its reference formula in REFS."""
    assert name in REFS, f"policy loss {name!r} has no independent reference formula in REFS"
    for seed in range(4):
        lp, old, adv, mask = batch(seed)
        loss, grad, _ = loss_and_grad(get_policy_loss(name), lp, old, adv, mask, agg=agg, **KNOBS)
        x = lp.clone().requires_grad_(True)
        ref = REFS[name](x, old, adv, mask, agg)
        ref.backward()
        assert loss.item() == pytest.approx(ref.item(), rel=1e-9, abs=1e-12), (name, agg, seed)
        assert torch.allclose(grad, x.grad, rtol=1e-9, atol=1e-12), (name, agg, seed)
        assert (grad[mask == 0] == 0).all()  # padding never gets a gradient


def test_the_random_cases_reach_every_region():
    """The batches above are not all inside the clip band: some tokens are clipped either side."""
    r = []
    for seed in range(4):
        lp, old, adv, mask = batch(seed)
        r.append((lp - old).exp()[mask > 0])
    r = torch.cat(r)
    assert (r > 1 + EPS_HIGH).any() and (r < 1 - EPS).any() and ((r > 1 - EPS) & (r < 1 + EPS_HIGH)).any()


def test_every_loss_reports_the_clip_losss_metrics_and_honours_with_metrics():
    lp, old, adv, mask = batch(0)
    _, clip_m = call_loss(clipped_surrogate_loss, lp, old, adv, mask)
    for name in POLICY_LOSSES:
        loss, m = call_loss(get_policy_loss(name), lp, old, adv, mask)
        assert set(m) == set(clip_m) == {"approx_kl", "ratio_mean", "ratio_max", "clip_frac", "policy_loss"}, name
        for k in ("approx_kl", "ratio_mean", "ratio_max"):  # token ratios: one meaning for every loss
            assert float(m[k]) == pytest.approx(float(clip_m[k])), (name, k)
        assert 0.0 <= float(m["clip_frac"]) <= 1.0
        _, m = call_loss(get_policy_loss(name), lp, old, adv, mask, with_metrics=False)
        assert set(m) == {"policy_loss"}, name


# ----------------------------------------------------------------------------------- dual clip
def one(fn, ratio, adv, **kw):
    logp = torch.tensor([[math.log(ratio)]], dtype=DT, requires_grad=True)
    loss, m = call_loss(fn, logp, torch.zeros(1, 1, dtype=DT), torch.tensor([[adv]], dtype=DT),
                        torch.ones(1, 1, dtype=DT), **kw)
    loss.backward()
    return loss.item(), logp.grad.item(), {k: float(v) for k, v in m.items()}


def test_dual_clip_by_hand():
    # A = -1, r = 5 > c = 3: PPO's min(-5, -1.2) = -5 is lifted to c A = -3: loss 3, no gradient
    loss, g, m = one(dual_clip_loss, 5.0, -1.0)
    assert loss == pytest.approx(3.0) and g == 0.0 and m["clip_frac"] == 1.0
    # A = -1, r = 2 < c: min(-2, -1.2) = -2, unbounded: loss 2, d(-rA)/dlogp = -A r = 2
    loss, g, m = one(dual_clip_loss, 2.0, -1.0)
    assert loss == pytest.approx(2.0) and g == pytest.approx(2.0) and m["clip_frac"] == 0.0
    # PPO's own regions still zero the gradient
    assert one(dual_clip_loss, 0.5, -1.0)[1] == 0.0 and one(dual_clip_loss, 1.5, 2.0)[1] == 0.0


def test_dual_clip_equals_clip_when_every_advantage_is_positive():
    for seed in range(3):
        lp, old, adv, mask = batch(seed, spread=1.0)
        adv = adv.abs() + 0.01
        for agg in AGGS:
            a = loss_and_grad(dual_clip_loss, lp, old, adv, mask, agg=agg, clip_eps=EPS, clip_eps_high=EPS_HIGH)
            b = loss_and_grad(clipped_surrogate_loss, lp, old, adv, mask, agg=agg, clip_eps=EPS,
                              clip_eps_high=EPS_HIGH)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            assert float(a[2]["clip_frac"]) == float(b[2]["clip_frac"])


def test_dual_clip_bounds_negative_advantages_by_c_times_a_for_huge_ratios():
    adv = -torch.tensor([[0.5, 2.0, 1.0]], dtype=DT)
    for log_r in (5.0, 50.0, 500.0):  # r = e^500 overflows: still a finite loss and a zero gradient
        lp = torch.full((1, 3), log_r, dtype=DT)
        for c in (1.5, 3.0, 10.0):
            loss, grad, m = loss_and_grad(dual_clip_loss, lp, torch.zeros(1, 3, dtype=DT), adv, torch.ones(1, 3),
                                          clip_ratio_c=c)
            assert loss.item() == pytest.approx(-(c * adv).mean().item())  # objective = c A exactly
            assert torch.equal(grad, torch.zeros_like(grad)) and float(m["clip_frac"]) == 1.0
            plain, _ = call_loss(clipped_surrogate_loss, lp, torch.zeros(1, 3, dtype=DT), adv, torch.ones(1, 3))
            assert plain.item() > loss.item()  # PPO alone is not bounded there
    with pytest.raises(ValueError, match="clip_ratio_c must be a finite number > 1"):
        call_loss(dual_clip_loss, lp, lp, adv, torch.ones(1, 3), clip_ratio_c=1.0)


# ---------------------------------------------------------------------------------------- cispo
def test_cispo_keeps_the_gradient_of_tokens_that_clip_zeroes():
    # A = 2, r = 1.5 past 1 + eps: PPO's gradient is 0, CISPO's is -sg(1.2) * A = -2.4
    loss, g, m = one(cispo_loss, 1.5, 2.0)
    assert g == pytest.approx(-1.2 * 2.0) and loss == pytest.approx(-1.2 * 2.0 * math.log(1.5))
    assert m["clip_frac"] == 1.0  # the weight is clipped (the gradient kept)
    assert one(clipped_surrogate_loss, 1.5, 2.0)[1] == 0.0
    # A = -1, r = 0.5 below 1 - eps: PPO's gradient is 0, CISPO's -0.8 * A = 0.8
    assert one(cispo_loss, 0.5, -1.0)[1] == pytest.approx(0.8) and one(clipped_surrogate_loss, 0.5, -1.0)[1] == 0.0
    # in the band CISPO's gradient is the surrogate's, -A r
    assert one(cispo_loss, 1.1, 3.0)[1] == pytest.approx(-3.0 * 1.1)
    # over a random batch: every token with A != 0 keeps a gradient, where clip zeroes some
    lp, old, adv, mask = batch(1, spread=1.0)
    _, g_cispo, _ = loss_and_grad(cispo_loss, lp, old, adv, mask)
    _, g_clip, _ = loss_and_grad(clipped_surrogate_loss, lp, old, adv, mask)
    live = mask > 0
    assert (g_cispo[live] != 0).all() and (g_clip[live] == 0).any()


def test_cispo_with_trls_absolute_cap():
    """TRL's cispo weight min(r, epsilon_high) is clip_eps >= 1 and clip_eps_high = epsilon_high - 1."""
    g = one(cispo_loss, 7.0, 1.0, clip_eps=1.0, clip_eps_high=4.0)[1]
    assert g == pytest.approx(-min(7.0, 5.0))
    assert one(cispo_loss, 0.01, 1.0, clip_eps=1.0, clip_eps_high=4.0)[1] == pytest.approx(-0.01)


# ----------------------------------------------------------------------------------------- gspo
def test_gspo_by_hand_two_tokens():
    lp = torch.tensor([[0.1], [0.3]], dtype=DT)  # old logp 0: s = exp(0.2) = 1.2214 > 1.2
    old, mask = torch.zeros(2, 1, dtype=DT), torch.ones(2, 1, dtype=DT)
    s = math.exp(0.2)
    loss, g, m = loss_and_grad(gspo_loss, lp, old, torch.ones(2, 1, dtype=DT), mask)
    assert loss.item() == pytest.approx(-1.2) and torch.equal(g, torch.zeros_like(g)) and float(m["clip_frac"]) == 1.0
    loss, g, m = loss_and_grad(gspo_loss, lp, old, -torch.ones(2, 1, dtype=DT), mask)
    # min(-s, -1.2) = -s; each token's gradient of -(mean_t s_it A) is -A s / 2
    assert loss.item() == pytest.approx(s) and torch.allclose(g, torch.full((2, 1), s / 2, dtype=DT))
    assert float(m["clip_frac"]) == 0.0
    # token-level clip would treat the tokens apart: ratio e^0.1 is inside the band
    _, g_clip, _ = loss_and_grad(clipped_surrogate_loss, lp, old, torch.ones(2, 1, dtype=DT), mask)
    assert g_clip[0, 0] != 0 and g_clip[1, 0] == 0


def test_gspo_equals_token_clip_when_every_sequence_has_one_token():
    for seed in range(3):
        lp, old, adv, _ = batch(seed, T=1, B=9, spread=0.5)
        mask = torch.ones_like(lp)
        for agg in AGGS:
            for delta in (None, 1.25):
                kw = dict(agg=agg, clip_eps=EPS, clip_eps_high=EPS_HIGH, delta=delta)
                a = loss_and_grad(gspo_loss, lp, old, adv, mask, **kw)
                b = loss_and_grad(clipped_surrogate_loss, lp, old, adv, mask, **kw)
                assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])
                assert float(a[2]["clip_frac"]) == float(b[2]["clip_frac"])
        # the control layout: one step per column, each its own sequence by seq_id
        seq = torch.arange(9).view(1, 9)
        a = loss_and_grad(gspo_loss, lp, old, adv, mask, seq_id=seq)
        b = loss_and_grad(clipped_surrogate_loss, lp, old, adv, mask, seq_id=seq)
        assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])


def test_gspo_equals_trls_sequence_level_ratio_when_the_advantage_is_constant_per_sequence():
    """TRL (importance_sampling_level="sequence") differentiates through s_i itself; with one
    advantage per sequence that is the same loss and gradient (GSPO paper, GSPO-token)."""
    lp, old, adv, mask = batch(3, spread=0.3)
    adv = adv[:1].expand_as(adv).clone()
    for agg in AGGS:
        loss, grad, _ = loss_and_grad(gspo_loss, lp, old, adv, mask, agg=agg, clip_eps=0.05)
        x = lp.clone().requires_grad_(True)
        out = {}
        for b, ts in columns(mask):
            s_i = torch.exp(sum(x[t, b] - old[t, b] for t in ts) / len(ts))  # no stop-gradient
            for t in ts:
                out[t, b] = torch.minimum(s_i * adv[t, b], torch.clamp(s_i, 0.95, 1.05) * adv[t, b])
        ref = -reduce(out, mask, agg)
        ref.backward()
        assert loss.item() == pytest.approx(ref.item()) and torch.allclose(grad, x.grad)


def to_steps(x, mask):
    """[T, B] columns -> the control layout [1, N] of their unmasked steps, and each step's seq_id."""
    keep = mask.T > 0
    seq = torch.arange(mask.shape[1]).unsqueeze(1).expand(-1, mask.shape[0])[keep]
    return x.T[keep].view(1, -1), seq.view(1, -1)


@pytest.mark.parametrize("name", ["gspo", "gmpo"])
@pytest.mark.parametrize("agg", AGGS[:2])
def test_sequence_losses_by_seq_id_equal_the_column_layout(name, agg):
    """Control minibatches are single steps ([1, N]) whose seq_id names the episode: the sequence
    ratio is then over the entries sharing an id, the same numbers as one column per sequence."""
    fn = get_policy_loss(name)
    lp, old, adv, mask = batch(5, T=6, B=4, spread=0.5)
    col_loss, col_grad, _ = loss_and_grad(fn, lp, old, adv, mask, agg=agg)
    lp_s, seq = to_steps(lp, mask)
    old_s, adv_s = to_steps(old, mask)[0], to_steps(adv, mask)[0]
    perm = torch.randperm(lp_s.shape[1], generator=torch.Generator().manual_seed(0))  # order does not matter
    step_loss, step_grad, _ = loss_and_grad(fn, lp_s[:, perm], old_s[:, perm], adv_s[:, perm],
                                            torch.ones_like(lp_s), agg=agg, seq_id=seq[:, perm])
    assert step_loss.item() == pytest.approx(col_loss.item(), rel=1e-12)
    assert torch.allclose(step_grad[:, perm.argsort()], to_steps(col_grad, mask)[0], rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------------------- gmpo
def test_gmpo_by_hand_two_tokens():
    lp = torch.tensor([[0.3], [-0.1]], dtype=DT)
    old, mask = torch.zeros(2, 1, dtype=DT), torch.ones(2, 1, dtype=DT)
    # A = 1: log ratios [min(0.3, 0.2), -0.1] = [0.2, -0.1]; J = exp(0.05); token 0 clipped
    loss, g, m = loss_and_grad(gmpo_loss, lp, old, torch.ones(2, 1, dtype=DT), mask, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-math.exp(0.05))
    assert g[0, 0] == 0 and g[1, 0].item() == pytest.approx(-math.exp(0.05) / 2)
    assert float(m["clip_frac"]) == 0.5
    # A = -2: [max(0.3, 0.2), max(-0.1, -0.1)] = [0.3, -0.1]: nothing clipped; J = -2 exp(0.1)
    loss, g, m = loss_and_grad(gmpo_loss, lp, old, -2 * torch.ones(2, 1, dtype=DT), mask, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(2 * math.exp(0.1))
    assert torch.allclose(g, torch.full((2, 1), math.exp(0.1), dtype=DT))  # d(2 e^{mean})/dx_t = e^{mean}
    assert float(m["clip_frac"]) == 0.0


def test_gmpo_is_clip_at_one_token_per_sequence_in_log_space():
    """One token: J = A exp(min(log r, clip(log r))) for A>0, i.e. PPO with the band (e^-eps, e^eps)."""
    for ratio, adv in ((1.5, 1.0), (1.1, 1.0), (0.5, -1.0), (0.9, -1.0), (3.0, -1.0)):
        loss, g, _ = one(gmpo_loss, ratio, adv)
        ref, g_ref, _ = one(clipped_surrogate_loss, ratio, adv, clip_eps=1 - math.exp(-0.2),
                            clip_eps_high=math.exp(0.2) - 1)
        assert loss == pytest.approx(ref) and g == pytest.approx(g_ref)


# ----------------------------------------------------------------------------------------- sapo
def test_sapo_by_hand():
    # r = 1: gate sigmoid(0) * 4 / tau = 2 / tau, its gradient 4 * 1/4 * r = 1: the plain surrogate's
    loss, g, m = one(sapo_loss, 1.0, 1.0)
    assert loss == pytest.approx(-2.0 / TAU_POS) and g == pytest.approx(-1.0) and m["clip_frac"] == 0.0
    loss, g, _ = one(sapo_loss, 1.0, -1.0)
    assert loss == pytest.approx(2.0 / TAU_NEG) and g == pytest.approx(1.0)
    # r = 2, A = 1, tau = 1: sigma(1) * 4; gradient -4 sigma(1)(1 - sigma(1)) * 2
    s = 1 / (1 + math.exp(-1.0))
    loss, g, m = one(sapo_loss, 2.0, 1.0)
    assert loss == pytest.approx(-4 * s) and g == pytest.approx(-4 * s * (1 - s) * 2)
    assert m["clip_frac"] == pytest.approx(1 - 4 * s * (1 - s))
    # the gate never zeroes a gradient, it shrinks it; a larger tau shrinks it faster
    g_sharp = one(sapo_loss, 2.0, 1.0, sapo_tau_pos=8.0)[1]
    assert 0 > g_sharp > g
    with pytest.raises(ValueError, match="sapo_tau_neg must be a finite number > 0"):
        one(sapo_loss, 1.0, 1.0, sapo_tau_neg=0.0)


# ---------------------------------------------------------------------------------- delta (TRL)
def test_delta_caps_the_unclipped_ratio_as_trl_does():
    # A = -1, r = 5, delta = 2: min(min(5, 2) * -1, 1.2 * -1) = -2: loss 2, no gradient
    loss, g, m = one(clipped_surrogate_loss, 5.0, -1.0, delta=2.0)
    assert loss == pytest.approx(2.0) and g == 0.0 and m["clip_frac"] == 1.0
    assert one(clipped_surrogate_loss, 5.0, -1.0)[0] == pytest.approx(5.0)  # without it: -rA
    # A = -1, r = 1.8 < delta: unchanged (-rA, gradient -A r)
    loss, g, m = one(clipped_surrogate_loss, 1.8, -1.0, delta=2.0)
    assert loss == pytest.approx(1.8) and g == pytest.approx(1.8) and m["clip_frac"] == 0.0
    # random batch against TRL's coef_1 = clamp(r, max=delta); -min(coef_1 A, coef_2 A)
    lp, old, adv, mask = batch(2, spread=1.0)
    loss, grad, _ = loss_and_grad(clipped_surrogate_loss, lp, old, adv, mask, clip_eps=EPS, clip_eps_high=EPS_HIGH,
                                  delta=1.5)
    x = lp.clone().requires_grad_(True)
    r = torch.exp(x - old)
    per = -torch.minimum(torch.clamp(r, max=1.5) * adv, torch.clamp(r, 1 - EPS, 1 + EPS_HIGH) * adv)
    ref = (per * mask).sum() / mask.sum()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item()) and torch.allclose(grad, x.grad * mask)


def test_delta_is_a_setting_of_clip_and_gspo_alone():
    assert [name for name, spec in POLICY_LOSSES.items() if "delta" in spec.knobs] == ["clip", "gspo"]
    lp, old, adv, mask = batch(0)
    for name in ("clip", "gspo"):
        call_loss(get_policy_loss(name), lp, old, adv, mask, delta=2.0)
    with pytest.raises(ValueError, match="delta must be a finite number > 1"):
        ClipSettings(delta=1.0)


# ----------------------------------------------------------------------------- population dims
@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_population_members_are_their_lone_losses(name):
    fn = get_policy_loss(name)
    members = [batch(s) for s in (0, 1, 2)]
    stacked = [torch.stack([m[i] for m in members]) for i in range(4)]
    for agg in AGGS:
        loss, grad, metrics = loss_and_grad(fn, stacked[0], *stacked[1:], agg=agg, **KNOBS)
        assert loss.shape == (3,) and all(v.shape == (3,) for v in metrics.values())
        for p, (lp, old, adv, mask) in enumerate(members):
            l1, g1, m1 = loss_and_grad(fn, lp, old, adv, mask, agg=agg, **KNOBS)
            assert loss[p].item() == pytest.approx(l1.item(), rel=1e-12, abs=1e-14)
            assert torch.allclose(grad[p], g1, rtol=1e-12, atol=1e-14)
            for k in m1:
                assert float(metrics[k][p]) == pytest.approx(float(m1[k]), rel=1e-12, abs=1e-14), (name, k)
    # with seq_id: each member's ids are its own (the same ids in two members are two sequences)
    lp_s, seq = to_steps(members[0][0], members[0][3])
    other = torch.randn(lp_s.shape, generator=torch.Generator().manual_seed(9), dtype=DT) * 0.3
    pop = torch.stack([lp_s, other])  # [P=2, 1, N]
    zeros, adv_s = torch.zeros_like(pop), torch.ones_like(pop)
    adv_s[1] = -1.0
    loss, grad, _ = loss_and_grad(fn, pop, zeros, adv_s, torch.ones_like(pop), seq_id=torch.stack([seq, seq]),
                                  agg="seq_mean_token_mean")
    assert loss.shape == (2,)
    for p in range(2):
        l1, g1, _ = loss_and_grad(fn, pop[p], zeros[p], adv_s[p], torch.ones_like(pop[p]), seq_id=seq,
                                  agg="seq_mean_token_mean")
        assert loss[p].item() == pytest.approx(l1.item()) and torch.allclose(grad[p], g1)


# ------------------------------------------------------------------------------------- config
def test_the_knobs_reach_the_update_settings_with_the_frameworks_defaults():
    from harness.train.update import UpdateSettings
    from harness.validation import validate

    cfg = make_cfg(["task=toy", "estimator=grpo"])
    assert (cfg.delta, cfg.clip_ratio_c, cfg.sapo_tau_pos, cfg.sapo_tau_neg) == (None, 3.0, 1.0, 1.05)
    for update, knobs, want in [("clip", ["delta=4", "clip_eps=0.1", "log_ratio_clamp=20"],
                                 PPOClipSettings(0.1, None, 4.0, 20.0)),
                                ("dual_clip", ["clip_ratio_c=2.5"], DualClipSettings(0.2, None, 2.5)),
                                ("sapo", ["sapo_tau_pos=2", "sapo_tau_neg=3"], SapoSettings(2.0, 3.0))]:
        cfg = make_cfg(["task=toy", "estimator=grpo", f"update={update}", *knobs])
        validate(cfg)
        s = UpdateSettings.from_plan(RunPlan.of(cfg), 3)
        assert s.loss_settings == want and s.policy_loss.fn is POLICY_LOSSES[update].fn


@pytest.mark.parametrize("overrides,message", [
    (["update=sapo", "delta=2.0"], "delta must be null with update=sapo"),
    (["update=dual_clip", "delta=2.0"], "delta must be null with update=dual_clip"),
    (["update=clip", "delta=1.0"], "delta must be a finite number > 1"),
    (["update=gspo", "delta=inf"], "delta must be a finite number > 1"),
    (["update=dual_clip", "clip_ratio_c=1.0"], "clip_ratio_c must be a finite number > 1"),
    (["update=dual_clip", "clip_ratio_c=nan"], "clip_ratio_c must be a finite number > 1"),
    (["update=sapo", "sapo_tau_pos=0"], "sapo_tau_pos must be a finite number > 0"),
    (["update=sapo", "sapo_tau_neg=-1"], "sapo_tau_neg must be a finite number > 0"),
    (["update=clip", "clip_ratio_c=2"], r"clip_ratio_c must be 3.0 with update=clip \(it applies to update=dual_clip\)"),
    (["update=pg", "sapo_tau_pos=2"], r"sapo_tau_pos must be 1.0 with update=pg \(it applies to update=sapo\)"),
    # the clip range is a knob of the clipping losses like any other: no second rule in the schema
    (["update=pg", "clip_eps=0.5"], r"clip_eps must be 0.2 with update=pg \(it applies to update=clip\|"),
    (["update=sapo", "clip_eps_high=0.3"], r"clip_eps_high must be null with update=sapo \(it applies to update="),
    (["update=clip", "clip_eps=0"], r"clip_eps must be a finite number > 0 or null \(no clipping\), got 0"),
    (["update=gmpo", "clip_eps_high=-0.1"], r"clip_eps_high must be a finite number > 0 or null"),
])
def test_bad_knobs_are_refused_by_name(overrides, message):
    from harness.validation import validate

    for task in (["task=toy", "estimator=grpo"], ["task=cartpole", "estimator=ppo_gae"]):
        with pytest.raises(ValueError, match=message):
            validate(make_cfg(task + overrides))


def test_the_knobs_at_their_defaults_keep_run_directory_hashes():
    from harness.io import config_hash

    base = make_cfg(["task=toy", "estimator=grpo"])
    same = make_cfg(["task=toy", "estimator=grpo", "clip_ratio_c=3.0", "sapo_tau_pos=1", "sapo_tau_neg=1.05",
                     "delta=null"])
    assert config_hash(base) == config_hash(same) == "80604a49ef"  # pinned in test_checkpoint.py before issue 14
    for knob in ("clip_ratio_c=2", "sapo_tau_pos=2", "sapo_tau_neg=2", "delta=2"):
        assert config_hash(make_cfg(["task=toy", "estimator=grpo", knob])) != config_hash(base), knob


# ----------------------------------------------------------------------------- claim C32 (exact)

def _grads_clip_and_cispo(seed: int):
    g = torch.Generator().manual_seed(seed)
    T, B = 5, 16
    old = -torch.rand(T, B, generator=g, dtype=torch.float64) - 0.1
    logp = old + 0.8 * torch.randn(T, B, generator=g, dtype=torch.float64)  # ratios ~0.1 to ~10
    adv = torch.randn(T, B, generator=g, dtype=torch.float64)
    mask = torch.ones(T, B, dtype=torch.float64)
    out = {}
    for name in ("clip", "cispo"):
        x = logp.clone().requires_grad_(True)
        loss, _ = call_loss(POLICY_LOSSES[name], x, old, adv, mask, clip_eps=0.2)
        (grad,) = torch.autograd.grad(loss, x)
        out[name] = grad
    return logp - old, adv, out


@pytest.mark.claim("C32")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_keeps_a_gradient_on_the_tokens_the_clip_drops(seed):
    """By hand: PPO's clip zeroes the gradient where A > 0 and r > 1.2, or A < 0 and r < 0.8;
    CISPO's gradient there is -clip(r) A / N (N tokens, token mean), never 0."""
    log_r, adv, grad = _grads_clip_and_cispo(seed)
    r = log_r.exp()
    dropped = ((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8))
    assert 0.1 < float(dropped.double().mean()) < 0.9  # the clip acts on a good share of the tokens
    assert (grad["clip"][dropped] == 0).all() and (grad["clip"][~dropped] != 0).all()
    n = adv.numel()
    torch.testing.assert_close(grad["cispo"][dropped], (-r.clamp(0.8, 1.2) * adv / n)[dropped])
    assert (grad["cispo"] != 0).all()


@pytest.mark.claim("C32")
@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_equals_the_clip_inside_the_band(seed):
    """Where the clip is not active, PPO's gradient -r A / N and CISPO's -sg(r) A / N are equal."""
    log_r, adv, grad = _grads_clip_and_cispo(seed)
    r = log_r.exp()
    inside = (r >= 0.8) & (r <= 1.2)
    assert inside.any()
    torch.testing.assert_close(grad["cispo"][inside], grad["clip"][inside])
    torch.testing.assert_close(grad["clip"][inside], (-r * adv / adv.numel())[inside])


# ----------------------------------------------------------------------------- claim C33 (exact)

def _ratio_variances(L: int, V: int = 3, seed: int = 0):
    """Exact variances, under y ~ pi_old, of the importance ratios of every response of length
    ``L`` over a ``V``-token vocabulary (all ``V**L`` enumerated), tokens i.i.d. with
    ``pi_old = softmax(z)`` and ``pi = softmax(z + d)`` (a policy one update away). Returns the
    token ratio's variance (over tokens), GSPO's sequence ratio's (:func:`sequence_mean` of the
    log-ratios, exponentiated, as ``gspo_loss`` forms it) and the plain product's."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64)
    log_old = torch.log_softmax(z, -1)
    log_new = torch.log_softmax(z + 0.5 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    seqs = torch.cartesian_prod(*[torch.arange(V)] * L).view(-1, L) if L > 1 else torch.arange(V).view(-1, 1)
    log_r = (log_new - log_old)[seqs].T  # [L, N] time-major, as the losses take it
    w = log_old[seqs].sum(-1).exp()  # P_old(y)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    mask = torch.ones_like(log_r)

    def var(x, weights):
        m = (weights * x).sum() / weights.sum()
        return float((weights * (x - m) ** 2).sum() / weights.sum())
    token = var(log_r.exp().flatten(), w.repeat(L))  # every token of every response, weighted by P_old(y)
    gspo = var(sequence_mean(log_r, mask)[0].exp(), w)
    product = var(log_r.sum(0).exp(), w)
    r = (log_new - log_old).exp()
    p = log_old.exp()
    return token, gspo, product, r, p


@pytest.mark.claim("C33")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_sequence_ratio_variance_falls_with_length_while_token_ratios_do_not(seed):
    """The token ratio's variance is the chi-square divergence sum_v pi^2 / pi_old - 1 at every
    length; GSPO's length-normalised ratio s = (prod_t r_t)^(1/L) has variance
    (E r^(2/L))^L - (E r^(1/L))^(2L) (i.i.d. tokens, by hand), equal to the token ratio's at L = 1
    and falling as L grows; the unnormalised product's, (1 + chi2)^L - 1, grows."""
    rows = {L: _ratio_variances(L, seed=seed) for L in (1, 2, 4, 8)}
    _, _, _, r, p = rows[1]
    chi2 = float((p * r * r).sum() - 1)
    gspo_by_hand = lambda L: float((p * r ** (2 / L)).sum() ** L - (p * r ** (1 / L)).sum() ** (2 * L))  # noqa: E731
    for L, (token, gspo, product, *_ ) in rows.items():
        assert token == pytest.approx(chi2, rel=1e-9)
        assert gspo == pytest.approx(gspo_by_hand(L), rel=1e-9)
        assert product == pytest.approx((1 + chi2) ** L - 1, rel=1e-9)
    assert rows[1][1] == pytest.approx(rows[1][0], rel=1e-9)
    g = [rows[L][1] for L in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(g, g[1:]))  # GSPO's falls with length
    assert g[-1] < 0.25 * g[0]
    prod = [rows[L][2] for L in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(prod, prod[1:]))  # the product's grows
