"""LM trainer: sample responses, score them, estimate advantages by registry name, update, log.

One iteration (Ouyang et al. 2022; Ahmadian et al. 2024; Shao et al. 2024), the same for every
estimator (the trainer asks the :class:`EstimatorSpec` what it needs and never its name):

1. ``lm.prompts_per_iter`` training prompts, each sampled ``group_size`` times: columns are
   group-major (column ``g * group_size + j`` is sample ``j`` of prompt ``g``). Every estimator
   sees the same batch; the group estimators use the grouping, the others ignore it.
2. ``spec.needs_greedy``: one greedy response per prompt as well (ReMax's baseline).
3. One teacher-forced forward each of the policy (``log pi_old``, values from the head), the
   frozen reference (``log pi_ref``) and, with ``lm.critic=model``, the critic.
4. The score (reward model or gold) of each response sits on its final token, minus
   ``lm.no_eos_penalty`` when it has no EOS. With ``kl.in_reward`` every token also gets
   ``-beta * k(log pi_old, log pi_ref)`` (InstructGPT); otherwise ``beta * k`` is a loss term
   (GRPO). The episode ends at the last response token (``terminated``): the score is the
   terminal reward, there is no continuation to bootstrap from.
5. ``spec(AdvantageBatch[T=L, B], params)`` -> advantages (and critic targets); optional
   whitening (``normalize_advantages``), then ``epochs`` x ``minibatches`` (over sequences) of
   the policy loss ``update: pg | clip`` aggregated with ``loss_agg``, plus value loss, entropy
   bonus and KL term.

Budgets are sampled tokens (response tokens incl. EOS, greedy and group samples included),
counted the same way for every estimator. Population members (``population > 1``) are trained
one after another here, each with its own seed; they share the cached SFT policy and RM.

Checkpoints (``checkpoint_every``, issue 7): every ``checkpoint_every`` iterations the run's
state goes into ``checkpoint.safetensors`` in its run directory (:mod:`harness.io.checkpoint`:
safetensors + JSON, written atomically, never unpickled): policy weights (value head included),
the separate critic's (``lm.critic=model``), Adam state, the torch/numpy/python global RNG
states and the trainer's own generators (sampling, minibatch order, prompt choice), the token
and truncation counters, the (adaptive) KL beta, the memory peak, the initial evaluation and
the metric rows. The frozen reference and the reward model come from the cache, not the
checkpoint. A restarted run resumes from it, metrics.parquet truncated to the checkpoint's
iteration; on CPU the metrics equal an uninterrupted run's bit for bit (wall-clock columns
aside), with or without checkpoints. Each population member has its own checkpoint.
"""
from __future__ import annotations

import logging
import math
import random
import resource
import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..estimators import AdvantageBatch, EstimatorParams, get_estimator, kl_estimate
from ..io import RunDir, config_hash
from ..io import checkpoint as ckpt
from ..losses import adaptive_kl_beta, entropy_bonus, explained_variance, get_policy_loss, kl_penalty, value_loss
from ..models.lm import NonFiniteError, PolicyWithValue, ValueModel, generate, response_forward
from ..tasks.lm.data import decode_responses, left_pad
from ..tasks.lm.pipeline import LMTask, autocast, build_task, evaluate_gold, uses_bf16

log = logging.getLogger("harness.lm")
CHECKPOINT_FORMAT = 1


