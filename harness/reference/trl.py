"""TRL's own GRPOTrainer and RLOOTrainer on a harness LM config (``reference=trl``).

Each member (its own seed) trains with TRL's trainer (``estimator=grpo``: ``trl.GRPOTrainer``;
``estimator=rloo``: ``trl.RLOOTrainer``, TRL 1.x's RLOO, not the old PPO-style one) from the same
SFT weights and tokenizer (the harness's LM pipeline, ``lm.cache_dir``; the model object itself is
handed to TRL), on the same training prompts (the harness's encoded prompts decoded to text: TRL
re-tokenizes them, checked token for token), with the harness's reward (:meth:`LMTask.reward` of
the decoded responses: the gold score with ``lm.reward=gold``). The translation (TRL 1.16 names;
:func:`trl_settings`):

==============================================  ==============================================================
harness                                         TRL
==============================================  ==============================================================
``lm.prompts_per_iter`` x ``group_size``        ``per_device_train_batch_size`` (completions),
                                                ``num_generations``, ``steps_per_generation=1``
``lm.max_response_len``, ``lm.temperature``     ``max_completion_length``, ``temperature`` (``top_p=1``, ``top_k=0``)
``lr``, Adam eps 1e-5, ``max_grad_norm``        ``learning_rate`` (constant, no warm-up, no weight decay),
                                                ``adam_epsilon=1e-5``, ``max_grad_norm`` (null: 0, off)
``epochs`` (``minibatches=1``)                  ``num_iterations``: the generation batch is reused for that
                                                many optimizer steps, each over the whole batch
``clip_eps``, ``clip_eps_high``, ``delta``      ``epsilon``, ``epsilon_high``, ``delta`` (grpo)
``mask_truncated``                              ``mask_truncated_completions``
grpo: ``std_normalize`` true / false            ``scale_rewards="group"`` / ``"none"``
grpo: ``loss_agg`` token_mean /                 ``loss_type="dapo"`` / ``"grpo"`` / ``"dr_grpo"`` (one minibatch, no
seq_mean_token_mean / seq_mean_token_sum_norm   accumulation: dapo's global token count is the batch's)
grpo: ``kl.beta``, k3 as a loss term to ref     ``beta``, ``use_bias_correction_kl=False`` (TRL's default
                                                multiplies the k3 term by the ratio, which the harness never does)
rloo: ``kl.beta``, k1 in the reward             ``beta`` (TRL's RLOO subtracts beta x the summed k1 from the score)
rloo: ``loss_agg=seq_mean_token_sum``, one      TRL's RLOO loss: the clipped *sequence* ratio times A, mean over
epoch: ``update`` clip or pg                    responses; with one optimizer step per batch the ratio is 1, so its
                                                gradient is the harness's ``-mean_i A_i sum_t grad log pi``
``budget.tokens`` / ``budget.iterations``       trained until the same sampled-token count (response tokens, EOS
                                                included, as the harness counts them) is reached after a step,
                                                or ``max_steps`` = iterations x ``num_iterations``
==============================================  ==============================================================

What TRL's trainers cannot do the same way is refused by :func:`check` (one line, exit 2): among
it a clamped log-ratio or KL (TRL clamps neither), members split over processes
(``population_workers``), a group std epsilon other than TRL's 1e-4 or the harness's default;
checkpoints and trackers by :data:`harness.reference.RUN_SETTINGS`.
Differences left (each a property of the library, not a setting): TRL samples its prompts by
shuffled passes over the training set (``RepeatSampler``), the harness uniformly with
replacement; TRL's group std adds 1e-4 (``(std + 1e-4)``), the harness ``group_std_eps`` (1e-6 by
default, 1e-4 under ``recipe=trl_grpo``); TRL samples with
``model.generate`` and runs transformers' Python GELU, the harness its own decode loop and the
fused GELU (the same function to float rounding). One change to what TRL runs: the models it is
given take their position ids from the attention mask (:func:`positions_from_mask`): TRL's own
loss passes number left padding as positions, which for GPT-2's learned absolute positions is
another function than the one that sampled (a TRL behaviour with such models, not a setting).

The run folder is the harness's (:class:`harness.io.rundir.RunDir`): one metric row per harness
iteration (one generation batch and its ``num_iterations`` optimizer steps) with the harness's
columns, ``env_steps`` = ``tokens`` = the sampled tokens so far; evaluation is the harness's own
(:func:`harness.train.lm.evaluate_policy` on TRL's model: the same held-out prompts, samples and
random numbers) at the same iterations (:func:`harness.train.loop.eval_due`) and before the first
(the summary's ``eval_return_init``). ``kl_ref`` is the harness's definition
(:func:`harness.train.lm.kl_to_reference`: mean over the batch's responses of the summed k1 of the
policy that sampled them to the frozen SFT policy), computed from teacher-forced passes on the
batch TRL sampled, where the harness computes it (every iteration at ``kl.beta > 0``, else every
``lm.kl_ref_every``); TRL's own training statistics fill ``policy_loss`` (TRL's logged loss),
``entropy``, ``clip_frac`` (``clip_ratio/region_mean``) and ``grad_norm``.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from ..config import Config, bad_field
from ..io.rundir import RunDir
from ..plan import RunPlan
from ..models.lm import Responses, positions, response_forward
from ..tasks.lm.pipeline import LMTask, build_task
from ..train.lm import evaluate_policy, initial_fields, kl_to_reference
from ..train.loop import RowHead, common_fields, eval_due, flush_due, metric_row
from ..train.update import ADAM_EPS

__all__ = ["check", "library", "train", "trl_settings", "trl_config", "trl_prompts", "RewardCounter", "make_trainer"]

TRAINERS = {"grpo": ("GRPOConfig", "GRPOTrainer"), "rloo": ("RLOOConfig", "RLOOTrainer")}
LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}
TRL_STD_EPS = 1e-4  # what TRL's GRPOTrainer adds to the group std (grpo_trainer.py: ``(std + 1e-4)``)


def check(cfg: DictConfig) -> None:
    """Refuse (:func:`harness.config.bad_field`) a setting TRL's GRPOTrainer / RLOOTrainer cannot
    run the same way."""
    est, lm, kl = cfg.estimator, cfg.lm, cfg.kl
    trainer = TRAINERS[est][1]
    need = {
        "device": (cfg.device, "cpu"),  # TRL on CPU in fp32, as the harness on CPU
        "lm.reward": (lm.reward, "gold"),
        "lm.no_eos_penalty": (float(lm.no_eos_penalty), 0.0),
        "minibatches": (int(cfg.minibatches), 1),
        "normalize_advantages": (cfg.normalize_advantages, "none"),
        "ent_coef": (float(cfg.ent_coef), 0.0),
        "anneal_lr": (bool(cfg.anneal_lr), False),
        "dynamic_sampling": (bool(cfg.dynamic_sampling), False),
        "overlong_cache": (cfg.overlong_cache, None),
        "log_ratio_clamp": (cfg.get("log_ratio_clamp"), None),  # the clip loss's clamp: TRL's has none
        "kl.adaptive": (bool(kl.adaptive), False),
        "kl.log_ratio_clamp": (kl.get("log_ratio_clamp"), None),  # TRL's KL terms have no clamps
        "kl.value_clamp": (kl.get("value_clamp"), None),
    }
    if est == "grpo":
        need.update({"update": (cfg["update"], "clip")})
    else:
        need.update({"epochs": (int(cfg.epochs), 1), "loss_agg": (cfg.loss_agg, "seq_mean_token_sum"),
                     "clip_eps_high": (cfg.clip_eps_high, None)})
    if float(kl.beta) > 0:
        if est == "grpo":
            need.update({"kl.in_reward": (bool(kl.in_reward), False), "kl.estimator": (kl.estimator, "k3"),
                         "kl.target": (kl.target, "ref")})
        else:
            need.update({"kl.in_reward": (bool(kl.in_reward), True), "kl.estimator": (kl.estimator, "k1"),
                         "kl.target": (kl.target, "ref")})
    for key, (value, allowed) in need.items():
        if value != allowed:
            bad_field(key, f"{allowed!r} with reference=trl (TRL's {trainer} has no other)", value)
    if lm.dtype == "bfloat16":
        bad_field("lm.dtype", "auto or float32 with reference=trl (TRL trains on CPU in fp32 here)", lm.dtype)
    if est == "grpo" and cfg.loss_agg not in LOSS_TYPES:
        bad_field("loss_agg", f"one of {list(LOSS_TYPES)} with reference=trl estimator=grpo (TRL's loss_type "
                  f"{list(LOSS_TYPES.values())})", cfg.loss_agg)
    if est == "rloo" and cfg["update"] not in ("clip", "pg"):
        bad_field("update", "clip or pg with reference=trl estimator=rloo (TRL's RLOO clips the sequence ratio, "
                  "which is 1 at its one step per batch)", cfg["update"])
    if est == "rloo" and cfg.get("delta") is not None:
        bad_field("delta", "null with reference=trl estimator=rloo (TRL's RLOOTrainer has no delta)", cfg.delta)
    if cfg.clip_eps is None:
        bad_field("clip_eps", f"a number with reference=trl (TRL's {trainer} always clips)", None)
    if int(cfg.group_size) < 2:
        bad_field("group_size", f">= 2 with reference=trl (TRL's num_generations)", cfg.group_size)
    if cfg.population_workers not in (None, 1):
        bad_field("population_workers", "null or 1 with reference=trl (TRL's trainer trains the members one after "
                  "another in one process)", cfg.population_workers)
    default_eps = Config.group_std_eps
    if est == "grpo" and cfg.std_normalize and float(cfg.group_std_eps) not in (TRL_STD_EPS, default_eps):
        bad_field("group_std_eps", f"{TRL_STD_EPS} (TRL's, added to the group std) or {default_eps} (the default) "
                  "with reference=trl estimator=grpo std_normalize=true", cfg.group_std_eps)


def library(cfg: DictConfig) -> None:
    """Import what :func:`train` uses of TRL and its dependencies, the trainer and config class of
    ``cfg.estimator`` among them (TRL imports them lazily; raises what a broken install raises)."""
    import datasets  # noqa: F401
    import trl
    from transformers import PrinterCallback, TrainerCallback  # noqa: F401

    for name in TRAINERS[cfg.estimator]:
        getattr(trl, name)


def trl_settings(cfg: DictConfig) -> dict[str, Any]:
    """The TRL config's settings that carry the harness config's meaning (the module's table):
    the keyword arguments of ``GRPOConfig`` / ``RLOOConfig`` for ``cfg`` (a config :func:`check` accepts)."""
    lm, k = cfg.lm, int(cfg.group_size)
    s = dict(
        per_device_train_batch_size=int(lm.prompts_per_iter) * k, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=k, max_completion_length=int(lm.max_response_len),
        num_iterations=int(cfg.epochs), temperature=float(lm.temperature), top_p=1.0, top_k=0,
        beta=float(cfg.kl.beta), epsilon=float(cfg.clip_eps),
        epsilon_high=None if cfg.clip_eps_high is None else float(cfg.clip_eps_high),
        mask_truncated_completions=bool(cfg.mask_truncated), disable_dropout=True,
        learning_rate=float(cfg.lr), lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_epsilon=ADAM_EPS, max_grad_norm=0.0 if cfg.max_grad_norm is None else float(cfg.max_grad_norm),
        optim="adamw_torch", seed=int(cfg.seed), data_seed=int(cfg.seed),
    )
    if cfg.estimator == "grpo":
        s.update(loss_type=LOSS_TYPES[cfg.loss_agg], scale_rewards="group" if cfg.std_normalize else "none",
                 use_bias_correction_kl=False, importance_sampling_level="token",
                 delta=None if cfg.get("delta") is None else float(cfg.delta))
    else:
        s.update(normalize_advantages=False)
    return s


def trl_config(cfg: DictConfig, out_dir: Path | str, max_steps: int):
    """TRL's config for ``cfg`` (:func:`trl_settings`) training ``max_steps`` optimizer steps on
    CPU in fp32, logging every step, saving and evaluating nothing of its own."""
    import trl

    config_cls = getattr(trl, TRAINERS[cfg.estimator][0])
    return config_cls(
        output_dir=str(out_dir), use_cpu=True, bf16=False, fp16=False, max_steps=int(max_steps), logging_steps=1,
        report_to="none", save_strategy="no", eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=False, log_completions=False, gradient_checkpointing=False, **trl_settings(cfg))


def trl_prompts(task: LMTask) -> list[str]:
    """The training prompts as text for TRL: the harness's encoded prompts (left-truncated to
    ``lm.max_prompt_len``) decoded; raises if TRL's tokenization of them (its tokenizer call with
    special tokens) is not the harness's token for token."""
    tok, split = task.tokenizer, task.train
    prompts = [tok.decode(ids) for ids in split.prompt_ids]
    bad = sum(tok(p, add_special_tokens=True)["input_ids"] != list(ids) for p, ids in zip(prompts, split.prompt_ids))
    if bad:
        raise RuntimeError(f"{bad} of {len(prompts)} prompts tokenize differently for TRL than for the harness")
    return prompts


