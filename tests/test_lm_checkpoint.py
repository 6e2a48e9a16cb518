"""LM checkpoints and resume (issue 7), in process on CPU with the tiny LM task: a run killed
midway and restarted resumes from its last checkpoint and ends with exactly the metrics of an
uninterrupted run (wall-clock columns aside); checkpoints change nothing; they are safetensors
+ JSON, never pickles, and are gone once the run finishes.

A "kill" raises a ``BaseException`` out of the training loop, which neither the LM trainer nor
the app catches: no summary.json is written, as after SIGKILL (as in tests/test_checkpoint.py).
"""
import json
import logging

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from harness.app import run
from harness.validation import validate
from harness.io import checkpoint as ckpt
from harness.train.lm import MEASURED_COLUMNS, LMSource

from .test_checkpoint import Killed, kill_at  # one killer for every trainer
from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)

SUMMARY_KEYS = ["status", "reason", "iterations", "tokens", "prompts_truncated", "eval_return_init",
                "eval_gold_greedy_init"]


def count_calls(monkeypatch, name: str) -> list[int]:
    calls = []
    original = getattr(LMSource, name)

    def wrapped(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LMSource, name, wrapped)
    return calls


def run_dirs(root) -> list:
    return sorted(p.parent for p in root.rglob("config.yaml"))


def metrics(d) -> pd.DataFrame:
    return pq.read_table(d / "metrics.parquet").to_pandas().drop(columns=list(MEASURED_COLUMNS))


def summary(d) -> dict:
    s = json.loads((d / "summary.json").read_text())
    return {k: s.get(k) for k in SUMMARY_KEYS}


def assert_same_runs(a, b) -> None:
    da, db = run_dirs(a), run_dirs(b)
    assert [d.relative_to(a) for d in da] == [d.relative_to(b) for d in db] and da
    for x, y in zip(da, db):
        pd.testing.assert_frame_equal(metrics(x), metrics(y), check_exact=True, obj=str(x.relative_to(a)))
        assert summary(x) == summary(y)


