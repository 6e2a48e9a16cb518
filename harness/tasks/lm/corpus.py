"""The embedded summarization corpus: seeded documents of key facts and distractors.

A document is a shuffled list of sentences. ``n_facts`` of them state a *key fact*::

    alice bought the red apple yesterday .        -> key fact (alice, bought, apple)

the others are distractors that share the vocabulary and must be left out of a summary::

    maybe bob sold the old car today .            (hedged: not a fact)
    carol said the kite was blue .                (an opinion about an object)
    the weather was rainy .                       (filler)

The reference summary lists the key facts in document order, one short claim each::

    alice bought apple . dave lost kite .

so a good summary has to find the fact sentences (not the hedged ones), copy three of their
seven words and stop. Everything is a pure function of the seed: the same ``DataSpec`` gives
the same train and held-out examples on every machine, with nothing to download.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "oscar")
VERBS = ("bought", "sold", "found", "lost", "painted", "fixed", "borrowed", "moved")
OBJECTS = ("apple", "bike", "boat", "book", "car", "chair", "clock", "drum", "hat", "kite",
           "lamp", "map", "piano", "radio", "sofa", "violin")
ADJECTIVES = ("red", "blue", "green", "old", "new", "small", "large", "shiny")
TIMES = ("yesterday", "today", "recently", "monday", "friday", "sunday")
WEATHER = ("sunny", "rainy", "cold", "warm", "windy")
HEDGES = ("maybe", "perhaps")
FUNCTION_WORDS = ("the", "said", "was", "weather", ".", "tl;dr", ":")
PROMPT_SUFFIX = "tl;dr :"

Fact = tuple[str, ...]


@dataclass(frozen=True)
class Example:
    """One document -> summary pair.

    ``facts`` are the key facts as word tuples (embedded corpus), or ``None`` for a dataset
    that only has a reference summary; the gold score uses whichever is there.
    """

    prompt: str
    reference: str
    facts: tuple[Fact, ...] | None = None


def vocabulary() -> list[str]:
    """Every word the generator can emit, in a fixed order (the tokenizer's vocabulary)."""
    words: list[str] = []
    for group in (FUNCTION_WORDS, NAMES, VERBS, OBJECTS, ADJECTIVES, TIMES, WEATHER, HEDGES):
        words.extend(w for w in group if w not in words)
    return words


def make_example(rng: random.Random, min_facts: int = 1, max_facts: int = 3,
                 min_distractors: int = 1, max_distractors: int = 3) -> Example:
    n_facts = rng.randint(min_facts, max_facts)
    n_distractors = rng.randint(min_distractors, max_distractors)
    subjects = rng.sample(NAMES, n_facts)
    facts = [(s, rng.choice(VERBS), rng.choice(OBJECTS)) for s in subjects]
    sentences: list[tuple[str, Fact | None]] = [
        (f"{s} {v} the {rng.choice(ADJECTIVES)} {o} {rng.choice(TIMES)} .", (s, v, o)) for s, v, o in facts
    ]
    for _ in range(n_distractors):
        kind = rng.randrange(3)
        if kind == 0:  # hedged: looks like a fact, is not one
            while True:
                triple = (rng.choice(NAMES), rng.choice(VERBS), rng.choice(OBJECTS))
                if triple not in facts:
                    break
            s, v, o = triple
            text = f"{rng.choice(HEDGES)} {s} {v} the {rng.choice(ADJECTIVES)} {o} {rng.choice(TIMES)} ."
        elif kind == 1:
            text = f"{rng.choice(NAMES)} said the {rng.choice(OBJECTS)} was {rng.choice(ADJECTIVES)} ."
        else:
            text = f"the weather was {rng.choice(WEATHER)} ."
        sentences.append((text, None))
    rng.shuffle(sentences)
    ordered = tuple(f for _, f in sentences if f is not None)
    prompt = " ".join(t for t, _ in sentences) + " " + PROMPT_SUFFIX
    reference = " ".join(" ".join(f) + " ." for f in ordered)
    return Example(prompt=prompt, reference=reference, facts=ordered)


def make_corpus(seed: int, train_size: int, eval_size: int, min_facts: int = 1, max_facts: int = 3,
                min_distractors: int = 1, max_distractors: int = 3) -> tuple[list[Example], list[Example]]:
    """``(train, held_out)``; the held-out documents never occur in the train split."""
    kw = dict(min_facts=min_facts, max_facts=max_facts, min_distractors=min_distractors,
              max_distractors=max_distractors)
    held_rng = random.Random(f"lm-corpus-eval-{seed}")
    held_out = [make_example(held_rng, **kw) for _ in range(eval_size)]
    seen = {e.prompt for e in held_out}
    train_rng = random.Random(f"lm-corpus-train-{seed}")
    train: list[Example] = []
    while len(train) < train_size:
        e = make_example(train_rng, **kw)
        if e.prompt not in seen:
            train.append(e)
    return train, held_out
