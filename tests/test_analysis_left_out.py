"""`python -m analysis report` / `claims`: every run they do not score is named (path + reason)
and counted, on stdout and in report.md / claims.md; a non-finite score never switches columns."""

import json

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from tests.analysis_fixtures import _summary, curve_columns, write_run

import analysis
from analysis import claims as C
from harness.experiments import Point

from tests.analysis_fixtures import run_analysis_cli

TASK = "CartPole-v1"
NOT_SCORED = "a non-finite score is not scored (nor replaced by another column)"


def _cli(*args):
    return run_analysis_cli(*args, timeout=300)


def _good(root, est, seed, n=8):
    cols = curve_columns(TASK, est, seed, iterations=n, eval_every=2)
    return write_run(root / TASK / est / f"seed{seed}", cols, summary=_summary(f"{est}{seed}", "completed", n))


@pytest.fixture()
def mixed(tmp_path):
    """3 good runs per estimator (rloo, reinforce) and one of each problem of issue 12."""
    root = tmp_path / "results"
    for est in ("rloo", "reinforce"):
        for seed in range(3):
            _good(root, est, seed)
    bad = {}
    d = _good(root, "rloo", 10)                                   # {"status": 5}
    s = json.loads((d / "summary.json").read_text())
    s["status"] = 5
    (d / "summary.json").write_text(json.dumps(s))
    bad[d] = "summary.json status 5 is not a string"
    d = _good(root, "rloo", 11, n=3)                              # summary says 1, metrics hold 3
    (d / "summary.json").write_text(json.dumps(_summary("x", "completed", 1)))
    bad[d] = "metrics.parquet holds iterations [1..3] (3 rows), summary.json says 1"
    d = _good(root, "reinforce", 12)                              # eval_return = inf once
    m = pd.read_parquet(d / "metrics.parquet")
    m.loc[m.iteration == 4, "eval_return"] = np.inf
    m.to_parquet(d / "metrics.parquet")
    bad[d] = f"eval_return holds inf at iteration 4: {NOT_SCORED}"
    d = _good(root, "reinforce", 13)                              # every evaluation -inf: no fallback
    m = pd.read_parquet(d / "metrics.parquet")
    m["eval_return"] = np.where(m["eval_return"].notna(), -np.inf, np.nan)
    m.to_parquet(d / "metrics.parquet")
    bad[d] = f"eval_return holds -inf at iteration 2, 4, 6, ...: {NOT_SCORED}"
    outside = _good(tmp_path / "elsewhere", "rloo", 7)            # a run folder linked from outside
    link = root / TASK / "rloo" / "linked"
    link.symlink_to(outside, target_is_directory=True)
    bad[link] = (f"symlink to {outside.resolve().as_posix()} (outside the results folder: its runs are not "
                 "part of this folder's results); not followed")
    return root, {k.as_posix(): v for k, v in bad.items()}


def test_loader_names_every_run_it_leaves_out(mixed):
    root, bad = mixed
    df = analysis.load(root)
    assert {r["path"]: r["reason"] for r in df.attrs["left_out"]} == bad
    assert df.groupby("estimator")["run_dir"].nunique().to_dict() == {"reinforce": 3, "rloo": 3}
    runs = analysis.run_table(df)
    assert (runs["score_source"] == "eval_return").all()     # nobody silently moved to episode_return


