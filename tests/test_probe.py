"""Gradient probes: statistics with known answers, bias detection on the toy task, output schema."""
import numpy as np
import pandas as pd
import pytest
import torch

from harness.app import run
from harness.estimators import EstimatorParams, get_estimator
from harness.probes import ProbeSettings, probe_toy
from harness.probes import stats as pstats
from harness.tasks.toy import PRESETS, ToyTask
from tests.control_helpers import make_cfg

torch.set_num_threads(1)


def _probe(name, task=None, theta=None, seed=0, M=1000, B=32, k=4, lam=0.95, std=True, **kw):
    task = task or ToyTask(PRESETS["mixed"])
    theta = task.init_logits() if theta is None else theta
    s = ProbeSettings(batches=M, reps=400, **kw)
    return probe_toy(task, theta, get_estimator(name), EstimatorParams(gamma=1.0, gae_lambda=lam, std_normalize=std),
                     settings=s, batch_size=B, group_size=k, seed=seed)


def _all(res):
    return next(r for r in res.rows if r["scope"] == "all")


def test_summary_statistics_recover_a_known_bias_and_variance():
    rng = np.random.default_rng(0)
    M, D = 4000, 20
    truth = np.ones(D)
    bias = np.zeros(D)
    bias[0] = 0.5  # ||bias||^2 = 0.25; Sigma = 4 I -> tr = 80
    G = truth + bias + 2.0 * rng.standard_normal((M, D))
    out = pstats.gradient_summary(G, truth, pstats.resample_weights(M, 500, 1))
    assert out["total_var_low"] < 80 < out["total_var_high"]
    assert out["bias_sq_low"] < 0.25 < out["bias_sq_high"]
    assert out["weight"] == pytest.approx(1 + 0.5 / D, abs=0.02)
    unbiased = pstats.gradient_summary(truth + 2.0 * rng.standard_normal((M, D)), truth,
                                       pstats.resample_weights(M, 500, 2))
    assert unbiased["bias_sq_low"] < 0 < unbiased["bias_sq_high"]


def test_reinforce_and_rloo_bias_intervals_contain_zero_and_a_biased_baseline_is_detected():
    for name in ("reinforce", "rloo"):
        r = _all(_probe(name))
        assert r["rel_bias_sq_low"] < 0 < r["rel_bias_sq_high"], (name, r["rel_bias_sq_low"], r["rel_bias_sq_high"])
    biased = _all(_probe("reinforce", negative_control=True))  # baseline 0.5 * [a_t == 0]: depends on the action
    assert biased["label"] == "reinforce+action_baseline"
    assert biased["rel_bias_sq_low"] > 0.1
    dr = _all(_probe("dr_grpo", M=2000, k=4))  # group mean including itself: E = (k-1)/k grad J
    assert dr["weight_high"] < 1.0 and dr["rel_bias_sq_low"] > 0
    assert dr["weight"] == pytest.approx(0.75, abs=0.05)


def test_c3_baseline_lowers_variance_on_common_random_numbers():
    rf, bl = _probe("reinforce"), _probe("baseline")
    # same seed, same layout: the same sampled sequences (common random numbers)
    assert np.array_equal(rf.batches.query("scope == 'all'")["value_est"], bl.batches.query("scope == 'all'")["value_est"])
    num = bl.batches.query("scope == 'all'")["dev_sq"].to_numpy()
    den = rf.batches.query("scope == 'all'")["dev_sq"].to_numpy()
    ratio, lo, hi = pstats.ratio_of_means_interval(num, den, reps=400)
    assert hi < 1.0 and ratio == pytest.approx(_all(bl)["total_var"] / _all(rf)["total_var"])
    b = _all(bl)
    assert b["rel_bias_sq_low"] < 0 < b["rel_bias_sq_high"]
    assert b["critic"] == "fitted" and b["critic_rmse"] < 0.1


def test_gae_lambda_zero_with_the_exact_critic_is_the_true_advantage():
    r = _all(_probe("ppo_gae", lam=0.0, critic="exact"))
    assert r["adv_mse"] < 1e-20
    noisy = _all(_probe("ppo_gae", lam=0.0, critic="noisy", critic_noise=0.3))
    assert noisy["rel_bias_sq_low"] > 0  # a wrong critic at lambda = 0 biases the gradient (C5)


def test_kl_probe_k1_k3_values_unbiased_k2_biased_k3_gradient_biased():
    task = ToyTask(PRESETS["mixed"])
    theta = task.init_logits(scale=0.5, seed=4)
    out = {}
    for k in ("k1", "k2", "k3"):
        s = ProbeSettings(batches=1000, reps=400, target="kl")
        out[k] = _all(probe_toy(task, theta, get_estimator("reinforce"), EstimatorParams(), settings=s,
                                batch_size=32, group_size=4, seed=0, kl_name=k))
    for k in ("k1", "k3"):
        assert out[k]["value_bias_low"] < 0 < out[k]["value_bias_high"], k
    assert not out["k2"]["value_bias_low"] < 0 < out["k2"]["value_bias_high"]
    assert out["k3"]["value_var"] < out["k1"]["value_var"]
    assert out["k3"]["rel_bias_sq_low"] > 0  # k3 in the loss does not give grad KL
    assert out["k3"]["label"] == "kl_k3"