class RewardCounter:
    """TRL's reward function: the harness's reward (:meth:`LMTask.reward`) of each completion,
    decoded as the harness decodes responses (without EOS and padding), and what a metric row
    needs of each generation batch: sampled tokens (EOS included), mean reward, gold score,
    length, the fraction without EOS, the fraction of groups whose scores are all equal."""

    __name__ = "harness_reward"  # TRL names a reward function's metrics by it

    def __init__(self, task: LMTask, group_size: int):
        self.task, self.k = task, group_size
        self.tokens = self.completions = 0
        self.batches: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, example_index, **kwargs) -> list[float]:
        from ..tasks.lm.metrics import zero_std_fraction

        tok = self.task.tokenizer
        ids = [list(c) for c in completion_ids]
        finished = [bool(c) and c[-1] == tok.eos_token_id for c in ids]
        texts = [tok.decode([t for t in c if t != tok.eos_token_id], skip_special_tokens=True) for c in ids]
        examples = [self.task.train.examples[i] for i in example_index]
        reward = self.task.reward(examples, texts, finished).float()
        gold = self.task.gold(examples, texts)
        n_tok = sum(len(c) for c in ids)
        self.tokens += n_tok
        self.completions += len(ids)
        self.batches.append({"tokens": n_tok, "reward": float(reward.mean()), "gold_reward": float(gold.mean()),
                             "response_len": n_tok / max(len(ids), 1),
                             "no_eos_frac": 1.0 - sum(finished) / max(len(ids), 1),
                             "zero_std_frac": zero_std_fraction(reward, self.k)})
        return reward.tolist()


