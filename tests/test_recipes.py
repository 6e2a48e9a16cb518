"""Every recipe of harness/conf/recipe/ against its framework's own function (issue 39).

For each recipe file, Hydra composes ``task=lm_summarize recipe=<name>``; the harness then goes the way an
LM run goes: the rollout's per-token rewards (the score on the last token, the in-reward KL penalty with
its guards, :meth:`harness.train.lm.LMSource.advantage_batch`), the recipe's estimator, the update batch
(:meth:`~harness.train.lm.LMSource.update_batch`) and one step of :func:`harness.train.update.update`.
Its loss and its gradient with respect to every token's log-prob must equal the framework's, written in
:mod:`tests.framework_refs` from the framework's source with the framework's defaults hard-coded
below (never read from the recipe), on responses of different lengths where every clip and clamp acts:
ratios far from 1, ``|log r| = 25`` on two tokens (the +-20 clamps), KL values above 10 in the loss and
``|log old - log ref| = 12`` in the reward (the +-10 clamps). A recipe file without a reference here fails.

Where the page states a difference, the reference carries it explicitly: verl's Bessel-corrected
whitening (the harness's advantages are verl's times sqrt(N/(N-1))), verl's ReMax reward-to-go (the
harness gives every token the whole return: verl's advantage plus the rewards before the token), TRL's
RLOO sequence ratio (equal gradient at ratio 1, where a run evaluates it; the loss value differs).
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.estimators import EstimatorParams, get_estimator
from harness.train.lm import LMSource, Rollout, greedy_baseline
from harness.train.update import MemberOptimizer, Members, UpdateSettings, update
from tests import framework_refs as F
from tests.control_helpers import make_cfg
from harness.plan import RunPlan

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "harness" / "conf" / "recipe").glob("*.yaml"))
T, B = 6, 16  # max response length, responses


@dataclasses.dataclass
class Episode:
    logp: torch.Tensor  # [B, T] the policy's log-probs (the gradient's variable)
    old: torch.Tensor
    ref: torch.Tensor
    score: torch.Tensor  # [B]
    mask: torch.Tensor
    values: torch.Tensor
    greedy: torch.Tensor  # [B // n] greedy responses' rewards
    n: int  # group size


def episode(seed: int, n: int, ratio_one: bool = False) -> Episode:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[:2] = T  # the two extreme tokens sit in full-length responses
    mask = (torch.arange(T).view(1, -1) < lengths.view(-1, 1)).double()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    logp = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios ~0.1 to ~10: the clips act
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    # |log r| = 25 on two tokens each of the best- and the worst-scored response of group 0 (A > 0 and A < 0
    # for every group estimator): the +-20 clamps act; the KL to ref in the loss exceeds 10 there
    logp[0, 1], logp[0, 3], logp[1, 2], logp[1, 4] = old[0, 1] + 25.0, old[0, 3] - 25.0, old[1, 2] - 25.0, old[1, 4] + 25.0
    ref[2, 0], ref[3, 0] = old[2, 0] - 12.0, old[3, 0] + 12.0  # |k1(old, ref)| > 10 in the reward
    if ratio_one:
        logp = old.clone()
    score = torch.randn(B, generator=g, dtype=torch.float64)
    score[0], score[1] = 3.0, -3.0
    values = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    greedy = torch.randn(B // n, generator=g, dtype=torch.float64)
    return Episode(logp, old * mask, ref * mask, score, mask, values, greedy, n)


# --------------------------------------------------------------------------- the frameworks, per recipe
# Each reference: Episode (with ``x``, the log-probs the gradient is taken in) -> loss. Framework defaults
# are written out here.

def _verl(policy_mode, estimator, agg="token-mean", clip_low=0.2, clip_high=0.2, kl_loss_coef=0.0,
          kl_coef_in_reward=0.0, gamma=1.0, lam=1.0, bessel=False, remax_whole_return=False, clip_ratio_c=3.0):
    def ref(e: Episode, x):
        r = F.verl_token_rewards(e.score, e.old, e.ref, e.mask, kl_coef_in_reward, "kl")
        adv = F.verl_advantages(estimator, r, e.mask, e.n, values=e.values, greedy=e.greedy, gamma=gamma, lam=lam)
        if bessel:  # documented: the harness whitens with the biased std, verl with the Bessel-corrected one
            n = e.mask.sum()
            adv = adv * (n / (n - 1)).sqrt()
        if remax_whole_return:  # documented: the harness gives every token the whole return
            adv = adv + (torch.cumsum(r, -1) - r) * e.mask
        pg = F.verl_policy_loss(policy_mode, e.old, x, adv * e.mask, e.mask, agg, clip_low, clip_high, clip_ratio_c)
        return F.verl_actor_loss(pg, x, e.ref, e.mask, agg, kl_loss_coef, "low_var_kl")
    return ref


def _trl_grpo(loss_type="dapo", epsilon=0.2, epsilon_high=None, level="token", scale_rewards="group"):
    def ref(e: Episode, x):
        adv = F.trl_grpo_advantages(e.score, e.n, scale_rewards)
        return F.trl_grpo_loss(x, e.old, e.ref, adv, e.mask, loss_type=loss_type, epsilon=epsilon,
                               epsilon_high=epsilon_high, importance_sampling_level=level, beta=0.0)
    return ref


def _trl_rloo(e: Episode, x):
    adv = F.trl_rloo_advantages(e.score, e.old, e.ref, e.mask, e.n, beta=0.05)
    return F.trl_rloo_loss(x, e.old, adv, e.mask, epsilon=0.2)


def _openrlhf(estimator, dual_clip=None, use_loss=False, kl_estimator="k1"):
    def ref(e: Episode, x):
        adv = F.openrlhf_advantages(estimator, e.score, e.old, e.ref, e.mask, e.n, values=e.values, gamma=1.0,
                                    lambd=1.0, kl_coef=0.01, kl_estimator=kl_estimator, use_loss=use_loss)
        pg = F.openrlhf_policy_loss(x, e.old, adv, e.mask, 0.2, 0.2, dual_clip)
        return F.openrlhf_actor_loss(pg, x, e.ref, e.mask, 0.01, kl_estimator, use_loss)
    return ref


REFERENCES = {
    # verl b178a3c: vanilla loss with clip_ratio 0.2 and clip_ratio_c 3, token-mean, ppo_epochs 1
    "verl_grpo": _verl("vanilla", "grpo", kl_loss_coef=0.001),
    "verl_ppo": _verl("vanilla", "gae", bessel=True),
    "verl_rloo": _verl("vanilla", "rloo", kl_coef_in_reward=0.001),
    "verl_remax": _verl("vanilla", "remax", kl_coef_in_reward=0.001, remax_whole_return=True),
    "verl_reinforce_plus_plus": _verl("vanilla", "reinforce_plus_plus", kl_coef_in_reward=0.001, bessel=True),
    "verl_reinforce_plus_plus_baseline": _verl("vanilla", "reinforce_plus_plus_baseline", kl_coef_in_reward=0.001,
                                               bessel=True),
    "verl_gspo": _verl("gspo", "grpo", agg="seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4),
    # verl's DAPO recipe script (recipe/dapo/run_dapo_qwen2.5_32b.sh): clip_ratio_c=10.0
    "verl_dapo": _verl("vanilla", "grpo", clip_high=0.28, clip_ratio_c=10.0),
    "verl_cispo": _verl("cispo", "grpo", clip_low=10.0, clip_high=0.2, kl_loss_coef=0.001),
    "verl_gmpo": _verl("geo_mean", "grpo", clip_low=0.4, clip_high=0.4),
    # TRL 1.16.0: GRPOConfig's defaults (loss_type="dapo", scale_rewards="group", beta 0, epsilon 0.2)
    "trl_grpo": _trl_grpo(),
    "trl_grpo_grpo": _trl_grpo("grpo"),
    "trl_grpo_bnpo": _trl_grpo("bnpo"),
    "trl_grpo_dr_grpo": _trl_grpo("dr_grpo"),
    "trl_grpo_cispo": _trl_grpo("cispo", epsilon_high=5.0),
    "trl_grpo_sapo": _trl_grpo("sapo"),
    "trl_gspo": _trl_grpo("grpo", epsilon=3e-4, epsilon_high=4e-4, level="sequence"),
    "trl_rloo": _trl_rloo,
    # OpenRLHF 3c3be62: train_ppo_ray.py's defaults (eps_clip 0.2, gamma 1, lambd 1, init_coef 0.01, k1 in the reward)
    "openrlhf_gae": _openrlhf("gae"),
    "openrlhf_reinforce": _openrlhf("reinforce"),
    "openrlhf_group_norm": _openrlhf("group_norm", use_loss=True, kl_estimator="k3"),
    "openrlhf_dual_clip": _openrlhf("gae", dual_clip=3.0),
    # Dr. GRPO (arXiv:2503.20783) as TRL implements it: loss_type="dr_grpo", scale_rewards="none", beta 0
    "dr_grpo": _trl_grpo("dr_grpo", scale_rewards="none"),
}
GRADIENT_ONLY_AT_RATIO_ONE = {"trl_rloo"}  # documented: TRL's sequence-ratio loss; equal gradient at ratio 1


# --------------------------------------------------------------------------- the harness, as an LM run goes

class TokenLearner:
    """The log-probs of the sampled tokens are the parameters (``[1, T, B]``): the update's gradient
    is d loss / d log pi per token (recorded by ``clip_grads``); values are the rollout's (constant)."""

    def __init__(self, logp: torch.Tensor, values: torch.Tensor | None):
        self.population = 1
        self.z = logp.clone().requires_grad_(True)
        self.params = [self.z]
        self.values = values
        self.grad = None

    def forward(self, inputs, idx, need_entropy):
        assert idx is None  # one minibatch
        return self.z, torch.zeros_like(self.z) if need_entropy else None, self.values

    def clip_grads(self, max_norm, per_network):
        self.grad = self.z.grad.detach().clone()
        return torch.linalg.vector_norm(self.grad).view(1, 1)


