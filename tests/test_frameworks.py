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


def _harness(overrides: str, logp, old, ref, adv, mask):
    cfg = make_cfg(["task=lm_summarize", *overrides.split(), "epochs=1", "minibatches=1",
                    "normalize_advantages=none", "max_grad_norm=null", "ent_coef=0"])
    s = UpdateSettings.from_cfg(cfg, norm_len=int(cfg.lm.max_response_len))
    s.norm_len = T  # the LM source passes lm.max_response_len; these tensors' T plays its part
    learner = TokenLearner(logp.T.unsqueeze(0))
    opt = MemberOptimizer(learner.params, 1, lr=0.0)
    batch = UpdateBatch(adv=(adv.view(1, -1) * mask.T).unsqueeze(0), mask=mask.T.unsqueeze(0),
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
    assert quoted == {o for o, _ in RECIPES.values()}
