"""One definition of a finished run (harness.io.finished), the same verdict everywhere: the
harness's skip-or-rerun (check_finished, run_status, RunDir.finished, point_done), the report's
loader (analysis.load) and the claims' evidence (analysis.claims.load_points)."""

import json
import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from tests.analysis_fixtures import _summary, curve_columns, write_run

import analysis
from harness.experiments import Point, point_done
from harness.io import check_finished, run_status
from harness.io import files as files_mod
from harness.io import rundir as rundir_mod
from harness.io.finished import FINISHED, check_run

TASK = "CartPole-v1"
CONFIG = "seed: 0\ntask:\n  name: CartPole-v1\nestimator:\n  name: rloo\nbudget:\n  iterations: 5\n"


def _run(root, name="r", n=3, status="completed"):
    """A finished run: iterations 1..n, summary saying n, budget.iterations 5."""
    return write_run(root / TASK / "rloo" / name, curve_columns(TASK, "rloo", 0, iterations=n, eval_every=1),
                     summary=_summary(name, status, n), config=CONFIG)


def _summary_edit(d, **kw):
    s = json.loads((d / "summary.json").read_text())
    s.update(kw)
    (d / "summary.json").write_text(json.dumps(s))


def _damage(d, how):
    m = d / "metrics.parquet"
    if how == "status_int":
        _summary_edit(d, status=5)
    elif how == "status_missing":
        (d / "summary.json").write_text(json.dumps({"iterations": 3}))
    elif how == "top_level_list":
        (d / "summary.json").write_text("[1, 2]")
    elif how == "torn_summary":
        (d / "summary.json").write_text('{"status": "compl')
    elif how == "summary_says_1_metrics_hold_3":
        _summary_edit(d, iterations=1)
    elif how == "iterations_str":
        _summary_edit(d, iterations="3")
    elif how == "iterations_bool":
        _summary_edit(d, iterations=True)
    elif how == "iterations_negative":
        _summary_edit(d, iterations=-1)
    elif how == "iterations_missing":
        s = json.loads((d / "summary.json").read_text())
        del s["iterations"]
        (d / "summary.json").write_text(json.dumps(s))
    elif how == "over_budget":
        (d / "config.yaml").write_text(CONFIG.replace("iterations: 5", "iterations: 2"))
    elif how == "torn_config":
        (d / "config.yaml").write_text("budget: {iterations: [")
    elif how == "truncated_metrics":
        m.write_bytes(m.read_bytes()[: m.stat().st_size // 2])
    elif how == "no_metrics":
        m.unlink()
    elif how == "zero_based_iterations":
        t = pq.read_table(m)
        t = t.set_column(t.schema.get_field_index("iteration"), "iteration", pa.array([0, 1, 2], pa.int64()))
        pq.write_table(t, m)
    elif how == "status_unknown_string":
        _summary_edit(d, status="done")
    # ---- issue 36: files that are not what they say (one reader, harness.io.files, for all)
    elif how in ("summary_fifo", "metrics_fifo"):
        f = d / ("summary.json" if how == "summary_fifo" else "metrics.parquet")
        f.unlink()
        os.mkfifo(f)  # opened for reading without a writer: a plain open() blocks for ever
    elif how in ("summary_dev_zero", "metrics_dev_zero"):
        f = d / ("summary.json" if how == "summary_dev_zero" else "metrics.parquet")
        f.unlink()
        f.symlink_to("/dev/zero")  # a read that never ends
    elif how in ("summary_loop", "metrics_loop"):
        f = d / ("summary.json" if how == "summary_loop" else "metrics.parquet")
        f.unlink()
        f.symlink_to(d / "loop_b")
        (d / "loop_b").symlink_to(f)
    elif how == "summary_deep":
        (d / "summary.json").write_text('{"status": "completed", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif how == "summary_too_big":
        _summary_edit(d, padding="x" * (files_mod.JSON_LIMIT + 1))
    elif how == "summary_huge_iterations":
        _summary_edit(d, iterations=10 ** 11)
        (d / "config.yaml").write_text(CONFIG.replace("budget:\n  iterations: 5\n", ""))
    elif how == "config_deep":  # flow style (a segfault in libyaml's composer on some PyYAML builds)
        (d / "config.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    elif how == "config_deep_block":  # block style: a sequence in a sequence ... 100,000 times
        (d / "config.yaml").write_text("- " * 100_000 + "x\n")
    elif how == "metrics_duplicated_column":
        t = pq.read_table(m)
        pq.write_table(t.append_column("eval_return", t.column("eval_return")), m)
    elif how == "metrics_string_return":
        t = pq.read_table(m)
        i = t.schema.get_field_index("episode_return")
        pq.write_table(t.set_column(i, "episode_return", pa.array(["high"] * t.num_rows)), m)
    else:
        raise AssertionError(how)


CORRUPT = {  # damage -> the exact reason every reader gives
    "status_int": "summary.json status 5 is not a string",
    "status_missing": "summary.json status None is not a string",
    "top_level_list": "summary.json is not a JSON object (a list)",
    "torn_summary": None,  # starts with "unreadable summary.json (JSONDecodeError: "
    "summary_says_1_metrics_hold_3": "metrics.parquet holds iterations [1..3] (3 rows), summary.json says 1",
    "iterations_str": "summary.json iterations '3' is not an int >= 0",
    "iterations_bool": "summary.json iterations True is not an int >= 0",
    "iterations_negative": "summary.json iterations -1 is not an int >= 0",
    "iterations_missing": "summary.json iterations None is not an int >= 0",
    "over_budget": "summary.json says 3 iterations, over budget.iterations=2 in config.yaml",
    "torn_config": None,  # starts with "unreadable config.yaml ("
    "truncated_metrics": None,  # starts with "unreadable metrics.parquet ("
    "no_metrics": None,
    "zero_based_iterations": "metrics.parquet holds iterations [0..2] (3 rows), summary.json says 3",
    # issue 36: worked out from the crafted entry (not from the code's own message table)
    "summary_fifo": "unreadable summary.json (is a FIFO, not a regular file)",
    "metrics_fifo": "unreadable metrics.parquet (is a FIFO, not a regular file)",
    "summary_dev_zero": "unreadable summary.json (is a symlink (not followed: run files must be regular files))",
    "metrics_dev_zero": "unreadable metrics.parquet (is a symlink (not followed: run files must be regular files))",
    "summary_loop": "unreadable summary.json (is a symlink (not followed: run files must be regular files))",
    "metrics_loop": "unreadable metrics.parquet (is a symlink (not followed: run files must be regular files))",
    "summary_deep": "unreadable summary.json (JSON nested deeper than 64 levels)",
    "summary_too_big": None,  # starts with "unreadable summary.json (is N bytes, over the"
    "summary_huge_iterations": "metrics.parquet holds iterations [1..3] (3 rows), summary.json says 100000000000",
    "config_deep": "unreadable config.yaml (YAML nested deeper than 64 levels)",
    "config_deep_block": "unreadable config.yaml (YAML nested deeper than 64 levels)",
    "metrics_duplicated_column": "unreadable metrics.parquet (has the column 'eval_return' more than once)",
    "metrics_string_return": "unreadable metrics.parquet (column 'episode_return' is string, expected double)",
}
PREFIX = {"torn_summary": "unreadable summary.json (JSONDecodeError: ",
          "torn_config": "unreadable config.yaml (", "truncated_metrics": "unreadable metrics.parquet (",
          "no_metrics": "unreadable metrics.parquet (",
          "summary_too_big": "unreadable summary.json (is "}


def _assert_reason(reason, how):
    if CORRUPT[how] is None:
        assert reason.startswith(PREFIX[how]), reason
    else:
        assert reason == CORRUPT[how]


def test_a_finished_run_is_finished_everywhere(tmp_path):
    d = _run(tmp_path)
    c = check_run(d)
    assert (c.finished, c.status, c.reason, c.kind, c.iterations) == (True, "completed", None, None, 3)
    assert check_finished(d) == "completed" and run_status(d) == "completed"
    df = analysis.load(tmp_path)
    assert df.attrs["left_out"] == [] and df["iteration"].tolist() == [1.0, 2.0, 3.0]
    assert point_done(Point("x", [], OmegaConf.create({"mode": "train"}), [d]))


def test_diverged_within_budget_and_zero_iterations_are_finished(tmp_path):
    d = _run(tmp_path, "div", n=2, status="diverged")
    assert check_finished(d) == "diverged" and run_status(d) == "diverged"
    z = tmp_path / "zero"
    write_run(z, {"iteration": pa.array([], pa.int64())}, summary=_summary("z", "completed", 0))
    assert check_run(z).finished and check_run(z).iterations == 0


@pytest.mark.parametrize("how", sorted(CORRUPT))
def test_a_damaged_run_is_named_and_redone_by_every_reader(how, tmp_path, caplog, monkeypatch):
    if how == "summary_too_big":
        monkeypatch.setattr(files_mod, "JSON_LIMIT", 4096)  # a bound a test can pass
    d = _run(tmp_path)
    _damage(d, how)
    c = check_run(d)
    assert not c.finished and c.kind == "corrupt"
    _assert_reason(c.reason, how)
    # the harness: not finished -> rerun, with a log line naming the run, the reason and the file
    caplog.set_level(logging.INFO, logger="harness")
    assert check_finished(d) is None
    (rec,) = [r for r in caplog.records if "rerun" in r.message]
    assert rec.message == f"rerun {d}: {c.reason} [{d / c.file}]"
    assert run_status(d) is None   # what point_done (python -m harness.experiments claims) reads
    assert not point_done(Point("x", [], OmegaConf.create({"mode": "train"}), [d]))
    # the report: left out, named with the same reason
    df = analysis.load(tmp_path)
    assert df.empty
    assert [(r["run_dir"], r["path"], r["reason"]) for r in df.attrs["left_out"]] == [
        (f"{TASK}/rloo/r", d.as_posix(), c.reason)]
    # the claims: not evidence, named with the same reason
    from analysis.claims import load_points
    e = load_points("claim_x", [Point("claim_x", [], OmegaConf.create({"mode": "train"}), [d])])
    assert e.runs[["status", "reason"]].values.tolist() == [["corrupt", c.reason]]
    assert e.metrics.empty and e.finished().empty
    assert e.left_out() == [{"experiment": "claim_x", "path": str(d), "status": "corrupt", "reason": c.reason}]


def test_unknown_status_string_and_failed_are_unfinished_not_corrupt(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    d = _run(tmp_path, "f")
    _summary_edit(d, status="failed", reason="ValueError: boom")
    c = check_run(d)
    assert (c.finished, c.status, c.kind, c.reason) == (False, "failed", "unfinished", "status 'failed' (ValueError: boom)")
    assert check_finished(d) is None and run_status(d) == "failed"   # app.py counts it as failed
    u = _run(tmp_path, "u")
    _damage(u, "status_unknown_string")
    assert check_run(u).reason == "status 'done'" and run_status(u) == "done" and check_finished(u) is None
    assert not [r for r in caplog.records if "rerun" in r.message]   # a failed run is redone quietly, as before
    left = {r["run_dir"]: r["reason"] for r in analysis.load(tmp_path).attrs["left_out"]}
    assert left == {f"{TASK}/rloo/f": "status 'failed' (ValueError: boom)", f"{TASK}/rloo/u": "status 'done'"}


def test_no_summary_is_missing_quietly(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    d = write_run(tmp_path / "running", curve_columns(TASK, "rloo", 0, iterations=3))
    c = check_run(d)
    assert (c.finished, c.kind, c.reason) == (False, "missing", "no summary.json (not run, still running or killed)")
    assert check_finished(d) is None and run_status(d) is None and not caplog.records
    assert check_run(tmp_path / "nowhere").kind == "missing"


def test_rundir_uses_the_shared_definition(tmp_path):
    assert rundir_mod.FINISHED == FINISHED == ("completed", "diverged")
    cfg = OmegaConf.create({"results_dir": str(tmp_path), "task": {"name": TASK}, "estimator": "rloo", "seed": 0})
    r = rundir_mod.RunDir(cfg)
    for i in (1, 2, 3):
        r.log({"iteration": i, "env_steps": 10 * i, "wall_time_s": 0.1 * i})
    r.finish("completed", None, 1.0)
    assert r.finished() == "completed" and r.status() == "completed" and check_run(r.path).finished
    _summary_edit(r.path, iterations=2)
    assert r.finished(quiet=True) is None and r.status() is None