def _response_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """``[B, L]`` 1 up to and including each completion's first EOS (all of it without one): the
    harness's response mask, whatever TRL masked for its loss (``mask_truncated_completions``)."""
    is_eos = (completion_ids == eos_id).long()
    before = is_eos.cumsum(-1) - is_eos  # EOS tokens strictly before each position
    return (before == 0).float()


def positions_from_mask(model: torch.nn.Module) -> torch.nn.Module:
    """Give ``model`` the position ids of its attention mask (``cumsum(mask) - 1``, as
    :func:`harness.models.lm.positions` and transformers' ``generate`` compute them) when a call
    passes none: a forward pre-hook, nothing else changes.

    Why: TRL's teacher-forced passes (``_get_per_token_logps_and_entropies``: the loss, ``log pi_old``
    and ``log pi_ref``) call the model with an attention mask and no position ids, and GPT-2
    (transformers 5.x) then numbers the positions 0..n-1 *including* the left padding of shorter
    prompts, while ``generate`` sampled the same responses at the mask's positions. For a model with
    learned absolute positions (GPT-2, the harness's tiny LM) TRL's loss is then the log-probability
    of another function than the one that sampled; with rotary positions (Llama, Qwen) a uniform
    shift changes nothing. Measured on the tiny LM with left-padded prompts: one TRL step's update
    had cosine 0.2-0.99 per tensor with the harness's; with this hook, or with prompts of one
    length, it is the harness's to float rounding (tests/test_reference_trl.py)."""
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        if kwargs.get("position_ids") is not None or mask is None or mask.dim() != 2:
            return args, kwargs
        ids = kwargs.get("input_ids", args[0] if args else None)
        width = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
        return args, {**kwargs, "position_ids": positions(mask)[:, -width:]}

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return model


