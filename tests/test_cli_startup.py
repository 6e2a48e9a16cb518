"""``python -m harness`` starts with Python's cyclic collector off and freezes start-up's objects
when a run begins (:func:`harness.__main__.end_startup`): what the runs compute is unchanged, and
the collector is back on, with start-up frozen, whenever a run trains."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.app import run
from tests.control_helpers import TINY, make_cfg
from tests.test_checkpoint import assert_same_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("extra", [["population=1"], ["population=3", "population_workers=2", "anneal_lr=true"]],
                         ids=["lone", "population-forked"])
def test_the_cli_run_is_the_in_process_run(extra, tmp_path):
    # the CLI process (collector paused, then start-up frozen; forked workers for the population)
    # against the same config trained in this process, where the collector runs all along (the
    # same worker layout and threads: a member's slice size and thread count move float32's last digits)
    args = ["task=cartpole", "estimator=ppo_gae", *TINY, "budget.iterations=4", "threads=1", *extra]
    r = subprocess.run([sys.executable, "-m", "harness", *args, f"results_dir={tmp_path / 'cli'}",
                        f"hydra.run.dir={tmp_path / 'hydra'}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run(make_cfg([*args, f"results_dir={tmp_path / 'inproc'}"]))
    assert_same_runs(tmp_path / "cli", tmp_path / "inproc")


@pytest.mark.parametrize("dynamo", [True, False])
def test_startup_pauses_the_collector_until_end_startup(dynamo):
    code = ("import gc, sys\n"
            "import harness.__main__ as m\n"
            "assert not gc.isenabled() and gc.get_freeze_count() == 0\n"
            f"m.end_startup({dynamo})\n"
            "n = gc.get_freeze_count()\n"
            f"assert gc.isenabled() and n > 10_000 and ('torch._dynamo' in sys.modules) is {dynamo}, n\n"
            "m.end_startup()\n"  # a sweep's next job: nothing more is frozen
            "assert gc.get_freeze_count() == n\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_on_start_is_called_only_when_a_valid_run_trains(tmp_path):
    calls: list[int] = []
    args = ["task=cartpole", "estimator=ppo_gae", *TINY, f"results_dir={tmp_path}"]
    with pytest.raises(ValueError):
        run(make_cfg([*args, "lr=-1"]), on_start=lambda: calls.append(1))
    assert calls == []
    assert run(make_cfg(args), on_start=lambda: calls.append(len(list(tmp_path.rglob("config.yaml")))))
    assert calls == [0]  # once, before the run folder was started (its config.yaml)
    assert list(tmp_path.rglob("metrics.parquet"))
    counts = run(make_cfg(args), on_start=lambda: calls.append(-1))  # every member finished: nothing trains
    assert counts.get("skipped") == 1 and calls == [0]


@pytest.mark.parametrize("args, imports", [
    (["task=cartpole", "estimator=ppo_gae"], False),  # fused Adam, made and stepped without it
    (["task=lm_summarize", "estimator=grpo"], True),  # transformers' import
    (["task=toy", "estimator=grpo"], True),  # torch.optim.Adam's own step
    (["task=cartpole", "estimator=ppo_gae", "mode=probe"], True),  # the probe's critic fit
    (["task=cartpole", "estimator=ppo_gae", "reference=sb3"], True),  # SB3's own optimizer
])
def test_the_cli_imports_dynamo_at_start_up_for_the_runs_that_will(args, imports):
    from harness.app import imports_dynamo

    assert imports_dynamo(make_cfg(args)) is imports
