r"""The gold score: a programmatic judge of a summary, in [0, 1].

With key facts (the embedded corpus), *fact F1*: the response is split into claims at ``.``;
a claim is correct when its words equal a key fact (a repeated fact counts once).

.. math::
    P = \frac{\#\text{distinct correct claims}}{\#\text{claims}},\quad
    R = \frac{\#\text{distinct correct claims}}{\#\text{facts}},\quad
    F_1 = \frac{2PR}{P + R}

With only a reference summary (a real dataset), unigram F1 (ROUGE-1 F) against it.
Either is multiplied by a length penalty that only bites past ``slack`` times the
reference length :math:`n_{ref}` (in words, punctuation included):

.. math:: \text{lp}(n) = \min\big(1, \text{slack}\cdot n_{ref} / n\big)

A perfect summary scores 1, an empty one 0. The reward model is trained to imitate this score
from preferences and is imperfect; the gap between the two is what claim C10 measures.
"""
from __future__ import annotations

import re
from collections import Counter

from .corpus import Example, Fact

_WORD = re.compile(r"[\w;]+|[^\w\s]")
LENGTH_SLACK = 1.5


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks (``tl;dr`` stays one word)."""
    return _WORD.findall(text.lower())


def claims(text: str) -> list[Fact]:
    """Word tuples between ``.`` marks; empty claims are dropped, an unterminated tail counts."""
    out, cur = [], []
    for w in words(text):
        if w == ".":
            if cur:
                out.append(tuple(cur))
            cur = []
        else:
            cur.append(w)
    if cur:
        out.append(tuple(cur))
    return out


def _f1(n_correct: int, n_predicted: int, n_true: int) -> float:
    if n_correct == 0 or n_predicted == 0 or n_true == 0:
        return 0.0
    p, r = n_correct / n_predicted, n_correct / n_true
    return 2 * p * r / (p + r)


def fact_f1(response: str, facts: tuple[Fact, ...] | list[Fact]) -> float:
    said = claims(response)
    key = set(facts)
    correct = {c for c in said if c in key}
    return _f1(len(correct), len(said), len(key))


def unigram_f1(response: str, reference: str) -> float:
    got, ref = Counter(words(response)), Counter(words(reference))
    overlap = sum((got & ref).values())
    return _f1(overlap, sum(got.values()), sum(ref.values()))


def length_penalty(n_words: int, n_reference_words: int, slack: float = LENGTH_SLACK) -> float:
    allowed = slack * max(n_reference_words, 1)
    return 1.0 if n_words <= allowed else allowed / n_words


def gold_score(response: str, example: Example) -> float:
    """Fact F1 (or unigram F1 without facts) times the length penalty, in [0, 1]."""
    if example.facts is not None:
        base = fact_f1(response, example.facts)
    else:
        base = unigram_f1(response, example.reference)
    if base == 0.0:
        return 0.0
    return base * length_penalty(len(words(response)), len(words(example.reference)))
