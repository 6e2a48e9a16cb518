"""GAE, n-step and reward-to-go against hand-worked numbers, identities and scalar loops."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.estimators import gae, n_step, reward_to_go


def col(*xs):
    return torch.tensor(xs, dtype=torch.float64).reshape(-1, 1)


# ----------------------------------------------------------------- C1: 002's worked example
# 3 tokens, reward 1 at the end, V = (0.5, 0.4, 0.8), V(terminal) = 0, gamma = 1.
C1 = dict(
    rewards=col(0.0, 0.0, 1.0),
    values=col(0.5, 0.4, 0.8),
    next_values=col(0.4, 0.8, 0.0),
    terminated=col(0, 0, 1),
    truncated=col(0, 0, 0),
)


@pytest.mark.claim("C1")
def test_c1_worked_example_lambda_1():
    adv, ret = gae(**C1, gamma=1.0, lam=1.0)
    assert adv.flatten().tolist() == pytest.approx([0.5, 0.6, 0.2])
    assert ret.flatten().tolist() == pytest.approx([1.0, 1.0, 1.0])


@pytest.mark.claim("C1")
def test_c1_worked_example_lambda_0_equals_deltas():
    adv, ret = gae(**C1, gamma=1.0, lam=0.0)
    assert adv.flatten().tolist() == pytest.approx([-0.1, 0.4, 0.2])  # the document's deltas
    assert ret.flatten().tolist() == pytest.approx([0.4, 0.8, 1.0])


def test_gae_hand_computed_with_discount_and_lambda():
    # gamma=0.5, lam=0.5, one episode truncated at t=1 (bootstrap 2.0), then one terminated.
    r = col(1.0, 1.0, 2.0)
    v = col(0.0, 1.0, 1.0)
    nv = col(1.0, 2.0, 5.0)
    te = col(0, 0, 1)
    tr = col(0, 1, 0)
    adv, _ = gae(r, v, nv, te, tr, gamma=0.5, lam=0.5)
    # deltas: 1 + .5*1 - 0 = 1.5 ; 1 + .5*2 - 1 = 1.0 ; 2 + 0 - 1 = 1.0
    # A2 = 1.0 ; A1 = 1.0 (trace cut by truncation) ; A0 = 1.5 + .25 * 1.0 = 1.75
    assert adv.flatten().tolist() == pytest.approx([1.75, 1.0, 1.0])


def test_n_step_hand_computed():
    r = col(1.0, 2.0, 3.0, 4.0)
    v = col(0.0, 0.0, 0.0, 0.0)
    nv = col(10.0, 20.0, 30.0, 40.0)
    zeros = col(0, 0, 0, 0)
    adv, ret = n_step(r, v, nv, zeros, zeros, gamma=0.5, n=2)
    # G0 = 1 + .5*2 + .25*V(s2)=20 -> 7 ; G1 = 2 + 1.5 + .25*30 = 11 ; G2 = 3 + 2 + .25*40 = 15
    # G3 = 4 + .5*40 = 24 (batch ends)
    assert ret.flatten().tolist() == pytest.approx([7.0, 11.0, 15.0, 24.0])
    term = col(0, 1, 0, 0)
    _, ret = n_step(r, v, nv, term, zeros, gamma=0.5, n=2)
    # termination at t=1: G0 = 1 + .5*2 = 2 ; G1 = 2
    assert ret.flatten().tolist() == pytest.approx([2.0, 2.0, 15.0, 24.0])


def test_reward_to_go_hand_computed():
    r = col(1.0, 1.0, 1.0, 1.0)
    te = col(0, 1, 0, 0)
    tr = col(0, 0, 0, 1)
    g = reward_to_go(r, te, tr, gamma=0.5)
    assert g.flatten().tolist() == pytest.approx([1.5, 1.0, 1.5, 1.0])


# ------------------------------------------------------- scalar reference loops (no tensors)
def ref_gae(r, v, nv, te, tr, gamma, lam):
    T = len(r)
    adv = [0.0] * T
    nxt = 0.0
    for t in reversed(range(T)):
        boot = 0.0 if te[t] else nv[t]
        delta = r[t] + gamma * boot - v[t]
        cont = 0.0 if (te[t] or tr[t] or t == T - 1) else 1.0
        nxt = delta + gamma * lam * cont * nxt
        adv[t] = nxt
    return adv


def ref_n_step(r, v, nv, te, tr, gamma, n):
    T = len(r)
    out = []
    for t in range(T):
        g, disc = 0.0, 1.0
        for k in range(n):
            s = t + k
            g += disc * r[s]
            disc *= gamma
            if te[s]:
                break
            if tr[s] or s == T - 1 or k == n - 1:
                g += disc * nv[s]
                break
        out.append(g - v[t])
    return out


def ref_rtg(r, te, tr, gamma):
    T = len(r)
    out, g = [0.0] * T, 0.0
    for t in reversed(range(T)):
        if te[t] or tr[t]:
            g = 0.0
        g = r[t] + gamma * g
        out[t] = g
    return out


def random_batch(T, B, p_term, p_trunc, seed):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(T, B, generator=gen, dtype=torch.float64)
    v = torch.randn(T, B, generator=gen, dtype=torch.float64)
    nv = torch.randn(T, B, generator=gen, dtype=torch.float64)
    te = torch.rand(T, B, generator=gen) < p_term
    tr = (torch.rand(T, B, generator=gen) < p_trunc) & ~te
    # consistency: after an episode continues, V(s_{t+1}) is the next row's V(s_t)
    cont = ~(te | tr)
    nv[:-1][cont[:-1]] = v[1:][cont[:-1]]
    return r, v, nv, te, tr


GRID = list(itertools.product([0.5, 0.99, 1.0], [0.0, 0.5, 0.95, 1.0], [1, 7], [1, 3], [0.0, 0.2], [0.0, 0.2]))


@pytest.mark.parametrize("gamma,lam,T,B,p_term,p_trunc", GRID)
def test_gae_matches_scalar_loop(gamma, lam, T, B, p_term, p_trunc):
    r, v, nv, te, tr = random_batch(T, B, p_term, p_trunc, seed=T * 100 + B)
    adv, ret = gae(r, v, nv, te, tr, gamma, lam)
    for b in range(B):
        want = ref_gae(r[:, b].tolist(), v[:, b].tolist(), nv[:, b].tolist(),
                       te[:, b].tolist(), tr[:, b].tolist(), gamma, lam)
        assert adv[:, b].tolist() == pytest.approx(want, abs=1e-10)
    assert torch.allclose(ret, adv + v)


@pytest.mark.parametrize("gamma,n,T,B,p_term,p_trunc",
                         list(itertools.product([0.5, 0.99, 1.0], [1, 2, 3, 10], [1, 7], [1, 3], [0.0, 0.3], [0.0, 0.3])))
def test_n_step_matches_scalar_loop(gamma, n, T, B, p_term, p_trunc):
    r, v, nv, te, tr = random_batch(T, B, p_term, p_trunc, seed=T * 10 + n)
    adv, ret = n_step(r, v, nv, te, tr, gamma, n)
    for b in range(B):
        want = ref_n_step(r[:, b].tolist(), v[:, b].tolist(), nv[:, b].tolist(),
                          te[:, b].tolist(), tr[:, b].tolist(), gamma, n)
        assert adv[:, b].tolist() == pytest.approx(want, abs=1e-10)
    assert torch.allclose(ret, adv + v)


@pytest.mark.parametrize("gamma,T,B,p_term,p_trunc",
                         list(itertools.product([0.5, 1.0], [1, 6], [2], [0.0, 0.3], [0.0, 0.3])))
def test_reward_to_go_matches_scalar_loop(gamma, T, B, p_term, p_trunc):
    r, _, _, te, tr = random_batch(T, B, p_term, p_trunc, seed=T)
    g = reward_to_go(r, te, tr, gamma)
    for b in range(B):
        assert g[:, b].tolist() == pytest.approx(ref_rtg(r[:, b].tolist(), te[:, b].tolist(), tr[:, b].tolist(), gamma))


def test_gae_and_reward_to_go_are_the_indexed_recursion_bit_for_bit():
    """The recursions take their rows by ``unbind`` and join them by ``stack`` (a speed change):
    in float32, the values are those of the loop that indexes and assigns each row, exactly."""
    r, v, nv, te, tr = (x.float() if x.is_floating_point() else x for x in random_batch(32, 8, 0.1, 0.05, seed=7))
    gamma, lam = 0.98, 0.8
    term, trunc = te.float(), tr.float()
    deltas = r + gamma * (1.0 - term) * nv - v
    carry = gamma * lam * (1.0 - term) * (1.0 - trunc)
    not_done = (1.0 - term) * (1.0 - trunc)
    want_adv, want_g = torch.empty_like(r), torch.empty_like(r)
    running, g = torch.zeros(8), torch.zeros(8)
    for t in range(31, -1, -1):
        running = deltas[t] + carry[t] * running
        want_adv[t] = running
        g = r[t] + gamma * not_done[t] * g
        want_g[t] = g
    adv, ret = gae(r, v, nv, te, tr, gamma, lam)
    assert torch.equal(adv, want_adv) and torch.equal(ret, want_adv + v)
    assert torch.equal(reward_to_go(r, te, tr, gamma), want_g)


# ---------------------------------------------------------------- C2: identities (hypothesis)
batches = st.tuples(
    st.integers(1, 12), st.integers(1, 4), st.floats(0.0, 0.4), st.floats(0.0, 0.4),
    st.integers(0, 10_000), st.floats(0.05, 1.0),
)


def mc_advantage_with_bootstrap(r, v, nv, te, tr, gamma):
    """G_t - V(s_t), G summed to the episode's end, + gamma^k V(s_end+1) if truncated/rollout end."""
    T, B = r.shape
    out = torch.zeros_like(r)
    for b in range(B):
        for t in range(T):
            g, disc = 0.0, 1.0
            for s in range(t, T):
                g += disc * float(r[s, b])
                disc *= gamma
                if te[s, b]:
                    break
                if tr[s, b] or s == T - 1:
                    g += disc * float(nv[s, b])
                    break
            out[t, b] = g - float(v[t, b])
    return out


