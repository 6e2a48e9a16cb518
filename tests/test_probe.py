"""Gradient probes: statistics with known answers, bias detection on the toy task, output schema."""
import numpy as np
import pandas as pd
import pytest
import torch

from harness.app import run
from harness.estimators import EstimatorParams, get_estimator
from harness.probes import ProbeSettings, probe_toy
from harness.probes.toy import ProbeTraining
from harness.probes import stats as pstats
from harness.tasks.toy import PRESETS, ToyTask
from tests.control_helpers import make_cfg

torch.set_num_threads(1)


def _probe(name, task=None, theta=None, seed=0, M=1000, B=32, k=4, lam=0.95, std=True, **kw):
    task = task or ToyTask(PRESETS["mixed"])
    theta = task.init_logits() if theta is None else theta
    s = ProbeSettings(batches=M, reps=400, **kw)
    return probe_toy(task, theta, get_estimator(name), EstimatorParams(gamma=1.0, gae_lambda=lam, std_normalize=std),
                     settings=s, training=ProbeTraining(batch_size=B, group_size=k, seed=seed))


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
                                training=ProbeTraining(batch_size=32, group_size=4, seed=0, kl_name=k)))
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
                                     settings=s, training=ProbeTraining(batch_size=32, group_size=4, seed=0)))
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
    for col in ("adv_within_std_se", "weight_se", "rel_bias_sq_se", "value_bias_se"):
        assert np.isfinite(rows["baseline"][col]) and rows["baseline"][col] >= 0, col
    b = {p.parent.parent.name: pd.read_parquet(p) for p in tmp_path.glob("cartpole/*/*/probe_batches.parquet")}
    # the same seeds and layout: both estimators saw the same episodes (common random numbers)
    assert np.array_equal(b["reinforce"]["value_est"], b["baseline"]["value_est"])



# ----------------------------------------------------------------------------- standard errors (_se)

def test_se_columns_are_the_sample_std_of_the_bootstrap_replicates():
    rng = np.random.default_rng(3)
    M, D = 4000, 12
    truth = rng.standard_normal(D)
    G = 0.9 * truth + 1.5 * rng.standard_normal((M, D))
    W = pstats.resample_weights(M, 800, 5)
    out = pstats.gradient_summary(G, truth, W)
    tn2 = truth @ truth
    gbar_r = W @ G / M  # worked out here, independently of gradient_summary
    weight_r = gbar_r @ truth / tn2
    assert out["weight_se"] == pytest.approx(np.std(weight_r, ddof=1), rel=1e-10)
    tr_r = (W @ (G**2).sum(1) / M - (gbar_r**2).sum(1)) * M / (M - 1)
    assert out["total_var_se"] == pytest.approx(np.std(tr_r, ddof=1), rel=1e-10)
    for name in ("bias_sq", "total_var", "mean_sq"):
        assert out[f"rel_{name}_se"] == pytest.approx(out[f"{name}_se"] / tn2, rel=1e-12)
    for name in ("total_var", "bias_sq", "snr", "cos", "weight", "cos_exp", "mean_sq"):
        assert np.isfinite(out[f"{name}_se"]) and out[f"{name}_se"] > 0, name
    # sanity, not the main check: at this M the normal interval is close to the percentile one
    for name in ("weight", "total_var", "bias_sq"):
        lo, hi = out[f"{name}_low"], out[f"{name}_high"]
        z = 1.959963984540054 * out[f"{name}_se"]
        assert abs(out[name] - z - lo) < 0.1 * (hi - lo) and abs(out[name] + z - hi) < 0.1 * (hi - lo), name
    values = G[:, 0]
    v = pstats.value_summary(values, 0.0, W)
    assert v["value_bias_se"] == pytest.approx(np.std(W @ values / M, ddof=1), rel=1e-10)
    assert np.isfinite(v["value_var_se"])
    assert np.isnan(pstats.bootstrap_se(np.array([1.0, np.nan, np.inf])))
    assert pstats.bootstrap_se(np.array([1.0, np.nan, 3.0])) == pytest.approx(np.sqrt(2.0))


def test_toy_probe_per_batch_extras_and_directions_carry_a_standard_error():
    task = ToyTask(PRESETS["varlen"])  # binary rewards: probe.arcsin applies
    M, reps, seed = 200, 400, 0
    s = ProbeSettings(batches=M, reps=reps, arcsin=True)
    res = probe_toy(task, task.init_logits(), get_estimator("grpo"), EstimatorParams(gamma=1.0), settings=s,
                    training=ProbeTraining(batch_size=32, group_size=4, seed=seed))
    r = _all(res)
    W = pstats.resample_weights(M, reps, seed=seed + 7)  # the probe's resampling
    b = res.batches.query("scope == 'all'")
    for name in ("adv_mse", "adv_within_std"):
        assert r[f"{name}_se"] == pytest.approx(np.std(W @ b[name].to_numpy() / M, ddof=1), rel=1e-10), name
    for x in ("", "_low", "_high", "_se"):
        assert r[f"cos_linear{x}"] == r[f"cos_exp{x}"]
    assert np.isfinite(r["cos_arcsin_se"]) and np.isfinite(r["cos_arcsin_gap_se"])


