"""The real-model path offline: a tiny model, tokenizer (without a pad token), reward model and
JSONL dataset saved to a temporary folder, loaded through the transformers Auto classes."""
import json

import pandas as pd
import pytest
import torch

from harness.app import run
from harness.tasks.lm import make_corpus, vocabulary
from harness.tasks.lm.pipeline import build_task

from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)

MAX_PROMPT = 12  # every document below is longer: each prompt is cut from the left


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification,
                              PreTrainedTokenizerFast)

    root = tmp_path_factory.mktemp("real")
    vocab = {"<unk>": 0, "</s>": 1}
    for w in vocabulary():
        vocab.setdefault(w, len(vocab))
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="</s>")  # no pad token
    config = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    LlamaForSequenceClassification(LlamaConfig(**config, num_labels=1, pad_token_id=1)).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    train, _ = make_corpus(7, 40, 0)
    rows = [{"document": e.prompt, "summary": " " + e.reference} for e in train]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def real_overrides(root, *more):
    return [f"lm.model={root / 'model'}", f"lm.dataset={root / 'data.jsonl'}", "lm.columns.prompt=document",
            "lm.columns.summary=summary", f"lm.max_prompt_len={MAX_PROMPT}", "lm.data.eval_size=8",
            "lm.sft.steps=5", "device=auto", *more]


def test_real_model_path_trains_and_counts_truncated_prompts(tmp_path, saved):
    cfg = compose("estimator=rloo", *real_overrides(saved), results_dir=tmp_path, cache_dir=tmp_path / "cache")
    task = build_task(cfg)
    assert task.tokenizer.pad_token == "</s>"  # a tokenizer without a pad token gets EOS as pad
    assert len(task.train) == 32 and len(task.held_out) == 8  # the last eval_size rows are held out
    assert task.train.examples[0].facts is None  # a dataset has references, not facts
    assert all(task.train.truncated) and all(len(p) == MAX_PROMPT for p in task.train.prompt_ids)
    assert task.meta["data"]["train_prompts_truncated"] == 32
    assert run(cfg) == {"skipped": 0, "completed": 1}
    [path] = list((tmp_path / "lm_summarize").glob("*/seed*/metrics.parquet"))
    df = pd.read_parquet(path)
    # 2 prompts x 2 samples per iteration, every one truncated from the left
    assert df.prompts_truncated.tolist() == [4, 4]
    assert json.loads((path.parent / "summary.json").read_text())["prompts_truncated"] == 8
    assert df.gold_reward.between(0, 1).all() and df.reward.notna().all()


def test_real_reward_model_and_no_sft(tmp_path, saved):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg = compose("estimator=remax", *real_overrides(saved, "lm.sft.steps=0", f"lm.reward_model={saved / 'rm'}"),
                  results_dir=tmp_path, cache_dir=tmp_path / "cache")
    task = build_task(cfg)
    assert task.policy_source == str(saved / "model") and task.meta["sft"] == {"skipped": True}
    assert not (tmp_path / "cache").exists()  # nothing to build
    ex = task.held_out.examples[:3]
    texts = ["alice bought apple .", "", "bob sold car . carol lost hat ."]
    got = task.reward(ex, texts, [True, True, False])
    rm = AutoModelForSequenceClassification.from_pretrained(saved / "rm").eval()
    tok = AutoTokenizer.from_pretrained(saved / "rm")
    for e, t, g in zip(ex, texts, got):  # one unpadded sequence at a time: the RM's own logit
        ids = tok(e.prompt, add_special_tokens=False)["input_ids"][-MAX_PROMPT:]
        ids += tok(t, add_special_tokens=False)["input_ids"] if t else []
        with torch.no_grad():
            want = rm(input_ids=torch.tensor([ids])).logits[0, 0]
        assert float(g) == pytest.approx(float(want), abs=1e-4)
    assert run(cfg) == {"skipped": 0, "completed": 1}
