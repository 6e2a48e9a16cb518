"""``reference=sb3``: stable-baselines3's own PPO/A2C on a harness config (harness/reference/sb3.py).

What is checked against values worked out here: the translation of each setting (SB3's model
attributes after building it from a config), the refusals (one line naming the field, exit 2,
no run folder), the evaluation marks (the same env-step marks as the harness's own run), the run
folder (read by analysis.load like any other), and that a config without a reference keeps the
run folder it had before the field existed. And the translation itself: from the same weights and
the same batch, one SB3 ``model.train()`` of the model the translation builds leaves the
parameters where the harness's update step leaves them (PPO and A2C, categorical and Gaussian
policies), with the two differences by construction stated as tests (SB3's Bessel-corrected
advantage std; its value clip, another loss, hence refused).
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from harness.app import run
from harness.io.rundir import config_hash, run_dir_for
from harness.validation import validate
from tests.control_helpers import TINY, make_cfg
from harness.plan import RunPlan

pytest.importorskip("stable_baselines3")

from harness.reference.sb3 import _model  # noqa: E402


def cfg_for(*overrides, tmp_path=None):
    base = ["task=cartpole", "estimator=ppo_gae", "reference=sb3", *TINY, "budget.iterations=null",
            "budget.env_steps=96", "threads=1"]
    if tmp_path is not None:
        base.append(f"results_dir={tmp_path}")
    return make_cfg([*base, *overrides])


def test_the_settings_are_translated_to_sb3s_ppo():
    cfg = cfg_for("task.num_envs=4", "task.rollout_steps=16", "minibatches=2", "epochs=3", "lr=0.002",
                  "anneal_lr=true", "gamma=0.97", "gae_lambda=0.9", "clip_eps=0.15", "ent_coef=0.01",
                  "vf_coef=0.6", "max_grad_norm=0.7", "task.hidden=[32,16]", "task.activation=relu",
                  "task.ortho_init=false", "normalize_advantages=none")
    validate(cfg)
    model, env, norm = _model(cfg)
    try:
        assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == (4, 16, 32, 3)  # 4*16/2
        assert (model.gamma, model.gae_lambda, model.ent_coef, model.max_grad_norm) == (0.97, 0.9, 0.01, 0.7)
        assert model.vf_coef == pytest.approx(0.3)  # SB3's value loss is the MSE, the harness's half of it
        assert model.clip_range(1.0) == 0.15 and model.clip_range_vf is None
        assert model.lr_schedule(0.25) == pytest.approx(0.0005)  # annealed: progress left x lr
        assert model.normalize_advantage is False
        assert model.policy.net_arch == {"pi": [32, 16], "vf": [32, 16]}
        assert model.policy.activation_fn is torch.nn.ReLU and model.policy.ortho_init is False
        assert isinstance(model.policy.optimizer, torch.optim.Adam)
        assert model.policy.optimizer.defaults["eps"] == 1e-5
        assert norm is None
    finally:
        env.close()


def test_a2c_is_sb3s_a2c_with_adam_and_the_rollouts_bootstrap():
    cfg = cfg_for("estimator=a2c", "task.rollout_steps=5", "n_steps=5", "grad_clip=joint", "lr=7e-4",
                  "anneal_lr=false")
    validate(cfg)
    model, env, _ = _model(cfg)
    try:
        assert type(model).__name__ == "A2C"
        assert (model.n_steps, model.gae_lambda, model.lr_schedule(0.5)) == (5, 1.0, 7e-4)
        assert isinstance(model.policy.optimizer, torch.optim.Adam)
        assert model.policy.optimizer.defaults["eps"] == 1e-5
    finally:
        env.close()


def test_normalisation_is_vecnormalize_with_the_tasks_clip():
    cfg = cfg_for("task.normalize_obs=true", "task.normalize_reward=true", "task.obs_clip=5.0", "gamma=0.9")
    model, env, norm = _model(cfg)
    try:
        assert norm is not None and norm.norm_obs and norm.norm_reward
        assert (norm.clip_obs, norm.clip_reward, norm.gamma) == (5.0, float("inf"), 0.9)
    finally:
        env.close()


@pytest.mark.parametrize("override, field", [
    ("reference=sb4", "reference"),
    ("task=toy", "reference"),
    ("estimator=grpo", "reference"),
    ("update=gspo", "update"),
    ("loss_agg=seq_mean_token_mean", "loss_agg"),
    ("clip_eps_high=0.3", "clip_eps_high"),
    ("vf_clip_eps=0.2", "vf_clip_eps"),
    ("estimator=a2c grad_clip=joint n_steps=8 vf_clip_eps=0.2", "vf_clip_eps"),
    ("kl.beta=0.1", "kl.beta"),
    ("grad_clip=per_network", "grad_clip"),
    ("normalize_advantages=batch", "normalize_advantages"),
    ("max_grad_norm=null", "max_grad_norm"),
    ("budget.iterations=3", "budget.iterations"),
    ("minibatches=3", "minibatches"),
    ("mode=probe", "reference"),
])
def test_what_sb3_cannot_do_is_refused_naming_the_field(override, field):
    with pytest.raises(ValueError) as e:
        validate(cfg_for(*override.split()))
    assert str(e.value).startswith(f"{field} must be ")


def test_a2c_needs_one_rollout_per_bootstrap():
    with pytest.raises(ValueError, match=r"^n_steps must be >= task.rollout_steps \(8\)"):
        validate(cfg_for("estimator=a2c", "n_steps=5", "grad_clip=joint"))


def test_the_cli_refuses_with_one_line_and_exit_2_before_any_folder(tmp_path):
    out = tmp_path / "res"
    p = subprocess.run([sys.executable, "-m", "harness", "task=cartpole", "reference=sb3", "update=gspo",
                        f"results_dir={out}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert (p.stdout + p.stderr).strip().splitlines() == [
        "invalid config: update must be 'clip' with reference=sb3 (SB3's PPO has no other), got 'gspo'"]
    assert not (out / "cartpole").exists()  # no run folder (Hydra keeps its job log under .hydra)


def test_without_a_reference_the_run_folder_is_the_one_it_had_before():
    cfg = cfg_for("reference=null")
    with_key = config_hash(cfg)
    before = OmegaConf.to_container(cfg)
    del before["reference"]  # a config written before the field existed
    assert config_hash(OmegaConf.create(before)) == with_key
    assert config_hash(cfg_for()) != with_key  # reference=sb3 is a different run


def test_a_reference_run_is_a_harness_run_folder_evaluated_at_the_same_marks(tmp_path):
    from analysis.load import load

    # Pendulum (episodes of 200 steps: none ends within the budget, so every step of both sides is a
    # transition): 2 envs x 8 steps = 16 env steps per iteration, 96 in all; evaluations where the
    # steps cross a multiple of 40 (48, 80) and at the end (96), on both sides
    common = ["task=pendulum", "task.max_episode_steps=null", "eval_every=0", "eval_every_steps=40",
              "eval_episodes=2"]
    counts = run(cfg_for(*common, tmp_path=tmp_path))
    assert counts.get("completed") == 1
    assert run(cfg_for("reference=null", *common, tmp_path=tmp_path)).get("completed") == 1
    df = load(tmp_path)
    assert len(df.attrs.get("left_out", [])) == 0
    sides = {rd.split("/")[-1]: g for rd, g in df.groupby("run_dir")}
    assert len(sides) == 2
    for g in sides.values():
        assert g.env_steps.tolist() == [16, 32, 48, 64, 80, 96]
        assert g.dropna(subset=["eval_return"]).env_steps.tolist() == [48, 80, 96]
        assert (g.status == "completed").all() and g.task.iloc[0] == "pendulum"
    sb3_dir = run_dir_for(cfg_for(*common, tmp_path=tmp_path))
    assert (sb3_dir / "summary.json").exists()


# --------------------------------------------------------------------------- the translation itself
# One update on each side from the same weights and the same batch: SB3's own ``model.train()`` on
# the model the translation built (``_model``), the harness's update step (harness.train.update.update)
# with the learner, settings and optimizer its control trainer builds (ControlSource, Loop) for the same
# config. Both run in float32; what remains between them is rounding in the forward/backward passes and
# in Adam (fused here, foreach in SB3): at most 6e-6 x lr measured; the tolerance, 1e-4 x lr, is far above it
# and far below what a mistranslated coefficient, clip or normalisation moves: SB3's vf_coef not
# halved moves a parameter 0.1-0.3 x lr away, normalisation switched 0.7-3.9 x lr, the clip range x 1.5
# 2.3-3.1 x lr (PPO), the harness's own whitening (its plain std, below) 0.007 x lr in the first case.

def _harness_layout(policy, agent) -> dict[str, torch.Tensor]:
    """SB3's ``ActorCriticPolicy`` weights in the layout of the harness's ``ControlAgent`` (one
    member), by parameter name. Actor row 0 of each ``PopulationMLP`` layer: SB3's
    ``mlp_extractor.policy_net`` linears, then ``action_net``; critic row 1: ``mlp_extractor.value_net``
    linears, then ``value_net`` into output column 0 (the critic's other columns, unused by the
    harness, are 0; their gradient is 0, so Adam leaves them there). ``torch.nn.Linear`` keeps
    ``[out, in]``, the harness ``[in, out]``; SB3's ``log_std [A]`` is the harness's ``[1, 1, A]``."""
    linears = lambda seq: [m for m in seq if isinstance(m, torch.nn.Linear)]  # noqa: E731
    actor = linears(policy.mlp_extractor.policy_net) + [policy.action_net]
    critic = linears(policy.mlp_extractor.value_net) + [policy.value_net]
    out = {}
    for i, (a, c) in enumerate(zip(actor, critic, strict=True)):
        w, b = torch.zeros_like(agent.net.weights[i]), torch.zeros_like(agent.net.biases[i])
        w[0, :, :a.out_features], b[0, 0, :a.out_features] = a.weight.detach().T, a.bias.detach()
        w[1, :, :c.out_features], b[1, 0, :c.out_features] = c.weight.detach().T, c.bias.detach()
        out[f"net.weights.{i}"], out[f"net.biases.{i}"] = w, b
    if agent.log_std is not None:
        out["log_std"] = policy.log_std.detach().view(1, 1, -1).clone()
    assert set(out) == {n for n, _ in agent.named_parameters()}
    return out


def _sb3_normalised(adv: torch.Tensor) -> torch.Tensor:
    """SB3's advantage normalisation, transcribed (stable-baselines3 2.9.2, ppo/ppo.py ``train`` and
    a2c/a2c.py ``train``): ``(advantages - advantages.mean()) / (advantages.std() + 1e-8)``, torch's
    ``std``: Bessel-corrected (divides by n - 1)."""
    return (adv - adv.mean()) / (adv.std() + 1e-8)


def _one_update_both_sides(overrides, seed=7):
    """Build both sides for ``cfg_for(*overrides)``, copy SB3's initial weights into the harness's
    agent, give both one batch (random observations and actions; old log-probs and old values the
    current ones plus noise, so that ratios leave the clip range; advantages with a nonzero mean;
    returns off the values), run one update on each. SB3's rollout buffer is filled directly (so
    neither side's GAE enters) in an order such that its shuffled minibatches hold the harness's.
    With advantage normalisation on, the harness is given SB3's normalised advantages and no
    normalisation of its own (:func:`_sb3_normalised`; the difference is
    ``test_sb3_normalises_advantages_with_the_bessel_corrected_std``); one minibatch then, where
    SB3 normalises the batch. Returns ``(cfg, start, harness's, SB3's parameters, harness stats, SB3's logged)``."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np
    from stable_baselines3.common.logger import Logger

    from harness.tasks.control import Rollout
    from harness.train.control import ControlSource
    from harness.train.loop import Loop
    from harness.train.update import Members, update

    cfg = cfg_for(*overrides)
    validate(cfg)
    model, env, _ = _model(cfg)
    env.close()
    runs = [SimpleNamespace(cfg=cfg)]  # what ControlSource and Loop read of a RunDir
    source = ControlSource(RunPlan.of(cfg), runs)
    source.close()
    loop = Loop(RunPlan.of(cfg), source, runs)
    agent, info = source.agent, source.info
    with torch.no_grad():
        for name, prm in agent.named_parameters():
            prm.copy_(_harness_layout(model.policy, agent)[name])

    T, N = int(cfg.task.rollout_steps), int(cfg.task.num_envs)
    B = T * N
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, 1, N, info.obs_dim, generator=g)
    act = (torch.randint(0, info.act_dim, (T, 1, N), generator=g) if info.discrete
           else torch.randn(T, 1, N, info.act_dim, generator=g))
    flat_obs, flat_act = obs.reshape(B, -1), act.reshape(B, *act.shape[3:])  # the harness's order (P = 1)
    with torch.no_grad():  # the mapping: the same policy and value on these observations
        values, logp, entropy = model.policy.evaluate_actions(flat_obs, flat_act)
        h_logp, h_entropy, h_values = source.learner.forward((flat_obs[None], flat_act[None]), None, True)
    values = values.flatten()
    for ours, theirs in ((h_logp, logp), (h_entropy, entropy), (h_values, values)):
        torch.testing.assert_close(ours.reshape(B), theirs, rtol=1e-5, atol=1e-6)
    old_logp = logp + 0.3 * torch.randn(B, generator=g)
    old_values = values + 0.5 * torch.randn(B, generator=g)
    returns = values + torch.randn(B, generator=g)
    adv = 0.5 + torch.randn(B, generator=g)
    tn = lambda x: x.reshape(T, 1, N)  # noqa: E731  (time-major, as the rollout)
    zeros = torch.zeros(T, 1, N)
    ro = Rollout(obs, obs, act, tn(old_logp), zeros, zeros, zeros, torch.ones(T, 1, N), [[]], torch.tensor([float(B)]))
    ub = source.update_batch(ro, tn(adv), tn(returns), tn(old_values))
    assert torch.equal(ub.inputs[0][0], flat_obs) and torch.equal(ub.adv[0, 0], adv)
    settings = loop.settings
    if cfg.normalize_advantages != "none":
        assert int(cfg.minibatches) == 1
        settings = dataclasses.replace(settings, normalize="none")
        ub.adv = _sb3_normalised(ub.adv)

    # minibatch order: the harness's i-th minibatch is perm_h[i*m:(i+1)*m] (torch.randperm from its
    # generator, drawn only with several minibatches), SB3's perm_s[...] (np.random.permutation at the
    # start of each epoch): put sample perm_h[j] at SB3's slot perm_s[j]
    gens = source.shuffle_generators()
    if int(cfg.minibatches) > 1:
        assert int(cfg.epochs) == 1  # one order for one epoch
        peek = torch.Generator()
        peek.set_state(gens[0].get_state())
        perm_h = torch.randperm(B, generator=peek).numpy()
    else:
        perm_h = np.arange(B)
    np.random.seed(seed)
    perm_s = np.random.permutation(B)
    rb = model.rollout_buffer
    assert (rb.buffer_size, rb.n_envs) == (T, N)
    for name, x in (("observations", flat_obs), ("actions", flat_act.float().reshape(B, -1)),
                    ("log_probs", old_logp), ("values", old_values), ("advantages", adv), ("returns", returns)):
        x = x.numpy().astype(np.float32).reshape(B, -1)
        y = np.empty_like(x)
        y[perm_s] = x[perm_h]
        setattr(rb, name, y)
    rb.full = rb.generator_ready = True  # already flat: SB3's get() skips its swap_and_flatten
    model.set_logger(Logger(None, []))

    start = {n: p.detach().clone() for n, p in agent.named_parameters()}
    stats = update(loop.learner, loop.opt, ub, settings, Members(gens, loop.active, loop.member_lr(), loop.kl_beta))
    np.random.seed(seed)
    model.train()
    ours = {n: p.detach().clone() for n, p in agent.named_parameters()}
    return cfg, start, ours, _harness_layout(model.policy, agent), stats, dict(model.logger.name_to_value)


