"""``reference=sb3``: stable-baselines3's own PPO/A2C on a harness config (harness/reference/sb3.py).

What is checked against values worked out here: the translation of each setting (SB3's model
attributes after building it from a config), the refusals (one line naming the field, exit 2,
no run folder), the evaluation marks (the same env-step marks as the harness's own run), the run
folder (read by analysis.load like any other), and that a config without a reference keeps the
run folder it had before the field existed.
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
                  "vf_coef=0.6", "max_grad_norm=0.7", "vf_clip_eps=0.3", "task.hidden=[32,16]", "task.activation=relu",
                  "task.ortho_init=false", "normalize_advantages=none")
    validate(cfg)
    model, env, norm = _model(cfg)
    try:
        assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == (4, 16, 32, 3)  # 4*16/2
        assert (model.gamma, model.gae_lambda, model.ent_coef, model.max_grad_norm) == (0.97, 0.9, 0.01, 0.7)
        assert model.vf_coef == pytest.approx(0.3)  # SB3's value loss is the MSE, the harness's half of it
        assert model.clip_range(1.0) == 0.15 and model.clip_range_vf(1.0) == 0.3
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
        validate(cfg_for(override))
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
