"""LM rollout source: sample responses, score them, hand them to the one training loop.

One iteration (Ouyang et al. 2022; Ahmadian et al. 2024; Shao et al. 2024), the same for every
estimator (:mod:`.loop` asks the :class:`EstimatorSpec` what it needs and never its name):

1. ``lm.prompts_per_iter`` training prompts, each sampled ``group_size`` times: columns are
   group-major (column ``g * group_size + j`` is sample ``j`` of prompt ``g``). Every estimator
   sees the same batch; the group estimators use the grouping, the others ignore it.
2. ``spec.needs_greedy``: one greedy response per prompt as well (ReMax's baseline), decoded
   with the samples: each prompt is prefilled once and its KV cache shared by its rows
   (:func:`harness.models.lm.generate_groups`).
3. One teacher-forced forward each of the policy (``log pi_old``, values from the head; in fp32
   without a head the sampler's log-probs stand in), the frozen reference (``log pi_ref``; at
   ``kl.beta = 0`` only every ``lm.kl_ref_every`` iterations, for the ``kl_ref`` columns:
   :meth:`LMSource.needs_ref`) and, with ``lm.critic=model``, the critic. The policy's and the
   reference's passes (and the update's) run each distinct prompt once (``share_prompts``).
4. The score (reward model or gold) of each response sits on its final token, minus
   ``lm.no_eos_penalty`` when it has no EOS. With ``kl.in_reward`` every token also gets
   ``-beta * k(log pi_old, log pi_ref)`` (InstructGPT); otherwise ``beta * k`` is a loss term
   (GRPO). The episode ends at the last response token (``terminated``): the score is the
   terminal reward, there is no continuation to bootstrap from.
5. The estimator's advantages go to :func:`harness.train.update.update` as ``[1, L, B]``: one
   response per column, minibatches over responses; ``loss_agg=seq_mean_token_sum_norm``
   divides by the constant ``lm.max_response_len`` (policy loss, entropy and KL alike).

Budgets are sampled tokens (response tokens incl. EOS, greedy and group samples included),
counted the same way for every estimator. Population members (``population > 1``) are trained
one after another, each with its own seed; they share the cached SFT policy and RM.
Checkpoints are the loop's; this source adds its counters, the prompt RNG and the memory peak.
Column ``peak_mem_mb``: the member's peak memory above the memory in use at its start
(:class:`PeakMemory`); ``peak_mem_base_mb``: that baseline.

Columns of every LM task: ``zero_std_frac``, the fraction of the batch's groups whose scores are
all equal (their group-relative advantages vanish). Where the gold score is a 0/1 verdict
(``task=lm_arith``, :attr:`LMTask.binary`; null elsewhere): at evaluation ``pass_at_1`` (the greedy
answer is correct) and ``pass_at_k`` (Chen et al. 2021's unbiased estimate from
``lm.eval_samples`` sampled answers, ``k = lm.arith.pass_k``); from the training batch
``response_len_correct`` / ``response_len_incorrect`` (mean sampled tokens, EOS included).
"""
from __future__ import annotations

import ctypes
import dataclasses
import gc
import random
import resource
import time
from dataclasses import dataclass
from typing import Callable

import torch
from omegaconf import DictConfig

from ..estimators import AdvantageBatch, kl_estimate, kl_guards
from ..io import RunDir
from ..io import checkpoint as ckpt
from ..models.lm import (DecodeSettings, NonFiniteError, PolicyWithValue, Responses, ValueModel, fast_gelu,
                         generate_groups, response_forward)
from ..plan import RunPlan
from ..tasks.lm.data import decode_responses, left_pad
from ..tasks.lm.metrics import length_by_correctness, mean_pass_at_k, zero_std_fraction
from ..tasks.lm.pipeline import Decoding, LMTask, autocast, build_task, evaluate_scores, uses_bf16
from .loop import Diverged, Source
from .workers import train_members
from .sampling import cat_rows, dynamic_sample, overlong_penalty, take_groups
from .update import UpdateBatch, clip_grad_groups, norms_finite


