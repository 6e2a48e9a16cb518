r"""The embedded arithmetic task: seeded problems, worked solutions, an exact checker.

A problem is a left-to-right chain of ``+``/``-`` over non-negative integers, written one
character per word so the embedded word-level tokenizer sees digits::

    prompt     1 2 + 3 5 - 7 =
    worked     1 2 + 3 5 = 4 7 ; 4 7 - 7 = 4 0 ; answer 4 0
    direct     answer 4 0

The difficulty knobs are ``lm.arith.min_digits..max_digits`` (digits per operand),
``min_ops..max_ops`` (operations per problem) and ``operators``. The supervised warm start sees
a worked solution (one line per operation, the running value restated) with probability
``worked_frac`` and the bare answer otherwise, so a policy may or may not write working before
its answer, and RL can change how often it does (and with it the response length).

**Canonical form and disjoint splits.** The value of ``t_0 o_1 t_1 ... o_n t_n`` is
``t_0 + sum_i s_i t_i`` with ``s_i = +1`` for ``+`` and ``-1`` for ``-``; its canonical form is
the sorted tuple of signed terms ``(t_0, s_1 t_1, ..., s_n t_n)``, so reorderings of the same
terms (``12 + 35`` and ``35 + 12``) are one problem. The held-out problems are drawn first
(distinct canonical forms); a train problem whose canonical form is held out is redrawn, so
the splits share no problem by construction.

**The checker** (:func:`check`) scores 1 when the response's final answer equals the problem's
value, else 0. The final answer is what follows the one word ``answer``:

* exactly one ``answer`` (none: no answer; two or more: ambiguous, scored 0);
* after it, an optional minus sign, then decimal digits (spaces between them allowed, the
  word-level tokenizer spaces them), then nothing but whitespace (trailing junk scores 0);
* the integer in its canonical decimal form: no leading zeros (``0 7`` scores 0, ``0`` is
  fine) and no ``-0``; negative answers are written ``- 2 5`` or ``-25``.

Working before ``answer`` is free text and never checked. A response the rule can read is
*well formed* (:func:`parse_answer` returns its integer); ``lm.arith.format_reward`` (default 0)
adds that much to the optimised reward of a well-formed response, right or wrong, and never to
the gold score (the 0/1 verdict that ``pass@1`` and ``pass@k`` count).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

DIGITS = tuple("0123456789")
OPERATORS = ("+", "-")
ANSWER = "answer"
WORDS = (*DIGITS, *OPERATORS, "=", ";", ANSWER)

MAX_MISSES = 2000  # draws in a row without a usable problem before a split is refused
_ANSWER_WORD = re.compile(rf"(?<![\w]){ANSWER}(?![\w])")
_NUMBER = re.compile(r"^(-\s*)?(\d(?:\s*\d)*)$")


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem: the prompt, a reference solution (what SFT imitates), the exact
    value and the canonical form (the identity the splits are disjoint by)."""

    prompt: str
    reference: str
    answer: int
    canonical: tuple[int, ...]
    facts: None = None  # the summarization gold score's field; an arithmetic problem has none


@dataclass(frozen=True)
class ArithSpec:
    """``lm.arith``: the generator's knobs (the split sizes, difficulty and working)."""

    train_size: int = 20000
    eval_size: int = 256
    min_digits: int = 1
    max_digits: int = 2
    min_ops: int = 1
    max_ops: int = 2
    operators: str = "+-"
    worked_frac: float = 0.5
    format_reward: float = 0.0
    pass_k: int = 4  # pass@k at evaluation (k of lm.eval_samples answers); not the generator's

    @classmethod
    def from_cfg(cls, node) -> "ArithSpec":
        return cls(**{k: node[k] for k in cls.__dataclass_fields__})


def vocabulary() -> list[str]:
    """Every word a problem or a solution uses (the embedded tokenizer's vocabulary)."""
    return list(WORDS)


def spell(n: int) -> str:
    """``-25`` -> ``- 2 5``: one word per character."""
    return " ".join(str(n)).replace("-  ", "- ")


def evaluate(terms: list[int], ops: list[str]) -> list[int]:
    """The running values of ``t_0 o_1 t_1 ...`` left to right (the last one is the answer)."""
    values = [terms[0]]
    for op, t in zip(ops, terms[1:]):
        values.append(values[-1] + t if op == "+" else values[-1] - t)
    return values