def recipe_cfg(name: str, *extra: str):
    return make_cfg(["task=lm_summarize", f"recipe={name}", *extra])


def harness_step(cfg, e: Episode):
    """One update of the recipe's config on the episode: ``(loss, d loss / d logp [B, T])``. Test mechanics
    only are overridden: one epoch of one minibatch (ratios are given), no value loss (not compared)."""
    spec = get_estimator(str(cfg.estimator))
    beta = float(cfg.kl.beta)
    src = SimpleNamespace(cfg=cfg, beta=beta, device=torch.device("cpu"), spec=spec)
    src._sequence_kl = lambda *a: LMSource._sequence_kl(src, *a)
    greedy = None
    if spec.needs_greedy:
        greedy = greedy_baseline(cfg, beta, e.greedy, lambda: pytest.fail("the greedy KL is not part of these recipes"))
    ro = Rollout(prompt_ids=None, prompt_mask=None, tokens=torch.zeros(B, T, dtype=torch.long), mask=e.mask,
                 old_logp=e.old, ref_logp=e.ref, values=e.values if spec.needs_critic else None, score=e.score,
                 reward=e.score, gold=e.score, has_eos=torch.ones(B, dtype=torch.bool), greedy_scores=greedy,
                 greedy_rewards=e.greedy, sampled_tokens=0, prompts_truncated=0)
    ab = LMSource.advantage_batch(src, ro)
    out = spec(ab, EstimatorParams.from_cfg(cfg))
    ub = LMSource.update_batch(src, ro, out.advantages, out.returns, ab.values)
    s = UpdateSettings.from_plan(RunPlan.of(cfg), norm_len=T)  # the LM passes lm.max_response_len: these tensors' T plays it
    s.epochs, s.minibatches, s.vf_coef = 1, 1, 0.0
    learner = TokenLearner(e.logp.T.unsqueeze(0), None if ub.returns is None else ub.old_values)
    opt = MemberOptimizer(learner.params, 1, lr=0.0)
    res = update(learner, opt, ub, s, Members([torch.Generator().manual_seed(0)], torch.ones(1, dtype=torch.bool),
                                              torch.zeros(1, dtype=torch.float64),
                                              torch.tensor([beta], dtype=torch.float64)))
    return float(res["loss"][0]), learner.grad[0].T


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the LM source's reward buffers follow the default dtype
    yield
    torch.set_default_dtype(old)


