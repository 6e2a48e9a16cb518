"""Two RL iterations of each estimator on the tiny LM task, through harness.app.run."""
import json

import pandas as pd
import pytest

from harness.app import run
from harness.io.rundir import METRIC_COLUMNS

from .test_lm_common import compose, one_thread  # noqa: F401  (autouse fixture)
from harness.plan import RunPlan

LM_COLUMNS = ["reward", "gold_reward", "kl_ref", "response_len", "tokens", "entropy", "approx_kl", "clip_frac",
              "tokens_per_s", "peak_mem_mb", "peak_mem_base_mb", "prompts_truncated"]
PROMPTS, GROUP, MAX_LEN = 2, 2, 10  # lm.prompts_per_iter, group_size, lm.max_response_len in TINY


def run_one(tmp_path, *overrides):
    cfg = compose(*overrides, results_dir=tmp_path)
    counts = run(cfg)
    [path] = list((tmp_path / "lm_summarize").glob("*/seed*/metrics.parquet"))
    return counts, pd.read_parquet(path), json.loads((path.parent / "summary.json").read_text())


@pytest.mark.parametrize("estimator,critic", [("ppo_gae", True), ("grpo", False), ("rloo", False), ("remax", False)])
def test_two_iterations_write_the_lm_metrics(tmp_path, estimator, critic):
    counts, df, summary = run_one(tmp_path, f"estimator={estimator}")
    assert counts == {"skipped": 0, "completed": 1} and summary["status"] == "completed"
    assert list(df.iteration) == [1, 2] and set(METRIC_COLUMNS) <= set(df.columns)
    assert df[LM_COLUMNS].notna().all().all()
    assert (df.task == "lm_summarize").all() and (df.estimator == estimator).all() and (df.seed == 0).all()
    assert (df.env_steps == df.tokens).all() and (df.episode_return == df.reward).all()
    assert df.gold_reward.between(0, 1).all() and df.eval_return.between(0, 1).all()
    assert (df.group_size == GROUP).all() and (df.kl_beta == 0.05).all()  # the task default
    # before the first update the policy is the reference: KL exactly 0
    assert df.kl_ref.iloc[0] == pytest.approx(0.0, abs=1e-6)
    # tokens: every sampled token counted, greedy ones too (ReMax), nothing else
    per_iter = df.tokens.diff().fillna(df.tokens.iloc[0])
    sampled = df.response_len * PROMPTS * GROUP
    extra = per_iter - sampled
    if estimator == "remax":  # one greedy response per prompt, 1..MAX_LEN tokens each
        assert ((extra >= PROMPTS - 1e-6) & (extra <= PROMPTS * MAX_LEN + 1e-6)).all()
        assert df.greedy_reward.notna().all()
    else:
        assert extra.abs().max() < 1e-6 and df.greedy_reward.isna().all()
    assert (df.tokens <= 2 * (PROMPTS * GROUP + PROMPTS) * MAX_LEN).all()
    if critic:
        assert df.value_loss.notna().all() and df.explained_variance.notna().all()
        assert (df.adv_within_std > 0).all()  # a critic spreads credit over the tokens (C14)
    else:
        assert df.value_loss.isna().all() and df.explained_variance.isna().all()
        assert (df.adv_within_std == 0).all()  # one advantage for every token of a response (C14)
    if estimator in ("rloo", "remax"):  # update: pg never clips
        assert (df.clip_frac == 0).all()
    # a rerun of the same config finds the finished run and skips it
    assert run(compose(f"estimator={estimator}", results_dir=tmp_path)) == {"skipped": 1}


def test_kl_in_reward_is_folded_into_the_return(tmp_path):
    _, df, _ = run_one(tmp_path, "estimator=rloo", "kl.in_reward=true", "kl.beta=0.5", "kl.estimator=k1")
    # return of a response = score - beta * sum_t k1_t, and kl_ref is the mean of sum_t k1_t
    assert df.return_mean.tolist() == pytest.approx((df.score - 0.5 * df.kl_ref).tolist(), abs=1e-5)
    assert df.kl_loss.isna().all()


