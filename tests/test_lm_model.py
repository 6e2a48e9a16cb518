"""Tokenizer round trip, prompt truncation, decoding, and claim C12 (teacher forcing)."""
import copy

import pytest
import torch

from harness.models.lm import DecodeSettings, Responses, TinyArch, generate, response_forward, tiny_causal_lm
from harness.tasks.lm import build_word_tokenizer, ensure_special_tokens, make_corpus, vocabulary
from harness.tasks.lm.data import encode_prompt, encode_response, left_pad, right_pad

from .test_lm_common import assert_own_decode_step_is_the_models, one_thread  # noqa: F401  (autouse fixture)


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


def test_decode_responses_drops_padding_and_eos_and_decodes_each_row():
    """Each row's text is the words of its tokens under the mask, without EOS: built here from the
    vocabulary by hand (word-level tokenizer), including a row with an EOS mid-mask, an empty row
    and a special token inside the mask."""
    from harness.tasks.lm.data import decode_responses

    tok = build_word_tokenizer(vocabulary())
    words = ["alice", "bought", "apple", "."]
    ids = tok(" ".join(words), add_special_tokens=False)["input_ids"]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    tokens = torch.tensor([ids + [eos, pad], [ids[0], eos, ids[1], ids[2], ids[3], pad], [ids[0]] * 6,
                           ids[:2] + [pad, eos] + ids[2:]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0] * 6, [1, 1, 1, 1, 1, 1]])
    assert decode_responses(tok, tokens, mask) == ["alice bought apple .", "alice bought", "", "alice bought apple ."]


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
        return tiny_causal_lm(vocab, pad_token_id=0, eos_token_id=2, n_positions=64,
                              arch=TinyArch(n_layer=2, n_embd=32, n_head=2), seed=0).eval()
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
    g = generate(model, ids, mask, DecodeSettings(12, eos_token_id=2, pad_token_id=0, temperature=T),
                 generator=torch.Generator().manual_seed(3))
    assert g.has_eos.any() and (~g.has_eos).any()  # some rows stop early, one runs to the limit
    with torch.no_grad():
        tf = response_forward(model, Responses(ids, mask, g.tokens, g.mask), temperature=T)
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
    g2 = generate(model, ids, mask, DecodeSettings(12, eos_token_id=2, pad_token_id=0, temperature=T, use_cache=False),
                  generator=torch.Generator().manual_seed(3))
    assert torch.equal(g2.tokens, g.tokens) and torch.allclose(g2.logp, g.logp, atol=1e-5, rtol=0)


def test_entropy_and_greedy_decoding():
    model = _tiny("gpt2")
    ids, mask = left_pad([[5, 6, 7]], 0)
    g = generate(model, ids, mask, DecodeSettings(3, eos_token_id=2, pad_token_id=0), greedy=True)
    with torch.no_grad():
        tf = response_forward(model, Responses(ids, mask, g.tokens, g.mask))
        logits = model(input_ids=torch.tensor([[5, 6, 7]])).logits[0, -1]
    p = torch.softmax(logits, -1)
    assert int(g.tokens[0, 0]) == int(logits.argmax())
    assert float(tf.entropy[0, 0]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)


def _decode_rows_alone(model, prompts, max_new, T, gen, greedy=False, eos=2, pad=0):
    """Per-row decoding as the sampler did before prompts were shared: every row its own prompt
    (no padding, no cache, one full forward per token and row), one ``multinomial`` over the rows
    still decoding per step, from one generator; returns ``(tokens, log-probs)`` per row."""
    rows = [list(p) for p in prompts]
    out = [[] for _ in prompts]
    logps = [[] for _ in prompts]
    done = [False] * len(prompts)
    with torch.no_grad():
        for _ in range(max_new):
            lp = torch.stack([torch.log_softmax(model(input_ids=torch.tensor([r])).logits[0, -1] / T, -1)
                              for r in rows])
            nxt = lp.argmax(-1) if greedy else torch.multinomial(lp.exp(), 1, generator=gen).squeeze(-1)
            for i, y in enumerate(nxt.tolist()):
                if not done[i]:
                    out[i].append(y)
                    logps[i].append(float(lp[i, y]))
                    rows[i].append(y)
                    done[i] = y == eos
            if all(done):
                break
    return out, logps