@pytest.mark.claim("C2")
@settings(max_examples=60, deadline=None)
@given(batches)
def test_c2_gae_lambda1_is_monte_carlo_minus_v(args):
    T, B, p_term, p_trunc, seed, gamma = args
    r, v, nv, te, tr = random_batch(T, B, p_term, p_trunc, seed)
    adv, _ = gae(r, v, nv, te, tr, gamma, 1.0)
    assert torch.allclose(adv, mc_advantage_with_bootstrap(r, v, nv, te, tr, gamma), atol=1e-9)


@pytest.mark.claim("C2")
@settings(max_examples=60, deadline=None)
@given(batches)
def test_c2_gae_lambda0_is_td_error(args):
    T, B, p_term, p_trunc, seed, gamma = args
    r, v, nv, te, tr = random_batch(T, B, p_term, p_trunc, seed)
    adv, _ = gae(r, v, nv, te, tr, gamma, 0.0)
    td = r + gamma * nv * (~te).double() - v
    assert torch.allclose(adv, td, atol=1e-12)


@pytest.mark.claim("C2")
@settings(max_examples=60, deadline=None)
@given(batches)
def test_c2_n_step_extremes(args):
    T, B, p_term, p_trunc, seed, gamma = args
    r, v, nv, te, tr = random_batch(T, B, p_term, p_trunc, seed)
    a1, _ = n_step(r, v, nv, te, tr, gamma, 1)
    td = r + gamma * nv * (~te).double() - v
    assert torch.allclose(a1, td, atol=1e-12)
    for n in (T, T + 3):
        an, _ = n_step(r, v, nv, te, tr, gamma, n)
        assert torch.allclose(an, mc_advantage_with_bootstrap(r, v, nv, te, tr, gamma), atol=1e-9)


