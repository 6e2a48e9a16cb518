"""The cached SFT -> reward model pipeline, and the checks validate_lm makes before any work."""
import json
from pathlib import Path

import pytest
import torch

from harness.validation import validate
from harness.tasks.lm.pipeline import build_task

from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)


def test_stages_are_cached_and_rebuilt_when_their_config_changes(tmp_path):
    cache = tmp_path / "cache"
    cfg = compose("estimator=rloo", results_dir=tmp_path, cache_dir=cache)
    first = build_task(cfg)
    assert first.meta["sft"]["cached"] is False and first.meta["rm"]["cached"] is False
    sft_dirs = sorted(cache.glob("sft-*"))
    assert len(sft_dirs) == 1 and Path(first.policy_source) == sft_dirs[0]
    stamp = (sft_dirs[0] / "stage.json").stat().st_mtime_ns

    again = build_task(cfg)  # same config: both stages reused, nothing rewritten
    assert again.meta["sft"]["cached"] is True and again.meta["rm"]["cached"] is True
    assert again.meta["sft"]["key"] == first.meta["sft"]["key"]
    assert (sft_dirs[0] / "stage.json").stat().st_mtime_ns == stamp

    # a reward-model setting rebuilds the RM only; an SFT setting rebuilds both
    rm_changed = build_task(compose("estimator=rloo", "lm.rm.lr=1e-4", results_dir=tmp_path, cache_dir=cache))
    assert rm_changed.meta["sft"]["cached"] is True and rm_changed.meta["rm"]["cached"] is False
    sft_changed = build_task(compose("estimator=rloo", "lm.sft.steps=31", results_dir=tmp_path, cache_dir=cache))
    assert sft_changed.meta["sft"]["cached"] is False and sft_changed.meta["rm"]["cached"] is False
    assert len(list(cache.glob("sft-*"))) == 2 and len(list(cache.glob("rm-*"))) == 3
    # another intra-op thread count is another stage (on a CPU the weights differ in their last bits
    # with the count): a run never loads weights built on another count
    torch.set_num_threads(2)
    try:
        two = build_task(cfg)
    finally:
        torch.set_num_threads(1)
    assert two.meta["sft"]["cached"] is False and two.meta["rm"]["cached"] is False
    assert build_task(cfg).meta["sft"]["key"] == first.meta["sft"]["key"]
    assert len(list(cache.glob("sft-*"))) == 3 and len(list(cache.glob("rm-*"))) == 4
    # safetensors only, no pickles; no half-built temporary folders left
    files = [f.name for f in cache.rglob("*") if f.is_file()]
    assert "model.safetensors" in files and "reward_head.safetensors" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    assert not list(cache.glob(".*.tmp"))
    meta = json.loads((sft_dirs[0] / "stage.json").read_text())
    assert 0.0 <= meta["sft_gold_sampled"] <= 1.0 and meta["reference_gold"] == 1.0


def test_reward_model_is_calibrated_to_gold_units(tmp_path):
    task = build_task(compose("estimator=rloo", results_dir=tmp_path))
    rm = task.meta["rm"]
    assert rm["rm_train_pairs"] > 0 and 0.0 <= rm["rm_eval_accuracy"] <= 1.0
    ex = task.held_out.examples[:4]
    texts = [e.reference for e in ex]
    raw = task.reward_model.raw([e.prompt for e in ex], texts, [True] * 4)
    scored = task.reward(ex, texts, [True] * 4)
    assert scored.tolist() == pytest.approx((raw * rm["rm_scale"] + rm["rm_shift"]).tolist(), abs=1e-5)
    # a group's responses to one prompt (training's layout): task.reward runs each prompt once in the
    # reward model, the scores of one pass per response to rounding
    group = [ex[0], ex[0], ex[0], ex[1], ex[1]]
    answers = [ex[0].reference, "", ex[1].reference, ex[1].reference, ex[0].reference]
    finished = [True, False, True, True, False]
    one_pass = task.reward_model.raw([e.prompt for e in group], answers, finished)
    shared = task.reward(group, answers, finished)
    assert shared.tolist() == pytest.approx((one_pass * rm["rm_scale"] + rm["rm_shift"]).tolist(), abs=1e-5)
    # reward=gold skips the reward model and returns the gold score itself
    gold_task = build_task(compose("estimator=rloo", "lm.reward=gold", results_dir=tmp_path))
    assert gold_task.reward_model is None and "rm" not in gold_task.meta
    assert gold_task.reward(ex, texts, [True] * 4).tolist() == [1.0] * 4


def test_unknown_model_path_fails_in_validate_with_the_path(tmp_path):
    from harness.app import run

    missing = tmp_path / "no" / "such-model"
    cfg = compose("estimator=rloo", f"lm.model={missing}", results_dir=tmp_path / "res")
    with pytest.raises(ValueError, match=str(missing)):
        run(cfg)
    assert not (tmp_path / "res").exists()  # nothing was started
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        validate(compose("estimator=rloo", f"lm.model={empty}", results_dir=tmp_path))