@pytest.mark.parametrize("arch,seed,case", [("gpt2", 11, "cap"), ("llama", 11, "cap"), ("gpt2", 1, "greedy_longer")])
def test_shared_prompt_decoding_draws_the_samples_of_decoding_each_row_alone(arch, seed, case):
    """``generate_groups`` runs each prompt once and shares its KV cache with the prompt's
    ``samples`` rows and its greedy row, in one preallocated cache: the sampled rows are token for
    token those of decoding every row alone from the same generator (log-probabilities to float
    rounding), the greedy rows those of argmax decoding, and the generator ends in the same state,
    also when the greedy rows decode on after every sampled row has ended (``greedy_longer``)."""
    from harness.models.lm import generate_groups

    model, T, k = _tiny(arch), 0.8, 3
    prompts = [[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]]
    ids, mask = left_pad(prompts, 0)
    gen = torch.Generator().manual_seed(seed)
    s, g = generate_groups(model, ids, mask, DecodeSettings(12, 2, 0, temperature=T), samples=k, with_greedy=True,
                           generator=gen)
    ref_gen = torch.Generator().manual_seed(seed)
    want, want_lp = _decode_rows_alone(model, [p for p in prompts for _ in range(k)], 12, T, ref_gen)
    assert any(len(w) < 12 for w in want)  # some end with EOS
    if case == "cap":
        assert any(len(w) == 12 for w in want)  # and some at the length cap
    else:
        assert max(map(len, want)) < int(g.mask.sum(-1).max())  # every sampled row ends before a greedy one
    assert len({tuple(w) for w in want}) > len(prompts)  # a group's samples differ
    assert s.tokens.shape == (len(prompts) * k, max(map(len, want)))
    for i, (w, lp) in enumerate(zip(want, want_lp)):
        n = len(w)
        assert s.tokens[i, :n].tolist() == w and int(s.mask[i].sum()) == n and bool(s.has_eos[i]) == (w[-1] == 2)
        assert (s.tokens[i, n:] == 0).all()
        assert torch.allclose(s.logp[i, :n], torch.tensor(lp), atol=1e-5, rtol=0)
    assert torch.equal(gen.get_state(), ref_gen.get_state())  # the same draws, no more
    # decoded under inference_mode, returned as ordinary tensors (the update embeds the tokens with autograd on)
    assert not any(x.is_inference() for part in (s, g) for x in (part.tokens, part.mask, part.logp, part.has_eos))
    greedy, greedy_lp = _decode_rows_alone(model, prompts, 12, T, None, greedy=True)
    for i, (w, lp) in enumerate(zip(greedy, greedy_lp)):
        assert g.tokens[i, :len(w)].tolist() == w and int(g.mask[i].sum()) == len(w)
        assert torch.allclose(g.logp[i, :len(w)], torch.tensor(lp), atol=1e-5, rtol=0)
    # greedy=True of generate is the greedy part; sampling alone is the sampled part
    g2 = generate(model, ids, mask, DecodeSettings(12, 2, 0, temperature=T), greedy=True)
    s2 = generate(model, ids, mask, DecodeSettings(12, 2, 0, temperature=T), samples=k,
                  generator=torch.Generator().manual_seed(seed))
    assert torch.equal(g2.tokens, g.tokens) and torch.equal(s2.tokens, s.tokens)