def test_kl_as_loss_term_and_no_eos_penalty(tmp_path):
    _, df, _ = run_one(tmp_path, "estimator=grpo", "kl.beta=0.1", "lm.no_eos_penalty=0.5", "lm.max_response_len=3",
                       "loss_agg=seq_mean_token_sum_norm")
    assert df.kl_loss.notna().all() and (df.kl_loss >= 0).all()  # k3 is non-negative
    assert (df.no_eos_frac > 0).any()  # 3 tokens are too few for most summaries
    assert df.score.tolist() == pytest.approx((df.reward - 0.5 * df.no_eos_frac).tolist(), abs=1e-5)
    assert (df.return_mean == df.score).all()  # the KL is not in the reward


def test_separate_critic_model_and_population(tmp_path):
    cfg = compose("estimator=ppo_gae", "lm.critic=model", "population=2", "budget.iterations=1",
                  results_dir=tmp_path)
    assert run(cfg) == {"skipped": 0, "completed": 2}
    frames = [pd.read_parquet(p) for p in sorted((tmp_path / "lm_summarize").glob("*/seed*/metrics.parquet"))]
    assert sorted(int(f.seed.iloc[0]) for f in frames) == [0, 1]
    assert all(f.value_loss.notna().all() for f in frames)


def test_budget_in_tokens_stops_the_run(tmp_path):
    _, df, summary = run_one(tmp_path, "estimator=rloo", "budget.iterations=null", "budget.tokens=30")
    # stops at the first iteration whose cumulative tokens reach the budget
    assert df.tokens.iloc[-1] >= 30 and (len(df) == 1 or df.tokens.iloc[-2] < 30)
    assert summary["tokens"] == int(df.tokens.iloc[-1])


def test_non_finite_update_is_recorded_as_diverged(tmp_path):
    _, df, summary = run_one(tmp_path, "estimator=rloo", "lr=1e30", "budget.iterations=5", "max_grad_norm=null")
    assert summary["status"] == "diverged" and "non-finite" in summary["reason"]
    assert 1 <= len(df) < 5  # the rows up to the divergence are kept


def test_evaluation_scores_the_sft_policy_first_and_never_moves_training(tmp_path):
    """``eval_return_init`` is the SFT policy's score under the very evaluation the rows use
    (same prompts, same eval seed), and evaluating draws from its own generator: the training
    rows of a run that evaluates every iteration equal those of a run that never evaluates."""
    import dataclasses

    import torch

    from harness.tasks.lm.pipeline import Decoding, build_task, evaluate_gold
    from harness.train.lm import LMSource

    _, with_eval, summary = run_one(tmp_path / "a", "estimator=rloo", "lm.eval_samples=3")
    _, no_eval, summary0 = run_one(tmp_path / "b", "estimator=rloo", "lm.eval_samples=3", "eval_every=0")
    cols = ["reward", "gold_reward", "kl_ref", "policy_loss", "tokens"]
    pd.testing.assert_frame_equal(with_eval[cols], no_eval[cols])
    assert no_eval.eval_return.isna().all() and summary0["eval_return_init"] is None

    cfg = compose("estimator=rloo", results_dir=tmp_path / "a")
    task = build_task(cfg)
    sft = task.load_policy()
    args = (sft, task.tokenizer, task.held_out, 4)  # TINY: lm.eval_prompts=4, max_response_len=10
    seed = int(cfg.lm.pipeline_seed) + LMSource.EVAL_SEED_OFFSET
    want_sampled = evaluate_gold(*args, Decoding(10, 1.0, False, torch.device("cpu"), samples=3), seed)
    want_greedy = evaluate_gold(*args, Decoding(10, 1.0, True, torch.device("cpu")), seed)
    assert summary["eval_return_init"] == pytest.approx(want_sampled, abs=1e-12)
    assert summary["eval_gold_greedy_init"] == pytest.approx(want_greedy, abs=1e-12)
    assert with_eval.eval_gold_greedy.between(0, 1).all()


