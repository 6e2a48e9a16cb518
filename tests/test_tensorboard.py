"""``logger=tensorboard`` (harness.io.trackers): every run's metric rows also as TensorBoard events.

The events are read back with TensorBoard's own ``EventAccumulator`` and compared with
metrics.parquet read independently with pandas: one scalar per numeric non-null cell, tagged
with its column, at step ``env_steps``, value rounded to float32 (TensorBoard's scalar type).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from harness.app import run
from harness.io import config_hash
from harness.validation import validate
from tests.control_helpers import TINY, make_cfg
from tests.tracker_helpers import expected_from_parquet, run_dirs

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from tests.test_checkpoint import Killed, kill_at  # noqa: E402

CONTROL = ["task=cartpole", "estimator=a2c", *TINY, "budget.iterations=3", "eval_every=2", "threads=1"]


def events(run_dir) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every scalar event under ``run_dir/tb``."""
    ea = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def assert_events_equal_parquet(run_dir) -> None:
    got, want = events(run_dir), expected_from_parquet(run_dir, np.float32)
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    for tag in want:
        assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
        np.testing.assert_array_equal([v for _, v in got[tag]], [v for _, v in want[tag]], err_msg=tag)


def test_events_hold_every_numeric_column_of_metrics_parquet(tmp_path):
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}", "logger=tensorboard"]))
    (d,) = run_dirs(tmp_path)
    assert len(list((d / "tb").glob("events.out.tfevents.*"))) == 1
    assert_events_equal_parquet(d)
    got = events(d)
    # spot checks against the run's own numbers: 3 iterations, evaluated at 2 and at the end
    df = pd.read_parquet(d / "metrics.parquet")
    assert [v for _, v in got["iteration"]] == [1.0, 2.0, 3.0]
    assert [s for s, _ in got["iteration"]] == df["env_steps"].tolist()
    assert [s for s, _ in got["eval_return"]] == df["env_steps"].tolist()[1:]
    assert {"run_id", "task", "update"}.isdisjoint(got)  # strings are not scalars


def test_population_writes_one_event_folder_per_member(tmp_path):
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}", "logger=tensorboard", "population=2", "seed=4"]))
    dirs = run_dirs(tmp_path)
    assert [d.name.split("-")[0] for d in dirs] == ["seed4", "seed5"]
    for d in dirs:
        assert len(list((d / "tb").glob("events.out.tfevents.*"))) == 1
        assert_events_equal_parquet(d)
        assert {v for _, v in events(d)["seed"]} == {float(d.name[4])}


def test_toy_task_events_too(tmp_path):
    run(make_cfg(["task=toy", "estimator=rloo", "budget.iterations=3", "progress=false",
                  f"results_dir={tmp_path}", "logger=tensorboard"]))
    (d,) = run_dirs(tmp_path)
    assert_events_equal_parquet(d)


def test_logger_off_writes_no_events_and_no_logger_changes_the_run_hash(tmp_path):
    run(make_cfg([*CONTROL, f"results_dir={tmp_path}"]))
    (d,) = run_dirs(tmp_path)
    assert not (d / "tb").exists()
    # the run directory of a run with the logger is the same one (pinned hashes of
    # tests/test_checkpoint.py::test_new_fields_leave_run_directory_hashes_unchanged)
    for overrides, pinned in {(): "ab1ce9aeb4", ("estimator=rloo",): "89080fd17d"}.items():
        assert config_hash(make_cfg([*overrides, "logger=tensorboard"])) == pinned
    assert config_hash(make_cfg([*CONTROL, "logger=tensorboard"])) == d.name.split("-")[1]
    # ... so a finished run is skipped, not redone for its events
    assert run(make_cfg([*CONTROL, f"results_dir={tmp_path}", "logger=tensorboard"])) == {"skipped": 1}
    assert not (d / "tb").exists()


def test_resumed_run_has_each_step_once(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    args = [*CONTROL, "budget.iterations=7", "checkpoint_every=3", f"results_dir={tmp_path}", "logger=tensorboard"]
    kill_at(monkeypatch, 6)  # dies building iteration 6's row: rows 1..5 logged, checkpoint at 3
    with pytest.raises(Killed):
        run(make_cfg(args))
    monkeypatch.undo()
    (d,) = run_dirs(tmp_path)
    assert [v for _, v in events(d)["iteration"]] == [1.0, 2.0, 3.0, 4.0, 5.0]  # live: 4, 5 are on disk
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}
    assert any("resume" in r.message and "at iteration 3" in r.message for r in caplog.records)
    got = events(d)
    assert [v for _, v in got["iteration"]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # 4 and 5 once
    assert len(list((d / "tb").glob("events.out.tfevents.*"))) == 1  # the killed attempt's file is gone
    assert_events_equal_parquet(d)


@pytest.mark.parametrize("value", ["tb", "TensorBoard", "w&b", ""])
def test_unknown_logger_is_refused(value):
    with pytest.raises(ValueError, match=r"^logger must be one of \['none', 'tensorboard', 'wandb', 'mlflow'\], got"):
        validate(make_cfg(["task=cartpole", "estimator=a2c", f"logger={value!r}"]))


def test_logger_tensorboard_without_the_package_is_refused_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^logger must be 'none' here: logger=tensorboard needs the tensorboard "):
        run(make_cfg([*CONTROL, "results_dir=res", "logger=tensorboard"]))
    assert not list(tmp_path.iterdir())
