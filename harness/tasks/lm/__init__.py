"""The LM summarization task: embedded corpus, gold score, tokenizer, cached SFT + reward model.

Public API: :func:`validate_lm` (called by ``harness.validation.validate`` for ``task.family=lm``),
:func:`build_task` -> :class:`LMTask`, :func:`gold_score`, :func:`make_corpus`,
:func:`build_word_tokenizer`.
"""
from .corpus import Example, make_corpus, make_example, vocabulary
from .gold import claims, fact_f1, gold_score, length_penalty, unigram_f1, words
from .tokenizer import build_word_tokenizer, ensure_special_tokens
from .validate import validate_lm


def build_task(cfg):
    from .pipeline import build_task as _build

    return _build(cfg)


__all__ = ["Example", "make_corpus", "make_example", "vocabulary", "claims", "fact_f1", "gold_score",
           "length_penalty", "unigram_f1", "words", "build_word_tokenizer", "ensure_special_tokens",
           "validate_lm", "build_task"]
