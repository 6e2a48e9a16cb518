"""The correspondence page (docs/frameworks.md): each framework configuration a user would copy
from a paper, the harness overrides that reproduce it, checked on the same tensors.

Each recipe's framework loss is written here from that framework's documented formula (TRL's
``GRPOTrainer._compute_loss`` and ``GRPOConfig`` docs, verl's ``core_algos.py`` docs, the papers),
independently of :mod:`harness.losses`. The harness side goes the way a run goes: Hydra composes
the recipe's overrides (``task=lm_summarize``: the LM task's settings), :class:`UpdateSettings`
reads them, and :func:`harness.train.update.update` takes one step. Its total loss (policy loss
plus ``kl.beta`` times the KL term) and the gradient with respect to every token's log-prob must
equal the framework's.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.train.update import MemberOptimizer, UpdateBatch, UpdateSettings, update
from tests.control_helpers import make_cfg

DOCS = Path(__file__).resolve().parents[1] / "docs" / "frameworks.md"
T, B, G = 6, 8, 4  # max response length, responses, group size


# --------------------------------------------------------------------------- the frameworks' formulas

def _trl_aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_len: int) -> torch.Tensor:
    """TRL ``GRPOTrainer._compute_loss``'s reductions of a ``[B, T]`` per-token loss (one process,
    no gradient accumulation: ``num_items_in_batch`` is the batch's completion tokens)."""
    if loss_type == "grpo":  # per-sequence token mean, then the mean over sequences
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo", "cispo"):  # every token of the batch weighs the same
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":  # token sum over batch size x max_completion_length
        return (per_token * mask).sum() / (per_token.shape[0] * max_len)
    raise ValueError(loss_type)