def make_trainer(cfg: DictConfig, task: LMTask, out_dir: Path | str, max_steps: int, callbacks=(),
                 measure_kl: bool = False, mask_positions: bool = True):
    """TRL's trainer for ``cfg`` on ``task`` (a fresh copy of the SFT policy), its
    :class:`RewardCounter`, and (``measure_kl``) a list that gets each generation batch's
    ``kl_ref`` (:func:`harness.train.lm.kl_to_reference`; None where the harness would not compute it).
    ``mask_positions``: the policy and TRL's reference model take their position ids from the
    attention mask (:func:`positions_from_mask`); False: TRL as shipped."""
    import datasets
    import trl
    from transformers import PrinterCallback

    counter = RewardCounter(task, int(cfg.group_size))
    kls: list[float | None] = []
    ref = task.load_policy() if measure_kl else None
    if ref is not None:
        for p in ref.parameters():
            p.requires_grad_(False)
    every = int(cfg.lm.get("kl_ref_every", 1))
    beta, temperature, eos = float(cfg.kl.beta), float(cfg.lm.temperature), task.tokenizer.eos_token_id
    base = getattr(trl, TRAINERS[cfg.estimator][1])

    class Trainer(base):
        """TRL's trainer unchanged; after each generation batch the harness's ``kl_ref`` of it
        (no-grad teacher-forced passes, no random numbers drawn: training is not moved)."""

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if ref is not None:
                n = len(kls) + 1
                if beta > 0 or (every > 0 and (n - 1) % every == 0):
                    with torch.no_grad():
                        mask = _response_mask(out["completion_ids"], eos)
                        batch = Responses(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask.long())
                        model = self.accelerator.unwrap_model(self.model)
                        logp = response_forward(model, batch, temperature).logp.float()
                        ref_logp = response_forward(ref, batch, temperature).logp.float()
                    kls.append(kl_to_reference(logp, ref_logp, mask))
                else:
                    kls.append(None)
            return out

    train = task.train
    ds = datasets.Dataset.from_dict({"prompt": trl_prompts(task), "example_index": list(range(len(train)))})
    trainer = Trainer(model=task.load_policy(), reward_funcs=[counter], args=trl_config(cfg, out_dir, max_steps),
                      train_dataset=ds, processing_class=task.tokenizer, callbacks=list(callbacks))
    trainer.remove_callback(PrinterCallback)  # disable_tqdm prints every log dict to stdout
    if mask_positions:
        for model in (trainer.model, trainer.ref_model):
            if model is not None:
                positions_from_mask(trainer.accelerator.unwrap_model(model))
    return trainer, counter, kls


