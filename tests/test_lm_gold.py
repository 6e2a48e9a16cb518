"""The gold score on hand-made summaries, and the embedded corpus it judges."""
import pytest

from harness.tasks.lm import Example, claims, fact_f1, gold_score, length_penalty, make_corpus, unigram_f1
from harness.tasks.lm.corpus import HEDGES, PROMPT_SUFFIX

FACTS = (("alice", "bought", "apple"), ("bob", "sold", "car"))
EX = Example(prompt="alice bought the red apple today . maybe carol lost the old hat monday . "
                    "bob sold the blue car friday . tl;dr :",
             reference="alice bought apple . bob sold car .", facts=FACTS)


def test_perfect_summary_scores_one_and_empty_zero():
    assert gold_score("alice bought apple . bob sold car .", EX) == 1.0
    assert gold_score("bob sold car . alice bought apple .", EX) == 1.0  # order does not matter
    assert gold_score("", EX) == 0.0
    assert gold_score(" . . ", EX) == 0.0


@pytest.mark.parametrize("response,want", [
    # P = 1, R = 1/2 -> F1 = 2/3; 4 words <= 1.5 * 8
    ("alice bought apple .", 2 / 3),
    # the hedged distractor is a wrong claim: P = 1/2, R = 1/2 -> 1/2
    ("alice bought apple . carol lost hat .", 0.5),
    # a repeated fact counts once: P = 1/2, R = 1/2
    ("alice bought apple . alice bought apple .", 0.5),
    # an unterminated tail is a claim: P = 2/3, R = 1 -> F1 = 0.8; 16 words > 12 -> x 12/16
    ("alice bought apple . bob sold car . x x x x x x x x", 0.8 * 12 / 16),
    # the document's wording is not the claim
    ("alice bought the red apple today .", 0.0),
])
def test_worked_gold_values(response, want):
    assert gold_score(response, EX) == pytest.approx(want)


def test_claims_and_f1_pieces():
    assert claims("a b . c .  . d") == [("a", "b"), ("c",), ("d",)]
    assert fact_f1("bob sold car .", FACTS) == pytest.approx(2 / 3)
    assert length_penalty(12, 8) == 1.0 and length_penalty(24, 8) == pytest.approx(0.5)


def test_unigram_f1_for_datasets_without_facts():
    ex = Example(prompt="p", reference="the cat sat on the mat")
    # overlap {the:1, cat:1} = 2 of 3 predicted, 2 of 6 reference -> F1 = 2 * (2/3)(1/3) / 1 = 4/9
    assert unigram_f1("the cat ran", ex.reference) == pytest.approx(4 / 9)
    assert gold_score("the cat sat on the mat", ex) == 1.0
    assert gold_score("", ex) == 0.0


def test_corpus_is_seeded_held_out_disjoint_and_references_are_perfect():
    train, held = make_corpus(3, 50, 20)
    again, held_again = make_corpus(3, 50, 20)
    assert train == again and held == held_again
    assert make_corpus(4, 50, 20)[0] != train
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    for e in train + held:
        assert e.prompt.endswith(PROMPT_SUFFIX)
        assert gold_score(e.reference, e) == 1.0
        sentences = [s.strip() for s in e.prompt.split(" .")]
        for name, verb, obj in e.facts:  # each key fact is stated plainly (not hedged) in the document
            stated = [s for s in sentences if s.startswith(f"{name} {verb} the ") and s.split()[4] == obj]
            assert stated and not any(s.split()[0] in HEDGES for s in stated)