def test_categorical_draws_what_torch_multinomial_draws():
    """``_categorical`` (the decode loop's draw) gives ``torch.multinomial(p, 1)``'s samples and
    leaves the generator where it leaves it, call after call: unnormalized rows, zeros, a row with
    one nonzero entry, one row and many."""
    from harness.models.lm import _categorical

    torch.manual_seed(3)
    for rows, cols in ((1, 5), (32, 67), (7, 2), (64, 300)):
        p = torch.rand(rows, cols) * (torch.rand(rows, cols) > 0.3)
        p[:, 0] += 1e-3  # every row has mass
        p[0] = 0
        p[0, -1] = 2.0  # a certain draw
        a, b = torch.Generator().manual_seed(rows), torch.Generator().manual_seed(rows)
        for _ in range(3):
            want = torch.multinomial(p, 1, generator=a).squeeze(-1)
            got = _categorical(p, b)
            assert torch.equal(got, want) and got[0] == cols - 1
            assert torch.equal(a.get_state(), b.get_state())


def test_decoding_writes_into_a_preallocated_cache():
    """The decode loop's cache layers are preallocated (no concatenation per token), and a step
    on them gives the logits of a step on transformers' growing cache."""
    from transformers.cache_utils import DynamicCache

    from harness.models.lm import _cache_kwarg, _preallocated_layer, positions, preallocate_cache

    model = _tiny("gpt2")
    ids, mask = left_pad([[5, 6, 7], [4, 5, 6, 7, 8]], 0)
    with torch.no_grad():
        grow = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True).past_key_values
        pre = preallocate_cache(model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                                      use_cache=True).past_key_values, 4)
        assert isinstance(grow, DynamicCache) and all(isinstance(layer, _preallocated_layer()) for layer in pre.layers)
        bufs = [layer.key_buf.data_ptr() for layer in pre.layers]
        step_mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
        pos = positions(step_mask)[:, -1:]
        nxt = torch.tensor([[3], [9]])
        ckw = _cache_kwarg(model)
        a = model(input_ids=nxt, attention_mask=step_mask, position_ids=pos, use_cache=True, **{ckw: grow})
        b = model(input_ids=nxt, attention_mask=step_mask, position_ids=pos, use_cache=True, **{ckw: pre})
    assert torch.allclose(a.logits, b.logits, atol=1e-6, rtol=0)
    assert [layer.key_buf.data_ptr() for layer in pre.layers] == bufs  # written in place
    assert all(layer.keys.shape[-2] == 6 for layer in pre.layers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prompts", [[[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]], [[5, 6, 7], [4, 5, 3], [9, 8, 7]]],
                         ids=["padded", "unpadded"])