def max_steps_for(cfg: DictConfig) -> int:
    """TRL's ``max_steps``: ``budget.iterations`` x ``num_iterations``, or, with a token budget
    alone, an upper bound (every completion has at least one token); the token budget stops the run."""
    per_iter = int(cfg.lm.prompts_per_iter) * int(cfg.group_size)
    bounds = []
    if cfg.budget.iterations is not None:
        bounds.append(int(cfg.budget.iterations))
    if cfg.budget.tokens is not None:
        bounds.append(math.ceil(int(cfg.budget.tokens) / per_iter))
    return min(bounds) * int(cfg.epochs)


def _train_one(cfg: DictConfig, task: LMTask, run: RunDir) -> None:
    from transformers import TrainerCallback

    t0 = time.perf_counter()
    lm = cfg.lm
    epochs = int(cfg.epochs)
    budget = None if cfg.budget.tokens is None else int(cfg.budget.tokens)
    max_iters = cfg.budget.iterations
    evaluating = int(cfg.eval_every) > 0 or bool(cfg.eval_every_steps)
    common = common_fields(cfg, uses_groups=True)
    state: dict[str, Any] = {"last_eval": 0, "pending": None, "t_iter": t0, "flushed": t0}
    holder: dict[str, Any] = {}

    def evaluate():
        return evaluate_policy(holder["trainer"].accelerator.unwrap_model(holder["trainer"].model), task, lm)

    class Rows(TrainerCallback):
        """A harness metric row per generation batch, after its last optimizer step; TRL's own
        logged statistics of that step are added when TRL logs them (right after)."""

        def on_step_begin(self, args, st, control, **kw):
            if st.global_step % epochs == 0:
                state["t_iter"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            if st.global_step % epochs:
                return
            iteration = st.global_step // epochs
            counter = holder["counter"]
            b = counter.batches[-1]
            tokens = counter.tokens
            done = (budget is not None and tokens >= budget) or (max_iters is not None and iteration >= int(max_iters))
            if done:
                control.should_training_stop = True
            ev = None
            if evaluating and eval_due(iteration, tokens, state["last_eval"], done, int(cfg.eval_every),
                                       cfg.eval_every_steps):
                state["last_eval"] = tokens
                ev = evaluate()
            wall = time.perf_counter() - t0
            kls = holder["kls"]
            head = RowHead(run.run_id, int(cfg.seed), iteration, tokens, wall, b["reward"],
                           None if ev is None else ev["eval_return"], float(cfg.kl.beta), float(cfg.lr))
            state["pending"] = metric_row(head, common)
            state["pending"].update({
                "eval_gold_greedy": None if ev is None else ev["eval_gold_greedy"],
                "pass_at_1": None if ev is None else ev["pass_at_1"], "pass_at_k": None if ev is None else ev["pass_at_k"],
                "zero_std_frac": b["zero_std_frac"], "reward": b["reward"], "gold_reward": b["gold_reward"],
                "kl_ref": kls[iteration - 1] if len(kls) >= iteration else None, "response_len": b["response_len"],
                "tokens": tokens, "score": b["reward"], "no_eos_frac": b["no_eos_frac"],
                "tokens_per_s": tokens / max(wall, 1e-9), "iter_time_s": time.perf_counter() - state["t_iter"],
            })

        def on_log(self, args, st, control, logs=None, **kw):
            row = state["pending"]
            if row is None or not logs or "loss" not in logs:
                return
            get = lambda k: None if logs.get(k) is None else float(logs[k])  # noqa: E731
            row.update(policy_loss=get("loss"), grad_norm=get("grad_norm"), entropy=get("entropy"),
                       clip_frac=get("clip_ratio/region_mean"))
            _emit()

    def _emit():
        row = state["pending"]
        run.log(row)
        if flush_due(row["iteration"], state["flushed"]):  # as the harness's loop; run.finish writes the rest
            run.flush()
            state["flushed"] = time.perf_counter()
        state["pending"] = None

    trainer, counter, kls = make_trainer(cfg, task, run.path / ".trl", max_steps_for(cfg), callbacks=[Rows()],
                                         measure_kl=True)
    holder.update(trainer=trainer, counter=counter, kls=kls)
    init = initial_fields(evaluate(), task.binary) if evaluating else {}
    trainer.train()
    if state["pending"] is not None:
        _emit()
    extra = {"tokens": counter.tokens, "prompts_truncated": None, "pipeline": task.meta,
             "eval_return_init": None, "eval_gold_greedy_init": None, **init}
    run.finish("completed", None, time.perf_counter() - t0, extra=extra)


def train(plan: RunPlan, runs: list[RunDir]) -> None:
    """Build (or load) the cached LM pipeline once, then train each member (its own seed) with
    TRL, one after another; a member that raises is recorded as failed and the others go on."""
    import shutil

    cfg = plan.cfg
    torch.set_num_threads(int(cfg.threads or 1))
    task = build_task(cfg)
    for run in runs:
        t0 = time.perf_counter()
        try:
            _train_one(run.cfg, task, run)
        except Exception as exc:  # record, never drop (as harness.app.run does for a whole worker)
            run.finish("failed", f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
        finally:
            shutil.rmtree(run.path / ".trl", ignore_errors=True)