def test_importance_weights_keep_the_mean_and_grow_the_variance():
    task = ToyTask(PRESETS["bandit"])
    theta = task.init_logits(scale=0.5, seed=1)
    rows = {}
    for shift in (0.0, 1.5):
        s = ProbeSettings(batches=1000, reps=400, target="importance", proposal_shift=shift)
        rows[shift] = _all(probe_toy(task, theta, get_estimator("reinforce"), EstimatorParams(gamma=1.0),
                                     settings=s, batch_size=32, group_size=4, seed=0))
    assert rows[0.0]["is_weight_m2"] == pytest.approx(1.0)
    assert rows[1.5]["is_weight_m2"] > 1.2
    for r in rows.values():
        assert r["value_bias_low"] < 0 < r["value_bias_high"]
        assert r["rel_bias_sq_low"] < 0 < r["rel_bias_sq_high"]
    assert rows[1.5]["total_var"] > rows[0.0]["total_var"]


def test_probe_mode_writes_the_parquet_schema(tmp_path):
    cfg = make_cfg(["task=toy", "estimator=rloo", "mode=probe", "++probe.batches=100", "++probe.reps=50",
                    "task.episodes_per_iter=16", "group_size=4", f"results_dir={tmp_path}", "progress=false"])
    assert run(cfg).get("completed") == 1
    run_dir = next(tmp_path.glob("toy/rloo/*"))
    df = pd.read_parquet(run_dir / "probe.parquet")
    assert df["scope"].tolist() == ["all", "prompt0", "prompt1", "prompt2", "prompt3"]
    for col in ("run_id", "task", "estimator", "seed", "label", "target", "batches", "batch_size",
                "samples_per_batch", "truth", "bias_sq", "bias_sq_low", "bias_sq_high", "rel_bias_sq",
                "total_var", "total_var_low", "total_var_high", "cos", "cos_low", "cos_high", "snr", "snr_low",
                "snr_high", "weight", "true_grad_norm", "critic", "critic_rmse", "value_bias", "policy"):
        assert col in df.columns, col
    assert df.loc[0, "truth"] == "exact" and df.loc[0, "batches"] == 100
    b = pd.read_parquet(run_dir / "probe_batches.parquet")
    assert len(b) == 5 * 100 and {"batch", "scope", "dev_sq", "err_proj", "cos_true", "label"} <= set(b.columns)
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["mode"] == "probe"
    # a rerun skips the finished probe
    assert run(cfg) == {"skipped": 1}


def test_probe_from_a_training_checkpoint(tmp_path):
    train_cfg = make_cfg(["task=toy", "estimator=rloo", "budget.iterations=20", "lr=0.1", "progress=false",
                          f"results_dir={tmp_path}/train"])
    run(train_cfg)
    ck_dir = next((tmp_path / "train").glob("toy/rloo/*"))
    cfg = make_cfg(["task=toy", "estimator=reinforce", "mode=probe", "++probe.batches=100", "++probe.reps=50",
                    f"++probe.checkpoint={ck_dir}", f"results_dir={tmp_path}/probe", "progress=false"])
    assert run(cfg).get("completed") == 1
    df = pd.read_parquet(next((tmp_path / "probe").glob("toy/reinforce/*/probe.parquet")))
    assert df.loc[0, "policy"].startswith("checkpoint:")
    last_J = pd.read_parquet(ck_dir / "metrics.parquet")["eval_return"].iloc[-1]
    assert df.loc[0, "value_true"] == pytest.approx(last_J)


def test_probe_refuses_bad_settings():
    from harness.probes import validate_probe

    with pytest.raises(ValueError, match="probe.batches"):
        validate_probe(make_cfg(["task=toy", "estimator=rloo", "mode=probe", "++probe.batches=7"]))
    with pytest.raises(ValueError, match="unknown keys"):
        validate_probe(make_cfg(["task=toy", "estimator=rloo", "mode=probe", "++probe.batchez=8"]))
    with pytest.raises(ValueError, match="whole-episode"):
        validate_probe(make_cfg(["task=cartpole", "estimator=ppo_gae", "mode=probe"]))


def test_control_probe_on_cartpole_writes_a_reference_based_summary(tmp_path):
    from harness.app import run as run_probe  # mode=probe is in base

    base = ["task=cartpole", "mode=probe", "++probe.batches=8", "++probe.reference_batches=16", "++probe.reps=50",
            "++probe.critic_episodes=16", "gamma=1.0", "normalize_advantages=none", "task.episodes_per_iter=4",
            "group_size=2", "task.hidden=[16]", f"results_dir={tmp_path}", "progress=false"]
    for est in ("reinforce", "baseline"):
        assert run_probe(make_cfg(base + [f"estimator={est}"])).get("completed") == 1
    rows = {p.parent.parent.name: pd.read_parquet(p).iloc[0] for p in tmp_path.glob("cartpole/*/*/probe.parquet")}
    assert rows["reinforce"]["truth"] == "reference" and rows["reinforce"]["reference_batches"] == 16
    assert np.isfinite(rows["baseline"]["critic_ev"]) and rows["baseline"]["total_var"] > 0
    b = {p.parent.parent.name: pd.read_parquet(p) for p in tmp_path.glob("cartpole/*/*/probe_batches.parquet")}
    # the same seeds and layout: both estimators saw the same episodes (common random numbers)
    assert np.array_equal(b["reinforce"]["value_est"], b["baseline"]["value_est"])