def trl_loss(logp, old, ref, adv, mask, *, loss_type="grpo", epsilon=0.2, epsilon_high=None, beta=0.0,
             level="token", delta=None, sapo=None):
    """TRL's GRPO-family loss on ``[B, T]`` tensors; ``adv [B]`` per completion."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logp - old
    if level == "sequence":  # GSPO: the length-normalised sequence log-ratio, one per completion
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_w = log_ratio
    coef_1 = torch.exp(log_w)
    a = adv.unsqueeze(-1)
    if loss_type == "cispo":  # detached, capped weight times log-prob (MiniMax-M1; TRL caps at epsilon_high)
        per_token = -torch.clamp(coef_1, max=eps_high).detach() * a * logp
    elif sapo is not None:  # soft gate sigma(tau (r - 1)) 4 / tau, tau by the advantage's sign
        tau = torch.where(a >= 0, torch.full_like(a, sapo[0]), torch.full_like(a, sapo[1]))
        per_token = -torch.sigmoid(tau * (coef_1 - 1)) * 4.0 / tau * a
    else:
        coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + eps_high)
        first = (torch.clamp(coef_1, max=delta) if delta is not None else coef_1) * a
        per_token = -torch.minimum(first, coef_2 * a)
    if beta:
        per_token = per_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)  # k3
    return _trl_aggregate(per_token, mask, loss_type, logp.shape[-1])


def verl_loss(logp, old, ref, adv, mask, *, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0, agg="token-mean",
              beta=0.0):
    """verl's ``compute_policy_loss_vanilla`` (dual clip for negative advantages) with ``agg_loss``
    and, with ``use_kl_loss``, ``kl_loss_type=low_var_kl`` (k3, clamped) added as a loss term."""
    a = adv.unsqueeze(-1)
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    clip1 = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    clip2 = torch.minimum(-a * clip_ratio_c, clip1)
    per_token = torch.where(a < 0, clip2, clip1)
    if beta:
        kl = torch.clamp(ref - logp, -20.0, 20.0)
        per_token = per_token + beta * torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
    if agg == "token-mean":
        return (per_token * mask).sum() / mask.sum()
    if agg == "seq-mean-token-mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    raise ValueError(agg)


# --------------------------------------------------------------------------- recipes: docs/frameworks.md

RECIPES = {
    # name: (harness overrides, framework loss on [B, T] tensors)
    "GRPO (DeepSeekMath; TRL loss_type=grpo, beta=0.04)": (
        "estimator=grpo update=clip clip_eps=0.2 loss_agg=seq_mean_token_mean kl.beta=0.04 kl.estimator=k3",
        lambda *x: trl_loss(*x, loss_type="grpo", beta=0.04)),
    "BNPO (TRL loss_type=bnpo)": (
        "estimator=grpo update=clip clip_eps=0.2 loss_agg=token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="bnpo")),
    "Dr. GRPO (TRL loss_type=dr_grpo, scale_rewards=none)": (
        "estimator=dr_grpo update=clip clip_eps=0.2 kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="dr_grpo")),
    "DAPO (TRL loss_type=dapo, epsilon_high=0.28)": (
        "estimator=grpo update=clip clip_eps=0.2 clip_eps_high=0.28 loss_agg=token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="dapo", epsilon_high=0.28)),
    "INTELLECT-2 two-sided clip (TRL delta=4)": (
        "estimator=grpo update=clip clip_eps=0.2 delta=4.0 loss_agg=token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="bnpo", delta=4.0)),
    "GSPO (TRL importance_sampling_level=sequence, epsilon=3e-4, epsilon_high=4e-4)": (
        "estimator=grpo update=gspo clip_eps=3e-4 clip_eps_high=4e-4 loss_agg=seq_mean_token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4, level="sequence")),
    "CISPO (TRL loss_type=cispo, epsilon_high=5.0)": (
        "estimator=grpo update=cispo clip_eps=1.0 clip_eps_high=4.0 loss_agg=token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="cispo", epsilon_high=5.0)),
    "SAPO (TRL loss_type=sapo, temperatures 1.0 / 1.05)": (
        "estimator=grpo update=sapo sapo_tau_pos=1.0 sapo_tau_neg=1.05 loss_agg=seq_mean_token_mean kl.beta=0",
        lambda *x: trl_loss(*x, loss_type="grpo", sapo=(1.0, 1.05))),
    "PPO with dual clip (verl, clip_ratio_c=3, token-mean, low_var_kl loss 0.001)": (
        "estimator=grpo update=dual_clip clip_eps=0.2 clip_ratio_c=3.0 loss_agg=token_mean kl.beta=0.001 "
        "kl.estimator=k3",
        lambda *x: verl_loss(*x, beta=0.001)),
}


# --------------------------------------------------------------------------- estimator recipes
#
# The frameworks' advantage estimators, from their documented formulas, on ``token_rewards [B, T]``
# (the task score on each response's last token, plus any per-token reward such as an in-reward KL
# penalty) and the tokens' ``values [B, T]`` (PPO), then the framework's policy loss on them.

def verl_rloo_adv(token_rewards, mask, n, **_):
    """verl ``compute_rloo_outcome_advantage``: the response score ``sum_t r_t`` rescaled by
    ``n/(n-1)`` minus the group mean rescaled the same way (= score minus the mean of the other
    n-1), on every response token."""
    s = (token_rewards * mask).sum(-1).view(-1, n)
    a = s * n / (n - 1) - s.mean(-1, keepdim=True) * n / (n - 1)
    return a.reshape(-1, 1) * mask


def verl_remax_adv(token_rewards, mask, greedy, n, **_):
    """verl ``compute_remax_outcome_advantage``: the reward-to-go ``sum_{t'>=t} r_t'`` (reverse
    cumsum) minus the greedy response's score of the same prompt, on every response token."""
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    return (returns - greedy.repeat_interleave(n).unsqueeze(-1)) * mask


def _whiten(x, mask, bessel):
    """Masked whitening over every response token of the batch: OpenRLHF's
    ``(x - mean) * rsqrt(clamp(var, 1e-8))`` with the biased variance; verl's ``masked_whiten``
    ``(x - mean) * rsqrt(var + 1e-8)`` with the Bessel-corrected one (``bessel``)."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n
    if bessel:
        return (x - mean) * torch.rsqrt(var * n / (n - 1) + 1e-8) * mask
    return (x - mean) * var.clamp(min=1e-8).rsqrt() * mask


def openrlhf_reinforce_pp_adv(token_rewards, mask, gamma=1.0, **_):
    """OpenRLHF ``advantage_estimator="reinforce"`` (REINFORCE++, Hu et al. 2025):
    ``get_cumulative_returns`` (the discounted reward-to-go), then normalised over every action
    token of the batch (biased variance)."""
    ret, run = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        run = token_rewards[:, t] + gamma * run
        ret[:, t] = run
    return _whiten(ret * mask, mask, bessel=False)


def verl_gae_adv(token_rewards, mask, values, gamma=1.0, lam=0.95, **_):
    """verl ``compute_gae_advantage_return``: ``delta_t = r_t + gamma V_{t+1} - V_t`` (0 after the
    last token), ``A_t = delta_t + gamma lam A_{t+1}``, then ``masked_whiten`` (Bessel-corrected)."""
    adv, last = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards[:, 0])
    T_ = token_rewards.shape[1]
    for t in reversed(range(T_)):
        nxt = values[:, t + 1] if t < T_ - 1 else torch.zeros_like(last)
        last = token_rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * last
        adv[:, t] = last
    return _whiten(adv, mask, bessel=True)


def ppo_clip_token_mean(logp, old, adv_tok, mask, eps=0.2):
    """The vanilla clipped surrogate per token, averaged over every response token (verl
    ``compute_policy_loss_vanilla`` with ``token-mean``; OpenRLHF ``PolicyLoss``)."""
    ratio = torch.exp(logp - old)
    per_token = -torch.minimum(ratio * adv_tok, torch.clamp(ratio, 1 - eps, 1 + eps) * adv_tok)
    return (per_token * mask).sum() / mask.sum()


def _bessel(mask):
    """verl's whitened advantages are the harness's times ``sqrt((N - 1) / N)`` (N response
    tokens): the clipped surrogate is linear in a positive scale of the advantages."""
    n = float(mask.sum())
    return (n / (n - 1)) ** 0.5


KL_IN_REWARD = 0.05
ESTIMATOR_RECIPES = {
    # name: (harness overrides, framework advantage, per-token rewards?, harness = scale(mask) x framework)
    "RLOO (verl adv_estimator=rloo, vanilla PPO loss, token-mean)": (
        "estimator=rloo update=clip clip_eps=0.2 normalize_advantages=none loss_agg=token_mean kl.beta=0",
        verl_rloo_adv, False, None),
    "ReMax (verl adv_estimator=remax, vanilla PPO loss, token-mean)": (
        "estimator=remax update=clip clip_eps=0.2 normalize_advantages=none loss_agg=token_mean kl.beta=0",
        verl_remax_adv, False, None),
    "REINFORCE++ (OpenRLHF advantage_estimator=reinforce, k1 KL in the reward)": (
        "estimator=reinforce_pp update=clip clip_eps=0.2 normalize_advantages=batch loss_agg=token_mean "
        f"kl.in_reward=true kl.estimator=k1 kl.beta={KL_IN_REWARD}",
        openrlhf_reinforce_pp_adv, True, None),
    "PPO (verl adv_estimator=gae, gamma=1, lam=0.95, k1 KL in the reward)": (
        "estimator=ppo_gae update=clip clip_eps=0.2 gamma=1.0 gae_lambda=0.95 normalize_advantages=batch "
        f"loss_agg=token_mean kl.in_reward=true kl.estimator=k1 kl.beta={KL_IN_REWARD}",
        verl_gae_adv, True, _bessel),
}


def _episode(seed: int, per_token: bool):
    """Token-level rewards as both sides see them, and PPO's per-token values: the score on each
    response's last token, with ``per_token`` also minus ``kl.beta`` x k1(pi_old || ref) on every
    token (the in-reward KL penalty of InstructGPT, OpenRLHF and verl's ``use_kl_in_reward``)."""
    logp, old, ref, _, mask = _tensors(seed)
    g = torch.Generator().manual_seed(100 + seed)
    score = torch.randn(B, generator=g, dtype=torch.float64)
    last = mask.sum(-1).long() - 1
    r = torch.zeros(B, T, dtype=torch.float64)
    if per_token:
        r = r - KL_IN_REWARD * (old - ref)
    r[torch.arange(B), last] += score
    values = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    greedy = torch.randn(B // G, generator=g, dtype=torch.float64)
    return logp, old, ref, r * mask, mask, values, greedy


def _harness_advantages(cfg, r, mask, values, greedy):
    """The harness's estimator on the same token rewards, laid out as the LM source lays out a
    batch (``harness.train.lm``: time-major, the last response token terminal)."""
    from harness.estimators.registry import AdvantageBatch, EstimatorParams, get_estimator
    last = mask.sum(-1).long() - 1
    term = torch.zeros(B, T, dtype=torch.float64)
    term[torch.arange(B), last] = 1.0
    nxt = torch.cat([values[:, 1:], torch.zeros(B, 1, dtype=torch.float64)], dim=1)
    spec = get_estimator(str(cfg.estimator))
    batch = AdvantageBatch(rewards=r.T, terminated=term.T, truncated=torch.zeros(T, B, dtype=torch.float64),
                           mask=mask.T, values=values.T, next_values=nxt.T, greedy_scores=greedy,
                           group_size=G)
    return spec(batch, EstimatorParams.from_cfg(cfg)).advantages.T  # [B, T]


class TokenLearner:
    """The policy's log-probs of the sampled tokens are the parameters (``[1, T, B]``), so the
    update's gradient is d loss / d log pi per token; ``clip_grads`` records it."""

    def __init__(self, logp: torch.Tensor):
        self.population = 1
        self.z = logp.clone().requires_grad_(True)
        self.params = [self.z]
        self.grad = None

    def forward(self, inputs, idx, need_entropy):
        assert idx is None  # one minibatch
        return self.z, torch.zeros_like(self.z) if need_entropy else None, None

    def clip_grads(self, max_norm, per_network):
        self.grad = self.z.grad.detach().clone()
        return torch.linalg.vector_norm(self.grad).view(1, 1)


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T).view(1, -1) < lengths.view(-1, 1)).double()  # [B, T]
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    logp = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios ~0.1 to ~10: every clip acts
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, ref, adv, mask


def _harness(overrides: str, logp, old, ref, adv, mask, estimate=None):
    """One update step composed from ``overrides``; ``adv [B]`` per response, or with ``estimate``
    the advantages are the recipe's estimator's on ``estimate = (token_rewards, values, greedy)``."""
    cfg = make_cfg(["task=lm_summarize", *overrides.split(), "epochs=1", "minibatches=1",
                    "max_grad_norm=null", "ent_coef=0", f"group_size={G}"]
                   + ([] if estimate else ["normalize_advantages=none"]))
    s = UpdateSettings.from_cfg(cfg, norm_len=int(cfg.lm.max_response_len))
    s.norm_len = T  # the LM source passes lm.max_response_len; these tensors' T plays its part
    learner = TokenLearner(logp.T.unsqueeze(0))
    opt = MemberOptimizer(learner.params, 1, lr=0.0)
    adv_tok = adv.view(-1, 1) * mask if estimate is None else _harness_advantages(cfg, estimate[0], mask, *estimate[1:])
    batch = UpdateBatch(adv=(adv_tok * mask).T.unsqueeze(0), mask=mask.T.unsqueeze(0),
                        old_logp=old.T.unsqueeze(0), inputs=None, kl_target=ref.T.unsqueeze(0))
    out = update(learner, opt, batch, s, [torch.Generator().manual_seed(0)], torch.ones(1, dtype=torch.bool),
                 torch.zeros(1, dtype=torch.float64), torch.tensor([float(cfg.kl.beta)], dtype=torch.float64))
    return float(out["loss"][0]), learner.grad[0].T


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("seed", [0, 1])
def test_recipe_matches_the_frameworks_loss_and_gradient(name, seed):
    overrides, framework = RECIPES[name]
    logp, old, ref, adv, mask = _tensors(seed)
    x = logp.clone().requires_grad_(True)
    want = framework(x, old, ref, adv, mask)
    want.backward()
    loss, grad = _harness(overrides, logp, old, ref, adv, mask)
    assert loss == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(grad * mask, x.grad * mask, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(ESTIMATOR_RECIPES))
@pytest.mark.parametrize("seed", [0, 1])
def test_estimator_recipe_matches_the_frameworks_advantages_loss_and_gradient(name, seed):
    """From the same token-level rewards (and values, and greedy scores): the framework's
    advantage estimator, then its clipped token-mean loss, against the harness's estimator and
    one update step. Where the page states a documented difference (verl's Bessel-corrected
    whitening), the harness's loss and gradient are the framework's times that factor."""
    overrides, estimator, per_token, scale = ESTIMATOR_RECIPES[name]
    logp, old, ref, r, mask, values, greedy = _episode(seed, per_token)
    adv_tok = estimator(r, mask, n=G, values=values, greedy=greedy)
    x = logp.clone().requires_grad_(True)
    want = ppo_clip_token_mean(x, old, adv_tok, mask)
    want.backward()
    k = 1.0 if scale is None else scale(mask)
    loss, grad = _harness(overrides, logp, old, ref, None, mask, estimate=(r, values, greedy))
    assert loss == pytest.approx(k * float(want.detach()), rel=1e-6, abs=1e-12)
    torch.testing.assert_close(grad * mask, k * x.grad * mask, rtol=1e-6, atol=1e-12)


def test_remax_differs_from_verl_with_per_token_rewards():
    """verl's ReMax gives token t the reward-to-go from t minus the greedy score; the harness's
    every token the whole response's return minus it (as the ReMax paper). With the score as the
    only reward they agree (the row above); with a per-token reward (the KL in the reward) the
    advantages of every token but the first differ by the rewards before it."""
    logp, old, ref, r, mask, values, greedy = _episode(0, per_token=True)
    cfg = make_cfg(["task=lm_summarize", "estimator=remax", f"group_size={G}"])
    ours = _harness_advantages(cfg, r, mask, values, greedy)
    theirs = verl_remax_adv(r, mask, greedy, G)
    torch.testing.assert_close(ours[:, 0] * mask[:, 0], theirs[:, 0])  # first token: the whole return
    before = torch.cumsum(r, -1) - r  # rewards before token t
    torch.testing.assert_close(ours * mask, (theirs + before) * mask)
    assert float(((ours - theirs) * mask).abs().max()) > 1e-3


def test_the_frameworks_disagree_where_the_page_says():
    """What 'token-mean' averages over differs: TRL's grpo (per sequence first) and bnpo/dapo
    (every token) give different losses on sequences of different lengths: the page's rows
    are not interchangeable."""
    logp, old, ref, adv, mask = _tensors(0)
    assert abs(float(trl_loss(logp, old, ref, adv, mask, loss_type="grpo"))
               - float(trl_loss(logp, old, ref, adv, mask, loss_type="bnpo"))) > 1e-3


def test_every_recipe_on_the_page_is_tested():
    """docs/frameworks.md quotes each recipe's overrides verbatim; a row the tests do not cover
    (or a recipe the page lost) fails here."""
    text = DOCS.read_text()
    quoted = set(re.findall(r"`(estimator=[^`]+)`", text))
    assert quoted == {o for o, _ in RECIPES.values()} | {o for o, *_ in ESTIMATOR_RECIPES.values()}


@pytest.mark.parametrize("preset,recipe", [
    ("clip", "BNPO (TRL loss_type=bnpo)"),
    ("gspo", "GSPO (TRL importance_sampling_level=sequence, epsilon=3e-4, epsilon_high=4e-4)"),
    ("cispo", "CISPO (TRL loss_type=cispo, epsilon_high=5.0)")])
def test_policy_loss_presets_are_the_tested_recipes_knobs(preset, recipe):
    """``policy_loss=<name>`` (harness/conf/policy_loss/, what experiment=lm_compare sweeps) sets the same
    update, clip_eps and clip_eps_high as the recipe the frameworks' loss was checked with."""
    keys = ("update", "clip_eps", "clip_eps_high")
    got = make_cfg(["task=lm_summarize", "estimator=rloo", f"policy_loss={preset}"])
    want = make_cfg(["task=lm_summarize", *RECIPES[recipe][0].split()])
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