def test_sampler_logprobs_stand_in_for_the_old_policy_pass_in_fp32(tmp_path, monkeypatch):
    """In fp32 without a value head, log pi_old comes from the sampler (C12: equal to the
    teacher-forced pass to float rounding), saving one policy pass per iteration: the metrics
    match a run that recomputes it, and the policy runs only in the update."""
    import harness.train.lm as lm_mod

    calls = {"n": 0}
    forward = lm_mod.PolicyWithValue.forward

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(lm_mod.PolicyWithValue, "forward", counted)
    _, fast, _ = run_one(tmp_path / "fast", "estimator=rloo", "eval_every=0")
    n_fast = calls["n"]
    calls["n"] = 0
    monkeypatch.setattr(lm_mod, "uses_bf16", lambda *a, **k: True)  # as under bf16: recompute
    _, slow, _ = run_one(tmp_path / "slow", "estimator=rloo", "eval_every=0")
    n_slow = calls["n"]
    assert n_fast == 2 and n_slow == 4  # 2 iterations x 1 epoch x 1 minibatch (+ 1 collect pass each)
    assert list(fast.tokens) == list(slow.tokens)
    for col in ("reward", "gold_reward", "kl_ref", "policy_loss", "entropy", "approx_kl"):
        assert fast[col].to_numpy() == pytest.approx(slow[col].to_numpy(), abs=1e-5), col


def test_peak_memory_is_the_peak_above_the_members_baseline():
    """``peak_mem_mb`` = largest reading after :meth:`start` minus the reading at start, whatever
    the process held before (readings in MiB from a stand-in for the resident set)."""
    import torch

    from harness.train.lm import PeakMemory

    readings = iter([1000.0, 1200.0, 1500.0, 1100.0, 3000.0, 3100.0, 3050.0])
    m = PeakMemory(torch.device("cpu"), read=lambda device: next(readings))
    m.start()
    for _ in range(3):
        m.sample()
    assert (m.base, m.above_base_mb) == (1000.0, 500.0)
    m.start()  # a later member in the same process, starting where the process now stands
    m.sample()
    m.sample()
    assert (m.base, m.above_base_mb) == (3000.0, 100.0)


def test_cpu_memory_counts_allocated_bytes_not_touched_pages():
    """``memory_mb`` on CPU rises by a tensor's size when it is allocated, even untouched (the
    resident set would not move), and falls back when it is freed."""
    import torch

    from harness.train.lm import _MALLINFO2, memory_mb

    if _MALLINFO2 is None:
        pytest.skip("no glibc mallinfo2 here: the resident set is used")
    cpu = torch.device("cpu")
    before = memory_mb(cpu)
    x = torch.empty(16 * 2**20, dtype=torch.float32)  # 64 MiB, never written
    during = memory_mb(cpu)
    del x
    after = memory_mb(cpu)
    assert abs((during - before) - 64.0) < 0.5
    assert abs(after - before) < 0.5


def test_overlong_penalty_is_added_to_the_score(tmp_path):
    """DAPO's soft overlong penalty with L_cache = L_max: every response pays -|y| / L_max, so
    the mean score is the mean reward minus the mean response length / L_max (by hand)."""
    _, df, _ = run_one(tmp_path, "estimator=grpo", "kl.beta=0", f"overlong_cache={MAX_LEN}")
    assert df.score.tolist() == pytest.approx((df.reward - df.response_len / MAX_LEN).tolist(), abs=1e-5)


def test_truncated_responses_leave_the_loss(tmp_path):
    """mask_truncated (TRL's mask_truncated_completions): with one-token responses almost none
    ends in EOS; an iteration whose responses are all truncated gives the policy no gradient."""
    opts = ["estimator=ppo_gae", "kl.beta=0", "lm.max_response_len=1", "budget.iterations=4", "eval_every=0"]
    _, cut, _ = run_one(tmp_path / "cut", *opts, "mask_truncated=true")
    _, kept, _ = run_one(tmp_path / "kept", *opts)
    all_cut = cut.no_eos_frac == 1.0
    assert all_cut.any() and (cut.grad_norm[all_cut] == 0).all()
    assert (kept.grad_norm[kept.no_eos_frac == 1.0] > 0).all()