def test_gpt2_decoding_step_is_the_models_own_step_bit_for_bit(prompts, dtype, monkeypatch):
    """The decode loop's own GPT-2 step (:func:`harness.models.lm._gpt2_decode_step`) is taken for
    a GPT-2, and decoding with it draws the tokens, log-probabilities and generator state of
    decoding with ``model(...)`` at every step, bit for bit: with left-padded prompts and without
    (where transformers gives the attention no mask), with rows that end early (their mask
    columns 0), in float32 and bfloat16."""
    from harness.models import lm as lm_mod

    model = _tiny("gpt2").to(dtype)
    ids, mask = left_pad(prompts, 0)
    sampled = assert_own_decode_step_is_the_models(model, ids, mask, monkeypatch)
    assert sampled.has_eos.any() and (~sampled.has_eos).any()  # rows end early, others run to the cap
    # any other model keeps transformers' step
    assert lm_mod._gpt2_decode_step(_tiny("llama"), None) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_stops_running_finished_rows_without_changing_a_bit(dtype, monkeypatch):
    """The own GPT-2 step drops the rows that have finished from its cache once enough have
    (``_DROP_*``); the sampled and greedy rows' tokens, log-probabilities, EOS flags and the
    generator's state are bit for bit those of decoding without dropping and of the model's own
    step (every row, every step), with rows ending at many different steps."""
    from harness.models import lm as lm_mod

    model = _tiny("gpt2", vocab=8).to(dtype)
    prompts = [[5, 6, 7, 4, 3], [4, 5], [3, 6, 7, 6], [7, 7, 3], [6, 5, 4, 3, 4, 5], [4, 4]]
    ids, mask = left_pad(prompts, 0)
    kept = []
    real_keep = lm_mod._preallocated_layer().keep_rows

    def spy(self, rows):
        kept.append(rows.numel())
        return real_keep(self, rows)

    monkeypatch.setattr(lm_mod._preallocated_layer(), "keep_rows", spy)
    own_step, own_trunk = lm_mod._gpt2_decode_step, lm_mod._gpt2_trunk
    sampled = assert_own_decode_step_is_the_models(model, ids, mask, monkeypatch)
    assert kept and min(kept) >= lm_mod._DROP_MIN_ROWS  # rows were dropped, never below the floor
    ends = sampled.mask.sum(-1)
    assert len(set(ends.tolist())) >= 4 and (ends < 12).any() and (ends == 12).any()

    def run(min_rows):
        monkeypatch.setattr(lm_mod, "_DROP_MIN_ROWS", min_rows)
        monkeypatch.setattr(lm_mod, "_gpt2_decode_step", own_step)  # turned off last by the helper above
        monkeypatch.setattr(lm_mod, "_gpt2_trunk", own_trunk)
        gen = torch.Generator().manual_seed(4)
        out = lm_mod.generate_groups(model, ids, mask, lm_mod.DecodeSettings(12, 2, 0, temperature=0.9), samples=3,
                                     with_greedy=True, generator=gen)
        return [getattr(part, name) for part in out for name in ("tokens", "mask", "logp", "has_eos")], gen.get_state()

    kept.clear()
    (dropped, state), (whole, whole_state) = run(4), run(10 ** 6)
    assert kept  # the first run dropped rows, the second none
    assert all(torch.equal(a, b) for a, b in zip(dropped, whole)) and torch.equal(state, whole_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prompts", [[[5, 6, 7, 8, 9, 3], [4, 5], [4, 5], [9, 8, 7, 6], [5, 6, 7, 8, 9, 3]],
                                     [[5, 6, 7], [4, 5, 3], [5, 6, 7], [9, 8, 7]]], ids=["padded", "unpadded"])