def _compare(name, cfg, seed):
    n = int(cfg.group_size)
    assert B % n == 0
    e = episode(seed, n, ratio_one=name in GRADIENT_ONLY_AT_RATIO_ONE)
    x = e.logp.clone().requires_grad_(True)
    want = REFERENCES[name](e, x)
    want.backward()
    loss, grad = harness_step(cfg, e)
    torch.testing.assert_close(grad * e.mask, x.grad * e.mask, rtol=1e-6, atol=1e-10)
    if name not in GRADIENT_ONLY_AT_RATIO_ONE:
        assert loss == pytest.approx(float(want.detach()), rel=1e-6, abs=1e-10)
    return e, loss, want


def test_every_recipe_has_a_reference():
    assert RECIPES and set(RECIPES) == set(REFERENCES)


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_recipe_matches_its_framework_loss_and_gradient(name, seed):
    assert name in REFERENCES, f"recipe {name} has no reference transcription in tests/test_recipes.py"
    _compare(name, recipe_cfg(name), seed)


def test_the_inputs_make_every_guard_act():
    """The episode is built so that the clamps the references carry change something."""
    e = episode(0, 8)
    assert float((e.logp - e.old).abs().max()) > 20  # policy log-ratio clamps (+-20)
    assert float(F.verl_kl_penalty(e.logp, e.ref, "low_var_kl").max()) == 10.0  # verl's k3 value clamp
    assert float(F.openrlhf_approx_kl(e.old, e.ref, "k1").abs().max()) == 10.0  # OpenRLHF's clamp in the reward
    assert float(F.openrlhf_approx_kl(e.logp, e.ref, "k3").max()) == 10.0  # ... and in the loss
    r = torch.exp(e.logp - e.old)
    assert bool(((r > 3.0) & (e.mask > 0)).any()) and bool(((r < 0.8) & (e.mask > 0)).any())  # dual clip, clip


