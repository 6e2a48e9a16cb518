"""Tokenizer round trip, prompt truncation, decoding, and claim C12 (teacher forcing)."""
import pytest
import torch

from harness.models.lm import generate, response_forward, tiny_causal_lm
from harness.tasks.lm import build_word_tokenizer, ensure_special_tokens, make_corpus, vocabulary
from harness.tasks.lm.data import encode_prompt, encode_response, left_pad, right_pad

from .test_lm_common import one_thread  # noqa: F401  (autouse fixture)


def test_word_tokenizer_round_trip_pad_and_eos(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = build_word_tokenizer(vocabulary())
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token, tok.pad_token_id, tok.eos_token, tok.eos_token_id) == ("[PAD]", 0, "[EOS]", 2)
    train, _ = make_corpus(0, 20, 2)
    for e in train:
        for text in (e.prompt, e.reference):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text.split()) and tok.unk_token_id not in ids
            assert tok.decode(ids) == text
    assert tok("alice zebra", add_special_tokens=False)["input_ids"][1] == tok.unk_token_id
    assert encode_response(tok, "alice bought apple .", 10)[-1] == tok.eos_token_id
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("bob sold car .", add_special_tokens=False)["input_ids"] == \
        tok("bob sold car .", add_special_tokens=False)["input_ids"]
    assert loaded.pad_token_id == 0 and loaded.eos_token_id == 2


def test_tokenizer_without_pad_gets_eos_as_pad():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, "a": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="</s>")
    assert tok.pad_token_id is None
    assert ensure_special_tokens(tok) is False  # no new token, so no embedding resize
    assert tok.pad_token_id == 1 and tok.padding_side == "left"
    no_eos = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    with pytest.raises(ValueError, match="EOS"):
        ensure_special_tokens(no_eos)


def test_prompt_is_truncated_from_the_left():
    tok = build_word_tokenizer(vocabulary())
    text = "alice bought the red apple today . tl;dr :"  # 9 words
    ids, cut = encode_prompt(tok, text, 4)
    assert cut and tok.decode(ids) == "today . tl;dr :"
    ids, cut = encode_prompt(tok, text, 9)
    assert not cut and len(ids) == 9


def test_padding_layout():
    ids, mask = left_pad([[5, 6, 7], [8]], 0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = right_pad([[5, 6, 7], [8]], 0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def _tiny(arch: str, vocab: int = 10):
    if arch == "gpt2":
        return tiny_causal_lm(vocab, pad_token_id=0, eos_token_id=2, n_positions=64, n_layer=2, n_embd=32,
                              n_head=2, seed=0).eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, eos_token_id=2, bos_token_id=1)).eval()


@pytest.mark.claim("C12")
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_c12_teacher_forced_logprobs_equal_sequential_decoding(arch):
    """Claim C12: one teacher-forced pass gives log pi(y_t | x, y_<t) for every t, equal to the
    log-probabilities of step-by-step decoding; the reference here decodes each prompt alone
    (no padding, no cache), one full forward per token."""
    model, T = _tiny(arch), 0.7
    prompts = [[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]]  # different lengths: left padding
    ids, mask = left_pad(prompts, 0)
    g = generate(model, ids, mask, 12, eos_token_id=2, pad_token_id=0, temperature=T,
                 generator=torch.Generator().manual_seed(3))
    assert g.has_eos.any() and (~g.has_eos).any()  # some rows stop early, one runs to the limit
    with torch.no_grad():
        tf = response_forward(model, ids, mask, g.tokens, g.mask, temperature=T)
    m = g.mask.bool()
    assert torch.allclose(tf.logp[m], g.logp[m], atol=1e-5, rtol=0)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            resp = g.tokens[i, :int(g.mask[i].sum())].tolist()
            for t, y in enumerate(resp):
                logits = model(input_ids=torch.tensor([p + resp[:t]])).logits[0, -1] / T
                want = torch.log_softmax(logits, -1)[y]
                assert abs(float(tf.logp[i, t]) - float(want)) < 1e-5
            if g.has_eos[i]:  # masked after EOS, which is the last kept token
                assert resp[-1] == 2 and (g.tokens[i, len(resp):] == 0).all()
    # the cache-free decoder draws the same tokens with the same log-probabilities
    g2 = generate(model, ids, mask, 12, eos_token_id=2, pad_token_id=0, temperature=T,
                  generator=torch.Generator().manual_seed(3), use_cache=False)
    assert torch.equal(g2.tokens, g.tokens) and torch.allclose(g2.logp, g.logp, atol=1e-5, rtol=0)


def test_entropy_and_greedy_decoding():
    model = _tiny("gpt2")
    ids, mask = left_pad([[5, 6, 7]], 0)
    g = generate(model, ids, mask, 3, eos_token_id=2, pad_token_id=0, greedy=True)
    with torch.no_grad():
        tf = response_forward(model, ids, mask, g.tokens, g.mask)
        logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits[0, -1]
    p = torch.softmax(logits, -1)
    assert int(g.tokens[0, 0]) == int(logits.argmax())
    assert float(tf.entropy[0, 0]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)