@pytest.mark.parametrize("override,field", [
    ("lm.reward=judge", "lm.reward"), ("lm.critic=shared", "lm.critic"), ("lm.temperature=0", "lm.temperature"),
    ("lm.dataset=/no/such/data.jsonl", "lm.dataset"), ("kl.target=none", "kl.target"),
    ("lm.max_prompt_len=0", "lm.max_prompt_len"), ("lm.arch.n_head=3", "lm.arch"),
])
def test_bad_lm_settings_name_the_field(tmp_path, override, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        validate(compose("estimator=rloo", override, results_dir=tmp_path))


def test_hub_dataset_without_the_datasets_package_is_refused_up_front(tmp_path):
    try:
        import datasets  # noqa: F401
        pytest.skip("`datasets` is installed: a hub id is then accepted")
    except ImportError:
        pass
    with pytest.raises(ValueError, match=r"lm\.dataset: 'trl-lib/tldr'.*datasets"):
        validate(compose("estimator=rloo", "lm.dataset=trl-lib/tldr", results_dir=tmp_path))


def _slow_build(out):
    """A stage builder that takes a while and leaves one marker per build in the cache's parent."""
    import os
    import time

    time.sleep(0.5)
    (out.parent.parent / f"built-by-{os.getpid()}").write_text("")
    (out / "weights.bin").write_text("w")
    return {"value": 1}


def _build_in_child(cache_dir, results):
    from harness.tasks.lm.pipeline import cached_stage

    folder, meta, reused = cached_stage(cache_dir, "sft", {"x": 1}, _slow_build)
    results.put((str(folder), meta["value"], reused))


def test_parallel_workers_build_a_cache_stage_once(tmp_path):
    """Four processes ask for one missing stage at once: one builds it, the others wait for
    that build and reuse it (no duplicate work, one folder, no temp folders left)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    cache = tmp_path / "cache"
    q = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(cache, q)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    out = [q.get(timeout=5) for _ in procs]
    assert all(p.exitcode == 0 for p in procs)
    assert len({folder for folder, _, _ in out}) == 1 and all(v == 1 for _, v, _ in out)
    assert sorted(r for _, _, r in out) == [False, True, True, True]
    assert len(list(tmp_path.glob("built-by-*"))) == 1
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_supervised_training_steps_once_per_batch_and_reports_the_last_twenty_losses():
    """The pipeline's one training loop (SFT and reward model): one step per batch, read lazily;
    the reported loss is the mean of the last 20 steps' losses (here the batches' own values,
    16..40 -> mean of 21..40 = 30.5), the model left in eval mode; no batch: nan, 0 steps. One
    step moves the weight by AdamW's first step, lr x the warmup factor 1/4 against the gradient's
    sign (Adam's first step is lr * g / |g|)."""
    import math

    import torch

    from harness.tasks.lm.pipeline import supervised_training

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    read = []

    def batches(values):
        for b in values:
            read.append(b)
            yield float(b)

    def loss_of(b: float) -> torch.Tensor:
        assert read[-1] == b  # lazily: batch b is drawn right before its step
        return 5.0 * model.weight.sum() + b

    final, steps = supervised_training(model, batches([7]), loss_of, lr=0.1, steps=25, warmup=4)
    assert (final, steps) == (7.0, 1) and not model.training
    assert model.weight.item() == pytest.approx(-0.1 / 4, rel=1e-4)
    with torch.no_grad():
        model.weight.zero_()
    final, steps = supervised_training(model, batches(range(16, 41)), loss_of, lr=0.0, steps=25, warmup=4)
    assert (final, steps) == (30.5, 25) and not model.training
    final, steps = supervised_training(model, iter([]), loss_of, lr=0.1, steps=1, warmup=1)
    assert math.isnan(final) and steps == 0


def test_pipelines_prepared_ahead_are_the_stages_a_point_builds(tmp_path):
    """``harness.experiments.run.prepare_pipelines`` (the claims runner's build of the LM stages
    beside the experiments before them) builds in a spawned process, once for points with one
    ``lm`` config, what a point builds itself in-process: every file of every stage byte for byte
    (stage.json but its build time); a point then reuses both stages. Finished points, points of
    other tasks and points without a thread count (the SFT weights depend on it) start nothing."""
    from harness.config import member_configs
    from harness.experiments import Point, run_dir_for
    from harness.experiments.run import prepare_pipelines

    def point(cfg):
        return Point("x", [], cfg=cfg, run_dirs=[run_dir_for(m) for m in member_configs(cfg)])

    ahead = [compose(f"estimator={e}", results_dir=tmp_path / e, cache_dir=tmp_path / "ahead") for e in ("rloo", "grpo")]
    proc = prepare_pipelines([point(c) for c in ahead])
    here = build_task(compose("estimator=rloo", results_dir=tmp_path / "here", cache_dir=tmp_path / "here"))
    assert here.meta["sft"]["cached"] is False and here.meta["rm"]["cached"] is False
    proc.join(300)
    assert proc.exitcode == 0
    for stage in ("sft", "rm"):
        (a,), (b,) = sorted((tmp_path / "ahead").glob(f"{stage}-*")), sorted((tmp_path / "here").glob(f"{stage}-*"))
        assert a.name == b.name and sorted(f.name for f in a.iterdir()) == sorted(f.name for f in b.iterdir())
        for f in a.iterdir():
            if f.name == "stage.json":
                ja, jb = (json.loads(p.read_text()) for p in (f, b / f.name))
                assert ja.pop("build_seconds") > 0 and jb.pop("build_seconds") > 0 and ja == jb
            else:
                assert f.read_bytes() == (b / f.name).read_bytes(), f
    again = build_task(ahead[0])
    assert again.meta["sft"]["cached"] is True and again.meta["rm"]["cached"] is True

    from omegaconf import OmegaConf

    finished = point(ahead[0])
    finished.run_dirs = []  # no run left to make
    toy = Point("y", [], cfg=OmegaConf.create({"task": {"family": "toy"}}), run_dirs=[tmp_path / "toy"])
    unthreaded = point(compose("estimator=rloo", "threads=null", results_dir=tmp_path / "t", cache_dir=tmp_path / "t"))
    assert prepare_pipelines([finished, toy, unthreaded]) is None and prepare_pipelines([]) is None