#: The row's columns that measure the machine (time, throughput, memory), not the run: two runs of
#: one config (resumed or not, on a GPU with deterministic kernels) differ in these alone
#: (tests/test_lm_checkpoint.py, benchmarks/gpu_determinism.py leave them out of their comparisons).
MEASURED_COLUMNS = ("wall_time_s", "iter_time_s", "tokens_per_s", "peak_mem_mb", "peak_mem_base_mb")
EVAL_SEED_OFFSET = 7919  # eval noise: seeded by lm.pipeline_seed only, shared by every run and estimator


@torch.no_grad()
def evaluate_policy(model, task: LMTask, lm: DictConfig) -> dict:
    """Gold scores of ``model`` on the first ``lm.eval_prompts`` held-out prompts: the LM tasks'
    one evaluation (the harness's trainer and ``reference=trl`` alike).

    ``eval_return`` is the policy's own objective, the gold score expected under sampling at
    ``lm.temperature``, estimated from ``lm.eval_samples`` responses per prompt with common
    random numbers across evaluations, runs and estimators (seeded by ``lm.pipeline_seed`` +
    :data:`EVAL_SEED_OFFSET` alone); ``eval_gold_greedy`` decodes the argmax response once per
    prompt. With a 0/1 gold score (:attr:`LMTask.binary`) the same answers give ``pass_at_1``
    (greedy) and ``pass_at_k`` (from the sampled ones); else null. Raises
    :class:`harness.models.lm.NonFiniteError` where the policy decodes to NaN.
    """
    args = (model, task.tokenizer, task.held_out, int(lm.eval_prompts))
    seed = int(lm.pipeline_seed) + EVAL_SEED_OFFSET
    sampling = Decoding(int(lm.max_response_len), float(lm.temperature), False, task.device, task.dtype,
                        samples=int(lm.eval_samples))
    sampled = evaluate_scores(*args, sampling, seed, task.gold_fn)
    greedy = evaluate_scores(*args, dataclasses.replace(sampling, greedy=True, samples=1), seed, task.gold_fn)
    mean = lambda per_prompt: sum(map(sum, per_prompt)) / max(sum(map(len, per_prompt)), 1)  # noqa: E731
    out = {"eval_return": mean(sampled), "eval_gold_greedy": mean(greedy), "pass_at_1": None, "pass_at_k": None}
    if task.binary:
        out["pass_at_1"] = out["eval_gold_greedy"]
        out["pass_at_k"] = mean_pass_at_k(sampled, int(lm.arith.pass_k))
    return out