def test_report_cli_prints_counts_and_writes_the_list(mixed, tmp_path):
    root, bad = mixed
    out = tmp_path / "rep"
    r = _cli("report", str(root), "--reps", "50", "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "6 runs scored, 1 task(s), 2 estimator(s): 6 completed, 0 diverged; 5 left out" in lines
    assert "5 run(s) left out (not scored):" in lines
    assert sorted(ln for ln in lines if ln.startswith("  left out: ")) == sorted(
        f"  left out: {p}: {why}" for p, why in bad.items())
    assert "Traceback" not in r.stderr
    md = (out / "report.md").read_text()
    assert "**5 left out**" in md and "5 run directories, not scored:" in md
    for p, why in bad.items():
        assert f"- `{p}`: {why}" in md
    scores = pd.read_csv(out / "scores.csv").set_index("estimator")
    assert scores["n_runs"].to_dict() == {"reinforce": 3, "rloo": 3}
    fails = pd.read_csv(out / "failures.csv").set_index("estimator")
    assert fails["left_out"].to_dict() == {"reinforce": 2, "rloo": 2}   # the symlink: in the list only
    assert sorted(pd.read_csv(out / "left_out.csv")["path"]) == sorted(bad)


def test_nothing_scoreable_lists_the_runs_then_one_error_line(tmp_path):
    d = _good(tmp_path, "rloo", 0)
    (d / "summary.json").write_text('{"status": 5}')
    r = _cli("report", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no finished run to score, 1 left out; expected a folder containing run "
        "directories with metrics.parquet"]
    assert f"  left out: {d.as_posix()}: summary.json status 5 is not a string" in r.stdout.splitlines()


def test_symlink_inside_the_folder_is_not_counted_twice(tmp_path):
    d = _good(tmp_path, "rloo", 0)
    (tmp_path / "again").symlink_to(d.parent, target_is_directory=True)
    df = analysis.load(tmp_path)
    assert df["run_dir"].unique().tolist() == [f"{TASK}/rloo/seed0"]
    assert df.attrs["left_out"] == [{
        "run_dir": "again", "path": (tmp_path / "again").as_posix(), "task": None, "estimator": None,
        "reason": f"symlink to {d.parent.resolve().as_posix()} (inside the results folder: counted once, under "
                  "its own path); not followed"}]


def test_episode_return_inf_is_left_out_but_nan_is_not_evaluated(tmp_path):
    cols = curve_columns(TASK, "rloo", 0, iterations=6, eval_every=2)
    cols["eval_return"] = [np.nan] * 6                                  # never evaluated: episode_return
    write_run(tmp_path / TASK / "rloo" / "nan", cols, summary=_summary("a", "completed", 6))
    cols = dict(cols, episode_return=[1.0, 2.0, np.inf, 3.0, 4.0, 5.0])
    write_run(tmp_path / TASK / "rloo" / "inf", cols, summary=_summary("b", "completed", 6))
    df = analysis.load(tmp_path)
    assert [r["reason"] for r in df.attrs["left_out"]] == [f"episode_return holds inf at iteration 3: {NOT_SCORED}"]
    runs = analysis.run_table(df)
    assert runs["run_dir"].tolist() == [f"{TASK}/rloo/nan"] and runs["score_source"].tolist() == ["episode_return"]


def test_claims_names_runs_it_does_not_use(tmp_path, monkeypatch, capsys):
    """A summary saying completed over corrupt metrics is not evidence: named in claims.md, on stdout
    and in claims.json, and run_status (python -m harness.experiments claims) reads it as not run."""
    root = tmp_path / "claims"
    exp = root / "claim_c3"
    good = _good(exp, "rloo", 0)
    corrupt = _good(exp, "rloo", 1)
    m = corrupt / "metrics.parquet"
    m.write_bytes(m.read_bytes()[:100])
    status5 = _good(exp, "rloo", 2)
    (status5 / "summary.json").write_text('{"status": 5}')
    inf = _good(exp, "rloo", 3)
    t = pd.read_parquet(inf / "metrics.parquet")
    t.loc[t.iteration == 2, "eval_return"] = np.inf
    t.to_parquet(inf / "metrics.parquet")
    never = exp / TASK / "rloo" / "seed9"
    cfg = OmegaConf.create({"mode": "train"})

    def compose(name, r, quick, seed_offset=0, extend=None):
        if name != "claim_c3":
            raise C.NotRun(f"{name} not in this test")
        return [Point(name, ["experiment=claim_c3", "x", "y", f"seed={i}"], cfg, [d])
                for i, d in enumerate([good, corrupt, status5, inf, never])]

    monkeypatch.setattr(C, "compose_points", compose)
    from harness.io import run_status
    assert run_status(corrupt) is None and run_status(good) == "completed"
    r = C.build_claims(root, C.ReportSettings(only={"C3"}), progress=lambda s: None)
    reasons = {x["path"]: x["reason"] for x in r.left_out}
    assert set(reasons) == {str(corrupt), str(status5), str(inf)}
    assert reasons[str(corrupt)].startswith("unreadable metrics.parquet (")
    assert reasons[str(status5)] == "summary.json status 5 is not a string"
    assert reasons[str(inf)] == f"eval_return holds inf at iteration 2: {NOT_SCORED}"
    assert r.missing == 1
    md = r.out.read_text()
    section = md.split("## Runs left out\n", 1)[1].split("\n## ", 1)[0]
    assert "3 run directories of the experiments are not evidence" in section
    for p, why in reasons.items():
        assert f"- `{p}`: {why.replace('|', chr(92) + '|')}" in section
    assert "1 run directory not run yet" in section
    saved = json.loads((root / "claims_only.json").read_text())
    assert {x["path"] for x in saved["left_out"]} == set(reasons) and saved["not_run_yet"] == 1

    from analysis.cli import main
    capsys.readouterr()
    assert main(["claims", str(root), "--only", "C3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "3 run(s) left out (not scored):" in lines
    assert sorted(ln for ln in lines if ln.startswith("  left out: ")) == sorted(
        f"  left out: {p}: {why}" for p, why in reasons.items())
    assert f"1 run directory not run yet (python -m analysis claims {root} --run --only C3)" in lines