@pytest.mark.parametrize("name,override", [
    ("verl_grpo", "clip_ratio_c=2.0"), ("verl_grpo", "loss_agg=seq_mean_token_mean"), ("verl_grpo", "kl.estimator=k3"),
    ("verl_cispo", "clip_eps_high=0.3"), ("openrlhf_gae", "kl.value_clamp=null"), ("openrlhf_gae", "log_ratio_clamp=null"),
    ("openrlhf_group_norm", "kl.value_clamp=null"), ("trl_grpo", "loss_agg=seq_mean_token_mean"),
    ("trl_grpo", "group_std_eps=1e-6"), ("verl_gspo", "clip_eps_high=1e-3"), ("verl_remax", "kl.beta=0.01"),
    ("trl_rloo", "kl.beta=0.04"), ("verl_ppo", "update=clip"), ("verl_gmpo", "loss_agg=token_mean"),
])
def test_a_changed_recipe_setting_fails_the_comparison(name, override):
    """The comparison sees each kind of setting: a recipe with one clip, aggregation, KL or guard
    value changed no longer matches its framework."""
    with pytest.raises(AssertionError):
        _compare(name, recipe_cfg(name, override), 0)


def test_verl_vanilla_loss_is_the_dual_clip():
    """One token, A = -1, r = 5 (issue 39): verl's vanilla loss 3.0 with gradient 0 (the dual clip's
    bound c A = -3), PPO's plain clip 5.0 with gradient 5.0; the harness's dual_clip is verl's."""
    from harness.losses import PolicyInputs, clipped_surrogate_loss, dual_clip_loss
    old, adv, mask = torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1)
    x = torch.full((1, 1), float(torch.log(torch.tensor(5.0))), requires_grad=True)
    verl = F.verl_policy_loss("vanilla", old, x, adv, mask)
    (g_verl,) = torch.autograd.grad(verl, x)
    assert float(verl.detach()) == pytest.approx(3.0) and float(g_verl) == 0.0
    for fn, loss_want, grad_want in ((dual_clip_loss, 3.0, 0.0), (clipped_surrogate_loss, 5.0, 5.0)):
        z = x.detach().clone().requires_grad_(True)
        loss, _ = fn(PolicyInputs(z, old, adv, mask))
        (g,) = torch.autograd.grad(loss, z)
        assert float(loss.detach()) == pytest.approx(loss_want) and float(g) == pytest.approx(grad_want)


def test_greedy_baseline_switch():
    """verl's ReMax baseline is the greedy reward alone (kl.greedy_penalty=false, the verl_remax recipe);
    the harness's default subtracts the greedy response's own KL penalty under kl.in_reward."""
    scores, kl = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])
    ours = make_cfg(["task=lm_summarize", "estimator=remax", "kl.in_reward=true", "kl.beta=0.5"])
    torch.testing.assert_close(greedy_baseline(ours, 0.5, scores, lambda: kl), torch.tensor([-0.5, -0.5]))
    verl = recipe_cfg("verl_remax")
    assert bool(verl.kl.in_reward) and float(verl.kl.beta) > 0 and verl.kl.greedy_penalty is False
    torch.testing.assert_close(greedy_baseline(verl, 0.001, scores, lambda: pytest.fail("not called")), scores)


@pytest.mark.parametrize("task", ["lm_summarize", "toy"])
def test_every_recipe_composes_and_validates(task):
    """``python -m harness task=<task> recipe=<name>`` passes validation for every recipe (the LM run
    itself builds its SFT pipeline first: run by hand, see the report)."""
    from harness.validation import validate
    for name in RECIPES:
        validate(make_cfg([f"task={task}", f"recipe={name}"]))


