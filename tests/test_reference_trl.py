"""``reference=trl`` (harness/reference/trl.py): TRL's own GRPOTrainer / RLOOTrainer on a harness
LM config. What cannot be translated is refused; a tiny run writes the harness's run folder; and
the translation itself: from the same weights and the same sampled batch, TRL's optimizer steps
through the translated config leave the parameters where the harness's update leaves them (with
the models' positions taken from the attention mask: :func:`harness.reference.trl.positions_from_mask`)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.plan import RunPlan

pytest.importorskip("trl")

import torch  # noqa: E402

from .test_lm_common import CACHE, compose, one_thread  # noqa: E402,F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[1]
GRPO = ["estimator=grpo", "reference=trl", "lm.reward=gold", "update=clip", "loss_agg=token_mean", "epochs=1",
        "kl.beta=0.04", "kl.estimator=k3", "kl.in_reward=false", "kl.target=ref"]
RLOO = ["estimator=rloo", "reference=trl", "lm.reward=gold", "update=clip", "loss_agg=seq_mean_token_sum",
        "epochs=1", "kl.beta=0.05", "kl.estimator=k1", "kl.in_reward=true", "kl.target=ref"]


def validate(*overrides, tmp_path):
    from harness.validation import validate as harness_validate

    harness_validate(compose(*overrides, results_dir=tmp_path))


@pytest.mark.parametrize("base", [GRPO, RLOO], ids=["grpo", "rloo"])
def test_translatable_configs_pass(base, tmp_path):
    validate(*base, tmp_path=tmp_path)


@pytest.mark.parametrize("base,override,field", [
    (GRPO, "update=pg", "update"),
    (GRPO, "loss_agg=seq_mean_token_sum", "loss_agg"),
    (GRPO, "minibatches=2", "minibatches"),
    (GRPO, "normalize_advantages=batch", "normalize_advantages"),
    (GRPO, "kl.in_reward=true", "kl.in_reward"),
    (GRPO, "kl.estimator=k1", "kl.estimator"),
    (GRPO, "kl.adaptive=true", "kl.adaptive"),
    (GRPO, "ent_coef=0.01", "ent_coef"),
    (GRPO, "anneal_lr=true", "anneal_lr"),
    (GRPO, "lm.reward=rm", "lm.reward"),
    (GRPO, "lm.no_eos_penalty=0.5", "lm.no_eos_penalty"),
    (GRPO, "dynamic_sampling=true", "dynamic_sampling"),
    (GRPO, "overlong_cache=4", "overlong_cache"),
    (GRPO, "checkpoint_every=5", "checkpoint_every"),
    (GRPO, "lm.dtype=bfloat16", "lm.dtype"),
    (GRPO, "device=cuda", "device"),
    (RLOO, "epochs=2", "epochs"),
    (RLOO, "loss_agg=token_mean", "loss_agg"),
    (RLOO, "kl.in_reward=false", "kl.in_reward"),
    (RLOO, "kl.estimator=k3", "kl.estimator"),
    (RLOO, "update=gspo", "update"),
    (RLOO, "clip_eps_high=0.28", "clip_eps_high"),
])
def test_untranslatable_settings_are_refused(base, override, field, tmp_path):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        validate(*base, override, tmp_path=tmp_path)


def test_estimator_without_a_trl_counterpart_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^reference must be reference=trl trains estimator in \['grpo', 'rloo'\]"):
        validate("estimator=ppo_gae", "reference=trl", "lm.reward=gold", tmp_path=tmp_path)


def test_cli_refuses_in_one_line_with_exit_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's harness, whatever is installed
    proc = subprocess.run([sys.executable, "-m", "harness", "task=lm_summarize", *GRPO, "update=pg",
                           f"results_dir={tmp_path}", f"lm.cache_dir={tmp_path / 'cache'}"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert lines == ["invalid config: update must be 'clip' with reference=trl (TRL's GRPOTrainer has no other), "
                     "got 'pg'"], lines
    assert not (tmp_path / "lm_summarize").exists()  # refused before any work


def test_translated_settings(tmp_path):
    """The TRL keyword arguments written out by hand from the module's table (TRL 1.16 names)."""
    from harness.reference.trl import trl_settings

    cfg = compose(*GRPO, "clip_eps=0.2", "clip_eps_high=0.28", "delta=4.0", "std_normalize=false", "epochs=3",
                  "lr=3e-4", "max_grad_norm=0.5", "mask_truncated=true", "lm.temperature=0.7", "seed=5",
                  results_dir=tmp_path)
    common = dict(per_device_train_batch_size=2 * 2, gradient_accumulation_steps=1, steps_per_generation=1,
                  num_generations=2, max_completion_length=10, temperature=0.7, top_p=1.0, top_k=0,
                  mask_truncated_completions=True, disable_dropout=True, learning_rate=3e-4,
                  lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_epsilon=1e-5,
                  max_grad_norm=0.5, optim="adamw_torch", seed=5, data_seed=5)
    assert trl_settings(cfg) == dict(common, num_iterations=3, beta=0.04, epsilon=0.2, epsilon_high=0.28,
                                     loss_type="dapo", scale_rewards="none", use_bias_correction_kl=False,
                                     importance_sampling_level="token", delta=4.0)
    for agg, loss_type in [("seq_mean_token_mean", "grpo"), ("seq_mean_token_sum_norm", "dr_grpo")]:
        assert trl_settings(compose(*GRPO, f"loss_agg={agg}", results_dir=tmp_path))["loss_type"] == loss_type
    assert trl_settings(compose(*GRPO, results_dir=tmp_path))["scale_rewards"] == "group"
    cfg = compose(*RLOO, "clip_eps=0.2", "lr=3e-4", "max_grad_norm=0.5", "mask_truncated=true",
                  "lm.temperature=0.7", "seed=5", results_dir=tmp_path)
    assert trl_settings(cfg) == dict(common, num_iterations=1, beta=0.05, epsilon=0.2, epsilon_high=None,
                                     normalize_advantages=False)


