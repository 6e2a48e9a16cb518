"""Checkpoints and resume (issue 7), in process on CPU: a run killed midway and restarted
ends with exactly the metrics of an uninterrupted run; corrupt files are named and redone;
nothing is unpickled; run-directory hashes of existing configs do not move.

A "kill" here raises a ``BaseException`` out of the training loop, which the app does not
catch: no summary.json is written, as after SIGKILL (tests/test_faults.py kills real processes).
"""
import json
import logging
import time

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from harness.app import restore_determinism, run, set_determinism
from harness.validation import validate
from harness.io import checkpoint as ckpt
from harness.io import config_hash
from harness.train import loop as train_loop
from harness.train.loop import Loop
from tests.control_helpers import TINY, make_cfg


class Killed(BaseException):
    """Not an Exception: the app records nothing, like a SIGKILL."""


def kill_at(monkeypatch, iteration: int, seed: int | None = None) -> None:
    """Make the trainer (of member ``seed``, or any) die while building iteration ``iteration``'s
    metric rows. Its metrics.parquet is rewritten every ``FLUSH_EVERY`` iterations whatever the
    clock (``FLUSH_SECONDS`` 0, as on a machine slow enough for it), so rows logged past the last
    checkpoint are on disk when it dies, and the resume must drop them."""
    monkeypatch.setattr(train_loop, "FLUSH_SECONDS", 0.0)
    original = Loop._row

    def row(self, p, rec):
        if rec.iteration == iteration and seed in (None, self.source.seeds[p]):
            raise Killed(f"killed at iteration {rec.iteration}")
        return original(self, p, rec)

    monkeypatch.setattr(Loop, "_row", row)