def test_a_recipe_wins_over_the_presets_and_the_command_line_over_the_recipe():
    # tuned/lm_summarize_grpo.yaml sets epochs 2; verl_grpo sets 1; a command-line value wins over both
    assert make_cfg(["task=lm_summarize", "estimator=grpo"]).epochs == 2
    assert recipe_cfg("verl_grpo").epochs == 1
    assert recipe_cfg("verl_grpo", "epochs=3").epochs == 3
    assert recipe_cfg("verl_grpo", "loss_type=grpo").loss_agg == "token_mean"  # a loss_type preset sits below
    assert make_cfg(["task=lm_summarize", "recipe=verl_rloo", "estimator=grpo"]).estimator == "grpo"


@pytest.mark.parametrize("overrides,message", [
    (["kl.value_clamp=0"], "kl.value_clamp must be a finite number > 0 or null (no clamp), got 0"),
    (["kl.log_ratio_clamp=-1"], "kl.log_ratio_clamp must be a finite number > 0 or null (no clamp), got -1"),
    (["group_std_eps=0"], "group_std_eps must be a finite number > 0, got 0"),
    (["update=clip", "log_ratio_clamp=0"], "log_ratio_clamp must be a finite number > 0 or null (no clamp), got 0.0"),
    (["update=dual_clip", "log_ratio_clamp=20"], "log_ratio_clamp must be null with update=dual_clip"),
])
def test_the_guards_are_validated(overrides, message):
    from harness.validation import validate
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(make_cfg(["task=toy", "estimator=grpo", *overrides]))


def test_new_fields_at_their_defaults_keep_the_run_folders():
    """A config with the guards at their defaults hashes as before they existed; away from them, differently."""
    from omegaconf import OmegaConf, open_dict

    from harness.io.rundir import config_hash
    cfg = make_cfg(["task=toy", "estimator=grpo"])
    before = OmegaConf.create(OmegaConf.to_container(cfg))
    with open_dict(before):
        for key in ("log_ratio_clamp", "value_clamp", "greedy_penalty"):
            before.kl.pop(key)
        before.pop("group_std_eps")
        before.pop("log_ratio_clamp")
    assert config_hash(cfg) == config_hash(before)
    for override in ("kl.value_clamp=10", "kl.greedy_penalty=false", "group_std_eps=1e-4", "log_ratio_clamp=20"):
        assert config_hash(make_cfg(["task=toy", "estimator=grpo", override])) != config_hash(cfg), override


# --------------------------------------------------------------------------- TRL's own code (the bench extra)

def _trl_trainer(loss_type, **args):
    """A GRPOTrainer built with object.__new__ and the attributes ``_compute_loss`` reads."""
    trl = pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer
    cfg_defaults = GRPOConfig.__dataclass_fields__
    t = object.__new__(GRPOTrainer)
    eps = args.get("epsilon", cfg_defaults["epsilon"].default)
    eps_high = args.get("epsilon_high", cfg_defaults["epsilon_high"].default)
    t.args = SimpleNamespace(delta=None, use_bias_correction_kl=True, sapo_temperature_pos=1.0,
                             sapo_temperature_neg=1.05, steps_per_generation=1)
    t.loss_type = loss_type
    t.epsilon_low, t.epsilon_high = eps, eps if eps_high is None else eps_high
    t.beta = 0.0
    t.importance_sampling_level = args.get("importance_sampling_level", "token")
    t.top_entropy_quantile, t.off_policy_mask_threshold = 1.0, None
    t.use_vllm, t.aux_loss_enabled, t._entropy_bonus_enabled = False, False, False
    t.current_gradient_accumulation_steps = 1
    t.max_completion_length = T
    t.model = SimpleNamespace(training=True)
    t.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                    reduce=lambda x, reduction=None: x)
    from collections import defaultdict
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return trl, t