def test_tiny_run_writes_a_finished_harness_run_folder(tmp_path):
    """Two members, a token budget: each stops at the first iteration whose sampled tokens reach
    it, evaluated by the harness's evaluation at every iteration and before the first, read by
    analysis like any harness run."""
    from analysis.load import load
    from harness.app import run

    cfg = compose(*GRPO, "population=2", "budget.iterations=null", "budget.tokens=50", results_dir=tmp_path)
    assert run(cfg)["completed"] == 2
    df = load(tmp_path)
    assert sorted(df.seed.unique()) == [0, 1] and set(df.status) == {"completed"}
    for _, runs in df.groupby("seed"):
        runs = runs.sort_values("iteration")
        assert list(runs.iteration) == list(range(1, len(runs) + 1))
        assert runs.tokens.iloc[-1] >= 50 and (len(runs) == 1 or runs.tokens.iloc[-2] < 50)
        assert (runs.env_steps == runs.tokens).all()
        # 2 prompts x 2 samples, 1..10 tokens each
        per_iter = runs.tokens.diff().fillna(runs.tokens.iloc[0])
        assert per_iter.between(4, 40).all()
        for col in ("eval_return", "eval_gold_greedy", "kl_ref", "gold_reward", "reward", "policy_loss", "grad_norm"):
            assert runs[col].notna().all(), col
        assert runs.kl_ref.abs().max() < 1.0  # a few tiny steps from the reference
    summaries = [p for p in tmp_path.rglob("summary.json")]
    import json

    for p in summaries:
        s = json.loads(p.read_text())
        assert s["status"] == "completed" and s["eval_return_init"] is not None and s["tokens"] >= 50
    assert not any(tmp_path.rglob(".trl"))  # TRL's own output folder is removed