def test_dynamic_sampling_keeps_informative_groups_from_several_draws_and_charges_every_draw(tmp_path):
    """DAPO's dynamic sampling on the LM source with scripted scores (3 prompts x 2 samples per
    draw): draw 1 has no informative group, draw 2 its group 1, draw 3 its groups 0 and 1. The
    batch is those three groups in that order, prompts re-padded to one width without changing
    any log-prob, and every drawn token (kept or not) counted."""
    import dataclasses

    import torch

    from harness.tasks.lm.pipeline import build_task
    from harness.train.lm import LMSource

    cfg = compose("estimator=grpo", "kl.beta=0", "lm.prompts_per_iter=3", "dynamic_sampling=true",
                  "dynamic_sampling_max_draws=5", results_dir=tmp_path)
    src = LMSource(RunPlan.of(cfg), build_task(cfg))
    src.kl_beta_now = torch.zeros(1)
    scripted = iter([[0, 0, 1, 1, .5, .5], [0, 0, 0, 1, 1, 1], [1, 0, .2, .3, 0, 0]])
    draws = []
    real_draw = src._draw

    def draw():  # draw 3's prompts wider than draw 2's, as if its longest prompt were longer: cat re-pads draw 2's
        ro = real_draw()
        if len(draws) == 2:
            extra = max(2, draws[1].prompt_ids.shape[1] - ro.prompt_ids.shape[1] + 2)
            pad = torch.nn.functional.pad
            ro = dataclasses.replace(ro, prompt_ids=pad(ro.prompt_ids, (extra, 0), value=src.tok.pad_token_id),
                                     prompt_mask=pad(ro.prompt_mask, (extra, 0), value=0))
        draws.append(ro)
        return ro

    def score(examples, texts, has_eos, lengths):
        s = torch.tensor(next(scripted), dtype=torch.float32)
        return s, s
    src._draw, src._score = draw, score
    ro = src.collect()
    assert src.drawn.draws == len(draws) == 3 and src.drawn.zero_std_frac == pytest.approx(6 / 9)
    assert ro.score.tolist() == pytest.approx([0, 1, 1, 0, .2, .3])
    kept = [(1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]  # (draw, row)
    for i, (d, r) in enumerate(kept):
        assert torch.equal(ro.tokens[i], draws[d].tokens[r]) and torch.equal(ro.old_logp[i], draws[d].old_logp[r])
        n = int(draws[d].prompt_mask[r].sum())  # the prompt, right-aligned, whatever the padding
        assert torch.equal(ro.prompt_ids[i][-n:], draws[d].prompt_ids[r][-n:]) and int(ro.prompt_mask[i].sum()) == n
    assert draws[1].prompt_ids.shape[1] < ro.prompt_ids.shape[1] == draws[2].prompt_ids.shape[1]
    assert ro.sampled_tokens == sum(int(d.mask.sum()) for d in draws) == src.tokens
    # the re-padded prompts give the policy the same log-probs as when each batch was drawn
    logp, _, _ = src.learner.forward(ro, None, False)
    torch.testing.assert_close(logp[0].T * ro.mask, ro.old_logp, atol=1e-5, rtol=1e-5)


def test_dynamic_sampling_runs_end_to_end_and_logs_its_draws(tmp_path):
    _, df, summary = run_one(tmp_path, "estimator=grpo", "dynamic_sampling=true", "dynamic_sampling_max_draws=3")
    assert summary["status"] == "completed" and df.sample_draws.between(1, 3).all()
    per_iter = df.tokens.diff().fillna(df.tokens.iloc[0])
    assert (per_iter >= df.response_len * PROMPTS * GROUP - 1e-6).all()


@pytest.mark.parametrize("estimator", ["grpo", "remax"])
def test_each_prompt_is_sampled_once_and_the_samples_are_those_of_per_row_decoding(tmp_path, estimator, monkeypatch):
    """The source prefills each prompt of the batch once (one prompt forward per distinct prompt,
    shared by its ``group_size`` samples and, for ReMax, its greedy response), and draws from the
    run's generator exactly the responses that decoding every row alone draws (the decoder the
    sampler replaced: tests/test_lm_model.py's reference), greedy responses included."""
    import functools

    import torch

    from harness.models import lm as lm_mod
    from harness.tasks.lm.data import decode_responses
    from harness.tasks.lm.pipeline import build_task
    from harness.train.lm import LMSource

    from .test_lm_model import _decode_rows_alone

    cfg = compose(f"estimator={estimator}", "lm.prompts_per_iter=3", "group_size=3", results_dir=tmp_path)
    task = build_task(cfg)
    src = LMSource(RunPlan.of(cfg), task)
    src.kl_beta_now = torch.full((1,), 0.05)
    # policy and reference run GPT-2's GELU as SigmoidGELU (harness.models.lm.fast_gelu)
    assert not any(type(m).__name__ == "NewGELUActivation" for net in (src.policy, src.ref) for m in net.modules())
    prompt_rows = []
    forward = type(src.policy.lm).forward

    @functools.wraps(forward)  # keeps forward's signature (harness.models.lm reads its cache argument's name)
    def counted(self, *args, **kwargs):  # the rows of every forward pass that sees a whole prompt
        if self is src.policy.lm and kwargs["input_ids"].shape[1] > 1:
            prompt_rows.append(kwargs["input_ids"].shape[0])
        return forward(self, *args, **kwargs)

    own_pass = lm_mod._gpt2_pass

    def counted_pass(trunk, ids, *args, **kwargs):  # the same through the harness's own GPT-2 pass
        if trunk is src.policy.lm.transformer and ids.shape[1] > 1:
            prompt_rows.append(ids.shape[0])
        return own_pass(trunk, ids, *args, **kwargs)

    monkeypatch.setattr(type(src.policy.lm), "forward", counted)
    monkeypatch.setattr(lm_mod, "_gpt2_pass", counted_pass)
    state, py_state = src.gen.get_state(), src.rng.getstate()
    ro = src._draw()
    assert prompt_rows == [3]  # 3 distinct prompts once, for 9 samples (+ 3 greedy responses)
    monkeypatch.undo()
    src.gen.set_state(state)
    split = task.train
    src.rng.setstate(py_state)
    idx = [src.rng.randrange(len(split)) for _ in range(3)]
    rows = [split.prompt_ids[i] for i in idx for _ in range(3)]
    want, want_lp = _decode_rows_alone(src.policy.lm, rows, int(cfg.lm.max_response_len), float(cfg.lm.temperature),
                                       src.gen, eos=src.tok.eos_token_id, pad=src.tok.pad_token_id)
    assert len({tuple(w) for w in want}) > 3
    for r, (w, lp) in enumerate(zip(want, want_lp)):
        assert ro.tokens[r, :len(w)].tolist() == w and int(ro.mask[r].sum()) == len(w)
        assert ro.old_logp[r, :len(w)].tolist() == pytest.approx(lp, abs=1e-5)
    if estimator == "remax":
        greedy, _ = _decode_rows_alone(src.policy.lm, [split.prompt_ids[i] for i in idx], int(cfg.lm.max_response_len),
                                       float(cfg.lm.temperature), None, greedy=True, eos=src.tok.eos_token_id)
        tok = torch.full((3, max(map(len, greedy))), src.tok.pad_token_id)
        mask = torch.zeros_like(tok)
        for i, w in enumerate(greedy):
            tok[i, :len(w)], mask[i, :len(w)] = torch.tensor(w), 1
        has_eos = torch.tensor([w[-1] == src.tok.eos_token_id for w in greedy])
        want_reward = task.reward([split.examples[i] for i in idx], decode_responses(src.tok, tok, mask),
                                  has_eos.tolist()).float()
        assert ro.greedy_rewards.tolist() == pytest.approx(want_reward.tolist(), abs=1e-6)
        assert ro.sampled_tokens == int(ro.mask.sum()) + sum(map(len, greedy))


def test_at_beta_zero_the_reference_runs_only_for_the_kl_ref_columns_every_kl_ref_every_iterations(tmp_path,
                                                                                                   monkeypatch):
    """At kl.beta = 0 training never reads log pi_ref: the reference runs on iterations 1, 1 + k,
    1 + 2k, ... (k = lm.kl_ref_every) for the kl_ref / kl_ref_token columns, which are null in
    between, and training is the same as with the reference every iteration (k = 1)."""
    import harness.train.lm as lm_mod

    calls = []
    ref_logp = lm_mod.LMSource._ref_logp

    def counted(self, *args):
        calls.append(self.iteration)
        return ref_logp(self, *args)

    monkeypatch.setattr(lm_mod.LMSource, "_ref_logp", counted)
    opts = ["estimator=grpo", "kl.beta=0", "budget.iterations=7", "eval_every=0"]
    _, every3, _ = run_one(tmp_path / "k3", *opts, "lm.kl_ref_every=3")
    assert calls == [1, 4, 7]
    calls.clear()
    _, every1, _ = run_one(tmp_path / "k1", *opts, "lm.kl_ref_every=1")
    assert calls == list(range(1, 8))
    calls.clear()
    _, never, _ = run_one(tmp_path / "k0", *opts, "lm.kl_ref_every=0")
    assert calls == [] and never.kl_ref.isna().all()
    measured = every3.iteration.isin([1, 4, 7])
    assert every3.kl_ref[measured].notna().all() and every3.kl_ref[~measured].isna().all()
    assert every3.kl_ref_token[~measured].isna().all() and every1.kl_ref.notna().all()
    assert every3.kl_ref[measured].tolist() == every1.kl_ref[measured].tolist()
    assert every1.kl_ref.iloc[0] == pytest.approx(0.0, abs=1e-6)  # the policy starts as the reference
    for col in ("reward", "gold_reward", "policy_loss", "entropy", "approx_kl", "grad_norm", "tokens"):
        assert every3[col].tolist() == every1[col].tolist() == never[col].tolist(), col
    # with beta > 0 the reference runs every iteration whatever lm.kl_ref_every says
    calls.clear()
    _, penalised, _ = run_one(tmp_path / "b", "estimator=grpo", "kl.beta=0.1", "budget.iterations=3", "eval_every=0",
                              "lm.kl_ref_every=3")
    assert calls == [1, 2, 3] and penalised.kl_ref.notna().all()


@pytest.mark.parametrize("value, expected", [(float("nan"), False), (float("inf"), False), (float("-inf"), False),
                                             (3e38, True), (None, True)],
                         ids=["nan", "inf", "-inf", "huge-finite", "all-finite"])
@pytest.mark.parametrize("where", ["policy", "critic"])
def test_lm_finite_members_reads_every_weight(value, expected, where):
    """:meth:`~harness.train.lm.LMLearner.finite_members`: one non-finite weight anywhere (the
    policy's, the separate critic's) makes the member non-finite; huge finite weights (3e38: their
    norm overflows to inf, which the fused check reads as "look entry by entry") still count as
    finite."""
    from types import SimpleNamespace

    import torch

    from harness.models.lm import PolicyWithValue, TinyArch, ValueModel, tiny_causal_lm
    from harness.train.lm import LMLearner

    policy = PolicyWithValue(tiny_causal_lm(10, 0, 2, 16, TinyArch(n_layer=1, n_embd=8, n_head=2)), value_head=False)
    critic = ValueModel(tiny_causal_lm(10, 0, 2, 16, TinyArch(n_layer=1, n_embd=8, n_head=2)).transformer)
    learner = LMLearner(SimpleNamespace(policy=policy, critic=critic))
    if value is not None:
        net = policy.lm.transformer if where == "policy" else critic.backbone
        with torch.no_grad():
            net.h[0].mlp.c_fc.weight[3, 5] = value
    assert learner.finite_members().tolist() == [expected]