def _masked_mean_std(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = mask.sum().clamp(min=1.0)
    mean = (x * mask).sum() / n
    var = (((x - mean) ** 2) * mask).sum() / n
    return mean, var.sqrt()


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean, std = _masked_mean_std(x, mask)
    return (x - mean) / (std + 1e-8) * mask


def memory_mb(device: torch.device) -> float:
    """Memory in use now: allocated tensor memory on CUDA, the process's resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux: the process's lifetime peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class Rollout:
    prompt_ids: torch.Tensor  # [B, P]
    prompt_mask: torch.Tensor
    tokens: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L] float
    old_logp: torch.Tensor  # [B, L]
    ref_logp: torch.Tensor  # [B, L]
    values: torch.Tensor | None  # [B, L]
    score: torch.Tensor  # [B] optimized score incl. the no-EOS penalty
    reward: torch.Tensor  # [B] reward-model (or gold) score
    gold: torch.Tensor  # [B]
    has_eos: torch.Tensor  # [B]
    greedy_scores: torch.Tensor | None  # [n_prompts]
    greedy_reward: float | None
    sampled_tokens: int
    prompts_truncated: int


class LMTrainer:
    def __init__(self, cfg: DictConfig, task: LMTask, run: RunDir):
        self.cfg, self.task, self.run_dir = cfg, task, run
        self.lm = cfg.lm
        self.seed = int(cfg.seed)
        self.spec = get_estimator(cfg.estimator)
        self.device = task.device
        torch.manual_seed(self.seed)
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.cpu_gen = torch.Generator().manual_seed(self.seed)
        self.rng = random.Random(self.seed)
        critic_head = self.spec.needs_critic and self.lm.critic == "head"
        self.policy = PolicyWithValue(task.load_policy(), value_head=critic_head).to(self.device)
        self.ref = task.load_policy()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.critic = None
        if self.spec.needs_critic and self.lm.critic == "model":
            self.critic = ValueModel(task.load_backbone()).to(self.device)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        if self.critic is not None:
            self.params += [p for p in self.critic.parameters() if p.requires_grad]
        self.optim = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5)
        self.policy_loss = get_policy_loss(cfg["update"])
        self.est_params = EstimatorParams(gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, n_steps=cfg.n_steps,
                                          std_normalize=cfg.std_normalize)
        self.kl_beta = float(cfg.kl.beta)
        # log pi_old straight from the sampler, skipping a teacher-forced pass of the policy: in
        # fp32 the two agree to float rounding (claim C12, tests/test_lm_model.py). Not under bf16
        # autocast (the KV-cache decode and the full pass round differently), nor with a value
        # head, whose values need that pass anyway.
        self.reuse_sampler_logp = not uses_bf16(self.device, task.dtype) and not critic_head
        self.tok = task.tokenizer
        self.tokens = 0
        self.truncated_total = 0
        # peak memory of this run: CUDA's own peak counter, else the resident set sampled where
        # it is largest (after sampling, and after each minibatch's forward pass)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.mem_peak = memory_mb(self.device)
        self.checkpoint_every = int(cfg.get("checkpoint_every", 0) or 0)

    def _sample_memory(self) -> None:
        self.mem_peak = max(self.mem_peak, memory_mb(self.device))

    # ------------------------------------------------------------------ helpers
    def _ac(self):
        return autocast(self.device, self.task.dtype)

    def _values(self, prompt_ids, prompt_mask, tokens, mask, out_values):
        if self.critic is not None:
            return self.critic(prompt_ids, prompt_mask, tokens, mask)
        return out_values

    def _sequence_kl(self, logp, ref_logp, mask) -> torch.Tensor:
        """Per-token KL estimate (``kl.estimator``) of the policy to the reference, masked."""
        return kl_estimate(self.cfg.kl.estimator, logp, ref_logp) * mask

    def _score(self, examples, texts, has_eos) -> tuple[torch.Tensor, torch.Tensor]:
        reward = self.task.reward(examples, texts, has_eos.tolist()).float()
        score = reward - float(self.lm.no_eos_penalty) * (~has_eos.cpu()).float()
        return reward, score

    # ------------------------------------------------------------------ collect
    @torch.no_grad()
    def collect(self) -> Rollout:
        lm, k = self.lm, int(self.cfg.group_size)
        split = self.task.train
        prompt_idx = [self.rng.randrange(len(split)) for _ in range(int(lm.prompts_per_iter))]
        rows = [i for i in prompt_idx for _ in range(k)]  # group-major
        examples = [split.examples[i] for i in rows]
        truncated = sum(split.truncated[i] for i in rows)
        p_ids, p_mask = left_pad([split.prompt_ids[i] for i in rows], self.tok.pad_token_id, self.device)
        with self._ac():
            g = generate(self.policy.lm, p_ids, p_mask, lm.max_response_len, self.tok.eos_token_id,
                         self.tok.pad_token_id, temperature=lm.temperature, generator=self.gen)
        mask = g.mask.float()
        with self._ac():
            if self.reuse_sampler_logp:
                old_logp, values = g.logp * mask, None
            else:
                out, values = self.policy(p_ids, p_mask, g.tokens, g.mask, lm.temperature)
                old_logp = out.logp
            ref = self.policy_forward_ref(p_ids, p_mask, g.tokens, g.mask)
            if self.spec.needs_critic:
                values = self._values(p_ids, p_mask, g.tokens, g.mask, values)
        self._sample_memory()
        texts = decode_responses(self.tok, g.tokens, g.mask)
        reward, score = self._score(examples, texts, g.has_eos)
        gold = self.task.gold(examples, texts)
        sampled = int(g.mask.sum())

        greedy_scores = greedy_reward = None
        if self.spec.needs_greedy:
            gp_ids, gp_mask = left_pad([split.prompt_ids[i] for i in prompt_idx], self.tok.pad_token_id, self.device)
            with self._ac():
                gg = generate(self.policy.lm, gp_ids, gp_mask, lm.max_response_len, self.tok.eos_token_id,
                              self.tok.pad_token_id, temperature=lm.temperature, greedy=True)
            g_texts = decode_responses(self.tok, gg.tokens, gg.mask)
            g_reward, g_score = self._score([split.examples[i] for i in prompt_idx], g_texts, gg.has_eos)
            greedy_reward = float(g_reward.mean())
            greedy_scores = g_score.to(self.device)
            if self.cfg.kl.in_reward and self.kl_beta > 0:
                # the greedy return carries its own KL penalty, like every sampled return
                with self._ac():
                    g_out, _ = self.policy(gp_ids, gp_mask, gg.tokens, gg.mask, lm.temperature)
                    g_ref = self.policy_forward_ref(gp_ids, gp_mask, gg.tokens, gg.mask)
                g_kl = self._sequence_kl(g_out.logp, g_ref, gg.mask.float()).sum(-1)
                greedy_scores = greedy_scores - self.kl_beta * g_kl
            sampled += int(gg.mask.sum())
        return Rollout(p_ids, p_mask, g.tokens, mask, old_logp.float(), ref.float(),
                       None if values is None else values.float(), score.to(self.device), reward, gold,
                       g.has_eos, greedy_scores, greedy_reward, sampled, truncated)

    def policy_forward_ref(self, p_ids, p_mask, tokens, mask) -> torch.Tensor:
        return response_forward(self.ref, p_ids, p_mask, tokens, mask, self.lm.temperature).logp

    # ------------------------------------------------------------------ advantages
    def advantages(self, ro: Rollout):
        B, L = ro.tokens.shape
        kl_tok = self._sequence_kl(ro.old_logp, ro.ref_logp, ro.mask)  # [B, L]
        rewards = torch.zeros(B, L, device=self.device)
        if self.cfg.kl.in_reward:
            rewards = rewards - self.kl_beta * kl_tok
        last = (ro.mask.sum(-1).long() - 1).clamp(min=0)  # index of the final response token
        ar = torch.arange(B, device=self.device)
        rewards[ar, last] += ro.score
        terminated = torch.zeros(B, L, device=self.device)
        terminated[ar, last] = 1.0
        values = next_values = None
        if self.spec.needs_critic:
            values = ro.values * ro.mask
            next_values = torch.cat([values[:, 1:], torch.zeros(B, 1, device=self.device)], dim=1)
        tm = lambda x: None if x is None else x.transpose(0, 1).contiguous()  # noqa: E731  [B, L] -> [T, B]
        batch = AdvantageBatch(
            rewards=tm(rewards), terminated=tm(terminated), truncated=torch.zeros(L, B, device=self.device),
            mask=tm(ro.mask), values=tm(values), next_values=tm(next_values), greedy_scores=ro.greedy_scores,
            group_size=int(self.cfg.group_size),
        )
        res = self.spec(batch, self.est_params)
        return res.advantages * batch.mask, res.returns, batch.values, kl_tok, rewards

    # ------------------------------------------------------------------ update
    def update(self, ro: Rollout, adv: torch.Tensor, returns, old_values) -> dict[str, float]:
        cfg, lm = self.cfg, self.lm
        B, L = ro.tokens.shape
        mask_tm = ro.mask.transpose(0, 1)
        if cfg.normalize_advantages == "batch":
            adv = whiten(adv, mask_tm)
        n_mb = min(int(cfg.minibatches), B)
        mb = math.ceil(B / n_mb)
        kl_loss_on = not cfg.kl.in_reward and (self.kl_beta > 0 or cfg.kl.adaptive)
        stats: dict[str, list[float]] = {}
        last_epoch: dict[str, list[float]] = {}
        for epoch in range(int(cfg.epochs)):
            perm = torch.randperm(B, generator=self.cpu_gen).to(self.device) if n_mb > 1 else torch.arange(B, device=self.device)
            for i in range(n_mb):
                idx = perm[i * mb:(i + 1) * mb]
                if idx.numel() == 0:
                    continue
                m = mask_tm[:, idx]
                a = adv[:, idx]
                if cfg.normalize_advantages == "minibatch":
                    a = whiten(a, m)
                with self._ac():
                    out, values = self.policy(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.tokens[idx],
                                              ro.mask[idx].long(), lm.temperature)
                    if self.spec.needs_critic:
                        values = self._values(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.tokens[idx],
                                              ro.mask[idx].long(), values)
                self._sample_memory()
                logp = out.logp.float().transpose(0, 1)
                old = ro.old_logp[idx].transpose(0, 1)
                pl, metrics = self.policy_loss(logp, old, a, m, clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                                               agg=cfg.loss_agg, norm_len=int(lm.max_response_len))
                ent_l, ent_m = entropy_bonus(out.entropy.float().transpose(0, 1), m, cfg.loss_agg)
                loss = pl + cfg.ent_coef * ent_l
                metrics = {k: float(v) for k, v in metrics.items()}
                metrics.update({k: float(v) for k, v in ent_m.items()})
                if self.spec.needs_critic:
                    vl, vm = value_loss(values.float().transpose(0, 1), returns[:, idx], m,
                                        old_values=old_values[:, idx], clip_eps=cfg.vf_clip_eps)
                    loss = loss + cfg.vf_coef * vl
                    metrics.update({k: float(v) for k, v in vm.items()})
                if kl_loss_on:
                    target = ro.ref_logp if cfg.kl.target == "ref" else ro.old_logp
                    kl_l, klm = kl_penalty(logp, target[idx].transpose(0, 1), m, cfg.kl.estimator, cfg.loss_agg)
                    loss = loss + self.kl_beta * kl_l
                    metrics["kl_loss"] = float(klm["kl"])
                metrics["loss"] = float(loss.detach())
                if not math.isfinite(metrics["loss"]):
                    stats.setdefault("loss", []).append(metrics["loss"])
                    return {k: sum(v) / len(v) for k, v in stats.items()}
                self.optim.zero_grad(set_to_none=True)
                loss.backward()
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
                metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
                if math.isfinite(metrics["grad_norm"]):
                    self.optim.step()
                for k, v in metrics.items():
                    stats.setdefault(k, []).append(v)
                    if epoch == int(cfg.epochs) - 1:
                        last_epoch.setdefault(k, []).append(v)
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        for k in ("approx_kl", "clip_frac"):  # last epoch: how far the update went
            if k in last_epoch:
                out[k] = sum(last_epoch[k]) / len(last_epoch[k])
        return out

    def _diverged(self, stats: dict[str, float]) -> str | None:
        for k in ("loss", "grad_norm"):
            if k in stats and not math.isfinite(stats[k]):
                return f"non-finite {k}"
        for p in self.params:
            if not torch.isfinite(p.detach()).all():
                return "non-finite parameters"
        return None

    # ------------------------------------------------------------------ eval
    EVAL_SEED_OFFSET = 7919  # eval noise: seeded by lm.pipeline_seed only, shared by every run and estimator

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """``(sampled, greedy)`` mean gold score on the first ``lm.eval_prompts`` held-out prompts.

        *sampled* (logged as ``eval_return``) is the policy's own objective, the gold score
        expected under sampling at ``lm.temperature``, estimated from ``lm.eval_samples``
        responses per prompt with common random numbers across evaluations, runs and estimators;
        *greedy* (``eval_gold_greedy``) decodes the argmax response once per prompt.
        """
        lm = self.lm
        args = (self.policy.lm, self.tok, self.task.held_out, int(lm.eval_prompts), int(lm.max_response_len),
                float(lm.temperature))
        seed = int(lm.pipeline_seed) + self.EVAL_SEED_OFFSET
        sampled = evaluate_gold(*args, False, seed, self.device, self.task.dtype, samples=int(lm.eval_samples))
        greedy = evaluate_gold(*args, True, seed, self.device, self.task.dtype)
        return sampled, greedy

    # ------------------------------------------------------------------ loop
    def run(self, resume: dict | None = None) -> None:
        """Train to the budget; ``resume``: what :meth:`restore` returned (continue from there)."""
        cfg = self.cfg
        budget, max_iters = cfg.budget.tokens, cfg.budget.iterations
        t0 = time.time() - (resume["wall_time_s"] if resume else 0.0)
        bar = tqdm(total=budget or max_iters, disable=not cfg.progress, unit="tok" if budget else "it",
                   desc=f"{cfg.task.name}/{cfg.estimator} seed={self.seed}", dynamic_ncols=True, leave=False)
        iteration = resume["iteration"] if resume else 0
        status, reason = "completed", None
        # the starting (SFT) policy, scored by the same evaluation as every later eval row
        if resume:
            init = tuple(resume["init"])
        else:
            init = self.evaluate() if cfg.eval_every > 0 else (None, None)
        try:
            while True:
                iteration += 1
                t_it = time.time()
                try:
                    ro = self.collect()
                except NonFiniteError as exc:  # the last update left weights that decode to NaN
                    status, reason = "diverged", f"{exc} at iteration {iteration}"
                    break
                self.tokens += ro.sampled_tokens
                self.truncated_total += ro.prompts_truncated
                adv, returns, old_values, kl_tok, rewards = self.advantages(ro)
                stats = self.update(ro, adv, returns, old_values)
                reason = self._diverged(stats)
                kl_seq = kl_estimate("k1", ro.old_logp, ro.ref_logp).mul(ro.mask).sum(-1)  # [B] nats per response
                kl_ref = float(kl_seq.mean())
                beta_used = self.kl_beta
                if cfg.kl.adaptive and reason is None:
                    self.kl_beta = adaptive_kl_beta(self.kl_beta, kl_ref, cfg.kl.kl_target)
                done = (budget is not None and self.tokens >= budget) or (max_iters is not None and iteration >= max_iters)
                eval_now = reason is None and cfg.eval_every > 0 and (iteration % cfg.eval_every == 0 or done)
                eval_return = eval_greedy = None
                if eval_now:
                    try:
                        eval_return, eval_greedy = self.evaluate()
                    except NonFiniteError as exc:
                        reason = f"{exc} (evaluation)"
                wall = time.time() - t0
                row = self._row(iteration, wall, time.time() - t_it, ro, stats, adv, returns, old_values, kl_ref,
                                kl_tok, rewards, beta_used, eval_return, eval_greedy)
                self.run_dir.log(row)
                if reason is not None:
                    status, reason = "diverged", f"{reason} at iteration {iteration}"
                    break
                if done:
                    break
                if self.checkpoint_every and iteration % self.checkpoint_every == 0:
                    self.save_checkpoint(iteration, wall, init)  # flushes the metrics first
                elif iteration % 10 == 0:
                    self.run_dir.flush()
                bar.n = min(self.tokens, budget) if budget else iteration
                bar.set_postfix(reward=f"{row['reward']:.3f}", gold=f"{row['gold_reward']:.3f}",
                                tok_s=f"{self.tokens / max(wall, 1e-9):.0f}", refresh=False)
                bar.refresh()
        finally:
            bar.close()
        self.run_dir.finish(status, reason, time.time() - t0, extra={
            "tokens": self.tokens, "prompts_truncated": self.truncated_total, "pipeline": self.task.meta,
            "eval_return_init": init[0], "eval_gold_greedy_init": init[1]})
        self.run_dir.remove_checkpoint()  # finished: summary.json is the record now

    # ------------------------------------------------------------------ checkpoints
    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """Every parameter of the policy (value head included) and of the separate critic."""
        named = [(f"policy.{n}", p) for n, p in self.policy.named_parameters()]
        if self.critic is not None:
            named += [(f"critic.{n}", p) for n, p in self.critic.named_parameters()]
        return named

    def _trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The named parameters in the optimizer's order (``self.params``)."""
        named = [(n, p) for n, p in self._named_params() if p.requires_grad]
        assert [id(p) for _, p in named] == [id(p) for p in self.params]
        return named

    def checkpoint_state(self, iteration: int, wall: float, init) -> tuple[dict[str, torch.Tensor], dict]:
        """``(tensors, meta)`` of this run after ``iteration``."""
        tensors: dict[str, torch.Tensor] = {f"param/{n}": p.data for n, p in self._named_params()}
        adam = []  # the parameters with Adam state (all of them once an update was made)
        for name, prm in self._trainable():
            state = {k: v for k, v in self.optim.state.get(prm, {}).items() if torch.is_tensor(v)}
            if state:
                adam.append(name)
            tensors.update({f"adam/{name}/{k}": v for k, v in state.items()})
        rng_t, rng_m = ckpt.rng_state([self.gen, self.cpu_gen])
        tensors.update(rng_t)
        meta = {
            "format": CHECKPOINT_FORMAT, "trainer": "lm", "config_hash": config_hash(self.cfg), "seed": self.seed,
            "iteration": iteration, "wall_time_s": wall, "rng": rng_m, "prompt_rng": ckpt.random_state(self.rng),
            "tokens": int(self.tokens), "prompts_truncated": int(self.truncated_total),
            "kl_beta": float(self.kl_beta), "mem_peak": float(self.mem_peak), "init": list(init),
            "adam": adam, "rows": self.run_dir.rows,
        }
        return tensors, meta

    def save_checkpoint(self, iteration: int, wall: float, init) -> None:
        """Flush the metrics, then write the checkpoint (one atomic write)."""
        self.run_dir.flush()
        ckpt.save(self.run_dir.path / ckpt.CHECKPOINT_FILE, *self.checkpoint_state(iteration, wall, init))

    def check_checkpoint(self, meta: dict) -> None:
        """Raise :class:`CheckpointError` unless ``meta`` is this run's (format, trainer, config
        hash, seed) with metric rows ``1..iteration``."""
        def bad(msg):
            raise ckpt.CheckpointError(msg)

        k = ckpt.check_header(meta, "lm", CHECKPOINT_FORMAT, config_hash(self.cfg))
        if meta.get("seed") != self.seed:
            bad(f"saved by seed {meta.get('seed')!r}, this run has seed {self.seed}")
        rows = meta.get("rows")
        its = [r.get("iteration") if isinstance(r, dict) else None for r in rows] if isinstance(rows, list) else None
        if its != list(range(1, k + 1)):
            bad(f"rows hold iterations {(its or [])[:1]}..{(its or [])[-1:]} at checkpoint iteration {k}")
        init = meta.get("init")
        if not (isinstance(init, list) and len(init) == 2):
            bad(f"initial evaluation {init!r}")

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict) -> dict:
        """Load a checkpoint into this freshly built trainer; returns the loop's resume state.
        Raises :class:`CheckpointError` (nothing written yet; the trainer is then unusable) if
        it does not fit."""
        self.check_checkpoint(meta)
        try:
            with torch.no_grad():
                for name, prm in self._named_params():
                    t = tensors[f"param/{name}"]
                    if t.shape != prm.shape or t.dtype != prm.dtype:
                        raise ckpt.CheckpointError(f"param/{name}: saved {tuple(t.shape)} {t.dtype}, "
                                                   f"model has {tuple(prm.shape)} {prm.dtype}")
                    prm.copy_(t)
            extra = {k for k in tensors if k.startswith("param/")} - {f"param/{n}" for n, _ in self._named_params()}
            if extra:
                raise ckpt.CheckpointError(f"parameters the model does not have: {sorted(extra)[:3]}")
            state, with_state = {}, set(meta["adam"])
            for i, (name, _) in enumerate(self._trainable()):
                prefix = f"adam/{name}/"
                st = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
                if bool(st) != (name in with_state):
                    raise ckpt.CheckpointError(f"Adam state of {name} {'missing' if not st else 'unexpected'}")
                if st:
                    state[i] = st
            sd = self.optim.state_dict()
            sd["state"] = state
            self.optim.load_state_dict(sd)  # moves the moments to the parameters' device
            ckpt.set_rng_state(tensors, meta["rng"], [self.gen, self.cpu_gen])
            ckpt.set_random_state(self.rng, meta["prompt_rng"])
            self.tokens = int(meta["tokens"])
            self.truncated_total = int(meta["prompts_truncated"])
            self.kl_beta = float(meta["kl_beta"])
            self.mem_peak = max(self.mem_peak, float(meta["mem_peak"]))
        except KeyError as exc:
            raise ckpt.CheckpointError(f"missing {exc}") from None
        except (ValueError, TypeError, RuntimeError) as exc:
            raise ckpt.CheckpointError(f"{type(exc).__name__}: {exc}") from None
        # fits: now (and only now) touch the run directory
        self.run_dir.resume_rows(meta["rows"])
        return {"iteration": meta["iteration"], "wall_time_s": float(meta["wall_time_s"]), "init": meta["init"]}

    def _row(self, iteration, wall, it_time, ro: Rollout, stats, adv, returns, old_values, kl_ref, kl_tok, rewards,
             beta, eval_return, eval_greedy) -> dict:
        cfg = self.cfg
        mask_tm = ro.mask.transpose(0, 1)
        a_mean, a_std = _masked_mean_std(adv, mask_tm)
        # C14: spread of the advantage across the steps of one response (0 for critic-free estimators)
        a64, m64 = adv.double(), mask_tm.double()  # float64: a constant column gives exactly 0
        n_tok = m64.sum(0).clamp(min=1.0)
        col_mean = (a64 * m64).sum(0) / n_tok
        col_std = ((((a64 - col_mean) ** 2) * m64).sum(0) / n_tok).sqrt()
        get = lambda k: stats.get(k)  # noqa: E731
        reward = float(ro.reward.mean())
        ev = None
        if self.spec.needs_critic and returns is not None:
            ev = explained_variance(old_values, returns, mask_tm)
            ev = None if not math.isfinite(ev) else float(ev)
        return {
            "run_id": self.run_dir.run_id, "task": cfg.task.name, "estimator": cfg.estimator, "seed": self.seed,
            "iteration": iteration, "env_steps": int(self.tokens), "wall_time_s": float(wall),
            "episode_return": reward, "eval_return": eval_return, "eval_gold_greedy": eval_greedy,
            "gamma": float(cfg.gamma), "gae_lambda": float(cfg.gae_lambda),
            "clip_eps": None if cfg.clip_eps is None else float(cfg.clip_eps),
            "kl_beta": float(beta), "n_steps": int(cfg.n_steps), "group_size": int(cfg.group_size),
            "lr": float(cfg.lr),
            "policy_loss": get("policy_loss"), "entropy": get("entropy"), "approx_kl": get("approx_kl"),
            "clip_frac": get("clip_frac"), "grad_norm": get("grad_norm"),
            "adv_mean": float(a_mean), "adv_std": float(a_std),
            "value_loss": get("value_loss"), "explained_variance": ev,
            "reward": reward, "gold_reward": float(ro.gold.mean()), "kl_ref": float(kl_ref),
            "response_len": float(ro.mask.sum(-1).mean()), "tokens": int(self.tokens),
            # LM extras
            "score": float(ro.score.mean()),
            "return_mean": float(rewards.mul(ro.mask).sum(-1).mean()),
            "kl_ref_token": float(kl_tok.sum() / ro.mask.sum().clamp(min=1.0)),
            "kl_loss": get("kl_loss"),
            "no_eos_frac": float((~ro.has_eos).float().mean()),
            "greedy_reward": ro.greedy_reward,
            "adv_within_std": float(col_std.mean()),
            "prompts_truncated": int(ro.prompts_truncated),
            "tokens_per_s": float(self.tokens / max(wall, 1e-9)),
            "iter_time_s": float(it_time),
            "peak_mem_mb": float(torch.cuda.max_memory_allocated(self.device) / 2**20
                                 if self.device.type == "cuda" else self.mem_peak),
        }


