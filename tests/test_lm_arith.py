"""task=lm_arith (issue 15): the checker, disjoint splits, pass@k, batch metrics, a training smoke run,
and one-line refusals of bad lm.arith settings. Tiny models and data built here; no network."""
from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.plan import RunPlan
from harness.app import run
from harness.estimators import ESTIMATORS
from harness.tasks.lm.arith import (ArithSpec, Problem, arith_reward, check, make_problems, parse_answer, spell,
                                    well_formed)
from harness.tasks.lm.metrics import length_by_correctness, mean_pass_at_k, pass_at_k, zero_std_fraction

from .test_lm_common import CACHE, CONF, one_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
TINY_ARITH = [
    "task=lm_arith", "progress=false", "threads=1",
    "lm.arith.train_size=64", "lm.arith.eval_size=8",
    "lm.arch.n_layer=1", "lm.arch.n_embd=32", "lm.arch.n_head=2",
    "lm.sft.steps=10", "lm.sft.batch_size=8", "lm.sft.eval_prompts=4", "lm.sft.warmup=2",
    "lm.max_response_len=8", "lm.prompts_per_iter=2", "group_size=2", "lm.eval_prompts=4", "lm.eval_samples=2",
    "lm.arith.pass_k=2", "eval_every=1", "budget.iterations=2",
]


def compose(*overrides: str, results_dir):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from harness.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=TINY_ARITH + [f"results_dir={results_dir}",
                                                                            f"lm.cache_dir={CACHE}", *overrides])


def problem(answer: int) -> Problem:
    return Problem(prompt="", reference="", answer=answer, canonical=(answer,))


# --------------------------------------------------------------------------- the checker
@pytest.mark.parametrize("response,answer,score", [
    ("answer 4 0", 40, 1.0),
    ("1 2 + 3 5 = 4 7 ; 4 7 - 7 = 4 0 ; answer 4 0", 40, 1.0),  # working before the answer is free
    ("answer 40", 40, 1.0),  # digits need not be spaced
    ("answer 4 0  ", 40, 1.0),  # trailing whitespace is fine
    ("answer 4 1", 40, 0.0),  # wrong
    ("", 40, 0.0),  # nothing
    ("4 0", 40, 0.0),  # no answer marker
    ("1 2 + 3 5 = 4 0 ;", 40, 0.0),  # working without an answer
    ("answer 4 0 ; answer 4 0", 40, 0.0),  # two answers, even equal ones
    ("answer 4 0 answer 4 1", 40, 0.0),
    ("answer", 40, 0.0),  # marker with nothing after it
    ("answer forty", 40, 0.0),  # non-numeric
    ("answer + 4 0", 40, 0.0),  # a plus sign is not part of the number
    ("answer 4 0 ;", 40, 0.0),  # trailing junk
    ("answer 4 0 = 4 0", 40, 0.0),
    ("answer 4 x 0", 40, 0.0),
    ("answers 4 0", 40, 0.0),  # the marker is the word "answer", not a prefix of another word
    ("answer40", 40, 0.0),
    ("answer - 2 5", -25, 1.0),  # negative numbers: a minus sign, spaced or not
    ("answer -25", -25, 1.0),
    ("answer 2 5", -25, 0.0),
    ("answer - - 2 5", -25, 0.0),
    ("answer 0 4 0", 40, 0.0),  # leading zeros: not the canonical form
    ("answer 0 0", 0, 0.0),
    ("answer 0", 0, 1.0),
    ("answer - 0", 0, 0.0),  # no negative zero
])
def test_checker_hand_written_cases(response, answer, score):
    assert check(response, problem(answer)) == score
    assert well_formed(response) == (parse_answer(response) is not None)


def test_format_reward_adds_only_for_well_formed_answers():
    p = problem(7)
    assert arith_reward("answer 7", p, 0.1) == pytest.approx(1.1)
    assert arith_reward("answer 8", p, 0.1) == pytest.approx(0.1)  # well formed, wrong
    assert arith_reward("answer 7 7 answer", p, 0.1) == 0.0  # malformed
    assert arith_reward("answer 7", p) == 1.0 and arith_reward("answer 8", p) == 0.0  # default 0


