"""Bad LM inputs (issue 12): no code from a model folder, no crash from a crafted file, one
clear line naming the field for every bad value, no stale temp folders, no cache in the cwd."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from harness.tasks.lm.pipeline import build_task, cached_stage, remove_stale_temps

from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)


# --------------------------------------------------------------------------- 4. stale temp folders
def _fast_build(out: Path) -> dict:
    (out / "weights.safetensors").write_text("w")
    return {"value": 1}


def _hang_build(out: Path) -> dict:
    (out / "half.safetensors").write_text("half")
    time.sleep(600)
    return {"value": 0}


def _build_and_hang(cache_dir):
    cached_stage(cache_dir, "sft", {"x": 1}, _hang_build)


def test_builder_killed_with_sigkill_leaves_no_temp_folder_for_good(tmp_path):
    """A builder killed mid-build (SIGKILL: no cleanup runs) leaves its temp folder; the next
    build of that stage, holding the stage lock, removes it and builds."""
    import multiprocessing as mp

    cache = tmp_path / "cache"
    child = mp.get_context("fork").Process(target=_build_and_hang, args=(cache,))
    child.start()
    deadline = time.time() + 60
    while not list(cache.glob(".sft-*.tmp/half.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    [stale] = list(cache.glob(".sft-*.tmp"))
    assert stale.name.endswith(f".{child.pid}.tmp")
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert stale.is_dir()  # what the killed builder left
    folder, meta, reused = cached_stage(cache, "sft", {"x": 1}, _fast_build)
    assert not reused and meta["value"] == 1 and (folder / "stage.json").is_file()
    assert not list(cache.glob(".*.tmp")), "the killed builder's temp folder is still there"


def test_temp_folders_of_other_keys_go_only_when_no_builder_holds_their_lock(tmp_path):
    import fcntl

    cache = tmp_path / "cache"
    cache.mkdir()
    free, busy, other_stage = cache / ".sft-aaaaaaaaaaaa.123.tmp", cache / ".sft-bbbbbbbbbbbb.456.tmp", \
        cache / ".rm-cccccccccccc.789.tmp"
    for tmp in (free, busy, other_stage):
        tmp.mkdir()
        (tmp / "junk").write_text("x")
        (cache / f"{tmp.name.rsplit('.', 2)[0]}.lock").touch()
    with open(cache / ".sft-bbbbbbbbbbbb.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live builder of that key
        removed = remove_stale_temps(cache, "sft", "dddddddddddd")
    assert removed == [free] and not free.exists() and busy.is_dir() and other_stage.is_dir()


def test_real_sft_build_removes_its_stale_temp_folder(tmp_path):
    cheap = ("estimator=rloo", "lm.reward=gold", "lm.sft.steps=2")
    key = build_task(compose(*cheap, results_dir=tmp_path)).meta["sft"]["key"]  # the shared test cache
    cache = tmp_path / "cache"
    stale = cache / f".sft-{key}.999999.tmp"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_text("half a model")
    task = build_task(compose(*cheap, results_dir=tmp_path, cache_dir=cache))
    assert task.meta["sft"]["key"] == key and task.meta["sft"]["cached"] is False
    assert (cache / f"sft-{key}" / "stage.json").is_file()
    assert not stale.exists() and not list(cache.glob(".*.tmp"))
