"""The report compares only runs of one config and one budget, apart from probe and claim runs,
and cuts every run at its budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.analysis_fixtures import _summary, curve_columns, run_analysis_cli, write_run

TASK = "CartPole-v1"


def _config(estimator: str, seed: int, env_steps: int, mode: str = "train", lr: float = 3e-4) -> str:
    """A config.yaml as the harness writes it (the keys a comparison reads)."""
    return (f"task:\n  name: {TASK}\n  family: control\nestimator: {estimator}\nseed: {seed}\nmode: {mode}\n"
            f"population: 1\nresults_dir: results\nlr: {lr}\n"
            f"budget:\n  env_steps: {env_steps}\n  tokens: null\n  iterations: null\n")


def _train_run(root: Path, estimator: str, seed: int, env_steps: int, digest: str, n_steps: int = 512) -> Path:
    """A finished run of ``env_steps`` budget, in ``<task>/<estimator>/seed<k>-<hash>`` (the
    harness's layout): whole iterations of ``n_steps``, the last one past the budget."""
    iterations = -(-env_steps // n_steps)
    cols = curve_columns(TASK, estimator, seed, iterations=iterations, n_steps=n_steps, critic=False)
    return write_run(root / TASK / estimator / f"seed{seed}-{digest}", cols,
                     summary=_summary(f"{estimator}-{seed}-{digest}", "completed", iterations),
                     config=_config(estimator, seed, env_steps))


def _probe_run(root: Path) -> Path:
    """A mode=probe run: config.yaml, probe.parquet and a summary.json with ``mode: probe``
    (harness.probes), no metrics.parquet."""
    d = root / TASK / "grpo" / "seed0-cccccccccc"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(_config("grpo", 0, 50_000, mode="probe"))
    pd.DataFrame({"scope": ["all"], "bias": [0.1]}).to_parquet(d / "probe.parquet")
    (d / "summary.json").write_text(json.dumps({**_summary("probe-0", "completed", 0), "mode": "probe"}))
    return d


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """grpo at 50k and 100k env steps, ppo_gae at 100k only, a probe run and a claims folder."""
    root = tmp_path_factory.mktemp("results")
    for seed in range(3):
        _train_run(root, "grpo", seed, 50_000, "aaaaaaaaaa")
        _train_run(root, "grpo", seed, 100_000, "bbbbbbbbbb")
        _train_run(root, "ppo_gae", seed, 100_000, "dddddddddd")
        _train_run(root / "claims" / "claim_c9", "ppo_gae", seed, 20_000, "eeeeeeeeee")
    _probe_run(root)
    running = root / TASK / "grpo" / "seed3-aaaaaaaaaa"       # a 50k run still running: no summary.json
    write_run(running, curve_columns(TASK, "grpo", 3, iterations=5, critic=False), config=_config("grpo", 3, 50_000))
    return root


def test_runs_of_different_budgets_kinds_are_kept_apart_and_the_report_says_so(mixed, tmp_path):
    out = tmp_path / "report"
    r = run_analysis_cli("report", str(mixed), "--out", str(out), "--reps", "50")
    assert r.returncode == 0, r.stderr
    index = (out / "report.md").read_text()
    assert "differ in `budget.env_steps` within a task" in index
    assert "[budget.env_steps=50000](budget.env_steps=50000/report.md)" in index
    assert "[budget.env_steps=100000](budget.env_steps=100000/report.md)" in index
    assert "Not compared: 1 probe runs" in index and "Not compared: 3 claim experiments' runs" in index

    small = pd.read_csv(out / "budget.env_steps=50000" / "scores.csv")
    large = pd.read_csv(out / "budget.env_steps=100000" / "scores.csv")
    assert small[["estimator", "n_runs", "n_configs"]].values.tolist() == [["grpo", 3, 1]]
    # rows by score (the figures' order), so compared as a set here
    assert sorted(large[["estimator", "n_runs", "n_configs"]].values.tolist()) == [["grpo", 3, 1], ["ppo_gae", 3, 1]]
    for group, budget in (("budget.env_steps=50000", 50_000), ("budget.env_steps=100000", 100_000)):
        runs = pd.read_csv(out / group / "runs.csv")
        assert not runs["run_dir"].str.startswith("claims/").any()        # claim runs: never scored here
        assert (runs["budget"] == budget).all()                           # each group at its own budget
        md = (out / group / "report.md").read_text()
        assert f"Comparison group **{group}**" in md
        assert "Not compared here: 1 probe runs" in md and "`claims/claim_c9/" in md
        assert "probe" not in pd.read_csv(out / group / "left_out.csv")["run_dir"].str.cat()
        assert f"{TASK}: {budget // 1000}k environment steps (configured; runs logged up to" in md
    assert f"`python -m analysis claims {(mixed / 'claims').as_posix()}`" in (
        out / "budget.env_steps=50000" / "report.md").read_text()
    # the run left out is named in the report of its budget's group
    assert pd.read_csv(out / "budget.env_steps=50000" / "left_out.csv")["run_dir"].tolist() == [
        f"{TASK}/grpo/seed3-aaaaaaaaaa"]
    assert pd.read_csv(out / "budget.env_steps=100000" / "left_out.csv").empty


def test_a_group_scores_the_same_whatever_else_the_folder_holds(mixed, tmp_path):
    """The 50k grpo runs alone give the AUC and IQM they get beside everything else."""
    alone = tmp_path / "alone"
    for seed in range(3):
        _train_run(alone, "grpo", seed, 50_000, "aaaaaaaaaa")
    for folder, out in ((mixed, tmp_path / "mixed_out"), (alone, tmp_path / "alone_out")):
        assert run_analysis_cli("report", str(folder), "--out", str(out), "--reps", "50").returncode == 0
    together = pd.read_csv(tmp_path / "mixed_out" / "budget.env_steps=50000" / "scores.csv")
    by_itself = pd.read_csv(tmp_path / "alone_out" / "scores.csv")
    cols = ["estimator", "n_runs", "iqm", "auc"]
    pd.testing.assert_frame_equal(together[cols], by_itself[cols])
    md = (tmp_path / "alone_out" / "report.md").read_text()
    assert "Comparison group" not in md and "Every estimator's runs on a task share one config here." in md


def test_a_swept_knob_is_a_label_never_pooled(tmp_path):
    for seed in range(2):
        for lr, digest in ((1e-3, "1111111111"), (3e-4, "2222222222")):
            d = _train_run(tmp_path, "grpo", seed, 20_000, digest)
            (d / "config.yaml").write_text(_config("grpo", seed, 20_000, lr=lr))
    out = tmp_path / "out"
    assert run_analysis_cli("report", str(tmp_path), "--out", str(out), "--reps", "20").returncode == 0
    scores = pd.read_csv(out / "scores.csv")
    assert scores[["estimator", "n_runs"]].values.tolist() == [["grpo[lr=0.0003]", 2], ["grpo[lr=0.001]", 2]]
    assert "grpo: `lr`" in (out / "report.md").read_text()


def test_only_probe_and_claim_runs_is_a_one_line_refusal(tmp_path):
    _probe_run(tmp_path)
    _train_run(tmp_path / "claims" / "claim_c9", "ppo_gae", 0, 5_000, "eeeeeeeeee")
    r = run_analysis_cli("report", str(tmp_path))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "no training runs to compare (1 probe runs" in line and "1 claim experiments' runs" in line
    assert f"python -m analysis claims {tmp_path.as_posix()}" in line


def test_a_run_past_its_budget_is_cut_at_the_budget(tmp_path):
    """Budget 100 env steps; the run's last iteration ends at 120. By hand: the curve (0 held
    from 0 to 40, 0 -> 10 over 40..80, 10 -> 30 over 80..120) is cut at 100, where it is 20:
    area 0*40 + (0+10)/2*40 + (10+20)/2*20 = 500, AUC 500/100 = 5; the final score reads the
    evaluations at or below 100 only: mean(0, 10) = 5 (not 13.33 with the one at 120)."""
    from analysis import stats
    from analysis.load import load, run_configs
    from analysis.report import compute_tables

    cols = {"run_id": ["r"] * 3, "task": [TASK] * 3, "estimator": ["grpo"] * 3, "seed": [0, 0, 0],
            "iteration": [1, 2, 3], "env_steps": [40, 80, 120], "wall_time_s": [1.0, 2.0, 3.0],
            "episode_return": [0.0, 10.0, 30.0], "eval_return": [0.0, 10.0, 30.0]}
    write_run(tmp_path / TASK / "grpo" / "seed0-ffffffffff", cols, summary=_summary("r", "completed", 3),
              config=_config("grpo", 0, 100))
    df = load(tmp_path)
    t = compute_tables(df, reps=10, configs=run_configs(tmp_path, ["CartPole-v1/grpo/seed0-ffffffffff"]))
    run = t.runs.iloc[0]
    assert run["budget"] == 100 and run["samples"] == 120
    assert run["auc"] == pytest.approx(5.0)
    assert run["score"] == pytest.approx(5.0)
    assert t.budgets == {TASK: ("env_steps", 100.0)}
    bands = stats.curve_bands(t.metrics, "eval_return", "env_steps", x_max={TASK: 100.0}, n_grid=6, reps=10)
    assert bands["x"].tolist() == [40.0, 60.0, 80.0, 100.0]            # the grid ends at the budget
    assert bands["mean"].tolist() == pytest.approx([0.0, 5.0, 10.0, 20.0])
    assert np.isclose(stats.area_under_curve([40, 80, 120], [0, 10, 30], 100.0), 5.0)


def test_the_budget_is_cut_on_the_column_it_counts(tmp_path):
    """The toy task logs ``tokens`` (3 a sequence) beside ``env_steps`` (sequences), its budget
    in env_steps: the run is cut at 100 sequences, not at 100 tokens (where it would be cut
    after its first iteration). By hand as the test above, on env_steps: AUC 5, score 5."""
    from analysis.load import load, run_configs
    from analysis.report import compute_tables

    cols = {"run_id": ["r"] * 3, "task": [TASK] * 3, "estimator": ["grpo"] * 3, "seed": [0, 0, 0],
            "iteration": [1, 2, 3], "env_steps": [40, 80, 120], "tokens": [120, 240, 360],
            "wall_time_s": [1.0, 2.0, 3.0], "episode_return": [0.0, 10.0, 30.0], "eval_return": [0.0, 10.0, 30.0]}
    write_run(tmp_path / TASK / "grpo" / "seed0-ffffffffff", cols, summary=_summary("r", "completed", 3),
              config=_config("grpo", 0, 100))
    t = compute_tables(load(tmp_path), reps=10, configs=run_configs(tmp_path, ["CartPole-v1/grpo/seed0-ffffffffff"]))
    run = t.runs.iloc[0]
    assert t.budgets == {TASK: ("env_steps", 100.0)}
    assert run["budget"] == 100 and run["samples"] == 120
    assert run["auc"] == pytest.approx(5.0) and run["score"] == pytest.approx(5.0)