def test_references_solve_their_problems_and_spell_negatives():
    assert spell(-25) == "- 2 5" and spell(0) == "0" and spell(107) == "1 0 7"
    train, held = make_problems(3, ArithSpec(train_size=200, eval_size=50, max_digits=2, max_ops=3))
    assert all(check(p.reference, p) == 1.0 for p in train + held)
    worked = [p for p in train if not p.reference.startswith("answer")]
    assert 0 < len(worked) < len(train)  # worked_frac=0.5: both kinds of solution
    assert any(p.answer < 0 for p in train)


# --------------------------------------------------------------------------- splits
def test_train_and_held_out_never_share_a_problem():
    # 1-digit, one operation: a space of about 150 canonical forms, two thirds of it held out
    spec = ArithSpec(train_size=2000, eval_size=100, min_digits=1, max_digits=1, min_ops=1, max_ops=1)
    train, held = make_problems(0, spec)
    held_forms = {p.canonical for p in held}
    assert len(held_forms) == len(held) == 100  # held-out problems are distinct
    assert not held_forms & {p.canonical for p in train}
    assert not {p.prompt for p in held} & {p.prompt for p in train}
    # reorderings are one problem: 3 + 5 and 5 + 3 have one canonical form
    from harness.tasks.lm.arith import canonical_form
    assert canonical_form([3, 5], ["+"]) == canonical_form([5, 3], ["+"]) != canonical_form([5, 3], ["-"])
    assert make_problems(0, spec) == (train, held)  # a pure function of the seed


def test_default_splits_are_disjoint_and_too_small_a_space_is_refused():
    train, held = make_problems(0, ArithSpec())
    assert not {p.canonical for p in held} & {p.canonical for p in train}
    with pytest.raises(ValueError, match=r"^lm\.arith\.eval_size"):
        make_problems(0, ArithSpec(eval_size=10_000, max_digits=1, max_ops=1))