# ----------------------------------------------------------------------------- probe.truth_scale (C24)

def _enumerated_rtg_moments(task, theta, gamma):
    """Token-weighted mean and std of the reward-to-go, walking the response tree from each root."""
    probs = torch.softmax(theta, -1).numpy()
    child, leaf_of, R = task.child.numpy(), task.leaf_of.numpy(), task.leaf_reward.numpy()
    weights, rtg = [], []

    def walk(state, p, depth):
        for a in range(task.spec.vocab):
            q = p * probs[state, a]
            if leaf_of[state, a] >= 0:  # the response ends after depth + 1 tokens
                n = depth + 1
                for t in range(n):
                    weights.append(q)
                    rtg.append(gamma ** (n - 1 - t) * R[leaf_of[state, a]])
            else:
                walk(child[state, a], q, depth + 1)

    for root in task.root.numpy():
        walk(root, 1.0 / task.n_prompts, 0)
    w, g = np.array(weights), np.array(rtg)
    mean = (w * g).sum() / w.sum()
    return mean, np.sqrt((w * (g - mean) ** 2).sum() / w.sum())


@pytest.mark.parametrize("preset", ["tiny", "varlen", "mixed"])
def test_reward_to_go_moments_match_an_enumeration_of_the_tokens(preset):
    task = ToyTask(PRESETS[preset])
    theta = task.init_logits(scale=1.0, seed=3)
    for gamma in (1.0, 0.8):
        mean, std = task.reward_to_go_moments(theta, gamma)
        ref_mean, ref_std = _enumerated_rtg_moments(task, theta, gamma)
        assert float(mean) == pytest.approx(ref_mean, rel=1e-12) and float(std) == pytest.approx(ref_std, rel=1e-12)


def test_reward_to_go_std_is_that_of_the_sampled_tokens():
    from harness.probes.toy import discounted_returns

    task = ToyTask(PRESETS["varlen"])  # variable lengths: token weighting differs from sequence weighting
    theta = task.init_logits(scale=1.0, seed=1)
    g = torch.Generator().manual_seed(0)
    batch = task.sample(theta, torch.randint(task.n_prompts, (200_000,), generator=g), g)
    for gamma in (1.0, 0.8):
        tokens = discounted_returns(task, batch, gamma).T[batch.mask.bool()]  # the trainer's reward-to-go
        mean, std = task.reward_to_go_moments(theta, gamma)
        assert float(mean) == pytest.approx(float(tokens.mean()), rel=0.01)
        assert float(std) == pytest.approx(float(tokens.std(unbiased=False)), rel=0.01)


def test_truth_scale_reward_std_makes_reinforce_pp_unbiased_in_weight(tmp_path):
    from harness.tasks.toy import build_task

    rows = {}
    for scale in ("none", "reward_std"):
        cfg = make_cfg(["task=toy", "estimator=reinforce_pp", "mode=probe", "++probe.batches=300",
                        "++probe.reps=400", f"++probe.truth_scale={scale}", "task.episodes_per_iter=256",
                        f"results_dir={tmp_path}/{scale}", "progress=false"])
        assert run(cfg).get("completed") == 1
        df = pd.read_parquet(next((tmp_path / scale).glob("toy/reinforce_pp/*/probe.parquet")))
        rows[scale] = df.iloc[0]
        assert (df["truth_scale"] == scale).all()
    task = build_task(cfg)
    sigma = float(task.reward_to_go_moments(task.init_logits(), float(cfg.gamma))[1])
    none, scaled = rows["none"], rows["reward_std"]
    assert np.isnan(none["reward_std_tok"]) and scaled["reward_std_tok"] == pytest.approx(sigma, rel=1e-12)
    assert scaled["weight_low"] < 1.0 < scaled["weight_high"]  # E g = grad J / sigma_tok
    assert scaled["rel_bias_sq_low"] < 0 < scaled["rel_bias_sq_high"]
    assert none["rel_bias_sq_low"] > 0  # against grad J itself the whitened estimator is off in scale
    # the same batches: only the truth's scale differs
    assert none["weight"] == pytest.approx(scaled["weight"] / sigma, rel=1e-10)
    assert none["cos_exp"] == pytest.approx(scaled["cos_exp"], rel=1e-12)
    assert none["total_var"] == pytest.approx(scaled["total_var"], rel=1e-12)


def test_truth_scale_is_refused_where_it_does_not_apply():
    from harness.probes import validate_probe

    base = ["task=toy", "estimator=reinforce_pp", "mode=probe"]
    with pytest.raises(ValueError, match=r"probe\.truth_scale must be one of \['none', 'reward_std'\], got 'foo'"):
        validate_probe(make_cfg([*base, "++probe.truth_scale=foo"]))
    with pytest.raises(ValueError, match=r"probe\.truth_scale must be none with probe\.target=kl"):
        validate_probe(make_cfg([*base, "++probe.truth_scale=reward_std", "++probe.target=kl"]))
    with pytest.raises(ValueError, match=r"probe\.truth_scale must be none with kl\.beta"):
        validate_probe(make_cfg([*base, "++probe.truth_scale=reward_std", "kl.beta=0.1"]))
    with pytest.raises(ValueError, match=r"probe\.truth_scale must be none on control tasks"):
        validate_probe(make_cfg(["task=cartpole", "estimator=reinforce", "mode=probe",
                                 "++probe.truth_scale=reward_std"]))
    validate_probe(make_cfg([*base, "++probe.truth_scale=reward_std"]))


