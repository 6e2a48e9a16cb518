"""docs/frameworks.md beyond the recipes: the configurations from papers that have no recipe, the
differences the page states, and the frameworks' names.

The recipes (harness/conf/recipe/, one per framework algorithm) are checked against their frameworks in
tests/test_recipes.py. Here the page's hand-written "Configurations from papers" rows: each quotes
harness overrides, composed by Hydra (``task=lm_summarize``) and run through one update step, against the
framework's function transcribed in :mod:`tests.framework_refs` (TRL 1.16.0, verl b178a3c): the same
loss and gradient per token's log-prob, on responses of different lengths with ratios far from 1.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.plan import RunPlan
from harness.train.update import MemberOptimizer, Members, UpdateBatch, UpdateSettings, update
from tests import framework_refs as F
from tests.control_helpers import make_cfg
from tests.test_recipes import TokenLearner

DOCS = Path(__file__).resolve().parents[1] / "docs" / "frameworks.md"
T, B, G = 6, 8, 4  # max response length, responses, group size

# name: (harness overrides quoted on the page, the framework's loss on [B, T] tensors; adv [B])
PAPER_CONFIGS = {
    "GRPO as in DeepSeekMath (TRL loss_type=grpo, beta=0.04, use_bias_correction_kl=False)": (
        "estimator=grpo update=clip clip_eps=0.2 loss_agg=seq_mean_token_mean kl.beta=0.04 kl.estimator=k3",
        lambda *x: F.trl_grpo_loss(*x, loss_type="grpo", beta=0.04, use_bias_correction_kl=False)),
    "INTELLECT-2 two-sided clip (TRL delta=4)": (
        "estimator=grpo update=clip clip_eps=0.2 delta=4.0 loss_agg=token_mean kl.beta=0",
        lambda *x: F.trl_grpo_loss(*x, loss_type="bnpo", delta=4.0)),
}


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T).view(1, -1) < lengths.view(-1, 1)).double()  # [B, T]
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    logp = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios ~0.1 to ~10: every clip acts
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, ref, adv, mask


def _harness(overrides: str, logp, old, ref, adv, mask):
    """One update step composed from ``overrides`` with the advantage ``adv [B]`` of each response."""
    cfg = make_cfg(["task=lm_summarize", *overrides.split(), "epochs=1", "minibatches=1", "max_grad_norm=null",
                    "ent_coef=0", f"group_size={G}", "normalize_advantages=none"])
    s = UpdateSettings.from_plan(RunPlan.of(cfg), norm_len=T)  # the LM source passes lm.max_response_len; T plays its part
    learner = TokenLearner(logp.T.unsqueeze(0), None)
    opt = MemberOptimizer(learner.params, 1, lr=0.0)
    batch = UpdateBatch(adv=(adv.view(-1, 1) * mask).T.unsqueeze(0), mask=mask.T.unsqueeze(0),
                        old_logp=old.T.unsqueeze(0), inputs=None, kl_target=ref.T.unsqueeze(0))
    out = update(learner, opt, batch, s, Members([torch.Generator().manual_seed(0)], torch.ones(1, dtype=torch.bool),
                                                 torch.zeros(1, dtype=torch.float64),
                                                 torch.tensor([float(cfg.kl.beta)], dtype=torch.float64)))
    return float(out["loss"][0]), learner.grad[0].T


@pytest.mark.parametrize("name", list(PAPER_CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_paper_configuration_matches_the_frameworks_loss_and_gradient(name, seed):
    overrides, framework = PAPER_CONFIGS[name]
    logp, old, ref, adv, mask = _tensors(seed)
    x = logp.clone().requires_grad_(True)
    want = framework(x, old, ref, adv, mask)
    want.backward()
    loss, grad = _harness(overrides, logp, old, ref, adv, mask)
    assert loss == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    torch.testing.assert_close(grad * mask, x.grad * mask, rtol=1e-9, atol=1e-12)


def test_trl_multiplies_the_kl_by_the_ratio_by_default():
    """TRL 1.16.0's ``use_bias_correction_kl=True`` (its default) multiplies the k3 term by the ratio: with
    ratios away from 1 that is not the harness's KL loss (the page's GRPO row names the switch)."""
    logp, old, ref, adv, mask = _tensors(0)
    on = F.trl_grpo_loss(logp, old, ref, adv, mask, loss_type="grpo", beta=0.04)
    off = F.trl_grpo_loss(logp, old, ref, adv, mask, loss_type="grpo", beta=0.04, use_bias_correction_kl=False)
    assert abs(float(on - off)) > 1e-3


def test_trl_bias_corrected_kl_has_the_plain_value_at_ratio_one_but_not_its_gradient():
    """At ratio 1 (``logp == old``) ``k3 * ratio`` equals ``k3``, but its gradient is
    ``ratio * grad k3 + k3 * grad ratio`` = ``grad k3 + k3 * grad logp``: the two KL losses differ in
    gradient wherever the policy is away from the reference (docs/frameworks.md says so)."""
    logp0, _, ref, adv, mask = _tensors(0)
    losses, grads = {}, {}
    for on in (True, False):
        logp = logp0.clone().requires_grad_(True)
        loss = F.trl_grpo_loss(logp, logp0, ref, adv, mask, loss_type="grpo", beta=0.04, use_bias_correction_kl=on)
        (grads[on],) = torch.autograd.grad(loss, logp)
        losses[on] = float(loss)
    assert losses[True] == pytest.approx(losses[False], rel=1e-12)
    # by hand: d(k3 * ratio) / d logp = grad k3 + k3 at ratio 1, each token weighted as loss_type=grpo
    # weights it (the mean over responses of each response's token mean): mask / (length * B)
    k3 = torch.exp(ref - logp0) - (ref - logp0) - 1
    weight = mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / B
    assert torch.allclose(grads[True] - grads[False], 0.04 * k3 * weight, rtol=1e-9, atol=1e-15)
    assert float((0.04 * k3 * weight).abs().max()) > 1e-5  # not a difference at rounding's scale


def test_remax_differs_from_verl_with_per_token_rewards():
    """verl's ReMax gives token t the reward-to-go from t minus the greedy score; the harness's every
    token the whole response's return minus it (as the ReMax paper). With the score as the only reward
    they agree; with a per-token reward (the KL in the reward) the advantages of every token but the
    first differ by the rewards before it."""
    from harness.estimators.registry import AdvantageBatch, EstimatorParams, get_estimator
    logp, old, ref, _, mask = _tensors(0)
    g = torch.Generator().manual_seed(100)
    score, greedy = torch.randn(B, generator=g, dtype=torch.float64), torch.randn(B // G, generator=g, dtype=torch.float64)
    r = F.verl_token_rewards(score, old, ref, mask, kl_coef=0.05)
    last = mask.sum(-1).long() - 1
    term = torch.zeros(B, T, dtype=torch.float64)
    term[torch.arange(B), last] = 1.0
    cfg = make_cfg(["task=lm_summarize", "estimator=remax", f"group_size={G}"])
    batch = AdvantageBatch(rewards=r.T, terminated=term.T, truncated=torch.zeros(T, B, dtype=torch.float64),
                           mask=mask.T, values=None, next_values=None, greedy_scores=greedy, group_size=G)
    ours = get_estimator("remax")(batch, EstimatorParams.from_cfg(cfg)).advantages.T
    theirs = F.verl_advantages("remax", r, mask, G, greedy=greedy)
    torch.testing.assert_close(ours[:, 0] * mask[:, 0], theirs[:, 0] * mask[:, 0])  # first token: the whole return
    before = torch.cumsum(r, -1) - r  # rewards before token t
    torch.testing.assert_close(ours * mask, (theirs + before) * mask)
    assert float(((ours - theirs) * mask).abs().max()) > 1e-3


def test_the_frameworks_disagree_where_the_page_says():
    """What 'token-mean' averages over differs: TRL's grpo (per sequence first) and bnpo/dapo
    (every token) give different losses on sequences of different lengths: the rows are not interchangeable."""
    logp, old, ref, adv, mask = _tensors(0)
    assert abs(float(F.trl_grpo_loss(logp, old, ref, adv, mask, loss_type="grpo"))
               - float(F.trl_grpo_loss(logp, old, ref, adv, mask, loss_type="bnpo"))) > 1e-3


def test_every_paper_configuration_on_the_page_is_tested():
    """docs/frameworks.md quotes each configuration's overrides verbatim; a row the tests do not cover
    (or a configuration the page lost) fails here. (The recipe rows are generated: tests/test_generated_docs.py.)"""
    quoted = set(re.findall(r"`(estimator=[^`]+)`", DOCS.read_text()))
    assert quoted == {o for o, _ in PAPER_CONFIGS.values()}


@pytest.mark.parametrize("preset,recipe", [("clip", "trl_grpo"), ("gspo", "trl_gspo"), ("cispo", "trl_grpo_cispo")])
def test_policy_loss_presets_are_the_tested_recipes_knobs(preset, recipe):
    """``policy_loss=<name>`` (harness/conf/policy_loss/, what experiment=lm_compare sweeps) sets the same
    update, clip_eps and clip_eps_high as the recipe the framework's loss was checked with (test_recipes)."""
    keys = ("update", "clip_eps", "clip_eps_high")
    got = make_cfg(["task=lm_summarize", "estimator=rloo", f"policy_loss={preset}"])
    want = make_cfg(["task=lm_summarize", f"recipe={recipe}"])
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