ONE_UPDATE = ["task.num_envs=2", "task.rollout_steps=16", "anneal_lr=false", "lr=0.01", "ent_coef=0.01",
              "vf_coef=0.6"]


@pytest.mark.parametrize("overrides", [
    # two epochs of one minibatch: the second with ratios moved by the first; SB3's normalisation
    ["estimator=ppo_gae", *ONE_UPDATE, "clip_eps=0.1", "epochs=2", "minibatches=1", "normalize_advantages=minibatch",
     "max_grad_norm=0.5"],
    # two minibatches in the same order on both sides; gradient clipping acting (a norm of about 1)
    ["estimator=ppo_gae", *ONE_UPDATE, "epochs=1", "minibatches=2", "normalize_advantages=none",
     "max_grad_norm=0.05", "clip_eps=0.2"],
    # the Gaussian policy and its log-std
    ["estimator=ppo_gae", "task=pendulum", *ONE_UPDATE, "clip_eps=0.1", "epochs=2", "minibatches=1",
     "normalize_advantages=none",
     "max_grad_norm=0.5", "task.init_log_std=-0.5"],
    # A2C's one step; clipped to a norm far below Adam's eps x sqrt(#parameters), so that Adam's first step is
    # about lr x gradient / eps, not lr x its sign, and a coefficient's scale shows in it
    ["estimator=a2c", *ONE_UPDATE, "n_steps=16", "grad_clip=joint", "max_grad_norm=1e-4"],
    ["estimator=a2c", "task=pendulum", *ONE_UPDATE, "n_steps=16", "grad_clip=joint", "max_grad_norm=1e-4",
     "normalize_advantages=batch", "task.init_log_std=-0.5"],
], ids=["ppo_cartpole_2_epochs", "ppo_cartpole_2_minibatches", "ppo_pendulum", "a2c_cartpole",
        "a2c_pendulum_normalised"])
