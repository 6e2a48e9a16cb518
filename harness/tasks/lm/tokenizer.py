"""Tokenizers: the embedded word-level one, and loading any other through AutoTokenizer.

The embedded tokenizer is a ``tokenizers`` WordLevel model over the corpus vocabulary,
split on whitespace, wrapped as a :class:`transformers.PreTrainedTokenizerFast` so the rest of
the code (and ``save_pretrained`` / ``AutoTokenizer.from_pretrained``) treats it like any
tokenizer from the hub. Decoding joins words with single spaces, so for corpus text
``decode(encode(text)) == text``.
"""
from __future__ import annotations

from typing import Any

PAD, UNK, EOS = "[PAD]", "[UNK]", "[EOS]"


def build_word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, UNK: 1, EOS: 2}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder joins with spaces and (cleanup=False) leaves " ." alone
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, eos_token=EOS)
    fast.padding_side = "left"
    return fast


def ensure_special_tokens(tokenizer: Any, field_name: str = "lm.tokenizer") -> bool:
    """Give a tokenizer without a pad token one (its EOS, else a new ``[PAD]``), and refuse
    one without EOS (one line naming ``field_name``): generation must be able to stop. Returns
    True when the vocabulary grew (the model's embeddings must then be resized)."""
    grew = False
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{field_name}: the tokenizer has no EOS token; generation needs one "
                         "(set eos_token in its tokenizer_config.json)")
    if tokenizer.pad_token_id is None:
        # padding is always masked out (the masks are tracked explicitly), so EOS can double as pad
        tokenizer.pad_token = tokenizer.eos_token
        if tokenizer.pad_token_id is None:  # pragma: no cover - exotic tokenizers
            tokenizer.add_special_tokens({"pad_token": PAD})
            grew = True
    tokenizer.padding_side = "left"
    return grew


def load_tokenizer(source: str, field_name: str = "lm.tokenizer"):
    """``AutoTokenizer`` from a local folder (``~`` expanded) or hub id; never runs code from it
    (``trust_remote_code=False``); a failure is one line naming ``field_name``."""
    from transformers import AutoTokenizer

    from ...models.lm import pretrained_source

    try:
        return AutoTokenizer.from_pretrained(pretrained_source(source), trust_remote_code=False)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:400]
        raise ValueError(f"{field_name}: cannot load a tokenizer from {str(source)!r}: {reason}") from None