def initial_fields(ev: dict, binary: bool) -> dict:
    """The summary's ``*_init`` fields from the starting (SFT) policy's :func:`evaluate_policy`."""
    init = {"eval_return_init": ev["eval_return"], "eval_gold_greedy_init": ev["eval_gold_greedy"]}
    if binary:
        init.update(pass_at_1_init=ev["pass_at_1"], pass_at_k_init=ev["pass_at_k"])
    return init


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """The ``kl_ref`` column: the mean over responses of the k1 KL estimate summed over each
    response's tokens, ``mean_i sum_t mask (log pi(y_t) - log pi_ref(y_t))`` (nats per response),
    of the policy that sampled the batch (``logp``, ``[B, L]``) to the reference."""
    return float(kl_estimate("k1", logp, ref_logp).mul(mask).sum(-1).mean())


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    """glibc's ``mallinfo2`` (2.33+), or None where there is none."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def memory_mb(device: torch.device) -> float:
    """Memory in use now, MiB. CUDA: allocated tensor memory. CPU with glibc: the bytes malloc
    holds for live allocations (``mallinfo2``: heap chunks in use + mmapped chunks), which, unlike
    the resident set, does not depend on what the allocator keeps cached or the OS has paged in
    (the resident-set peak of identical, deterministic runs spread over +-10% here). Else the
    process's resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    if _MALLINFO2 is not None:
        m = _MALLINFO2()
        return (m.uordblks + m.hblkhd) / 2**20
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux: the process's lifetime peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def release_memory(device: torch.device) -> None:
    """Give back what earlier work freed, so a baseline taken now is the memory still held:
    collect garbage (a previous member's trainer, reference cycles), then on CUDA empty the
    caching allocator, on CPU (glibc) return the heap's free pages to the OS (``malloc_trim``)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline keeps the allocator's free pages
        pass


class PeakMemory:
    """``peak_mem_mb``: the peak memory of one member's run *above its baseline*, in MiB.

    The baseline is the memory in use when the member starts (:meth:`start`, called before its
    policy, reference and critic are loaded, after :func:`release_memory`): the interpreter,
    the libraries and the shared SFT/RM pipeline, which every estimator pays alike. The peak is
    CUDA's own peak counter (``max_memory_allocated``, reset at :meth:`start`) on CUDA, else
    the largest :func:`memory_mb` sampled (:meth:`sample`: after sampling, after each
    minibatch's forward pass; on CPU with glibc the bytes malloc holds for live allocations, else
    the resident set). So the column is what the run itself needed (its models, optimizer state,
    activations), not where the process happened to be. What earlier runs in the same process
    left allocated or cached still moves the baseline (``peak_mem_base_mb``, logged too), so
    memory claims run each point in its own process (:attr:`harness.experiments.Experiment.isolate`)."""

    def __init__(self, device: torch.device, read=memory_mb):
        self.device, self.read = device, read
        self.base = self.peak = 0.0

    def start(self) -> None:
        release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.base = self.peak = float(self.read(self.device))

    def sample(self) -> None:
        self.peak = max(self.peak, float(self.read(self.device)))

    def peak_now(self) -> float:
        if self.device.type == "cuda":
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device) / 2**20)
        return self.peak

    @property
    def above_base_mb(self) -> float:
        """The column ``peak_mem_mb``: peak minus baseline (>= 0)."""
        return max(0.0, self.peak_now() - self.base)


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # [B, P]
    prompt_mask: torch.Tensor
    tokens: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L] float
    old_logp: torch.Tensor  # [B, L]
    ref_logp: torch.Tensor | None  # [B, L]; None where the reference was not run (kl.beta = 0, LMSource.needs_ref)
    values: torch.Tensor | None  # [B, L]
    score: torch.Tensor  # [B] optimized score incl. the no-EOS penalty
    reward: torch.Tensor  # [B] reward-model (or gold) score
    gold: torch.Tensor  # [B]
    has_eos: torch.Tensor  # [B]
    greedy_scores: torch.Tensor | None  # [n_prompts]
    greedy_rewards: torch.Tensor | None  # [n_prompts] the greedy responses' reward-model (or gold) scores
    sampled_tokens: int
    prompts_truncated: int
    cost: torch.Tensor | None = None  # [1] sampled tokens
    kl_tok: torch.Tensor | None = None  # [B, L] per-token KL estimate to the reference
    rewards: torch.Tensor | None = None  # [B, L] per-token rewards given to the estimator

    PER_GROUP = ("greedy_scores", "greedy_rewards")  # one entry per prompt, not per response

    def take_groups(self, groups: torch.Tensor, k: int) -> "Rollout":
        """The groups ``groups`` (prompt indices) of this rollout: their ``k`` responses each and
        their greedy entries (:func:`harness.train.sampling.take_groups` for the per-response rows)."""
        per_group = {f: getattr(self, f)[groups.to(getattr(self, f).device)] for f in self.PER_GROUP
                     if getattr(self, f) is not None}
        rows = take_groups(dataclasses.replace(self, greedy_scores=None, greedy_rewards=None), groups, k)
        return dataclasses.replace(rows, **per_group)

    @staticmethod
    def cat(parts: list["Rollout"], pad_token_id: int) -> "Rollout":
        """Rollouts of several generation batches as one (DAPO's dynamic sampling): prompts are
        left-padded to the longest of them (masked: a left pad changes no position or attention),
        responses already share the width ``lm.max_response_len``. The counters are the first
        part's: the caller sets them from every batch drawn, kept or not."""
        width = max(r.prompt_ids.shape[1] for r in parts)

        def pad(r: Rollout) -> Rollout:
            extra = width - r.prompt_ids.shape[1]
            if not extra:
                return r
            f = torch.nn.functional.pad
            return dataclasses.replace(r, prompt_ids=f(r.prompt_ids, (extra, 0), value=pad_token_id),
                                       prompt_mask=f(r.prompt_mask, (extra, 0), value=0))
        return cat_rows([pad(r) for r in parts])


def greedy_baseline(cfg, beta: float, scores: torch.Tensor, greedy_kl: Callable[[], torch.Tensor]) -> torch.Tensor:
    """ReMax's baseline per prompt from the greedy responses' ``scores``: with ``kl.in_reward`` (and
    ``beta > 0``) the greedy return carries its own KL penalty, ``scores - beta * greedy_kl()``, like
    every sampled return, unless ``kl.greedy_penalty=false``: then the greedy reward alone, verl's
    ``reward_baselines`` (verl's ``compute_remax_outcome_advantage``). ``greedy_kl`` is called
    only when the penalty enters (it runs the policy and the reference on the greedy responses)."""
    if cfg.kl.in_reward and beta > 0 and cfg.kl.get("greedy_penalty", True):
        return scores - beta * greedy_kl()
    return scores


class LMLearner:
    """Policy (with its optional value head) and the optional separate critic model."""

    population = 1

    def __init__(self, source: "LMSource"):
        self.src = source
        policy, critic = source.policy, source.critic
        head = [p for p in (policy.value_head.parameters() if policy.value_head is not None else []) if p.requires_grad]
        head_ids = {id(p) for p in head}
        self.policy_params = [p for p in policy.parameters() if p.requires_grad and id(p) not in head_ids]
        self.critic_params = head + ([p for p in critic.parameters() if p.requires_grad] if critic is not None else [])
        self.params = [p for p in policy.parameters() if p.requires_grad]
        if critic is not None:
            self.params += [p for p in critic.parameters() if p.requires_grad]

    def named_params(self):
        """Every parameter of the policy (value head included) and of the separate critic."""
        named = [(f"policy.{n}", p) for n, p in self.src.policy.named_parameters()]
        if self.src.critic is not None:
            named += [(f"critic.{n}", p) for n, p in self.src.critic.named_parameters()]
        return named

    def forward(self, ro: Rollout, idx, need_entropy):
        s = self.src
        i = slice(None) if idx is None else idx[0]
        mask = ro.mask[i].long()
        with s.ac():
            out, values = s.policy(ro.prompt_ids[i], ro.prompt_mask[i], ro.tokens[i], mask, s.temperature,
                                   share_prompts=True)
            if s.spec.needs_critic:
                values = s.values(ro.prompt_ids[i], ro.prompt_mask[i], ro.tokens[i], mask, values)
        s.sample_memory()
        tm = lambda x: None if x is None else x.float().transpose(0, 1).unsqueeze(0)  # noqa: E731  [b, L] -> [1, L, b]
        return tm(out.logp), tm(out.entropy) if need_entropy else None, tm(values) if s.spec.needs_critic else None

    def clip_grads(self, max_norm, per_network):
        return clip_grad_groups([self.policy_params, self.critic_params], max_norm, per_network)

    @torch.no_grad()
    def finite_members(self) -> torch.Tensor:
        """``[1]``: every weight finite (fused norms first, :func:`~harness.train.update.norms_finite`)."""
        return torch.tensor([norms_finite(self.params) or all(bool(torch.isfinite(p).all()) for p in self.params)])


class LMSource(Source):
    cost_unit = "tok"
    uses_groups = True  # every estimator samples group_size responses per prompt
    fused_adam = True  # one Adam kernel for all parameters (as the control source), not one loop per tensor
    EVAL_SEED_OFFSET = EVAL_SEED_OFFSET

    def __init__(self, plan: RunPlan, task: LMTask):
        cfg = plan.cfg
        self.cfg, self.task = cfg, task
        self.P, self.lm = 1, cfg.lm
        self.seed = int(cfg.seed)
        self.seeds = [self.seed]
        self.spec = plan.estimator
        self.device = task.device
        self.memory = PeakMemory(self.device)
        self.memory.start()  # the baseline: before this member's policy, reference and critic exist
        torch.manual_seed(self.seed)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.cpu_gen = torch.Generator().manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        critic_head = self.spec.needs_critic and self.lm.critic == "head"
        # GPT-2's Python GELU as three kernels (fast_gelu: the same function to float rounding)
        self.policy = PolicyWithValue(fast_gelu(task.load_policy()), value_head=critic_head).to(self.device)
        self.ref = fast_gelu(task.load_policy())
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.critic = None
        if self.spec.needs_critic and self.lm.critic == "model":
            self.critic = ValueModel(fast_gelu(task.load_backbone())).to(self.device)
        self.learner = LMLearner(self)
        self.temperature = self.lm.temperature
        self.budget = cfg.budget.tokens
        self.norm_len = int(self.lm.max_response_len)
        # log pi_old straight from the sampler, skipping a teacher-forced pass of the policy: in
        # fp32 the two agree to float rounding (claim C12, tests/test_lm_model.py). Not under bf16
        # autocast (the KV-cache decode and the full pass round differently), nor with a value
        # head, whose values need that pass anyway.
        self.reuse_sampler_logp = not uses_bf16(self.device, task.dtype) and not critic_head
        self.tok = task.tokenizer
        self.kl_ref_every = int(self.lm.get("kl_ref_every", 1))
        self.iteration = 0  # collects so far (the loop's iteration), for lm.kl_ref_every
        self.tokens = 0
        self.truncated_total = 0
        self.drawn = None  # dynamic sampling: what the last collect drew (harness.train.sampling.Drawn)
        self.memory.sample()

    @property
    def beta(self) -> float:
        """This iteration's KL beta (the loop's, adaptive or not)."""
        return float(self.kl_beta_now[0])

    def sample_memory(self) -> None:
        self.memory.sample()

    def generators(self):
        return [self.gen, self.cpu_gen]

    def shuffle_generators(self):
        return [self.cpu_gen]

    # ------------------------------------------------------------------ helpers
    def ac(self):
        return autocast(self.device, self.task.dtype)

    def values(self, prompt_ids, prompt_mask, tokens, mask, out_values):
        if self.critic is not None:
            return self.critic(prompt_ids, prompt_mask, tokens, mask, share_prompts=True)
        return out_values

    def _sequence_kl(self, logp, ref_logp, mask) -> torch.Tensor:
        """Per-token KL estimate (``kl.estimator``) of the policy to the reference, masked."""
        return kl_estimate(self.cfg.kl.estimator, logp, ref_logp, **kl_guards(self.cfg.kl)) * mask

    def _score(self, examples, texts, has_eos, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        """``(reward, score)``: the score the estimator sees is the reward minus ``lm.no_eos_penalty``
        without EOS, plus DAPO's soft overlong penalty (``overlong_cache``) of each response length."""
        reward = self.task.reward(examples, texts, has_eos.tolist()).float()
        score = reward - float(self.lm.no_eos_penalty) * (~has_eos.cpu()).float()
        if self.cfg.overlong_cache is not None:
            score = score + overlong_penalty(lengths.cpu(), int(self.lm.max_response_len),
                                             int(self.cfg.overlong_cache)).float()
        return reward, score

    def _ref_logp(self, p_ids, p_mask, tokens, mask) -> torch.Tensor:
        return response_forward(self.ref, Responses(p_ids, p_mask, tokens, mask), self.temperature,
                                share_prompts=True).logp

    def needs_ref(self) -> bool:
        """Whether this iteration runs the reference: always where training uses ``log pi_ref``
        (``kl.beta > 0`` or ``kl.adaptive``); at ``kl.beta = 0`` only for the ``kl_ref`` /
        ``kl_ref_token`` columns, on iterations 1, 1 + ``lm.kl_ref_every``, ... (0: never), which
        are null in between. The reference pass draws no random numbers, so this never changes
        training."""
        if self.cfg.kl.adaptive or self.beta > 0:
            return True
        return self.kl_ref_every > 0 and (self.iteration - 1) % self.kl_ref_every == 0

    # ------------------------------------------------------------------ collect
    def collect(self) -> Rollout:
        self.t_iteration = time.perf_counter()
        self.iteration += 1
        try:
            ro = self._collect()
        except NonFiniteError as exc:  # the last update left weights that decode to NaN
            raise Diverged(str(exc)) from None
        self.tokens += ro.sampled_tokens
        self.truncated_total += ro.prompts_truncated
        ro.cost = torch.tensor([ro.sampled_tokens])
        return ro

    def _collect(self) -> Rollout:
        """One generation batch; with ``dynamic_sampling`` (DAPO) the groups whose scores are not
        all equal from as many as it takes (:func:`harness.train.sampling.dynamic_sample`), every
        drawn response (and greedy response) counted against the budget."""
        self.drawn = None
        if not self.cfg.dynamic_sampling:
            return self._draw()
        k = int(self.cfg.group_size)
        ro, self.drawn = dynamic_sample(self._draw, lambda r: r.score.view(-1, k), lambda r, g: r.take_groups(g, k),
                                        lambda parts: Rollout.cat(parts, self.tok.pad_token_id),
                                        int(self.lm.prompts_per_iter), int(self.cfg.dynamic_sampling_max_draws))
        return dataclasses.replace(ro, sampled_tokens=sum(r.sampled_tokens for r in self.drawn.batches),
                                   prompts_truncated=sum(r.prompts_truncated for r in self.drawn.batches))

    @torch.no_grad()
    def _draw(self) -> Rollout:
        lm, k = self.lm, int(self.cfg.group_size)
        split = self.task.train
        prompt_idx = [self.rng.randrange(len(split)) for _ in range(int(lm.prompts_per_iter))]
        rows = [i for i in prompt_idx for _ in range(k)]  # group-major
        examples = [split.examples[i] for i in rows]
        truncated = sum(split.truncated[i] for i in rows)
        # each prompt once (generate_groups shares its KV cache with its k samples and greedy row)
        u_ids, u_mask = left_pad([split.prompt_ids[i] for i in prompt_idx], self.tok.pad_token_id, self.device)
        per_row = torch.arange(len(prompt_idx), device=self.device).repeat_interleave(k)
        p_ids, p_mask = u_ids[per_row], u_mask[per_row]
        with self.ac():
            decoding = DecodeSettings(lm.max_response_len, self.tok.eos_token_id, self.tok.pad_token_id,
                                      temperature=lm.temperature)
            g, gg = generate_groups(self.policy.lm, u_ids, u_mask, decoding, samples=k,
                                    with_greedy=self.spec.needs_greedy, generator=self.gen)
        mask = g.mask.float()
        ref = None
        with self.ac():
            if self.reuse_sampler_logp:
                old_logp, values = g.logp * mask, None
            else:
                out, values = self.policy(p_ids, p_mask, g.tokens, g.mask, lm.temperature, share_prompts=True)
                old_logp = out.logp
            if self.needs_ref():
                ref = self._ref_logp(p_ids, p_mask, g.tokens, g.mask)
            if self.spec.needs_critic:
                values = self.values(p_ids, p_mask, g.tokens, g.mask, values)
        self.sample_memory()
        texts = decode_responses(self.tok, g.tokens, g.mask)
        reward, score = self._score(examples, texts, g.has_eos, g.mask.sum(-1))
        gold = reward if self.task.reward_is_gold else self.task.gold(examples, texts)  # not scored twice
        sampled = int(g.mask.sum())

        greedy_scores = greedy_rewards = None
        if self.spec.needs_greedy:
            g_texts = decode_responses(self.tok, gg.tokens, gg.mask)
            g_reward, g_score = self._score([split.examples[i] for i in prompt_idx], g_texts, gg.has_eos,
                                            gg.mask.sum(-1))
            greedy_rewards = g_reward.float()

            def greedy_kl() -> torch.Tensor:  # the greedy responses' summed KL penalty, [n_prompts]
                with self.ac():
                    g_out, _ = self.policy(u_ids, u_mask, gg.tokens, gg.mask, lm.temperature)
                    g_ref = self._ref_logp(u_ids, u_mask, gg.tokens, gg.mask)
                return self._sequence_kl(g_out.logp, g_ref, gg.mask.float()).sum(-1)
            greedy_scores = greedy_baseline(self.cfg, self.beta, g_score.to(self.device), greedy_kl)
            sampled += int(gg.mask.sum())
        return Rollout(p_ids, p_mask, g.tokens, mask, old_logp.float(), None if ref is None else ref.float(),
                       None if values is None else values.float(), score.to(self.device), reward, gold,
                       g.has_eos, greedy_scores, greedy_rewards, sampled, truncated)

    # ------------------------------------------------------------------ advantages
    def advantage_batch(self, ro: Rollout) -> AdvantageBatch:
        B, L = ro.tokens.shape
        ro.kl_tok = None if ro.ref_logp is None else self._sequence_kl(ro.old_logp, ro.ref_logp, ro.mask)  # [B, L]
        rewards = torch.zeros(B, L, device=self.device)
        if self.cfg.kl.in_reward and ro.kl_tok is not None:  # absent only at beta = 0
            rewards = rewards - self.beta * ro.kl_tok
        last = (ro.mask.sum(-1).long() - 1).clamp(min=0)  # index of the final response token
        ar = torch.arange(B, device=self.device)
        rewards[ar, last] += ro.score
        ro.rewards = rewards
        terminated = torch.zeros(B, L, device=self.device)
        terminated[ar, last] = 1.0
        values = next_values = None
        if self.spec.needs_critic:
            values = ro.values * ro.mask
            next_values = torch.cat([values[:, 1:], torch.zeros(B, 1, device=self.device)], dim=1)
        tm = lambda x: None if x is None else x.transpose(0, 1).contiguous()  # noqa: E731  [B, L] -> [T, B]
        return AdvantageBatch(
            rewards=tm(rewards), terminated=tm(terminated), truncated=torch.zeros(L, B, device=self.device),
            mask=tm(ro.mask), values=tm(values), next_values=tm(next_values), greedy_scores=ro.greedy_scores,
            group_size=int(self.cfg.group_size))

    def update_batch(self, ro: Rollout, adv, returns, values) -> UpdateBatch:
        mask_tm = ro.mask.transpose(0, 1)
        if self.cfg.mask_truncated:  # TRL's mask_truncated_completions: scored, counted, not in the loss
            mask_tm = mask_tm * ro.has_eos.to(mask_tm.device, mask_tm.dtype).view(1, -1)
        one = lambda x: None if x is None else x.unsqueeze(0)  # noqa: E731
        old = ro.old_logp.transpose(0, 1)
        target = old
        if self.cfg.kl.target == "ref":  # None at beta = 0 on iterations without the reference (no KL term then)
            target = None if ro.ref_logp is None else ro.ref_logp.transpose(0, 1)
        return UpdateBatch(adv=one(adv * mask_tm), mask=one(mask_tm), old_logp=one(old), inputs=ro,
                           returns=one(returns), old_values=one(values), kl_target=one(target))

    def kl_to_reference(self, ro: Rollout) -> torch.Tensor:
        """``[1]``: mean over responses of the k1 KL (nats per response) of pi_old to the reference."""
        return torch.tensor([self._kl_ref(ro)])

    def _kl_ref(self, ro: Rollout) -> float | None:
        return None if ro.ref_logp is None else kl_to_reference(ro.old_logp, ro.ref_logp, ro.mask)

    # ------------------------------------------------------------------ eval
    def _evaluate(self) -> dict:
        """:func:`evaluate_policy` of this member's policy; a policy that decodes to NaN has diverged."""
        try:
            return evaluate_policy(self.policy.lm, self.task, self.lm)
        except NonFiniteError as exc:
            raise Diverged(str(exc)) from None

    def evaluate(self, flags):
        return [self._evaluate()]

    def initial_evaluation(self) -> dict:
        """The starting (SFT) policy, scored by the same evaluation as every later eval row."""
        return initial_fields(self._evaluate(), self.task.binary)

    # ------------------------------------------------------------------ rows
    def episode_return(self, p, ro):
        return float(ro.reward.mean())

    def row_extras(self, p, ro: Rollout, stats, ev, pre, row) -> dict:
        reward = float(ro.reward.mean())
        lengths = ro.mask.sum(-1)
        len_correct = len_incorrect = None
        if self.task.binary:
            len_correct, len_incorrect = length_by_correctness(lengths, ro.gold)
        extra = {} if self.drawn is None else {"sample_draws": self.drawn.draws}  # as the toy source's
        return extra | {
            "eval_gold_greedy": None if ev is None else ev["eval_gold_greedy"],
            "pass_at_1": None if ev is None else ev["pass_at_1"],
            "pass_at_k": None if ev is None else ev["pass_at_k"],
            # with dynamic sampling: over every group drawn (the kept ones have none), and the draws
            "zero_std_frac": (self.drawn.zero_std_frac if self.drawn is not None
                              else zero_std_fraction(ro.score, int(self.cfg.group_size))),
            "response_len_correct": len_correct, "response_len_incorrect": len_incorrect,
            "reward": reward, "gold_reward": float(ro.gold.mean()), "kl_ref": self._kl_ref(ro),
            "response_len": float(lengths.mean()), "tokens": int(self.tokens),
            "score": float(ro.score.mean()),
            "return_mean": float(ro.rewards.mul(ro.mask).sum(-1).mean()),
            "kl_ref_token": None if ro.kl_tok is None else float(ro.kl_tok.sum() / ro.mask.sum().clamp(min=1.0)),
            "no_eos_frac": float((~ro.has_eos).float().mean()),
            "greedy_reward": None if ro.greedy_rewards is None else float(ro.greedy_rewards.mean()),
            "prompts_truncated": int(ro.prompts_truncated),
            "tokens_per_s": float(self.tokens / max(row["wall_time_s"], 1e-9)),
            "iter_time_s": float(time.perf_counter() - self.t_iteration),
            # peak memory above the member's baseline (PeakMemory), and that baseline
            "peak_mem_mb": float(self.memory.above_base_mb), "peak_mem_base_mb": float(self.memory.base),
        }

    def summary_extra(self, p) -> dict:
        extra = {"tokens": self.tokens, "prompts_truncated": self.truncated_total, "pipeline": self.task.meta,
                 "eval_return_init": None, "eval_gold_greedy_init": None}
        if self.task.binary:
            extra.update(pass_at_1_init=None, pass_at_k_init=None)
        return extra

    def postfix(self, ro, rows):
        r = rows[0] if rows else {"reward": float("nan"), "gold_reward": float("nan"), "tokens_per_s": 0.0}
        return {"reward": f"{r['reward']:.3f}", "gold": f"{r['gold_reward']:.3f}", "tok_s": f"{r['tokens_per_s']:.0f}"}

    # ------------------------------------------------------------------ checkpoints
    def state(self):
        return {}, {"prompt_rng": ckpt.random_state(self.rng), "tokens": int(self.tokens), "iteration": self.iteration,
                    "prompts_truncated": int(self.truncated_total),
                    "mem_peak": float(self.memory.peak_now() - self.memory.base)}

    def load_state(self, tensors, meta):
        try:
            tokens, truncated, peak = meta["tokens"], meta["prompts_truncated"], meta["mem_peak"]
            state, iteration = meta["prompt_rng"], meta["iteration"]
        except (KeyError, TypeError) as exc:
            raise ckpt.CheckpointError(f"LM source state: missing {exc}") from None
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (tokens, truncated, iteration)):
            raise ckpt.CheckpointError(f"LM source state: tokens {tokens!r}, prompts_truncated {truncated!r}, "
                                       f"iteration {iteration!r}")
        ckpt.set_random_state(self.rng, state)
        self.tokens, self.truncated_total, self.iteration = tokens, truncated, iteration
        # the peak above baseline before the interruption, carried over onto this process's baseline
        self.memory.peak = max(self.memory.peak, self.memory.base + float(peak))


def train(plan: RunPlan, runs: list[RunDir]) -> None:
    """Build (or load) the cached pipeline once, then train the members one after another,
    each resuming from its own checkpoint if it has one (``population_workers``: split over that
    many forked processes, which share the pipeline; default one)."""
    cfg = plan.cfg
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    task = build_task(cfg)
    train_members(plan, runs, lambda member, rs: LMSource(member, task), workers=int(cfg.population_workers or 1))