def test_gpt2_teacher_forced_passes_are_the_models_own_bit_for_bit(prompts, dtype, monkeypatch):
    """The harness's own GPT-2 passes (:func:`harness.models.lm._gpt2_pass`) are taken for a GPT-2
    (an LM head model, and a bare trunk as a critic's backbone) and give what calling the model
    gives, bit for bit: log-probabilities, entropies, hidden states and the gradient of a loss on
    them, in one pass and with shared prompts, with left-padded prompts and without (where
    transformers gives the attention no mask), with responses of one token and of many (rows that
    end early: padding inside the responses), in float32 and bfloat16. Any other model keeps
    transformers' forward."""
    from harness.models import lm as lm_mod
    from harness.models.lm import trunk_states

    model = _tiny("gpt2").to(dtype)
    ids, mask = left_pad(prompts, 0)
    g = generate(model, ids, mask, DecodeSettings(9, eos_token_id=2, pad_token_id=0, temperature=0.9),
                 generator=torch.Generator().manual_seed(5))
    assert (g.mask == 0).any() and g.tokens.shape[1] > 1  # padded responses
    real_trunk, taken = lm_mod._gpt2_trunk, []

    def spy(m):
        taken.append(real_trunk(m) is not None)
        return real_trunk(m)

    def run(trunk_of, tokens, rmask, share):
        monkeypatch.setattr(lm_mod, "_gpt2_trunk", trunk_of)
        model.zero_grad()
        out = response_forward(model, Responses(ids, mask, tokens, rmask), temperature=0.9, want_hidden=True,
                               share_prompts=share)
        states = trunk_states(model.transformer, ids, mask, tokens, rmask, share_prompts=share)
        loss = (out.logp * rmask).sum() + (out.entropy * rmask).sum() + out.hidden.float().square().mean() \
            + states.float().sum()
        loss.backward()
        return [out.logp, out.entropy, out.hidden, states] + [p.grad.clone() for p in model.parameters()]

    for tokens, rmask in ((g.tokens, g.mask), (g.tokens[:, :1], g.mask[:, :1])):
        for share in (False, True):
            taken.clear()
            own = run(spy, tokens, rmask, share)
            assert taken == [True, True]
            theirs = run(lambda m: None, tokens, rmask, share)
            assert all(torch.equal(a, b) for a, b in zip(own, theirs)), (share, tokens.shape)
            assert any(float(x.abs().max()) > 0 for x in own[4:])
    assert real_trunk(_tiny("llama")) is None and real_trunk(_tiny("llama").model) is None
    # a hook on a module whose forward or kernels the own passes call directly, or a global module
    # hook: the model's own forward (which runs it); transformers' output-capturing hooks on the
    # blocks (its forward above installed them) keep the own passes
    assert any(b._forward_hooks for b in model.transformer.h) and real_trunk(model) is model.transformer
    for module in (model.transformer.h[0].ln_1, model.transformer.h[1].mlp.act, model.lm_head,
                   model.transformer.wte, model.transformer.h[1].attn.c_proj):
        handle = module.register_forward_pre_hook(lambda *a: None)
        assert real_trunk(model) is None and real_trunk(model.transformer) is (model.transformer if module is
                                                                               model.lm_head else None)
        handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert real_trunk(model) is None
    finally:
        handle.remove()
    assert real_trunk(model) is model.transformer
    # dropout at work (training, p > 0): transformers' forward; in eval mode the dropouts are not
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.2
    model.train()
    assert real_trunk(model) is None and real_trunk(model.transformer) is None
    model.eval()
    assert real_trunk(model) is model.transformer
    # a projection that is not transformers' Conv1D (an adapter, say): the model's own forward
    model.transformer.h[1].mlp.c_fc = torch.nn.Sequential(model.transformer.h[1].mlp.c_fc)
    assert real_trunk(model) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("order", ["scattered", "grouped"])