def canonical_form(terms: list[int], ops: list[str]) -> tuple[int, ...]:
    return tuple(sorted([terms[0]] + [t if op == "+" else -t for op, t in zip(ops, terms[1:])]))


def make_problem(rng: random.Random, spec: ArithSpec) -> Problem:
    n_ops = rng.randint(spec.min_ops, spec.max_ops)
    terms = []
    for _ in range(n_ops + 1):
        d = rng.randint(spec.min_digits, spec.max_digits)
        terms.append(rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1))
    ops = [rng.choice(spec.operators) for _ in range(n_ops)]
    values = evaluate(terms, ops)
    prompt = " ".join([spell(terms[0])] + [f"{op} {spell(t)}" for op, t in zip(ops, terms[1:])]) + " ="
    answer = values[-1]
    if rng.random() < spec.worked_frac:
        steps = [f"{spell(v)} {op} {spell(t)} = {spell(w)} ;"
                 for v, op, t, w in zip(values, ops, terms[1:], values[1:])]
        reference = " ".join(steps + [f"{ANSWER} {spell(answer)}"])
    else:
        reference = f"{ANSWER} {spell(answer)}"
    return Problem(prompt=prompt, reference=reference, answer=answer, canonical=canonical_form(terms, ops))


def make_problems(seed: int, spec: ArithSpec) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: ``eval_size`` held-out problems with distinct canonical forms, and
    ``train_size`` train problems (repeats allowed) whose canonical forms are never held out.
    A space too small for the sizes is refused (``ValueError`` naming the field), never looped on."""
    held_rng = random.Random(f"lm-arith-eval-{seed}")
    held: list[Problem] = []
    seen: set[tuple[int, ...]] = set()
    misses = 0  # draws in a row that found nothing new: the space is (all but) exhausted
    while len(held) < spec.eval_size:
        p = make_problem(held_rng, spec)
        if p.canonical in seen:
            misses += 1
            if misses > MAX_MISSES:
                raise ValueError(f"lm.arith.eval_size must be at most the number of distinct problems the "
                                 f"difficulty settings allow (about {len(held)}), got {spec.eval_size}")
            continue
        misses = 0
        seen.add(p.canonical)
        held.append(p)
    train_rng = random.Random(f"lm-arith-train-{seed}")
    train: list[Problem] = []
    misses = 0
    while len(train) < spec.train_size:
        p = make_problem(train_rng, spec)
        if p.canonical in seen:
            misses += 1
            if misses > MAX_MISSES:
                raise ValueError("lm.arith.eval_size must leave train problems: the held-out split holds (nearly) "
                                 f"every problem the difficulty settings allow, got {spec.eval_size}")
            continue
        misses = 0
        train.append(p)
    return train, held


# --------------------------------------------------------------------------- the checker
def parse_answer(response: str) -> int | None:
    """The final answer of ``response`` by the rule in the module docstring, or None when the
    response is malformed (no ``answer``, two of them, a non-numeric or junk-trailed tail,
    leading zeros, ``-0``)."""
    marks = list(_ANSWER_WORD.finditer(response))
    if len(marks) != 1:
        return None
    m = _NUMBER.match(response[marks[0].end():].strip())
    if m is None:
        return None
    digits = re.sub(r"\s", "", m.group(2))
    negative = m.group(1) is not None
    if (len(digits) > 1 and digits[0] == "0") or (negative and digits == "0"):
        return None
    return -int(digits) if negative else int(digits)


def check(response: str, problem: Problem) -> float:
    """1.0 when the response's final answer equals the problem's value, else 0.0."""
    value = parse_answer(response)
    return 1.0 if value is not None and value == problem.answer else 0.0


def well_formed(response: str) -> bool:
    return parse_answer(response) is not None


def arith_reward(response: str, problem: Problem, format_reward: float = 0.0) -> float:
    """The optimised reward: the checker's verdict plus ``format_reward`` for a well-formed answer."""
    value = parse_answer(response)
    if value is None:
        return 0.0
    return (1.0 if value == problem.answer else 0.0) + float(format_reward)
