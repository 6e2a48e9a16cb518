"""Claims report: verdict rules on synthetic data with known answers, the not-run path, and one
claim end to end on the toy task (run by harness.experiments, judged by analysis.claims)."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from analysis import claims as C
from harness import experiments as X
from harness.experiments import run as XR


# ----------------------------------------------------------------------------- rules

def test_effect_rule_reads_the_interval_against_the_threshold():
    assert C.rule_greater("s", 2.0, 1.5, 2.5, 1.0).verdict == "supported"
    assert C.rule_greater("s", 0.5, 0.2, 0.8, 1.0).verdict == "refuted"
    assert C.rule_greater("s", 1.1, 0.8, 1.4, 1.0).verdict == "inconclusive"
    assert C.rule_less("s", 0.5, 0.2, 0.8, 1.0).verdict == "supported"
    assert C.rule_less("s", 2.0, 1.5, 2.5, 1.0).verdict == "refuted"
    assert C.rule_greater("s", np.nan, np.nan, np.nan, 0.0).verdict == "inconclusive"


def test_null_rule_needs_zero_inside_and_a_narrow_interval():
    assert C.rule_null("b", 0.001, -0.004, 0.006, 0.01).verdict == "supported"
    assert C.rule_null("b", 0.001, -0.03, 0.05, 0.01).verdict == "inconclusive"  # too wide to call a null
    assert C.rule_null("b", 0.02, 0.01, 0.03, 0.05).verdict == "refuted"  # excludes 0: an effect was found
    assert C.rule_exact("x", 1e-12).verdict == "supported" and C.rule_exact("x", 1e-3).verdict == "refuted"


def test_combine_parts():
    s, r, i = (C.Part("p", 0, 0, 0, "", v) for v in ("supported", "refuted", "inconclusive"))
    assert C.combine([s, s]) == "supported"
    assert C.combine([s, i]) == "inconclusive"
    assert C.combine([s, i, r]) == "refuted"
    assert C.combine([]) == "inconclusive"


def test_a_true_effect_is_found_and_a_null_effect_never_is():
    rng = np.random.default_rng(1)
    # true effect: group a is larger by 1 sd over 40 samples each
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
    diff = C.group_bootstrap({"a": a, "b": b}, lambda g: C._mean(g["a"]) - C._mean(g["b"]))
    assert C.rule_greater("d", *diff, 0.0).verdict == "supported"
    assert C.rule_null("d", *diff, 0.1).verdict == "refuted"
    # null effect built symmetric (b = -a): the point estimate is exactly 0, so an effect rule can
    # never call it supported, and the null rule calls it supported only with a narrow interval
    x = rng.normal(0.0, 1.0, 40)
    null = C.group_bootstrap({"a": x, "b": -x}, lambda g: C._mean(g["a"]) + C._mean(g["b"]))
    assert null[0] == pytest.approx(0.0, abs=1e-12)
    assert C.rule_greater("d", *null, 0.0).verdict == "inconclusive"
    assert C.rule_null("d", *null, 0.05).verdict == "inconclusive"  # 40 noisy samples: too wide
    tight = np.concatenate([x, -x]) * 1e-3
    t = C.group_bootstrap({"a": tight}, lambda g: C._mean(g["a"]))
    assert C.rule_null("d", *t, 0.05).verdict == "supported"


def test_paired_bootstrap_uses_the_shared_noise():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 10.0, 500)
    a, b = noise + 0.5, noise  # a differs from b by exactly 0.5 on every shared batch
    pt, lo, hi = C.paired_bootstrap({"a": a, "b": b}, lambda d: C._mean(d["a"]) - C._mean(d["b"]))
    assert (pt, lo, hi) == pytest.approx((0.5, 0.5, 0.5))
    unpaired = C.group_bootstrap({"a": a, "b": b}, lambda d: C._mean(d["a"]) - C._mean(d["b"]))
    assert unpaired[2] - unpaired[1] > 1.0  # without pairing the same difference drowns in noise


# ----------------------------------------------------------------------------- claim evaluation

def _c3_data(var_ratio: float, baseline_bias: tuple[float, float, float], control_low: float = 1.0) -> dict:
    rng = np.random.default_rng(0)
    M = 400
    dev_rf = rng.gamma(2.0, 1.0, M)
    probe, batches = [], []
    for est, ctrl, dev, bias in (("reinforce", False, dev_rf, (0.0, -0.01, 0.01)),
                                 ("baseline", False, dev_rf * var_ratio, baseline_bias),
                                 ("reinforce", True, dev_rf, (2.0, control_low, 3.0))):
        run_dir = f"{est}-{ctrl}"
        probe.append({"run_dir": run_dir, "scope": "all", "estimator": est, "negative_control": ctrl, "seed": 0,
                      "batches": M, "rel_bias_sq": bias[0], "rel_bias_sq_low": bias[1], "rel_bias_sq_high": bias[2],
                      "critic_rmse": 0.01})
        batches.append(pd.DataFrame({"run_dir": run_dir, "scope": "all", "seed": 0, "batch": np.arange(M),
                                     "dev_sq": dev}))
    runs = pd.DataFrame({"run_dir": [p["run_dir"] for p in probe], "status": "completed", "reason": None, "point": ""})
    return {"claim_c3": C.ExpData("claim_c3", runs, pd.DataFrame(probe), pd.concat(batches), pd.DataFrame())}


def test_c3_verdicts_on_synthetic_probes_with_known_answers():
    assert C.eval_c3(_c3_data(0.3, (0.0, -0.004, 0.004))).verdict == "supported"
    # no variance reduction (ratio exactly 1 on every batch): never supported
    assert C.eval_c3(_c3_data(1.0, (0.0, -0.004, 0.004))).verdict == "inconclusive"
    # more variance: refuted; a detected baseline bias: refuted
    assert C.eval_c3(_c3_data(1.5, (0.0, -0.004, 0.004))).verdict == "refuted"
    assert C.eval_c3(_c3_data(0.3, (0.2, 0.1, 0.3))).verdict == "refuted"
    # the probe missed the deliberately biased control: no power, so no "supported"
    assert C.eval_c3(_c3_data(0.3, (0.0, -0.004, 0.004), control_low=-0.5)).verdict == "inconclusive"


def test_missing_runs_are_inconclusive_not_run(tmp_path):
    out, verdicts = C.build_claims_report(tmp_path, quick=False, only={"C1", "C3", "C10"}, progress=lambda s: None)
    by = {v.claim: v for v in verdicts}
    assert all(v.verdict == "inconclusive" and v.not_run for v in verdicts)
    assert "python -m harness.experiments claims" in by["C3"].not_run
    assert by["C1"].not_run.startswith("tests not run")
    text = out.read_text()
    assert "inconclusive — not run" in text and "| C10 |" in text
    assert json.loads((tmp_path / "claims.json").read_text())["verdicts"][0]["claim"] == "C1"


def test_lm_claims_say_why_they_were_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "lm_unavailable", lambda: "the LM task (harness/train/lm.py) is not present")
    _, verdicts = C.build_claims_report(tmp_path, quick=False, only={"C10", "C21"}, progress=lambda s: None)
    for v in verdicts:
        assert v.label == "inconclusive — not run: the LM task (harness/train/lm.py) is not present"
    _, quick = C.build_claims_report(tmp_path, quick=True, only={"C15"}, progress=lambda s: None)
    assert quick[0].not_run.startswith("--quick skips the LM task")


def test_every_claim_has_a_rule_and_every_experiment_file_composes():
    assert [c.id for c in C.CLAIMS] == [f"C{i}" for i in range(1, 23)]
    for c in C.CLAIMS:
        assert c.rule and (c.exact or c.evaluate is not None)
        assert c.exact or c.experiments  # every claim is exact or has an experiment (harness.experiments)
        for x in c.experiments:
            assert x in X.EXPERIMENTS
    assert set(X.CLAIM_EXPERIMENTS) | set(X.EXACT_TESTS) == set(C.CLAIMS_BY_ID) == set(X.CLAIM_IDS)
    for name, ex in X.EXPERIMENTS.items():
        if ex.family == "lm" and X.lm_unavailable():
            continue
        for quick in (False, True):
            params = X.sweep_params(name, quick)
            assert params, name
            assert len(X.sweep_overrides(params)) >= 1


def test_sweep_expansion_is_hydras_cartesian_product():
    combos = X.sweep_overrides({"estimator": "a,b", "++probe.batches": "4", "clip_eps": "0.2,null"})
    assert len(combos) == 4
    assert ["estimator=a", "++probe.batches=4", "clip_eps=null"] in combos
    assert X.sweep_overrides({"group_size": "range(2,5)"}) == [["group_size=2"], ["group_size=3"], ["group_size=4"]]


def test_analysis_claims_runs_nothing(tmp_path, capsys):
    from analysis.cli import main

    assert main(["claims", str(tmp_path), "--run", "--quick", "--only", "C3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"analysis runs nothing; run the experiments with: python -m harness.experiments claims "
                   f"{tmp_path} --quick --only C3"]
    assert not any(tmp_path.iterdir())


def test_c3_end_to_end_on_the_toy_task(tmp_path, monkeypatch):
    small = {"++probe.batches": "200", "++probe.negative_control": "false"}  # 2 configs: reinforce, baseline
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c3", X.Experiment("claim_c3", "toy", small))
    tiny = {"++probe.batches": "6", "++probe.reference_batches": "8", "++probe.critic_episodes": "8",
            "task.episodes_per_iter": "4", "group_size": "2", "task.hidden": "[16]"}
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c3_control", X.Experiment("claim_c3_control", "control", tiny))
    lines = []
    XR.run_claims(tmp_path, quick=True, only={"C3"}, progress=lines.append)
    out, verdicts = C.build_claims_report(tmp_path, quick=True, only={"C3"}, progress=lines.append)
    v = verdicts[0]
    assert not v.not_run and v.verdict in C.VERDICTS
    assert v.point < 1 and v.high < 1  # the baseline lowers the variance on shared samples
    assert any("claim_c3 (2/2)" in line for line in lines)
    assert any("claim_c3_control (2/2)" in line for line in lines)
    assert "Negative control not run" in v.note
    assert any(p.name.startswith("CartPole") for p in v.parts)
    assert (tmp_path / "claims_figures" / "c3.png").is_file()
    # a rerun reuses the finished runs
    lines.clear()
    XR.run_claims(tmp_path, quick=True, only={"C3"}, progress=lines.append)
    assert sum("done already" in line for line in lines) == 4


def test_exact_claim_runs_its_tests(tmp_path, monkeypatch):
    # a stand-in tests folder keeps the pytest subprocess light (the real one imports torch)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text(
        "def test_c16_holds():\n    assert 1 + 1 == 2\n\n"
        "def test_c7_breaks():\n    assert 1 + 1 == 3\n")
    monkeypatch.setattr(C, "REPO", tmp_path)
    monkeypatch.setattr(C, "TESTS_DIR", tmp_path / "tests")
    tests = {"C16": (("test_c16_",), ("test_fake.py",)), "C7": (("test_c7_",), ("test_fake.py",)),
             "C12": (("test_c12",), ("test_lm*.py",))}
    c16, c7, none = (C.Claim(cid, "t", "s", tests=t, test_files=f) for cid, (t, f) in tests.items())
    # the harness runs the tests (a pytest subprocess) and records them; analysis only reads the record
    rec = XR.run_exact_tests(["C16", "C7", "C12"], tmp_path / "exact_tests.json", progress=lambda s: None,
                             repo=tmp_path, tests=tests)
    assert json.loads((tmp_path / "exact_tests.json").read_text()) == rec
    v = C.eval_exact(c16, rec)
    assert v.verdict == "supported" and "tests/test_fake.py::test_c16_holds" in v.note
    assert C.eval_exact(c7, rec).verdict == "refuted"
    missing = C.eval_exact(none, rec)
    assert missing.not_run and "no test matching" in missing.not_run and "no test file yet" in missing.not_run


def _lm_metrics(configs: list[dict], iters: int = 12) -> "C.ExpData":
    """Synthetic LM training curves: one run per (config, seed)."""
    rows, runs = [], []
    for i, c in enumerate(configs):
        for seed in (0, 1, 2):
            rd = f"run{i}"
            runs.append({"run_dir": rd, "status": "completed", "reason": None, "point": str(c)})
            for it in range(1, iters + 1):
                f = it / iters
                rows.append({"run_dir": rd, "seed": seed, "iteration": it, "estimator": c.get("estimator", "rloo"),
                             "kl_beta": c.get("beta", 0.0), "epochs": c.get("epochs", 1),
                             "cfg_clip_eps": c.get("clip", 0.2), "reward": c["reward"] * f + 0.01 * seed,
                             "gold_reward": 0.5 + c["gold"] * f + 0.01 * seed, "kl_ref": c["kl"] * f,
                             "clip_frac": c.get("clip_frac", 0.01), "peak_mem_mb": c.get("mem", 100.0),
                             "wall_time_s": c.get("wall", 10.0) * f, "status": "completed"})
    return C.ExpData("x", pd.DataFrame(runs).drop_duplicates("run_dir"), pd.DataFrame(), pd.DataFrame(),
                     pd.DataFrame(rows))


def test_lm_claims_on_synthetic_curves():
    hacking = _lm_metrics([{"beta": 0.0, "reward": 1.0, "gold": -0.2, "kl": 4.0},
                           {"beta": 0.5, "reward": 0.3, "gold": 0.1, "kl": 0.5}])
    assert C.eval_c10({"claim_c10": hacking}).verdict == "supported"
    honest = _lm_metrics([{"beta": 0.0, "reward": 1.0, "gold": 0.3, "kl": 4.0},
                          {"beta": 0.5, "reward": 0.3, "gold": 0.1, "kl": 0.5}])
    assert C.eval_c10({"claim_c10": honest}).verdict == "refuted"  # gold rises without a penalty: no hacking
    assert C.eval_c21({"claim_c10": hacking}).verdict in C.VERDICTS
    c15 = _lm_metrics([{"estimator": "ppo_gae", "reward": 1.0, "gold": 0.1, "kl": 1.0, "mem": 200.0, "wall": 20.0},
                       {"estimator": "rloo", "reward": 1.0, "gold": 0.1, "kl": 1.0, "mem": 100.0, "wall": 10.0},
                       {"estimator": "remax", "reward": 1.0, "gold": 0.1, "kl": 1.0, "mem": 110.0, "wall": 12.0}])
    assert C.eval_c15({"claim_c15": c15}).verdict == "supported"
    c19 = _lm_metrics([{"clip": 0.2, "reward": 1.0, "gold": 0.1, "kl": 1.0, "clip_frac": 0.2},
                       {"clip": None, "reward": 1.0, "gold": 0.1, "kl": 1.0, "clip_frac": 0.0}])
    assert C.eval_c19({"claim_c19": c19}).verdict == "refuted"  # clipping active on 20% of tokens


@pytest.mark.parametrize("quick", [True, False])
def test_every_claim_experiment_composes_and_validates(tmp_path, quick):
    """Each point of each claim experiment (full and --quick budgets) composes and passes the
    harness's validation, so ``python -m harness.experiments claims`` never meets an invalid config mid-way."""
    from harness.experiments import EXPERIMENTS, compose_points
    from harness.validation import validate

    bad = []
    for name in EXPERIMENTS:
        for p in compose_points(name, tmp_path, quick):
            try:
                assert p.error is None, p.error
                validate(p.cfg)
            except Exception as exc:  # collect all, report together
                bad.append(f"{name} {' '.join(p.overrides[3:])}: {exc}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- isolated points

_TINY_TOY = {"loss_agg": "token_mean", "population": "2", "task.episodes_per_iter": "8", "budget.env_steps": "48"}


def _parquet_rows(root):
    """Every run's metrics (wall-clock columns left out), keyed by the run directory relative to ``root``."""
    out = {}
    for f in sorted(root.rglob("metrics.parquet")):
        out[str(f.parent.relative_to(root))] = pd.read_parquet(f).drop(columns=["wall_time_s"])
    return out


def test_isolated_points_give_the_in_process_results(tmp_path, monkeypatch):
    """The same tiny toy experiment run in this process and each point in a spawned process of its
    own: the same run directories, the same metrics, the same progress lines."""
    results = {}
    for isolate in (False, True):
        monkeypatch.setitem(X.EXPERIMENTS, "claim_c18", X.Experiment("claim_c18", "toy", _TINY_TOY, isolate=isolate))
        root = tmp_path / ("own" if isolate else "shared")
        lines = []
        XR.run_claims(root, quick=True, only={"C18"}, progress=lines.append)
        results[isolate] = (_parquet_rows(root), lines)
        runs = sorted(p.parent.name for p in root.rglob("summary.json"))
        assert [r.split("-")[0] for r in runs] == ["seed0", "seed1"]
        assert all(json.loads(p.read_text())["status"] == "completed" for p in root.rglob("summary.json"))
        # who trained them: each run's lock names the process that claimed it
        pids = {json.loads(p.read_text())["pid"] for p in root.rglob(".lock")}
        assert (os.getpid() in pids) is (not isolate) and len(pids) == 1
    (shared, lines_shared), (own, lines_own) = results[False], results[True]
    assert shared.keys() == own.keys() and len(shared) == 2  # population 2: two run directories, same paths
    for key in shared:
        pd.testing.assert_frame_equal(shared[key], own[key])
    assert lines_own[0] == "[claims] experiment claim_c18: 1 config(s), each in its own process"
    assert lines_own[1].startswith("[claims] claim_c18 (1/1) loss_agg=token_mean population=2")
    assert "2 completed" in lines_own[1] and "2 completed" in lines_shared[1]


def _die(cfg):  # a point whose process ends without an exception (as a kill or the OOM killer would)
    os._exit(3)


def _raise(cfg):
    raise ValueError("bad point")


def test_an_isolated_point_whose_process_dies_is_recorded_failed(tmp_path, monkeypatch):
    monkeypatch.setitem(X.EXPERIMENTS, "claim_c18", X.Experiment("claim_c18", "toy", _TINY_TOY, isolate=True))
    (p,) = X.compose_points("claim_c18", tmp_path, quick=True)
    with pytest.raises(XR.WorkerDied):
        XR.run_isolated(p.cfg, target=_die)
    summaries = [json.loads((d / "summary.json").read_text()) for d in p.run_dirs]
    assert [s["status"] for s in summaries] == ["failed", "failed"]
    assert all("process died" in s["reason"] for s in summaries)
    # an exception in the point's process reaches the runner as in-process: type and message
    with pytest.raises(ValueError, match="bad point"):
        XR.run_isolated(p.cfg, target=_raise)
    # run_points records a dead process as that point's error, with its progress line
    lines = []
    fresh = X.compose_points("claim_c18", tmp_path / "again", quick=True)
    monkeypatch.setattr(XR, "run_isolated", lambda cfg: (_ for _ in ()).throw(XR.WorkerDied("it died")))
    totals = XR.run_points(fresh, lines.append, isolate=True)
    assert totals == {"error": 1}
    assert lines == [lines[0]] and lines[0].startswith("[claims] claim_c18 (1/1)")
    assert "error: WorkerDied: it died" in lines[0]


# ----------------------------------------------------------------------------- experiment designs

def _flat(cfg) -> dict:
    """Every leaf of a composed config as ``dotted.key -> value`` (results paths left out)."""
    from omegaconf import OmegaConf

    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(v, key + ".")
            else:
                out[key] = v
    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return {k: v for k, v in out.items() if k not in ("results_dir", "lm.cache_dir")}


def _differences(a, b) -> dict:
    fa, fb = _flat(a), _flat(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def test_c9_compares_epochs_and_nothing_else(tmp_path):
    for quick in (False, True):
        one, ten = X.compose_points("claim_c9", tmp_path, quick)
        assert _differences(one.cfg, ten.cfg) == {"epochs": (1, 10)}
        assert (one.cfg.estimator, one.cfg.minibatches, one.cfg.population) == ("ppo_gae", 1, 10 if not quick else 3)
    assert one.cfg.budget.env_steps <= 30000 or quick


@pytest.mark.skipif(X.lm_unavailable() is not None, reason="no LM task")
def test_c19_clipping_can_act_in_every_setting_and_pairs_by_seed(tmp_path):
    points = {(p.cfg.epochs, p.cfg.clip_eps): p for p in X.compose_points("claim_c19", tmp_path, False)}
    assert sorted(points, key=str) == sorted([(1, 0.2), (1, None), (2, 0.2), (2, None)], key=str)
    for epochs in (1, 2):
        clipped, free = points[(epochs, 0.2)], points[(epochs, None)]
        assert clipped.cfg.minibatches > 1  # the ratio leaves 1 after the first minibatch step
        assert _differences(clipped.cfg, free.cfg) == {"clip_eps": (0.2, None)}
        assert [d.name.split("-")[0] for d in clipped.run_dirs] == [d.name.split("-")[0] for d in free.run_dirs]
    assert all(p.cfg.budget.tokens <= 8000 for p in points.values())


@pytest.mark.skipif(X.lm_unavailable() is not None, reason="no LM task")
def test_c15_measures_each_run_alone_in_its_process(tmp_path):
    assert X.EXPERIMENTS["claim_c15"].isolate
    points = X.compose_points("claim_c15", tmp_path, False)
    assert all(len(p.run_dirs) == 1 for p in points)  # one run per point, so one per process
    seeds = {p.cfg.estimator: set() for p in points}
    for p in points:
        seeds[p.cfg.estimator].add(p.cfg.seed)
    assert seeds == {"ppo_gae": {0, 1}, "rloo": {0, 1}, "remax": {0, 1}}
    assert all(p.cfg.budget.tokens <= 8000 for p in points)