@pytest.mark.parametrize("seconds, flushed_at", [(0.0, [10]), (3600.0, [])])
def test_metrics_are_rewritten_by_the_loops_rule(seconds, flushed_at, tmp_path, monkeypatch):
    """metrics.parquet as the harness's loop writes it (:func:`harness.train.loop.flush_due`):
    after iterations 10, 20, ... unless the last rewrite (or the start) is under FLUSH_SECONDS
    old; the end writes every row."""
    import pyarrow.parquet as pq

    import harness.train.loop as train_loop
    from harness.app import run
    from harness.io import RunDir

    monkeypatch.setattr(train_loop, "FLUSH_SECONDS", seconds)
    at = []
    original = RunDir.flush
    monkeypatch.setattr(RunDir, "flush", lambda self: (at.append(len(self.rows)), original(self))[1])
    assert run(compose(*RLOO, "eval_every=0", "budget.iterations=12", results_dir=tmp_path))["completed"] == 1
    assert at == flushed_at + [12]  # the last: RunDir.finish
    (d,) = [p.parent for p in tmp_path.rglob("summary.json")]
    assert pq.read_table(d / "metrics.parquet").column("iteration").to_pylist() == list(range(1, 13))


# --------------------------------------------------------------------------- the translation itself
def _rewards(examples, texts, finished):
    """A reward that varies with the text (the tiny SFT policy scores 0 gold on everything), on a
    scale (0-130) where the epsilons in the group std's denominator (TRL 1e-4, the harness 1e-6,
    a documented difference) are both negligible: what remains between the two sides is rounding."""
    return torch.tensor([100.0 * (len(t) % 7) / 7.0 + 30.0 * float(f) for t, f in zip(texts, finished)])


def _one_iteration_both_sides(overrides, tmp_path, monkeypatch, mask_positions=True):
    """TRL's trainer (the translation of ``overrides``) runs one generation batch and its
    optimizer steps; the harness then runs one iteration on that very batch (its prompts chosen
    and its responses "sampled" as TRL's, log pi_old teacher-forced). Returns the parameters:
    start, after TRL, after the harness."""
    import harness.train.lm as lm_mod
    from harness.config import member_configs
    from harness.io import RunDir
    from harness.models.lm import Generation, Responses, response_forward
    from harness.reference.trl import _response_mask, make_trainer
    from harness.tasks.lm.pipeline import build_task
    from harness.train.workers import train_members

    cfg = compose(*overrides, "eval_every=0", "budget.iterations=1", "group_size=4", "lm.prompts_per_iter=2",
                  results_dir=tmp_path)
    task = build_task(cfg)
    monkeypatch.setattr(task, "reward", _rewards)
    start = {k: v.detach().clone() for k, v in task.load_policy().state_dict().items()}

    trainer, _, _ = make_trainer(cfg, task, tmp_path / "trl", int(cfg.epochs), mask_positions=mask_positions)
    seen = {}
    orig = trainer._generate_and_score_completions

    def capture(inputs):
        out = orig(inputs)
        seen.update(out=out, idx=[x["example_index"] for x in inputs])
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    after_trl = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    out, k = seen["out"], int(cfg.group_size)
    assert seen["idx"] == [i for i in seen["idx"][::k] for _ in range(k)]  # group-major, as the harness's
    assert (out["prompt_mask"] == 0).any()  # prompts of several lengths: left padding, where positions matter

    class Picks:  # the harness's prompt RNG, drawing TRL's prompts
        def __init__(self):
            self.left = list(seen["idx"][::k])

        def randrange(self, n):
            return self.left.pop(0)

    def replay(model, u_ids, u_mask, settings, samples=1, with_greedy=False, generator=None):
        eos, pad, temperature = settings.eos_token_id, settings.pad_token_id, settings.temperature
        tokens = out["completion_ids"]
        mask = _response_mask(tokens, eos)
        rows = torch.arange(u_ids.shape[0]).repeat_interleave(samples)
        assert torch.equal(u_ids[rows][u_mask[rows].bool()], out["prompt_ids"][out["prompt_mask"].bool()])
        with torch.no_grad():
            logp = response_forward(model, Responses(u_ids[rows], u_mask[rows], tokens, mask.long()), temperature).logp
        has_eos = (tokens == eos).any(-1)
        return Generation(tokens.masked_fill(mask == 0, pad), mask.long(), logp * mask, has_eos), None

    sources = []

    def make_source(c, rs):
        src = lm_mod.LMSource(c, task)
        src.rng = Picks()
        sources.append(src)
        return src

    monkeypatch.setattr(lm_mod, "generate_groups", replay)
    train_members(RunPlan.of(cfg), [RunDir(m) for m in member_configs(cfg)], make_source)
    after_harness = {k: v.detach().clone() for k, v in sources[0].policy.lm.state_dict().items()}
    return cfg, start, after_trl, after_harness