def test_packed_responses_equal_the_padded_pass_to_float_rounding(dtype, order, monkeypatch):
    """A GPT-2's shared-prompt forward without hidden states runs only the prompts' columns that are
    not left padding and the response columns that predict a response token
    (:func:`harness.models.lm._gpt2_packed_response`): its
    log-probabilities and entropies equal the padded pass's at every response token (to float
    rounding; bit for bit where this CPU's matrix products do not depend on their row count),
    are 0 at the padding, and the gradient of a loss on them is the padded pass's to float
    rounding. Each prompt's rows together and as many each (``grouped``, a group's samples) attend
    once per prompt (``groups`` of :class:`harness.models.lm._PassLayout`), other orders with the
    prompts' keys and values gathered to the rows. Responses of one token run the padded pass, a
    model with dropout at work transformers'. The packed prompts' last layer runs its attention,
    projection and MLP at each prompt's last column only (``last`` of
    :func:`harness.models.lm._gpt2_pass`), the one column of it the responses use (a single query's
    attention: float rounding)."""
    from harness.models import lm as lm_mod
    from harness.models.lm import distinct_prompts

    model = _tiny("gpt2").to(dtype)
    prompts = [[5, 6, 7, 8, 9, 3], [4, 5], [4, 5], [9, 8, 7, 6], [5, 6, 7, 8, 9, 3], [9, 8, 7, 6]]
    if order == "grouped":
        prompts = [p for p in ([5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6]) for _ in range(2)]
    ids, mask = left_pad(prompts, 0)
    g = generate(model, ids, mask, DecodeSettings(9, eos_token_id=2, pad_token_id=0, temperature=0.9),
                 generator=torch.Generator().manual_seed(5))
    m = g.mask.bool()
    assert (~m).sum() > 5 and g.tokens.shape[1] > 2  # rows end early: padding to leave out
    own_pass, packed_rows, grouped, last_only = lm_mod._gpt2_pass, [], [], []

    def spy(trunk, ids, *args, layout=lm_mod._PassLayout(), **kwargs):
        packed_rows.append(None if layout.columns is None else layout.columns.numel())
        grouped.append(layout.groups)
        last_only.append(layout.last is not None)
        return own_pass(trunk, ids, *args, layout=layout, **kwargs)

    monkeypatch.setattr(lm_mod, "_gpt2_pass", spy)

    def run(packed, tokens=g.tokens, rmask=g.mask, net=model):
        if not packed:
            monkeypatch.setattr(lm_mod, "_gpt2_packed_response", lambda *a, **k: None)
        packed_rows.clear()
        net.zero_grad()
        out = response_forward(net, Responses(ids, mask, tokens, rmask), temperature=0.9, share_prompts=True)
        ((out.logp * rmask).sum() + (out.entropy * rmask).sum()).backward()
        monkeypatch.undo()
        monkeypatch.setattr(lm_mod, "_gpt2_pass", spy)
        return out, [p.grad.clone() for p in net.parameters()], list(packed_rows)

    # Tolerances from the computation itself: the same weights in float64 give the exact values, and
    # the packed pass may be off them by at most twice the padded pass's own rounding error plus a
    # few units of the dtype's precision (eps, relative to the largest value): no constant tuned to
    # one CPU's kernels, which round differently with the row count.
    exact_net = copy.deepcopy(model).double()
    eps = torch.finfo(dtype).eps

    def off(a, b, where=None) -> float:  # the largest error of a against b, relative to b's largest value
        a, b = (a[where], b[where]) if where is not None else (a, b)
        return float((a.double() - b.double()).abs().max() / b.double().abs().max())

    def close(packed_out, padded_out, exact_out, where=None) -> bool:
        return off(packed_out, exact_out, where) <= 2 * off(padded_out, exact_out, where) + 4 * eps

    def grads_close(packed_grads, padded_grads, exact_grads) -> bool:
        return max(off(a, c) for a, c in zip(packed_grads, exact_grads)) <= \
            2 * max(off(b, c) for b, c in zip(padded_grads, exact_grads)) + 4 * eps

    grouped.clear()
    (out, grads, rows), (ref, ref_grads, ref_rows) = run(True), run(False)
    first, _ = distinct_prompts(ids, mask)  # the prompts' left padding and the responses' padding left out
    assert rows == [int(mask[first].sum()), int(g.mask[:, 1:].sum())] and ref_rows == [None, None]
    assert grouped == [1, 2 if order == "grouped" else 1, 1, 1]  # the packed responses, then the padded pass
    assert last_only == [True, False, False, False]  # the prompts' last layer at their last columns only
    exact, exact_grads, _ = run(False, net=exact_net)
    assert close(out.logp, ref.logp, exact.logp, m) and close(out.entropy, ref.entropy, exact.entropy, m)
    assert not out.logp[~m].any() and not out.entropy[~m].any() and ref.logp[~m].any()
    assert grads_close(grads, ref_grads, exact_grads)
    # one-token responses, a response mask with a hole: the padded pass, bit for bit; right-padded prompts
    one, _, one_rows = run(True, g.tokens[:, :1], g.mask[:, :1])
    assert one_rows == [None] and torch.equal(one.logp, run(False, g.tokens[:, :1], g.mask[:, :1])[0].logp)
    holed = g.mask.clone()
    holed[0, 1] = 0
    assert holed[0, 2] == 1
    out, _, holed_rows = run(True, g.tokens, holed)
    assert holed_rows[1] is None and torch.equal(out.logp, run(False, g.tokens, holed)[0].logp)
    left_ids, left_mask = ids, mask
    try:
        ids, mask = right_pad(prompts, 0)
        last_only.clear()
        out, _, right_rows = run(True)  # the prompts unpacked, the responses packed
        assert right_rows[0] is None and right_rows[1] == int(g.mask[:, 1:].sum()) and last_only[0] is False
        assert close(out.logp, run(False)[0].logp, run(False, net=exact_net)[0].logp, m)
        ids, mask = left_pad([p[-2:] for p in prompts], 0)  # no padding: nothing to pack, the last columns still
        last_only.clear()
        (out, grads, same_rows), (ref, ref_grads, _) = run(True), run(False)
        assert same_rows[0] is None and last_only[:2] == [True, False]
        exact, exact_grads, _ = run(False, net=exact_net)
        assert close(out.logp, ref.logp, exact.logp, m) and grads_close(grads, ref_grads, exact_grads)
    finally:
        ids, mask = left_ids, left_mask
    model.transformer.h[0].attn.resid_dropout.p = 0.1
    model.train()
    try:
        assert run(True)[2] == []  # transformers' forward (:func:`harness.models.lm._gpt2_trunk`)
    finally:
        model.eval()
        model.transformer.h[0].attn.resid_dropout.p = 0.0


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_shared_prompt_teacher_forcing_equals_one_pass_with_its_gradient(arch):
    """``response_forward(share_prompts=True)`` runs each distinct prompt once and gathers its
    cache (with the autograd graph) to its rows, in any row order: log-probabilities, entropies and
    hidden states equal the one-pass values, and so does the gradient of a loss on them."""
    from harness.models.lm import distinct_prompts

    model, T = _tiny(arch), 0.9
    prompts = [[5, 6, 7, 8, 9, 3], [4, 5], [9, 8, 7, 6], [4, 5], [5, 6, 7, 8, 9, 3], [1, 4], [4, 5]]
    ids, mask = left_pad(prompts, 0)
    first, rows = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 2, 5] and rows.tolist() == [0, 1, 2, 1, 0, 3, 1]
    assert distinct_prompts(ids[:3], mask[:3]) is None  # nothing shared: the one-pass path
    g = generate(model, ids, mask, DecodeSettings(9, eos_token_id=2, pad_token_id=0, temperature=T),
                 generator=torch.Generator().manual_seed(5))
    m = g.mask.bool()

    def run(share):
        model.zero_grad()
        out = response_forward(model, Responses(ids, mask, g.tokens, g.mask), temperature=T, want_hidden=True,
                               share_prompts=share)
        loss = (out.logp * g.mask).sum() + (out.entropy * g.mask).sum() + out.hidden[m].square().mean()
        loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    full, full_grad = run(False)
    shared, shared_grad = run(True)
    assert torch.allclose(shared.logp[m], full.logp[m], atol=1e-5, rtol=0)
    assert torch.allclose(shared.entropy[m], full.entropy[m], atol=1e-5, rtol=0)
    assert torch.allclose(shared.hidden[m], full.hidden[m], atol=1e-5, rtol=0)
    assert max(float((a - b).abs().max() / (a.abs().max() + 1e-12)) for a, b in zip(full_grad, shared_grad)) < 1e-4
    assert any(float(a.abs().max()) > 0 for a in full_grad)