def test_sb3_update_through_the_translation_is_the_harness_update(overrides):
    torch.manual_seed(0)
    cfg, start, ours, theirs, stats, logged = _one_update_both_sides(overrides)
    lr = float(cfg.lr)
    moved = max(float((ours[n] - start[n]).abs().max()) for n in start)
    assert moved > 0.1 * lr  # the step did something (Adam's first step moves a weight by up to lr)
    worst = max(float((ours[n] - theirs[n]).abs().max()) for n in start)
    assert worst < 1e-4 * lr, (worst, moved)
    # the losses: SB3 logs the mean over every minibatch of every epoch (train/loss: the last
    # minibatch's), the harness the last epoch's mean; its value loss is half SB3's (the MSE)
    stat = lambda k: float(stats[k][0])  # noqa: E731
    close = lambda a, b: a == pytest.approx(b, rel=1e-5, abs=1e-6)  # noqa: E731
    if cfg.estimator == "a2c":
        assert close(stat("policy_loss"), logged["train/policy_loss"])
        assert close(2 * stat("value_loss"), logged["train/value_loss"])
        assert close(stat("entropy"), -logged["train/entropy_loss"])
    else:
        if int(cfg.minibatches) == 1:  # the whole objective: vf_coef and ent_coef as the harness means them
            assert close(stat("loss"), logged["train/loss"])
        if int(cfg.epochs) == 1:
            assert close(stat("policy_loss"), logged["train/policy_gradient_loss"])
            assert close(2 * stat("value_loss"), logged["train/value_loss"])
            assert close(stat("entropy"), -logged["train/entropy_loss"])