def test_truncation_bootstraps_termination_does_not():
    r = col(1.0)
    v = col(0.0)
    nv = col(10.0)
    for fn in (lambda *a: gae(*a, gamma=0.9, lam=0.95)[0], lambda *a: n_step(*a, gamma=0.9, n=3)[0]):
        assert fn(r, v, nv, col(0), col(1)).item() == pytest.approx(1.0 + 0.9 * 10.0)
        assert fn(r, v, nv, col(1), col(0)).item() == pytest.approx(1.0)


def test_nothing_leaks_across_episode_boundary():
    # Two episodes in one column; changing the second episode must not change the first's numbers.
    r, v, nv, te, tr = random_batch(8, 1, 0.0, 0.0, seed=3)
    te[3] = True
    a, _ = gae(r, v, nv, te, tr, 0.99, 0.9)
    n, _ = n_step(r, v, nv, te, tr, 0.99, 6)
    g = reward_to_go(r, te, tr, 0.99)
    r2, v2, nv2 = r.clone(), v.clone(), nv.clone()
    r2[4:] += 100.0
    v2[4:] -= 7.0
    nv2[4:] += 3.0
    a2, _ = gae(r2, v2, nv2, te, tr, 0.99, 0.9)
    n2, _ = n_step(r2, v2, nv2, te, tr, 0.99, 6)
    g2 = reward_to_go(r2, te, tr, 0.99)
    assert torch.equal(a[:4], a2[:4]) and torch.equal(n[:4], n2[:4]) and torch.equal(g[:4], g2[:4])


# ------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_named_errors():
    r, v, nv, te, tr = random_batch(4, 2, 0.1, 0.1, seed=0)
    with pytest.raises(ValueError, match=r"values=\[3, 2\]"):
        gae(r, v[:3], nv, te, tr, 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae(r, v, nv, te, tr, 0.0, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        reward_to_go(r, te, tr, 1.5)
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, nv, te, tr, 0.9, 1.1)
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, nv, te, tr, 0.9, -0.1)
    with pytest.raises(ValueError, match="n must"):
        n_step(r, v, nv, te, tr, 0.9, 0)
    with pytest.raises(ValueError, match="shapes"):
        reward_to_go(r[:, 0], te[:, 0], tr[:, 0], 0.9)
