"""``python -m harness`` starts with Python's cyclic collector off and freezes start-up's objects
when a run begins (:func:`harness.__main__.end_startup`): what the runs compute is unchanged, and
the collector is back on, with start-up frozen, whenever a run trains."""
from __future__ import annotations

import os
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
    (["task=toy", "estimator=grpo"], False),  # Adam made and stepped as the control task's is, unfused
    (["task=cartpole", "estimator=ppo_gae", "mode=probe"], True),  # the probe's critic fit
    (["task=cartpole", "estimator=ppo_gae", "reference=sb3"], True),  # SB3's own optimizer
])
def test_the_cli_imports_dynamo_at_start_up_for_the_runs_that_will(args, imports):
    from harness.app import imports_dynamo

    assert imports_dynamo(make_cfg(args)) is imports


_MMAPPED = ("import ctypes, sys\n"
            "class M(ctypes.Structure):\n"
            "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd',\n"
            "                'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.mallinfo2.restype = M\n"
            "from harness.allocator import tune_allocator\n"
            "tuned = tune_allocator()\n"
            "before = libc.mallinfo2().hblkhd\n"
            "block = bytearray(4 * 2**20)\n"  # 4 MiB: mmapped at glibc's start (128 KiB), heap when tuned
            "print(tuned, libc.mallinfo2().hblkhd - before >= 4 * 2**20)\n")


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's allocator only")
@pytest.mark.parametrize("user_env, expected", [({}, "True False"), ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "False True")])
def test_the_cli_keeps_big_blocks_on_glibcs_heap_unless_the_user_tuned_it(user_env, expected):
    """:func:`harness.allocator.tune_allocator` (the CLI calls it first): a 4 MiB block, which
    glibc maps on its own at its start-up settings, comes from the heap once it ran (``mallinfo2``'s
    mmapped bytes do not grow); a user's own ``MALLOC_*`` setting is left alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    r = subprocess.run([sys.executable, "-c", _MMAPPED], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**env, **user_env})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == expected


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_the_claims_runner_tunes_the_allocator_as_the_cli_does(tmp_path):
    """``python -m analysis claims --run`` trains in its own process (and forks population workers
    from it): :func:`harness.experiments.run.run_claims` tunes glibc's allocator first, as
    ``python -m harness`` does (here with no claim selected, so nothing runs)."""
    code = _MMAPPED.replace("from harness.allocator import tune_allocator\ntuned = tune_allocator()\n",
                            "from harness.experiments.run import run_claims\n"
                            f"tuned = run_claims({str(tmp_path)!r}, only=set(), progress=print) == {{}}\n")
    assert "run_claims" in code
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True False"  # nothing ran; the 4 MiB block came from the heap


@pytest.mark.parametrize("thread", [False, True], ids=["ends-in-command", "waits-for-a-thread"])
def test_a_command_ends_as_a_normal_exit_would_less_the_teardown(thread, tmp_path):
    """``python -m harness`` (:func:`harness.__main__.command`) ends its process after the command
    without the interpreter's teardown: what a normal exit does before it still happens (``atexit``
    handlers, buffered output flushed, status 0) and an object's finalizer, which only the teardown
    would run, does not. A thread that is not a daemon and still runs makes it return instead, and
    the normal exit waits for the thread."""
    args = ["task=cartpole", "estimator=ppo_gae", *TINY, "budget.iterations=1", f"results_dir={tmp_path / 'r'}",
            f"hydra.run.dir={tmp_path / 'h'}"]
    code = ("import atexit, os, sys, threading\n"
            "import harness.__main__ as m\n"
            "class Teardown:\n"
            "    def __del__(self, write=os.write):\n"
            "        write(1, b'teardown\\n')\n"
            "keep = Teardown()\n"
            # registered last, so run first (before logging's handlers flush): only exit_now's flush sends it
            "atexit.register(print, 'atexit', end='', file=sys.stderr)\n"
            f"sys.argv = ['harness', *{args!r}]\n"
            "print('buffered', end=' ')\n"  # in stdout's buffer (a pipe) when the command ends
            "go = threading.Event()\n"
            + ("threading.Thread(target=go.wait).start()\n" if thread else "")
            + "m.command()\n"
            "print('after')\n"
            "go.set()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as piped
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((tmp_path / "r").rglob("summary.json"))
    lines = r.stdout.split()
    assert lines[0] == "buffered" and "completed" in lines, r.stdout
    assert r.stderr.endswith("atexit"), r.stderr[-2000:]
    if thread:  # command() returned: the script went on, the thread was waited for, the teardown ran
        assert lines[-2:] == ["after", "teardown"], r.stdout
    else:
        assert "after" not in lines and "teardown" not in lines, r.stdout