@pytest.mark.parametrize("overrides", [
    # two optimizer steps on one batch: the second has ratios != 1 (clip) and a policy off the reference (k3 KL)
    [*GRPO, "epochs=2", "kl.beta=0.5", "clip_eps=0.05", "lr=3e-3"],
    [*GRPO, "loss_agg=seq_mean_token_mean", "std_normalize=false", "lr=3e-3"],
    [*RLOO, "lr=3e-3"],
], ids=["grpo_dapo_2_epochs_kl", "grpo_seq_mean_no_std", "rloo"])
def test_trl_update_through_the_translation_is_the_harness_update(overrides, tmp_path, monkeypatch):
    cfg, start, trl_p, ours = _one_iteration_both_sides(overrides, tmp_path, monkeypatch)
    lr = float(cfg.lr)
    moved = max(float((trl_p[n] - start[n]).abs().max()) for n in start)
    assert moved > 0.5 * lr  # the step did something (Adam's first step moves weights by about lr)
    worst = max(float((trl_p[n] - ours[n]).abs().max()) for n in start)
    assert worst < 1e-3 * lr * int(cfg.epochs), (worst, moved)
    assert math.isfinite(worst)


def test_trl_as_shipped_scores_left_padded_gpt2_prompts_at_shifted_positions(tmp_path, monkeypatch):
    """Why the models given to TRL take their positions from the mask (positions_from_mask):
    without it, TRL's loss pass numbers the left padding as positions, and its step on GPT-2
    (learned absolute positions) is not the harness's, nor that of the function that sampled."""
    cfg, start, trl_p, ours = _one_iteration_both_sides([*GRPO, "lr=3e-3"], tmp_path, monkeypatch,
                                                        mask_positions=False)
    worst = max(float((trl_p[n] - ours[n]).abs().max()) for n in start)
    assert worst > 0.5 * float(cfg.lr)


@pytest.mark.parametrize("name", ["claim_c57", "claim_c58"])
def test_claim_experiments_run_one_config_on_both_sides(name, tmp_path):
    """The parity experiments: both points (reference null and trl) validate, full and --quick,
    and are the same config but for ``reference``, so a difference between them is the library's."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from harness.config import register_configs
    from harness.experiments import read_experiment
    from harness.validation import validate as harness_validate

    from .test_lm_common import CONF

    quick = read_experiment(CONF / "experiment" / f"{name}.yaml").quick
    register_configs()
    for extra in ([], [f"{k}={v}" for k, v in quick.items()]):
        sides = {}
        for ref in ("null", "trl"):
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                cfg = hydra_compose(config_name="config", overrides=[f"experiment={name}", f"reference={ref}",
                                                                     f"results_dir={tmp_path}", *extra])
            harness_validate(cfg)
            sides[ref] = OmegaConf.to_container(cfg, resolve=True)
        assert sides["trl"].pop("reference") == "trl" and sides["null"].pop("reference") is None
        assert sides["null"] == sides["trl"]
        assert sides["trl"]["lm"]["reward"] == "gold" and sides["trl"]["population"] == (2 if extra else 10)