def test_sb3_normalises_advantages_with_the_bessel_corrected_std():
    """The one difference in advantage normalisation, by construction (SB3 has no other): SB3's
    normalised advantages (:func:`_sb3_normalised`) are the harness's (``harness.losses.whiten``)
    times sqrt((n - 1) / n), up to the 1e-8 in both denominators. The update test above gives the
    harness SB3's normalised advantages for that reason."""
    from harness.losses import whiten

    adv = torch.tensor([1.0, 2.0, 4.0, 9.0])  # mean 4, squared deviations 9 + 4 + 0 + 25 = 38
    ours = whiten(adv.view(1, 1, 4), torch.ones(1, 1, 4)).view(4)
    torch.testing.assert_close(ours, (adv - 4.0) / (38.0 / 4) ** 0.5)
    torch.testing.assert_close(_sb3_normalised(adv), (adv - 4.0) / (38.0 / 3) ** 0.5)
    torch.testing.assert_close(_sb3_normalised(adv), ours * (3 / 4) ** 0.5)


def test_sb3s_value_clip_is_another_loss_so_vf_clip_eps_is_refused():
    """SB3 (2.9.2, ppo/ppo.py ``train``) regresses the clipped prediction alone,
    ``F.mse_loss(R, V_old + clamp(V - V_old, -c, c))``; the harness's ``vf_clip_eps`` takes the larger
    of the clipped and unclipped errors (PPO2's). V = 1, V_old = 0, R = 0, c = 0.2 by hand: SB3
    0.2^2 = 0.04 (so 0.02 on the harness's half-MSE scale), the harness 0.5 x max(1, 0.04) = 0.5."""
    from harness.losses import value_loss

    ones = torch.ones(1, 1, 1)
    ours, _ = value_loss(ones, 0 * ones, ones, old_values=0 * ones, clip_eps=0.2)
    sb3 = torch.nn.functional.mse_loss(torch.zeros(1), torch.zeros(1) + torch.clamp(torch.ones(1), -0.2, 0.2))
    assert float(ours) == pytest.approx(0.5) and float(sb3) / 2 == pytest.approx(0.02)
    with pytest.raises(ValueError, match=r"^vf_clip_eps must be None with reference=sb3"):
        validate(cfg_for("vf_clip_eps=0.2"))


def test_a_reference_run_leaves_no_folder_in_the_temp_dir(tmp_path, monkeypatch):
    """SB3 left to itself makes an empty ``SB3-<time>`` folder in the temp dir for every run
    (its default logger, which writes nothing there); a reference run leaves nothing behind."""
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for overrides in (["estimator=ppo_gae"], ["estimator=a2c", "task.rollout_steps=4", "n_steps=4", "grad_clip=joint"]):
        assert run(cfg_for(*overrides, tmp_path=tmp_path / "results")).get("completed") == 1
    assert [p.name for p in temp.iterdir() if p.name.startswith("SB3-")] == []  # (torch keeps its inductor cache there)