# --------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("n,c", [(5, 0), (5, 1), (5, 2), (6, 3), (4, 4)])
def test_pass_at_k_equals_exact_enumeration_of_subsets(n, c):
    correct = set(range(c))  # which samples are correct does not matter
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(range(n), k))
        exact = sum(bool(correct & set(s)) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    n, c, k = 2000, 3, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert mean_pass_at_k([[1, 0, 0, 0], [0, 0, 0, 0]], 2) == pytest.approx((0.5 + 0.0) / 2)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_zero_std_fraction_and_length_by_correctness_on_a_hand_made_batch():
    # three groups of four (group-major): all right, mixed, all wrong
    scores = torch.tensor([1., 1., 1., 1., 0., 1., 0., 0., 0., 0., 0., 0.])
    assert zero_std_fraction(scores, 4) == pytest.approx(2 / 3)
    assert zero_std_fraction(torch.tensor([0.5, 0.5, 0.2, 0.3]), 2) == pytest.approx(0.5)
    assert zero_std_fraction(scores, 1) is None  # a group of one has no spread to lose
    lengths = torch.tensor([3., 5., 7., 9.])
    assert length_by_correctness(lengths, torch.tensor([1., 0., 1., 0.])) == (5.0, 7.0)
    assert length_by_correctness(lengths, torch.ones(4)) == (6.0, None)


# --------------------------------------------------------------------------- training
def test_two_iterations_of_the_arith_task(tmp_path):
    counts = run(compose("estimator=grpo", results_dir=tmp_path))
    assert counts == {"skipped": 0, "completed": 1}
    [path] = list((tmp_path / "lm_arith").glob("*/seed*/metrics.parquet"))
    df, summary = pd.read_parquet(path), json.loads((path.parent / "summary.json").read_text())
    assert list(df.iteration) == [1, 2] and (df.task == "lm_arith").all()
    assert df.pass_at_1.between(0, 1).all() and df.pass_at_k.between(0, 1).all()
    assert (df.pass_at_k >= df.eval_return - 1e-9).all()  # pass@k >= pass@1 of a sample (k >= 1)
    assert (df.pass_at_1 == df.eval_gold_greedy).all()
    assert df.zero_std_frac.between(0, 1).all()
    assert set(df.gold_reward.unique()) <= {0.0, 0.5, 1.0} and (df.reward == df.gold_reward).all()
    for col in ("response_len_correct", "response_len_incorrect"):
        assert df[col].dropna().between(1, 8).all()
    assert {"pass_at_1_init", "pass_at_k_init"} <= set(summary) and 0 <= summary["pass_at_1_init"] <= 1
    assert summary["pipeline"]["sft"]["sft_gold_greedy"] is not None and "rm" not in summary["pipeline"]


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_estimator_runs_on_the_arith_task(tmp_path, estimator):
    cfg = compose(f"estimator={estimator}", "budget.iterations=1", "eval_every=0", "lm.arith.format_reward=0.5",
                  results_dir=tmp_path)
    assert run(cfg) == {"skipped": 0, "completed": 1}
    [path] = list((tmp_path / "lm_arith").glob("*/seed*/metrics.parquet"))
    df = pd.read_parquet(path)
    assert df.pass_at_1.isna().all()  # no evaluation asked for
    # the format reward is in the optimised reward, never in the gold score
    assert (df.reward >= df.gold_reward).all() and (df.reward - df.gold_reward <= 0.5 + 1e-6).all()


# --------------------------------------------------------------------------- bad settings
@pytest.mark.parametrize("override,field", [
    ("lm.corpus=poem", "lm.corpus"),
    ("lm.reward=rm", "lm.reward"),
    ("lm.arith.train_size=0", "lm.arith.train_size"),
    ("lm.arith.min_digits=0", "lm.arith.min_digits"),
    ("lm.arith.max_digits=19", "lm.arith.max_digits"),
    ("lm.arith.max_ops=0", "lm.arith.max_ops"),
    ("lm.arith.operators=x", "lm.arith.operators"),
    ("lm.arith.operators=++", "lm.arith.operators"),
    ("lm.arith.worked_frac=1.5", "lm.arith.worked_frac"),
    ("lm.arith.format_reward=-1", "lm.arith.format_reward"),
    ("lm.arith.pass_k=3", "lm.arith.pass_k"),  # > lm.eval_samples=2
    ("lm.arith.eval_size=100000", "lm.arith.eval_size"),  # more problems than the settings allow
    ("lm.max_prompt_len=4", "lm.max_prompt_len"),
])
def test_bad_arith_settings_are_refused_in_one_line(tmp_path, override, field):
    with pytest.raises(ValueError) as info:
        run(compose(override, results_dir=tmp_path / "r"))
    msg = str(info.value)
    assert msg.startswith(f"{field} must be") and "\n" not in msg
    assert not (tmp_path / "r").exists()  # before any work


def test_bad_arith_setting_exits_2_from_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "task=lm_arith", "estimator=grpo", "lm.arith.operators=x",
                          f"results_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("invalid config:")]
    assert len(lines) == 1 and "lm.arith.operators must be" in lines[0] and "'+-'" in lines[0]
    assert not (tmp_path / "lm_arith").exists()


@pytest.mark.parametrize("format_reward", [0.0, 0.5])
def test_the_gold_column_is_the_gold_score_whether_or_not_it_is_the_reward(tmp_path, format_reward):
    """A rollout's ``gold`` is each response's gold score: read from the reward when the reward is
    the gold score itself (scored once), scored apart when a format reward is added (then the
    reward is the gold score plus 0 or the format reward)."""
    from harness.tasks.lm.data import decode_responses
    from harness.tasks.lm.pipeline import build_task
    from harness.train.lm import LMSource

    cfg = compose("estimator=grpo", f"lm.arith.format_reward={format_reward}", results_dir=tmp_path)
    task = build_task(cfg)
    src = LMSource(RunPlan.of(cfg), task)
    src.kl_beta_now = torch.full((1,), 0.05)  # what the loop sets before collecting
    calls = []
    gold_fn = task.gold_fn
    task.gold_fn = lambda r, e: calls.append((r, e)) or gold_fn(r, e)
    ro = src._draw()
    texts = decode_responses(task.tokenizer, ro.tokens, ro.mask)
    assert [r for r, _ in calls] == texts  # each response's gold score once
    want = torch.tensor([gold_fn(r, e) for r, e in calls])
    assert torch.equal(ro.gold, want)
    assert task.reward_is_gold == (format_reward == 0)
    extra = ro.reward - want
    assert ((extra == 0) | (extra == format_reward)).all()