def count_updates(monkeypatch) -> list[int]:
    calls = []
    original = train_loop.update

    def update(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(train_loop, "update", update)
    return calls


def metrics_by_run(root) -> dict[str, pd.DataFrame]:
    """Each run directory's metrics (wall clock dropped) keyed by its path below ``root``."""
    out = {}
    for p in sorted(root.rglob("metrics.parquet")):
        out[str(p.parent.relative_to(root))] = pq.read_table(p).to_pandas().drop(columns=["wall_time_s"])
    return out


def statuses(root) -> dict[str, str]:
    return {str(p.parent.relative_to(root)): json.loads(p.read_text())["status"] for p in root.rglob("summary.json")}


def assert_same_runs(a, b) -> None:
    ma, mb = metrics_by_run(a), metrics_by_run(b)
    assert sorted(ma) == sorted(mb) and ma
    for key in ma:
        pd.testing.assert_frame_equal(ma[key], mb[key], check_exact=True, obj=key)
    assert statuses(a) == statuses(b)


CASES = {  # overrides, iteration at which the run is killed (checkpoints every 3 iterations)
    # persistent native vector envs (replayed), discrete, a population of 2; metrics were
    # flushed at iteration 10, after the checkpoint at 9: resume truncates them
    "ppo_gae": (["task=cartpole", "estimator=ppo_gae", "population=2", "budget.iterations=14"], 11),
    # persistent SyncVectorEnv, continuous actions, adaptive KL beta carried over
    "a2c_pendulum": (["task=pendulum", "estimator=a2c", "kl.adaptive=true", "kl.beta=0.01",
                      "budget.iterations=14"], 11),
    # whole episodes; the members reach the step budget at iterations 12, 13 and 14: at the
    # checkpoint (12) one is frozen, at the kill (14) two are finished, so the restart trains
    # those two as shadows (same population, nothing written) next to the one it resumes
    "rloo": (["task=cartpole", "estimator=rloo", "population=3", "budget.iterations=null",
              "budget.env_steps=1100", "task.max_episode_steps=60"], 14),
    # greedy rollouts
    "remax": (["task=cartpole", "estimator=remax", "budget.iterations=14"], 11),
    # per-member schedules: annealed learning rates and adaptive KL betas; the members stop at
    # iterations 13, 13 and 12: one is finished at the checkpoint (12), the others are killed at 13
    "grpo_schedules": (["task=cartpole", "estimator=grpo", "population=3", "budget.iterations=null",
                        "budget.env_steps=1100", "task.max_episode_steps=60", "anneal_lr=true",
                        "kl.adaptive=true", "kl.beta=0.01"], 13),
    # issue 18: per-member observation and reward normalisation (saved, and rebuilt by the replay), tanh
    # squashing, a state-dependent log-std; persistent envs, then whole episodes (the statistics are all
    # that their envs carry from one iteration to the next)
    "ppo_gae_normalised": (["task=pendulum", "estimator=ppo_gae", "population=2", "budget.iterations=14",
                            "task.normalize_obs=true", "task.normalize_reward=true", "task.action_bound=tanh",
                            "task.log_std=state_dependent"], 11),
    "rloo_normalised": (["task=pendulum", "estimator=rloo", "population=2", "budget.iterations=14",
                         "task.normalize_obs=true", "task.normalize_reward=true", "task.obs_clip=3"], 11),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_run_resumes_from_checkpoint_with_identical_metrics(case, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    overrides, kill = CASES[case]
    every = 3
    resumed_at = (kill - 1) // every * every
    args = TINY + overrides + ["eval_every=4", f"checkpoint_every={every}", "threads=1"]
    run(make_cfg(args + [f"results_dir={tmp_path}/plain", "checkpoint_every=0"]))
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    # checkpointing itself changes nothing (the action log replays the envs exactly)
    assert_same_runs(tmp_path / "plain", tmp_path / "ref")
    ref = metrics_by_run(tmp_path / "ref")
    n_iter = max(len(df) for df in ref.values())

    kill_at(monkeypatch, kill)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/killed"]))
    monkeypatch.undo()
    killed = tmp_path / "killed"
    done = set(statuses(killed))
    for key, df in metrics_by_run(killed).items():
        if key in done:  # finished before the kill: complete
            pd.testing.assert_frame_equal(df, ref[key], check_exact=True)
        else:  # half-way: no summary, rows 1..n with n at or past the checkpoint
            assert resumed_at <= len(df) < kill and df["iteration"].tolist() == list(range(1, len(df) + 1))
            assert ckpt.load(killed / key / ckpt.CHECKPOINT_FILE)[1]["iteration"] == resumed_at
    if case == "rloo":
        assert len(done) == 2
    elif case == "ppo_gae":
        assert not done and all(len(df) == 10 for df in metrics_by_run(killed).values())

    updates = count_updates(monkeypatch)
    counts = run(make_cfg(args + [f"results_dir={killed}"]))
    assert counts == {"skipped": len(done), "completed": len(ref) - len(done)}
    assert len(updates) == n_iter - resumed_at  # resumed at the checkpoint, not from zero
    assert any("resume" in r.message and f"at iteration {resumed_at}" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", killed)
    assert not list(killed.rglob(ckpt.CHECKPOINT_FILE))  # finished runs keep no checkpoint
    assert not list(killed.rglob(".*.tmp"))


TOY_CASES = {  # overrides, (seed, iteration) at which the run is killed (checkpoints every 3 iterations)
    # a batched population of 2, killed at 8 and resumed at 6 together; learning rates annealed by
    # the sequence budget (16 a iteration: 10 iterations), per-member adaptive KL betas, the token-sum loss
    "grpo_population_anneal": (["estimator=grpo", "population=2", "budget.iterations=null", "budget.env_steps=160",
                                "anneal_lr=true", "kl.adaptive=true", "kl.beta=0.01",
                                "loss_agg=seq_mean_token_sum_norm"], (1, 8)),
    # the tabular critic and its Adam state, several epochs of shuffled minibatches (the run's
    # generator), an adaptive in-reward KL penalty to the reference
    "ppo_gae_critic_adaptive_kl": (["estimator=ppo_gae", "budget.iterations=10", "epochs=2", "minibatches=2",
                                    "kl.beta=0.05", "kl.adaptive=true", "kl.in_reward=true", "kl.target=ref"],
                                   (0, 8)),
    # greedy rollouts with random rewards (drawn from the run's generator), the CISPO loss
    "remax_random_cispo": (["estimator=remax", "budget.iterations=10", "policy_loss=cispo",
                            "++toy.reward=random"], (0, 7)),
    # DAPO's dynamic sampling (a variable number of draws) and overlong penalty on the EOS preset,
    # the per-prompt columns; members one after another (dynamic sampling): seed 0 finishes, seed 1
    # is killed right after a checkpoint's iteration
    "rloo_dynamic_gspo": (["estimator=rloo", "population=2", "budget.iterations=10", "task.env_id=varlen",
                           "policy_loss=gspo", "dynamic_sampling=true", "overlong_cache=2", "++toy.log_prompts=true"],
                          (1, 10)),
}


def policies(root) -> dict[str, dict[str, torch.Tensor]]:
    """Each toy run's final ``policy.safetensors`` tensors, keyed by its path below ``root``."""
    return {str(p.parent.relative_to(root)): ckpt.load(p)[0] for p in sorted(root.rglob("policy.safetensors"))}


@pytest.mark.parametrize("case", sorted(TOY_CASES))
def test_killed_toy_run_resumes_from_checkpoint_with_identical_metrics_and_policy(case, tmp_path, monkeypatch,
                                                                                  caplog):
    """Issue 38: the toy trainer checkpoints through the loop like control and LM: a member killed
    after a checkpoint and started again ends with the metrics and the final policy (logits,
    critic) of an uninterrupted run, bit for bit; finished members are skipped. A batched
    population is killed and resumed as one; members trained one after another (dynamic
    sampling) finish before the killed one, and those after it never start."""
    caplog.set_level(logging.INFO, logger="harness")
    overrides, (seed, kill) = TOY_CASES[case]
    one_by_one = "dynamic_sampling=true" in overrides
    every = 3
    resumed_at = (kill - 1) // every * every
    args = ["task=toy", *overrides, "task.episodes_per_iter=16", "group_size=4", "lr=0.05", "progress=false",
            "threads=1", f"checkpoint_every={every}"]
    run(make_cfg(args + [f"results_dir={tmp_path}/plain", "checkpoint_every=0"]))
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    assert_same_runs(tmp_path / "plain", tmp_path / "ref")  # checkpointing itself changes nothing
    ref, ref_policies = metrics_by_run(tmp_path / "ref"), policies(tmp_path / "ref")
    assert sorted(ref_policies) == sorted(ref) and len(ref) == (2 if "population=2" in overrides else 1)
    lengths = {key: len(df) for key, df in ref.items()}
    assert all(n >= kill for n in lengths.values())  # the kill falls inside every run

    kill_at(monkeypatch, kill, seed)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/killed"]))
    monkeypatch.undo()
    killed = tmp_path / "killed"
    done = set(statuses(killed))
    # one by one: the members before the killed one finished; a population: none did
    assert len(done) == (seed if one_by_one else 0)
    halfway = set(metrics_by_run(killed)) - done
    assert len(halfway) == (1 if one_by_one else len(ref))
    for key in halfway:
        df = metrics_by_run(killed)[key]
        assert resumed_at <= len(df) < kill and df["iteration"].tolist() == list(range(1, len(df) + 1))
        assert ckpt.load(killed / key / ckpt.CHECKPOINT_FILE)[1]["iteration"] == resumed_at

    updates = count_updates(monkeypatch)
    assert run(make_cfg(args + [f"results_dir={killed}"])) == {"skipped": len(done), "completed": len(ref) - len(done)}
    later = sum(n for k, n in lengths.items() if k not in done and k not in halfway)  # kept from starting
    # resumed at the checkpoint: one update an iteration for the killed member (or population) from there
    assert len(updates) == max(lengths[k] for k in halfway) - resumed_at + later
    assert any("resume" in r.message and f"at iteration {resumed_at}" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", killed)
    got = policies(killed)
    assert sorted(got) == sorted(ref_policies)
    for k, tensors in ref_policies.items():
        assert sorted(got[k]) == sorted(tensors) and all(torch.equal(got[k][n], t) for n, t in tensors.items()), k
    assert not list(killed.rglob(ckpt.CHECKPOINT_FILE)) and not list(killed.rglob(".*.tmp"))


def test_checkpoint_is_safetensors_with_weights_optimizer_and_rng(tmp_path, monkeypatch):
    args = TINY + ["task=cartpole", "estimator=ppo_gae", "budget.iterations=6", "checkpoint_every=2",
                   f"results_dir={tmp_path}"]
    kill_at(monkeypatch, 5)
    with pytest.raises(Killed):
        run(make_cfg(args))
    (path,) = tmp_path.rglob(ckpt.CHECKPOINT_FILE)
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])  # safetensors: length + JSON
    assert "__metadata__" in header and raw[8:9] == b"{"  # a JSON header at byte 8, not a pickle
    tensors, meta = ckpt.load(path)
    assert meta["iteration"] == 4 and meta["seeds"] == [0]
    names = set(tensors)
    assert {"param/net.weights.0", "param/net.biases.0", "rng/torch", "rng/generator0", "rng/numpy_keys",
            "loop/kl_beta", "loop/cost", "source/actions"} <= names
    assert {"adam/net.weights.0/exp_avg", "adam/net.weights.0/exp_avg_sq", "adam/net.weights.0/step"} <= names
    # policy and critic rows (P=1: [actor, critic]); 4 iterations x 8 steps of 2 envs logged
    assert tensors["param/net.weights.0"].shape[0] == 2
    assert tuple(tensors["source/actions"].shape) == (4 * 8, 1, 2)
    assert [r["iteration"] for r in meta["members"][0]["rows"]] == [1, 2, 3, 4]
    assert len(meta["rng"]["python"][1]) == 625


def test_rng_states_round_trip_through_a_checkpoint(tmp_path):
    import random

    import numpy as np

    g = torch.Generator().manual_seed(5)
    tensors, meta = ckpt.rng_state([g])
    ckpt.save(tmp_path / "c.safetensors", tensors, {"rng": meta})
    first = (random.random(), float(np.random.rand()), float(torch.rand(())), float(torch.rand((), generator=g)))
    t2, m2 = ckpt.load(tmp_path / "c.safetensors")
    ckpt.set_rng_state(t2, m2["rng"], [g])
    again = (random.random(), float(np.random.rand()), float(torch.rand(())), float(torch.rand((), generator=g)))
    assert first == again


def _finished_run(tmp_path, extra=()):
    args = TINY + ["task=cartpole", "estimator=a2c", "budget.iterations=6", f"results_dir={tmp_path}", *extra]
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}
    (d,) = {p.parent for p in tmp_path.rglob("summary.json")}
    return args, d, pq.read_table(d / "metrics.parquet").to_pandas().drop(columns=["wall_time_s"])


@pytest.mark.parametrize("damage", ["truncated_metrics", "garbage_summary", "short_metrics", "empty_summary"])
def test_corrupt_file_of_a_finished_run_makes_resume_redo_it(damage, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    args, d, before = _finished_run(tmp_path)
    m, s = d / "metrics.parquet", d / "summary.json"
    if damage == "truncated_metrics":
        m.write_bytes(m.read_bytes()[: m.stat().st_size // 2])
    elif damage == "garbage_summary":
        s.write_text('{"status": "compl')
    elif damage == "short_metrics":  # a valid parquet file, but rows missing for the summary's count
        pq.write_table(pq.read_table(m).slice(0, 3), m)
    else:
        s.write_bytes(b"")
    named = s if "summary" in damage else m
    assert run(make_cfg(args)) == {"skipped": 0, "completed": 1}  # redone, never "skipped"
    assert any(str(named) in r.message and "rerun" in r.message for r in caplog.records), named
    after = pq.read_table(m).to_pandas().drop(columns=["wall_time_s"])
    pd.testing.assert_frame_equal(before, after, check_exact=True)
    assert run(make_cfg(args)) == {"skipped": 1}


def test_corrupt_metrics_of_a_killed_run_resume_from_its_checkpoint(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="harness")
    args = TINY + ["task=cartpole", "estimator=ppo_gae", "budget.iterations=12", "checkpoint_every=4"]
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    kill_at(monkeypatch, 11)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/k"]))
    monkeypatch.undo()
    (m,) = (tmp_path / "k").rglob("metrics.parquet")
    m.write_bytes(b"PAR1 not really")  # the rows live in the checkpoint too
    updates = count_updates(monkeypatch)
    assert run(make_cfg(args + [f"results_dir={tmp_path}/k"])) == {"skipped": 0, "completed": 1}
    assert len(updates) == 12 - 8
    assert_same_runs(tmp_path / "ref", tmp_path / "k")


@pytest.mark.parametrize("damage", ["truncated", "other_population", "adam_shape", "param_dtype", "past_budget",
                                    "extra_param", "bad_rows", "source_actions",
                                    # issue 36: a header that passes, a field that does not
                                    "deep_meta", "wall_time_abc", "outcome_without_status", "string_return"])
def test_unusable_checkpoint_is_named_and_the_run_restarts_from_zero(damage, tmp_path, monkeypatch, caplog):
    """Crafted checkpoints carry this run's own config hash (so only the tensor-by-tensor checks
    can catch them): wrong Adam-state shapes (a SIGSEGV in the fused Adam step on main), a
    parameter of another dtype, an iteration past budget.iterations (main resumed it and ended
    "completed" with more iterations than the budget), an unknown parameter, rows that are not
    records, env actions of another shape."""
    caplog.set_level(logging.INFO, logger="harness")
    estimator = "a2c" if damage == "source_actions" else "rloo"  # a2c: persistent envs, replayed actions
    args = TINY + ["task=cartpole", f"estimator={estimator}", "budget.iterations=8", "checkpoint_every=2"]
    run(make_cfg(args + [f"results_dir={tmp_path}/ref"]))
    kill_at(monkeypatch, 7)
    with pytest.raises(Killed):
        run(make_cfg(args + [f"results_dir={tmp_path}/k"]))
    monkeypatch.undo()
    (c,) = (tmp_path / "k").rglob(ckpt.CHECKPOINT_FILE)
    if damage == "truncated":
        c.write_bytes(c.read_bytes()[:100])
    elif damage == "deep_meta":  # this run's own header, then a key nested 100,000 deep
        from safetensors.torch import save as st_save

        tensors, meta = ckpt.load(c)
        text = json.dumps(meta)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
        c.write_bytes(st_save(tensors, metadata={"harness": text}))
    else:
        tensors, meta = ckpt.load(c)
        if damage == "other_population":  # seeds [0, 1] (population=2 shares seed 0's directory)
            meta["seeds"] = [0, 1]
        elif damage == "adam_shape":
            key = next(k for k in tensors if k.startswith("adam/") and k.endswith("/exp_avg"))
            tensors[key] = torch.zeros(3, 1)
        elif damage == "param_dtype":
            tensors["param/net.weights.0"] = tensors["param/net.weights.0"].double()
        elif damage == "past_budget":
            meta["iteration"] = 10
        elif damage == "extra_param":
            tensors["param/net.extra"] = torch.zeros(2)
        elif damage == "bad_rows":
            meta["members"][0]["rows"] = [1, 2, 3]
        elif damage == "wall_time_abc":
            meta["wall_time_s"] = "abc"
        elif damage == "outcome_without_status":
            meta["members"][0]["outcome"] = {"reason": None, "wall_time_s": 1.0}
        elif damage == "string_return":
            meta["members"][0]["rows"][0]["episode_return"] = "high"
        else:
            tensors["source/actions"] = torch.zeros(2, 5, dtype=torch.int8)
        ckpt.save(c, tensors, meta)
    updates = count_updates(monkeypatch)
    assert run(make_cfg(args + [f"results_dir={tmp_path}/k"])) == {"skipped": 0, "completed": 1}
    assert len(updates) == 8  # from zero
    assert any(str(c) in r.message and "not resuming" in r.message for r in caplog.records)
    assert_same_runs(tmp_path / "ref", tmp_path / "k")


@pytest.mark.parametrize("value", [-1, "3", 2.5, True, None])
def test_checkpoint_every_must_be_a_non_negative_integer(value):
    from omegaconf import OmegaConf

    # untyped copy: the schema would refuse (or coerce) some of these at composition already
    cfg = OmegaConf.create(OmegaConf.to_container(make_cfg(["task=cartpole", "estimator=a2c", *TINY])))
    cfg.checkpoint_every = value
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 0"):
        validate(cfg)


def test_checkpoint_every_is_accepted_by_every_trainer():
    """Issue 38: the toy trainer checkpoints too (it refused ``checkpoint_every`` before)."""
    for task in ("toy", "cartpole", "lm_arith"):
        validate(make_cfg([f"task={task}", "estimator=rloo", "checkpoint_every=5"]))


def test_new_fields_leave_run_directory_hashes_unchanged():
    """Hashes computed before checkpoint_every/deterministic/task.worst_return existed: finished
    runs of older sweeps are still found (and skipped) after the upgrade (the presets set
    task.worst_return, so every case below carries one)."""
    pinned = {
        (): "ab1ce9aeb4",
        ("estimator=rloo",): "89080fd17d",
        ("task=toy", "estimator=grpo"): "80604a49ef",
        (*TINY, "estimator=a2c", "seed=3"): "4f74fd32f1",
    }
    for overrides, expected in pinned.items():
        assert config_hash(make_cfg(list(overrides))) == expected, overrides
        switched = list(overrides) + ["checkpoint_every=7", "deterministic=true"]
        assert config_hash(make_cfg(switched)) == expected, overrides


def test_deterministic_sets_torch_flags_and_restores_them():
    import os

    before = torch.are_deterministic_algorithms_enabled()
    previous = set_determinism(True)
    try:
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
    finally:
        restore_determinism(previous)
    assert torch.are_deterministic_algorithms_enabled() == before


def test_deterministic_run_equals_the_default_run_on_cpu(tmp_path):
    args = ["task=cartpole", "estimator=ppo_gae", *TINY, "budget.iterations=3", "seed=7"]
    run(make_cfg(args + [f"results_dir={tmp_path}/a"]))
    run(make_cfg(args + [f"results_dir={tmp_path}/b", "deterministic=true"]))
    assert not torch.are_deterministic_algorithms_enabled()  # the job's setting does not leak
    assert_same_runs(tmp_path / "a", tmp_path / "b")  # same directory too: deterministic is not hashed


def test_a_slow_rewrite_spaces_the_next_ones_out():
    """A rewrite of a population's files that took ``cost`` seconds waits ``10 cost`` (FLUSH_SHARE
    0.1) before the next when that is over FLUSH_SECONDS (1 s): the rewrites stay a tenth of the time."""
    started = time.perf_counter() - 2.0  # the last rewrite began two seconds ago
    assert train_loop.flush_due(20, started, cost=0.0) and train_loop.flush_due(20, started, cost=0.1)
    assert train_loop.flush_due(20, started, cost=0.19)  # waits 1.9 s
    assert not train_loop.flush_due(20, started, cost=0.21)  # waits 2.1 s
    assert not train_loop.flush_due(20, started, cost=0.5)  # waits 5 s
    assert not train_loop.flush_due(25, started, cost=0.0)  # every FLUSH_EVERY (10) iterations only


@pytest.mark.parametrize("seconds, flushed_at", [(0.0, [10, 20]), (3600.0, [])])
def test_metrics_are_rewritten_every_flush_every_iterations_and_not_within_flush_seconds(
        seconds, flushed_at, tmp_path, monkeypatch):
    """Without checkpoints the loop rewrites metrics.parquet after iterations 10, 20, ... unless
    the last rewrite (or the run's start) is under FLUSH_SECONDS old; the end writes every row."""
    from harness.io import RunDir

    monkeypatch.setattr(train_loop, "FLUSH_SECONDS", seconds)
    at = []
    original = RunDir.flush
    monkeypatch.setattr(RunDir, "flush", lambda self: (at.append(len(self.rows)), original(self))[1])
    run(make_cfg(TINY + ["task=cartpole", "estimator=ppo_gae", "budget.iterations=25", "threads=1",
                         f"results_dir={tmp_path}"]))
    assert at == flushed_at + [25]  # the last: RunDir.finish
    (d,) = [p.parent for p in tmp_path.rglob("summary.json")]
    assert pq.read_table(d / "metrics.parquet").column("iteration").to_pylist() == list(range(1, 26))
