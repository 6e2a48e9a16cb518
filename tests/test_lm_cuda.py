"""The LM task's CUDA path (bf16 autocast, CUDA peak memory); skipped where no GPU is present.

CI has no GPU: these run on a GPU machine (``python -m pytest -q tests/test_lm_cuda.py``)."""
import json

import pandas as pd
import pytest
import torch

from harness.app import run
from harness.models.lm import DecodeSettings, Responses, TinyArch, generate, response_forward, tiny_causal_lm
from harness.tasks.lm.data import left_pad

from .test_lm_common import assert_own_decode_step_is_the_models, compose
from .test_lm_common import one_thread  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_teacher_forcing_on_cuda_in_bf16():
    """Teacher-forced log-probabilities equal the sampler's on CUDA under bf16 autocast, up to
    bf16 rounding. (Not named test_c12_*: the claims report's C12 row quotes the CPU tests in
    tests/test_lm_model.py, which run everywhere; a skipped GPU test would make it inconclusive.)"""
    model = tiny_causal_lm(10, pad_token_id=0, eos_token_id=2, n_positions=64,
                           arch=TinyArch(n_layer=2, n_embd=32, n_head=2), seed=0).cuda().eval()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]], 0, torch.device("cuda"))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        g = generate(model, ids, mask, DecodeSettings(12, eos_token_id=2, pad_token_id=0, temperature=0.7),
                     generator=torch.Generator(device="cuda").manual_seed(3))
        with torch.no_grad():
            tf = response_forward(model, Responses(ids, mask, g.tokens, g.mask), temperature=0.7)
    m = g.mask.bool()
    assert m.sum() > 3
    assert torch.allclose(tf.logp[m].float(), g.logp[m].float(), atol=0.05, rtol=0)
    # fp32 on the GPU: equal to float rounding, as on CPU
    g32 = generate(model, ids, mask, DecodeSettings(12, eos_token_id=2, pad_token_id=0, temperature=0.7),
                   generator=torch.Generator(device="cuda").manual_seed(3))
    with torch.no_grad():
        tf32 = response_forward(model, Responses(ids, mask, g32.tokens, g32.mask), temperature=0.7)
    m32 = g32.mask.bool()
    assert torch.allclose(tf32.logp[m32], g32.logp[m32], atol=1e-4, rtol=0)


@pytest.mark.parametrize("estimator,critic", [("rloo", "head"), ("ppo_gae", "model")])
def test_rl_iterations_on_cuda(tmp_path, estimator, critic):
    cfg = compose(f"estimator={estimator}", f"lm.critic={critic}", "device=cuda", "budget.iterations=3",
                  results_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert run(cfg) == {"skipped": 0, "completed": 1}
    [path] = list((tmp_path / "lm_summarize").glob("*/seed*/metrics.parquet"))
    df = pd.read_parquet(path)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["status"] == "completed" and list(df.iteration) == [1, 2, 3]
    assert df[["reward", "gold_reward", "kl_ref", "entropy", "tokens_per_s"]].notna().all().all()
    assert df.kl_ref.iloc[0] == pytest.approx(0.0, abs=1e-3)  # the policy starts as the reference
    assert (df.peak_mem_mb > 0).all()  # from torch.cuda.max_memory_allocated
    assert df.eval_return.between(0, 1).all()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_gpt2_decoding_step_on_cuda_is_the_models_own_step(autocast, monkeypatch):
    """On CUDA, as on CPU (tests/test_lm_model.py), decoding with the harness's own GPT-2 step
    (:func:`harness.models.lm._gpt2_decode_step`) draws the tokens, log-probabilities and generator
    state of decoding with ``model(...)`` at every step, bit for bit: in float32 and under the bf16
    autocast the LM task uses on a GPU, with left-padded prompts and rows that end early."""
    model = tiny_causal_lm(10, pad_token_id=0, eos_token_id=2, n_positions=64,
                           arch=TinyArch(n_layer=2, n_embd=32, n_head=2), seed=0).cuda().eval()
    ids, mask = left_pad([[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]], 0, torch.device("cuda"))
    assert_own_decode_step_is_the_models(model, ids, mask, monkeypatch, device="cuda", autocast=autocast)
