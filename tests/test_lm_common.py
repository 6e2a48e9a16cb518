"""Shared helpers for the LM tests (no tests here): tiny configs composed with Hydra, one
SFT/RM cache per pytest process so the pipeline is built once."""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[1] / "harness" / "conf"
CACHE = Path(tempfile.mkdtemp(prefix="lm-test-cache-"))
atexit.register(shutil.rmtree, CACHE, True)

# tiny sizes: a 1-layer width-32 GPT-2, 30 SFT steps, a 12-prompt reward model
TINY = [
    "task=lm_summarize", "progress=false", "threads=1",
    "lm.data.train_size=64", "lm.data.eval_size=16", "lm.data.max_facts=2", "lm.data.max_distractors=1",
    "lm.arch.n_layer=1", "lm.arch.n_embd=32", "lm.arch.n_head=2",
    "lm.sft.steps=30", "lm.sft.batch_size=8", "lm.sft.eval_prompts=8", "lm.sft.warmup=3",
    "lm.rm.prompts=12", "lm.rm.eval_prompts=8", "lm.rm.epochs=1", "lm.rm.batch_size=16", "lm.rm.include_reference=true",
    "lm.max_response_len=10", "lm.prompts_per_iter=2", "group_size=2", "lm.eval_prompts=4", "eval_every=1",
    "budget.iterations=2",
]


def compose(*overrides: str, results_dir: Path | str, cache_dir: Path | str | None = None):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import harness.losses  # noqa: F401  (the losses' knobs are in the schema)
    from harness.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    extra = [f"results_dir={results_dir}", f"lm.cache_dir={cache_dir or CACHE}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=TINY + extra + list(overrides))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two
    threads per process can make them ten times slower; restore the setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_own_decode_step_is_the_models(model, ids, mask, monkeypatch, device: str = "cpu", autocast: bool = False):
    """``generate_groups`` (12 tokens, 3 samples and a greedy row per prompt, temperature 0.9) twice
    from the same generator seed: with the decode loop's own GPT-2 step
    (:func:`harness.models.lm._gpt2_decode_step`, after the prompts' own pass
    :func:`harness.models.lm._gpt2_pass`) and with both turned off (the model's own prefill and
    step). Asserts the own step was taken and both give the same tokens, mask, log-probabilities, EOS flags
    and generator state, bit for bit; returns the sampled rows."""
    import torch

    from harness.models import lm as lm_mod

    taken = []
    real_step = lm_mod._gpt2_decode_step

    def spy(model, cache):
        step = real_step(model, cache)
        taken.append(step is not None)
        return step

    def run(step_factory, trunk_of):
        monkeypatch.setattr(lm_mod, "_gpt2_decode_step", step_factory)
        monkeypatch.setattr(lm_mod, "_gpt2_trunk", trunk_of)
        gen = torch.Generator(device=device).manual_seed(4)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            sampled, greedy = lm_mod.generate_groups(model, ids, mask, lm_mod.DecodeSettings(12, 2, 0, temperature=0.9),
                                                     samples=3, with_greedy=True, generator=gen)
        return sampled, greedy, gen.get_state()

    (fast_s, fast_g, fast_state) = run(spy, lm_mod._gpt2_trunk)
    (slow_s, slow_g, slow_state) = run(lambda model, cache: None, lambda model: None)
    assert taken == [True]
    for a, b in ((fast_s, slow_s), (fast_g, slow_g)):
        for name in ("tokens", "mask", "logp", "has_eos"):
            x, y = getattr(a, name), getattr(b, name)
            assert torch.equal(x, y), (name, (x.float() - y.float()).abs().max().item() if x.shape == y.shape else
                                       (x.shape, y.shape))
    assert torch.equal(fast_state, slow_state)
    return fast_s