CASES = {  # overrides, iterations, checkpoint_every, iteration at which the run is killed
    # head-free; killed at 4, resumed from the checkpoint at 2
    "rloo": (["estimator=rloo"], 5, 2, 4),
    # separate critic model (its weights and Adam state), minibatch order from cpu_gen
    "ppo_gae_critic_model": (["estimator=ppo_gae", "lm.critic=model", "minibatches=2", "epochs=2"], 5, 2, 4),
    # value head on the policy, adaptive KL beta carried over
    "ppo_gae_head_adaptive_kl": (["estimator=ppo_gae", "kl.adaptive=true", "kl.beta=0.2", "kl.kl_target=0.01"],
                                 5, 2, 5),
    # metrics were flushed at iteration 10, after the checkpoint at 8: resume truncates them;
    # greedy rollouts (ReMax)
    "remax_truncated_metrics": (["estimator=remax"], 12, 4, 11),
    # kl.beta=0: kl_ref measured at iterations 1 and 4 only; the resumed run counts on from 2
    "grpo_beta0_kl_ref_every": (["estimator=grpo", "kl.beta=0", "lm.kl_ref_every=3"], 5, 2, 4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_lm_run_resumes_from_checkpoint_with_identical_metrics(case, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    overrides, n_iter, every, kill = CASES[case]
    resumed_at = (kill - 1) // every * every
    args = [*overrides, f"budget.iterations={n_iter}", f"checkpoint_every={every}"]
    assert run(compose(*args, "checkpoint_every=0", results_dir=tmp_path / "plain")) == \
        {"skipped": 0, "completed": 1}
    assert run(compose(*args, results_dir=tmp_path / "ref")) == {"skipped": 0, "completed": 1}
    # checkpointing itself changes nothing, and leaves nothing behind
    assert_same_runs(tmp_path / "plain", tmp_path / "ref")
    assert not list((tmp_path / "ref").rglob(ckpt.CHECKPOINT_FILE))
    (ref_dir,) = run_dirs(tmp_path / "ref")
    ref = metrics(ref_dir)
    assert ref.iteration.tolist() == list(range(1, n_iter + 1))
    if "adaptive" in case:
        assert ref.kl_beta.nunique() == n_iter  # beta moves every iteration: a stale one would show
    if "kl_ref_every" in case:
        assert ref.kl_ref.notna().tolist() == [True, False, False, True, False]

    killed = tmp_path / "killed"
    kill_at(monkeypatch, kill)
    with pytest.raises(Killed):
        run(compose(*args, results_dir=killed))
    monkeypatch.undo()
    (d,) = run_dirs(killed)
    assert not (d / "summary.json").exists()
    half = pq.read_table(d / "metrics.parquet").column("iteration").to_pylist()
    assert resumed_at <= len(half) < kill and half == list(range(1, len(half) + 1))
    if case == "remax_truncated_metrics":
        assert len(half) == 10 > resumed_at  # rows past the checkpoint: resume drops them
    _, meta = ckpt.load(d / ckpt.CHECKPOINT_FILE)
    assert meta["trainer"] == "lm" and meta["iteration"] == resumed_at
    assert [r["iteration"] for r in meta["members"][0]["rows"]] == list(range(1, resumed_at + 1))

    collects = count_calls(monkeypatch, "collect")
    evaluations = count_calls(monkeypatch, "_evaluate")
    assert run(compose(*args, results_dir=killed)) == {"skipped": 0, "completed": 1}
    assert len(collects) == n_iter - resumed_at  # resumed at the checkpoint, not from zero
    assert len(evaluations) == n_iter - resumed_at  # eval_every=1; the initial evaluation is not redone
    assert any("resume" in r.message and f"at iteration {resumed_at}" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", killed)
    assert not list(killed.rglob(ckpt.CHECKPOINT_FILE))  # finished runs keep no checkpoint
    assert not list(killed.rglob(".*.tmp"))


def test_lm_checkpoint_is_safetensors_with_weights_optimizer_rng_and_counters(tmp_path, monkeypatch):
    args = ["estimator=ppo_gae", "lm.critic=model", "budget.iterations=4", "checkpoint_every=2"]
    kill_at(monkeypatch, 3)
    with pytest.raises(Killed):
        run(compose(*args, results_dir=tmp_path))
    (path,) = tmp_path.rglob(ckpt.CHECKPOINT_FILE)
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])  # safetensors: length + JSON
    assert "__metadata__" in header and raw[8:9] == b"{"  # a JSON header at byte 8, not a pickle
    assert b"torch._utils" not in raw and b"cnumpy" not in raw  # nothing pickled in the metadata
    tensors, meta = ckpt.load(path)
    names = set(tensors)
    policy = {n for n in names if n.startswith("param/policy.lm.")}
    critic = {n for n in names if n.startswith("param/critic.")}
    assert policy and critic and "param/critic.head.weight" in names
    assert not any(n.startswith("param/policy.value_head") for n in names)  # lm.critic=model: no head
    some = sorted(policy)[0][len("param/"):]
    assert {f"adam/{some}/exp_avg", f"adam/{some}/exp_avg_sq", f"adam/{some}/step"} <= names
    assert {"adam/critic.head.weight/exp_avg", "rng/torch", "rng/numpy_keys", "rng/generator0",
            "rng/generator1"} <= names
    assert meta["iteration"] == 2 and meta["seeds"] == [0] and meta["format"] == 2
    assert [r["iteration"] for r in meta["members"][0]["rows"]] == [1, 2]
    assert meta["source"]["tokens"] == meta["members"][0]["rows"][-1]["tokens"] > 0
    assert tensors["loop/kl_beta"].tolist() == [0.05]
    assert len(meta["source"]["prompt_rng"][1]) == 625 and len(meta["rng"]["python"][1]) == 625
    assert 0 <= meta["init"]["eval_return_init"] <= 1 and "eval_gold_greedy_init" in meta["init"]

    # a head on the policy (lm.critic=head) is saved with it
    kill_at(monkeypatch, 3)
    with pytest.raises(Killed):
        run(compose("estimator=ppo_gae", "budget.iterations=4", "checkpoint_every=2", results_dir=tmp_path / "h"))
    (path,) = (tmp_path / "h").rglob(ckpt.CHECKPOINT_FILE)
    tensors, _ = ckpt.load(path)
    assert {"param/policy.value_head.weight", "adam/policy.value_head.weight/exp_avg"} <= set(tensors)
    assert not any(n.startswith("param/critic.") for n in tensors)


def test_population_members_resume_from_their_own_checkpoints(tmp_path, monkeypatch, caplog):
    """Members train one after another: member 0 finished, member 1 killed midway; the rerun
    skips member 0 and resumes member 1 from its own checkpoint."""
    caplog.set_level(logging.INFO, logger="harness")
    args = ["estimator=grpo", "population=2", "budget.iterations=5", "checkpoint_every=2"]
    assert run(compose(*args, results_dir=tmp_path / "ref")) == {"skipped": 0, "completed": 2}
    kill_at(monkeypatch, 4, seed=1)
    with pytest.raises(Killed):
        run(compose(*args, results_dir=tmp_path / "k"))
    monkeypatch.undo()
    checkpoints = list((tmp_path / "k").rglob(ckpt.CHECKPOINT_FILE))
    assert len(checkpoints) == 1 and checkpoints[0].parent.name.startswith("seed1-")
    collects = count_calls(monkeypatch, "collect")
    assert run(compose(*args, results_dir=tmp_path / "k")) == {"skipped": 1, "completed": 1}
    assert len(collects) == 5 - 2
    assert_same_runs(tmp_path / "ref", tmp_path / "k")
    assert not list((tmp_path / "k").rglob(ckpt.CHECKPOINT_FILE))


def test_population_workers_split_the_members_and_change_no_number(tmp_path, caplog):
    """``population_workers=2``: the members are split over two forked processes (a log line names
    the split), each training its slice one after another; every member's files are its run's with
    one process, bit for bit (the measured columns aside)."""
    caplog.set_level(logging.INFO, logger="harness")
    args = ["estimator=ppo_gae", "population=3", "budget.iterations=3", "minibatches=2"]
    assert run(compose(*args, "population_workers=1", results_dir=tmp_path / "one")) == {"skipped": 0, "completed": 3}
    assert "worker processes" not in caplog.text
    assert run(compose(*args, "population_workers=2", results_dir=tmp_path / "two")) == {"skipped": 0, "completed": 3}
    assert "population of 3: 2 worker processes (seeds 0-1, 2-2)" in caplog.text
    assert_same_runs(tmp_path / "one", tmp_path / "two")


@pytest.mark.parametrize("damage", ["truncated", "other_seed", "missing_generator", "missing_adam", "adam_shape",
                                    "past_budget", "bad_prompt_rng"])
def test_unusable_lm_checkpoint_is_named_and_the_run_restarts_from_zero(damage, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    args = ["estimator=rloo", "budget.iterations=4", "checkpoint_every=2"]
    run(compose(*args, results_dir=tmp_path / "ref"))
    kill_at(monkeypatch, 4)
    with pytest.raises(Killed):
        run(compose(*args, results_dir=tmp_path / "k"))
    monkeypatch.undo()
    (c,) = (tmp_path / "k").rglob(ckpt.CHECKPOINT_FILE)
    if damage == "truncated":
        c.write_bytes(c.read_bytes()[:100])
    else:
        tensors, meta = ckpt.load(c)
        if damage == "other_seed":
            meta["seeds"] = [1]
        elif damage == "missing_generator":
            tensors.pop("rng/generator1")
        elif damage == "adam_shape":  # re-stamped with this run's hash: only the shape check catches it
            key = next(k for k in tensors if k.startswith("adam/policy.lm.") and k.endswith("/exp_avg_sq"))
            tensors[key] = torch.zeros(7)
        elif damage == "past_budget":
            meta["iteration"] = 10
        elif damage == "bad_prompt_rng":
            meta["source"]["prompt_rng"] = [3, [1, 2], None]
        else:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("adam/policy.lm.")}
        ckpt.save(c, tensors, meta)
    collects = count_calls(monkeypatch, "collect")
    assert run(compose(*args, results_dir=tmp_path / "k")) == {"skipped": 0, "completed": 1}
    assert len(collects) == 4  # from zero
    assert any(str(c) in r.message and "not resuming" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", tmp_path / "k")
    assert not list((tmp_path / "k").rglob(ckpt.CHECKPOINT_FILE))


def test_checkpoint_every_is_accepted_for_lm(tmp_path):
    validate(compose("estimator=rloo", "checkpoint_every=5", results_dir=tmp_path))