def test_sigmoid_gelu_is_gpt2s_gelu_values_and_gradients():
    """``SigmoidGELU`` computes 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out here in
    float64 with autograd's derivative of it: float64 values and gradients to 1e-12 (the identity
    ``0.5 (1 + tanh(u)) = sigmoid(2u)`` and the hand-written derivative), float32 to float rounding,
    with and without autograd; bfloat16 goes to PyTorch's fused kernel unchanged."""
    import math

    from harness.models.lm import SigmoidGELU

    gelu = SigmoidGELU()
    x64 = torch.cat([torch.randn(4096, dtype=torch.float64) * 4, torch.linspace(-30, 30, 601, dtype=torch.float64)])
    g64 = torch.randn_like(x64)

    def by_hand(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    xa = x64.clone().requires_grad_()
    ref = by_hand(xa)
    ref.backward(g64)
    xb = x64.clone().requires_grad_()
    got = gelu(xb)
    got.backward(g64)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(xb.grad, xa.grad, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        assert torch.allclose(gelu(x64), ref, rtol=1e-12, atol=1e-12)
    # float32: to float rounding of the float64 values (the fused kernel's own error is of the same size)
    x32 = x64.float().requires_grad_()
    y32 = gelu(x32)
    y32.backward(g64.float())
    scale = lambda t: 1e-6 * (1 + t.abs())  # noqa: E731
    assert ((y32.double() - ref).abs() <= scale(ref)).all()
    assert ((x32.grad.double() - xa.grad).abs() <= 2 * scale(xa.grad)).all()
    with torch.no_grad():
        assert torch.equal(gelu(x32), y32)
    xbf = x64.bfloat16()
    assert torch.equal(gelu(xbf), torch.nn.functional.gelu(xbf, approximate="tanh"))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_fast_gelu_is_gpt2s_gelu_to_float_rounding(arch):
    """``fast_gelu`` swaps GPT-2's Python ``gelu_new`` modules for ``SigmoidGELU`` and nothing else:
    the model's logits and gradients move by float rounding only (Llama's SiLU: unchanged)."""
    import copy

    from transformers.activations import NewGELUActivation

    from harness.models.lm import SigmoidGELU, fast_gelu

    model = _tiny(arch)
    fast = fast_gelu(copy.deepcopy(model))
    kinds = lambda m: [type(x).__name__ for x in m.modules()]  # noqa: E731
    if arch == "gpt2":
        assert NewGELUActivation.__name__ in kinds(model) and NewGELUActivation.__name__ not in kinds(fast)
        assert kinds(fast).count(SigmoidGELU.__name__) == kinds(model).count(NewGELUActivation.__name__) == 2
    else:
        assert kinds(fast) == kinds(model)
    ids, mask = left_pad([[5, 6, 7, 8, 9, 3], [4, 5]], 0)
    a, b = model(input_ids=ids, attention_mask=mask).logits, fast(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=0)
    a.square().sum().backward()
    b.square().sum().backward()
    for p, q in zip(model.parameters(), fast.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4 * float(p.grad.abs().max()) + 1e-7, rtol=0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_critic_and_reward_model_share_prompts_with_the_one_pass_values_and_gradients(arch):
    """The separate critic (``ValueModel``) and the pooled reward model read a trunk's hidden states
    at the columns that predict the response (``trunk_states``): with ``share_prompts`` each distinct
    prompt runs once, in any row order, and values, rewards and their gradients equal one pass."""
    from harness.models.lm import PooledRewardModel, ValueModel

    trunk = _tiny(arch).base_model
    prompts = [[5, 6, 7, 8, 9, 3], [4, 5], [5, 6, 7, 8, 9, 3], [9, 8, 7, 6], [4, 5], [4, 5]]
    ids, mask = left_pad(prompts, 0)
    resp, rmask = right_pad([[3, 4, 2], [7], [8, 8, 8, 8], [2], [6, 5], [9, 9, 9]], 0)
    for net in (ValueModel(trunk), PooledRewardModel(trunk)):
        with torch.no_grad():  # a non-zero head, so the gradient reaches the trunk
            for name, p in net.named_parameters():
                if not name.startswith("backbone."):
                    p.add_(torch.linspace(-0.5, 0.5, p.numel()).view_as(p))

        def run(share):
            net.zero_grad()
            out = net(ids, mask, resp, rmask, share_prompts=share)
            (out * (rmask if out.dim() == 2 else 1)).square().sum().backward()
            return out.detach(), [p.grad.clone() for p in net.parameters()]

        full, full_grad = run(False)
        shared, shared_grad = run(True)
        m = rmask.bool() if full.dim() == 2 else slice(None)
        assert torch.allclose(shared[m], full[m], atol=1e-5, rtol=0), type(net).__name__
        assert max(float((a - b).abs().max() / (a.abs().max() + 1e-12)) for a, b in zip(full_grad, shared_grad)) < 1e-4
        assert all(float(g.abs().max()) > 0 for g in full_grad), [n for (n, _), g in zip(net.named_parameters(), full_grad) if float(g.abs().max()) == 0]