def start(cfg: DictConfig, task: LMTask, run: RunDir) -> tuple[LMTrainer, dict | None]:
    """A trainer for ``run`` and its resume state: from the run's checkpoint if there is a
    valid one (metrics.parquet truncated to it), else from zero (progress discarded); an
    unusable checkpoint is named in a log line."""
    trainer = LMTrainer(cfg, task, run)
    path = run.path / ckpt.CHECKPOINT_FILE
    if path.is_file():
        try:
            resume = trainer.restore(*ckpt.load(path))
            log.info("resume %s from %s at iteration %d (metrics.parquet truncated to it)",
                     run.run_id, path, resume["iteration"])
            return trainer, resume
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s; starting from zero", path, exc)
            trainer = LMTrainer(cfg, task, run)  # restore may have loaded part of it
    run.discard_progress()
    return trainer, None


def train(cfg: DictConfig, runs: list[RunDir]) -> None:
    """Build (or load) the cached pipeline once, then train the members one after another,
    each resuming from its own checkpoint if it has one."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    task = build_task(cfg)
    for r in runs:
        t0 = time.time()
        try:
            trainer, resume = start(r.cfg, task, r)
            trainer.run(resume)
        except Exception as exc:  # record this member as failed, go on with the next
            log.exception("lm run %s failed", r.run_id)
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.time() - t0)
            if len(runs) == 1:
                raise
