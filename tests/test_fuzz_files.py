"""Bad files in a results folder, through the command lines (issue 36, class "files").

Every file the harness or the analysis reads from a results folder goes through one reader,
:mod:`harness.io.files` (tests/test_finished.py checks each damaged file in process, with every
reader: the harness's skip-or-rerun, the report's loader, the claims' evidence). Here the same
damages are put in one folder next to good runs and the commands run on it as a user would:
``python -m analysis report`` ends with exit 0, names each bad run in one line and scores the good
ones, never hangs (a FIFO, ``/dev/zero``) and prints no traceback; ``python -m harness`` reruns a
run whose summary.json is nested 100,000 deep or claims 10**11 iterations, with one line naming
the file. Also: a finished run with no score is named as left out (item 11), and summary.json's
``final`` holds each column's last recorded value with its iteration (item 15).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.analysis_fixtures import _summary, curve_columns, run_analysis_cli, write_run
from tests.control_helpers import make_cfg
from tests.test_finished import CONFIG, CORRUPT, TASK, _damage

from harness.io import RunDir
from harness.io.finished import check_run

REPO = Path(__file__).resolve().parents[1]
TINY_RUN = ["task=cartpole", "estimator=a2c", "budget.iterations=2", "task.num_envs=2", "task.rollout_steps=8",
            "eval_every=0", "progress=false", "task.hidden=[8]", "minibatches=1"]
FILE_DAMAGES = sorted(h for h in CORRUPT if h.startswith(("summary_", "metrics_", "config_")) and h != "summary_too_big")


def _good(root: Path, name: str, seed: int, n: int = 4) -> Path:
    cols = curve_columns(TASK, "rloo", seed, iterations=n, eval_every=1)
    return write_run(root / TASK / "rloo" / name, cols, summary=_summary(name, "completed", n), config=CONFIG)


def test_the_report_names_every_bad_file_and_scores_the_rest(tmp_path):
    root = tmp_path / "res"
    for seed in range(3):
        _good(root, f"good{seed}", seed, n=3)
    bad = {}
    for i, how in enumerate(FILE_DAMAGES):
        d = _good(root, f"bad_{how}", 10 + i, n=3)
        _damage(d, how)
        bad[d.as_posix()] = check_run(d).reason  # the reason the shared definition gives in process
    out = run_analysis_cli("report", str(root), "--reps", "50", "--out", str(tmp_path / "rep"), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"3 runs scored, 1 task(s), 1 estimator(s): 3 completed, 0 diverged; {len(bad)} left out" in lines, lines
    for path, why in bad.items():
        assert why is not None and f"  left out: {path}: {why}" in lines, (path, why)


def test_the_harness_reruns_a_run_whose_files_break_the_bounds(tmp_path):
    """A summary.json nested 100,000 deep (RecursionError on main) or claiming 10**11 iterations
    (MemoryError on main): one line naming the file, the run redone, exit 0."""
    from harness.io.rundir import run_dir_for

    res = tmp_path / "res"
    for k, damage in enumerate(("deep", "huge")):
        overrides = [*TINY_RUN, f"seed={k}", f"results_dir={res}"]
        d = run_dir_for(make_cfg(overrides))
        d.mkdir(parents=True)
        pq.write_table(pa.table({"iteration": pa.array([1], pa.int64())}), d / "metrics.parquet")
        text = ('{"status": "completed", "x": ' + "[" * 100_000 + "]" * 100_000 + "}" if damage == "deep"
                else json.dumps({"status": "completed", "iterations": 10 ** 11}))
        (d / "summary.json").write_text(text)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        assert "Traceback" not in text and "1 completed" in out.stdout, text
        why = ("JSON nested deeper than 64 levels" if damage == "deep"
               else "holds iterations [1..1] (1 rows), summary.json says 100000000000")
        named = [ln for ln in text.splitlines() if f"rerun {d}" in ln and why in ln]
        assert len(named) == 1, text
        assert check_run(d).finished


def test_a_finished_run_without_a_score_is_left_out_by_name(tmp_path):
    """An env that never ends an episode and eval_every=0: nothing to score. Named, with the
    reason, and not counted as scored (main: "3 runs scored, 0 left out", the estimator n=2)."""
    from analysis.load import NO_SCORE

    root = tmp_path / "res"
    for seed in range(2):
        _good(root, f"good{seed}", seed)
    cols = curve_columns(TASK, "rloo", 5, iterations=4, eval_every=1)
    cols["eval_return"] = [None] * 4
    cols["episode_return"] = [float("nan")] * 4
    d = write_run(root / TASK / "rloo" / "noscore", cols, summary=_summary("noscore", "completed", 4), config=CONFIG)
    out = run_analysis_cli("report", str(root), "--reps", "50", "--out", str(tmp_path / "rep"), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "2 runs scored, 1 task(s), 1 estimator(s): 2 completed, 0 diverged; 1 left out" in lines, lines
    assert f"  left out: {d.as_posix()}: {NO_SCORE}" in lines


def test_summary_final_holds_each_columns_last_value_and_its_iteration(tmp_path):
    """Worked by hand: episode_return last ended an episode at iteration 2, eval_return was last
    evaluated at 3, policy_loss is NaN at 4 (its last number is at 3); strings are not metrics."""
    r = RunDir(make_cfg([*TINY_RUN, f"results_dir={tmp_path}"]))
    r.start()
    base = {"run_id": "x", "task": "t", "estimator": "a2c", "seed": 0, "update": "clip", "loss_agg": "token-mean",
            "env_steps": 16, "wall_time_s": 0.5}
    r.log({**base, "iteration": 1, "episode_return": 10.0, "eval_return": None, "policy_loss": 0.1})
    r.log({**base, "iteration": 2, "episode_return": 12.0, "eval_return": None, "policy_loss": 0.2})
    r.log({**base, "iteration": 3, "episode_return": None, "eval_return": 30.0, "policy_loss": 0.3})
    r.log({**base, "iteration": 4, "episode_return": None, "eval_return": None, "policy_loss": math.nan})
    r.finish("completed", None, 1.0)
    s = json.loads((r.path / "summary.json").read_text())
    assert {k: s["final"][k] for k in ("episode_return", "eval_return", "policy_loss", "iteration")} == {
        "episode_return": 12.0, "eval_return": 30.0, "policy_loss": 0.3, "iteration": 4}
    assert {k: s["final_iteration"][k] for k in ("episode_return", "eval_return", "policy_loss")} == {
        "episode_return": 2, "eval_return": 3, "policy_loss": 3}
    assert "task" not in s["final"] and "update" not in s["final"]