def test_probe_whitens_each_batch_by_the_update_rule():
    """normalize_advantages=batch: each of the M batches' advantages has masked mean 0 and std 1 on its
    own (computed here with numpy); minibatch with minibatches=1 is the same whitening (the update's rule);
    minibatch over several minibatches is refused, in the probe and by validation (one line, the field)."""
    from harness.probes import validate_probe
    from harness.probes.toy import ToyProbe, draw_batches, estimator_advantages

    task = ToyTask(PRESETS["mixed"])
    theta = task.init_logits(scale=0.5, seed=1)
    M, B, k = 3, 16, 4
    batch = draw_batches(task, theta, M, B // k, k, seed=0)
    spec, params = get_estimator("reinforce"), EstimatorParams(gamma=1.0)

    def adv(normalize, minibatches=1):
        training = ProbeTraining(batch_size=B, group_size=k, seed=0, normalize=normalize, minibatches=minibatches)
        return estimator_advantages(ToyProbe(task, theta, theta, spec, params, ProbeSettings(batches=M), training,
                                             batch=batch))

    raw, white = adv("none"), adv("batch")
    mask = batch.mask.T.numpy()  # [L, M*B]
    for m in range(M):
        cols = slice(m * B, (m + 1) * B)
        keep = mask[:, cols] > 0
        w, r = white.numpy()[:, cols][keep], raw.numpy()[:, cols][keep]
        assert r.std() > 0.01  # there was something to whiten
        assert w.mean() == pytest.approx(0.0, abs=1e-9)
        assert w.std() == pytest.approx(1.0, rel=1e-6)  # the biased std, + 1e-8
        assert np.allclose(w, (r - r.mean()) / (r.std() + 1e-8), atol=1e-12)
    assert torch.equal(adv("minibatch", minibatches=1), white)
    with pytest.raises(ValueError, match="normalize_advantages must be none or batch in mode=probe with minibatches=2"):
        adv("minibatch", minibatches=2)
    base = ["task=toy", "estimator=ppo_gae", "mode=probe"]  # ppo_gae's preset: minibatch whitening, 4 minibatches
    with pytest.raises(ValueError, match="^normalize_advantages must be none or batch in mode=probe with minibatches=4"):
        validate_probe(make_cfg(base))
    validate_probe(make_cfg(base + ["minibatches=1"]))
    validate_probe(make_cfg(base + ["normalize_advantages=batch"]))


def test_control_probe_whitens_each_batch_as_the_update(tmp_path, monkeypatch):
    """normalize_advantages=batch on a control probe: the policy loss receives, for every batch
    (population member), advantages with masked mean 0 and std 1 (checked here with numpy); with
    none they are the estimator's own (not whitened). minibatch over 4 minibatches is refused."""
    import harness.probes.control as control
    from harness.app import run as run_probe

    seen = {}
    real = control.get_policy_loss

    def spy(name):
        loss = real(name)

        def record(x, s):
            seen.setdefault("adv", []).append((x.advantages.detach().numpy().copy(), x.mask.numpy().copy()))
            return loss(x, s)
        return record

    monkeypatch.setattr(control, "get_policy_loss", spy)
    base = ["task=cartpole", "mode=probe", "++probe.batches=4", "++probe.reference_batches=4", "++probe.reps=20",
            "gamma=1.0", "task.episodes_per_iter=4", "group_size=2", "task.hidden=[16]", "estimator=reinforce",
            "progress=false", "minibatches=1"]
    for normalize in ("batch", "none"):
        seen.clear()
        assert run_probe(make_cfg(base + [f"normalize_advantages={normalize}",
                                          f"results_dir={tmp_path / normalize}"])).get("completed") == 1
        adv, mask = seen["adv"][0]  # the estimator's batches (the reference batches come after)
        for a, m in zip(adv, mask):  # one member = one batch
            v = a[m > 0]
            if normalize == "batch":
                assert v.mean() == pytest.approx(0.0, abs=1e-5) and v.std() == pytest.approx(1.0, rel=1e-4)
            else:
                assert v.mean() > 1.0  # CartPole's reward-to-go: positive, not centred
        row = pd.read_parquet(next((tmp_path / normalize).glob("cartpole/*/*/probe.parquet"))).iloc[0]
        assert row["normalize_advantages"] == normalize
    with pytest.raises(ValueError, match="^normalize_advantages must be none or batch in mode=probe with minibatches=4"):
        from harness.probes import validate_probe
        validate_probe(make_cfg(base[:-1] + ["minibatches=4", "normalize_advantages=minibatch"]))