@pytest.mark.parametrize("name,loss_type,args", [
    ("trl_grpo", "dapo", {}), ("trl_grpo_grpo", "grpo", {}), ("trl_grpo_bnpo", "bnpo", {}),
    ("trl_grpo_dr_grpo", "dr_grpo", {}), ("trl_grpo_cispo", "cispo", {"epsilon_high": 5.0}),
    ("trl_grpo_sapo", "sapo", {}),
    ("trl_gspo", "grpo", {"epsilon": 3e-4, "epsilon_high": 4e-4, "importance_sampling_level": "sequence"}),
])
def test_trl_recipes_match_trls_own_compute_loss(name, loss_type, args):
    """Where TRL is installed: GRPOTrainer._compute_loss itself (its per-token log-probs patched to return
    the given tensors) against the recipe's harness step, loss and gradient."""
    _, t = _trl_trainer(loss_type, **args)
    cfg = recipe_cfg(name)
    e = episode(0, int(cfg.group_size))
    x = e.logp.clone().requires_grad_(True)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (x, torch.zeros_like(x), None)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": e.mask,
              "advantages": F.trl_grpo_advantages(e.score, e.n), "old_per_token_logps": e.old,
              "num_items_in_batch": e.mask.sum()}
    want = t._compute_loss(None, inputs)
    want.backward()
    loss, grad = harness_step(cfg, e)
    torch.testing.assert_close(grad * e.mask, x.grad * e.mask, rtol=1e-6, atol=1e-10)
    assert loss == pytest.approx(float(want.detach()), rel=1e-6, abs=1e-10)


# --------------------------------------------------------------------------- the recipes train

TOY_BUDGET = ["budget.iterations=2", "eval_every=0", "progress=false"]


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_trains_on_the_toy_task(name, tmp_path):
    """``python -m harness task=toy recipe=<name>`` for two iterations, in-process: it completes with
    finite losses."""
    import pandas as pd

    from harness.app import run
    cfg = make_cfg(["task=toy", f"recipe={name}", f"results_dir={tmp_path}", *TOY_BUDGET])
    counts = run(cfg)
    assert counts.get("completed") == 1, counts
    df = pd.read_parquet(next(tmp_path.rglob("metrics.parquet")))
    loss = df["policy_loss"].dropna()
    assert len(loss) >= 2 and bool((loss.abs() < 1e6).all()) and bool(loss.map(math.isfinite).all())


def test_the_cli_takes_a_recipe(tmp_path):
    """One real command line: ``python -m harness task=toy recipe=verl_grpo`` (exit 0)."""
    proc = subprocess.run([sys.executable, "-m", "harness", "task=toy", "recipe=verl_grpo", f"results_dir={tmp_path}",
                           *TOY_BUDGET], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_trl_rloo_recipe_matches_rlootrainers_own_compute_loss_gradient():
    """Where TRL is installed: RLOOTrainer._compute_loss itself at ratio 1 (TRL's default single iteration;
    its sequence-ratio loss has no counterpart here, see the recipe) against the recipe's harness step:
    the same gradient per token."""
    pytest.importorskip("trl")
    from collections import defaultdict

    from trl import RLOOTrainer
    cfg = recipe_cfg("trl_rloo")
    e = episode(0, int(cfg.group_size), ratio_one=True)
    t = object.__new__(RLOOTrainer)
    t.epsilon_low, t.epsilon_high, t.aux_loss_enabled = 0.2, 0.2, False
    t.model = SimpleNamespace(training=True)
    t.accelerator = SimpleNamespace(gather=lambda x: x, gather_for_metrics=lambda x: x,
                                    reduce=lambda x, reduction=None: x)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    x = e.logp.clone().requires_grad_(True)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (x, torch.zeros_like(x), None)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": e.mask,
              "old_logps": (e.old * e.mask).sum(1),
              "advantages": F.trl_rloo_advantages(e.score, e.old, e.ref, e.mask, e.n, beta=0.05)}
    t._compute_loss(None, inputs).backward()
    _, grad = harness_step(cfg, e)
    torch.testing.assert_close(grad * e.mask, x.grad * e.mask, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("choice", ["recipe=../estimator/rloo", "recipe=[verl_grpo,trl_grpo]"])
def test_a_recipe_is_one_of_the_recipe_group(choice, tmp_path):
    """Hydra takes a path into another group (an estimator preset loaded as a recipe) and a list (two
    frameworks merged) as ``recipe``; the command refuses both: one line naming ``recipe`` and its
    options, exit 2, no run folder (Hydra's own job log only)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "harness", "task=cartpole", choice, "budget.iterations=1",
                          "results_dir=res", "progress=false"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("invalid config: recipe must be one of ['dr_grpo'"), lines
    assert "verl_grpo" in lines[0] and lines[0].endswith(f"got '{choice.split('=', 1)[1]}'")
    assert [p.name for p in (tmp_path / "res").iterdir()] == [".hydra"]
