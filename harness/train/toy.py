"""Toy trainer: sample responses from a tabular softmax policy, estimate advantages by
registry name, update with the shared losses, log the *exact* expected reward.

One iteration, the same for every estimator (the trainer asks the :class:`EstimatorSpec`
what it needs and never its name), laid out like the LM trainer:

1. ``task.episodes_per_iter / group_size`` prompts drawn uniformly, each sampled
   ``group_size`` times (column ``g * group_size + j`` is sample ``j`` of prompt ``g``).
   ``spec.needs_greedy``: one greedy response per prompt as well (ReMax's baseline).
2. Reward on the last token, ``terminated`` there; a tabular critic ``V[state]`` when the
   spec needs one (regressed on the estimator's returns, built from ``V_old``).
3. ``spec(AdvantageBatch[T=L, B], params)``, optional whitening, then ``epochs`` x
   ``minibatches`` (over sequences) of the policy loss aggregated with ``loss_agg``
   (``seq_mean_token_sum_norm`` divides by the constant ``L = toy length``), entropy bonus,
   value loss and KL term (``kl.target``: ``ref`` = the initial policy, ``old`` = pre-update).

Sample budget: ``env_steps`` counts **sampled sequences** (greedy ones included); ``tokens``
counts sampled tokens (EOS included). ``eval_return`` is the exact ``J(theta)`` every
iteration; ``grad_cos`` is the cosine between the batch's policy-gradient estimate (before the
update) and the exact gradient. Population members train one after another.
With ``mode=probe`` the app calls :func:`harness.probes.run_probe` instead.
"""
from __future__ import annotations

import math
import time
from types import SimpleNamespace

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..estimators import AdvantageBatch, EstimatorParams, get_estimator, kl_estimate
from ..io import RunDir
from ..io import checkpoint as ckpt
from ..losses import entropy_bonus, explained_variance, get_policy_loss, kl_penalty, value_loss
from ..tasks.toy import DTYPE, ToyTask, build_task, time_major, validate_toy

POLICY_FILE = "policy.safetensors"  # the final policy (older runs: policy.pt, a torch.save dict)


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum().clamp(min=1.0)
    mean = (x * mask).sum() / n
    std = ((((x - mean) ** 2) * mask).sum() / n).sqrt()
    return (x - mean) / (std + 1e-8) * mask


def gather_logp(theta: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t | s_t)`` time-major ``[L, N]`` from batch-major states/tokens ``[N, L]``."""
    return torch.log_softmax(theta, dim=-1)[states, tokens].T


def token_entropy(theta: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    logpi = torch.log_softmax(theta, dim=-1)[states]  # [N, L, V]
    return -(logpi.exp() * logpi).sum(-1).T


def toy_settings(cfg) -> dict:
    node = cfg.get("toy") if "toy" in cfg else None
    node = node or {}
    return {"init_scale": float(node.get("init_scale", 0.0) or 0.0),
            "init_seed": int(node.get("init_seed", 0) or 0)}


class ToyTrainer:
    def __init__(self, cfg: DictConfig, task: ToyTask, run: RunDir):
        self.cfg, self.task, self.run_dir = cfg, task, run
        self.seed = int(cfg.seed)
        self.spec = get_estimator(cfg.estimator)
        self.gen = torch.Generator().manual_seed(self.seed)
        ts = toy_settings(cfg)
        self.theta = task.init_logits(ts["init_scale"], ts["init_seed"]).requires_grad_(True)
        self.theta_ref = self.theta.detach().clone()
        self.critic = torch.zeros(task.n_states, dtype=DTYPE, requires_grad=True) if self.spec.needs_critic else None
        self.params = [self.theta] + ([self.critic] if self.critic is not None else [])
        self.optim = torch.optim.Adam(self.params, lr=float(cfg.lr))
        self.policy_loss = get_policy_loss(cfg["update"])
        self.est_params = EstimatorParams(gamma=float(cfg.gamma), gae_lambda=float(cfg.gae_lambda),
                                          n_steps=int(cfg.n_steps), std_normalize=bool(cfg.std_normalize))
        self.k = int(cfg.group_size)
        self.n_groups = int(cfg.task.episodes_per_iter) // self.k
        self.sequences = 0
        self.tokens = 0
        # plain-Python copies of the knobs read in the hot loop (OmegaConf access is slow)
        self.hp = SimpleNamespace(
            normalize=str(cfg.normalize_advantages), minibatches=int(cfg.minibatches), epochs=int(cfg.epochs),
            clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, vf_clip_eps=cfg.vf_clip_eps,
            loss_agg=str(cfg.loss_agg), ent_coef=float(cfg.ent_coef), vf_coef=float(cfg.vf_coef),
            max_grad_norm=None if cfg.max_grad_norm is None else float(cfg.max_grad_norm),
            kl_beta=float(cfg.kl.beta), kl_estimator=str(cfg.kl.estimator), kl_target=str(cfg.kl.target),
            kl_in_reward=bool(cfg.kl.in_reward))

    # ------------------------------------------------------------------ one batch
    def collect(self):
        task = self.task
        prompts = torch.randint(task.n_prompts, (self.n_groups,), generator=self.gen)
        batch = task.sample(self.theta, prompts.repeat_interleave(self.k), self.gen)
        greedy = None
        self.sequences += batch.prompts.shape[0]
        self.tokens += int(batch.length.sum())
        if self.spec.needs_greedy:
            leaves = task.greedy(self.theta)[prompts]
            greedy = task.leaf_reward[leaves]
            self.sequences += self.n_groups
            self.tokens += int(task.leaf_len[leaves].sum())
        return batch, greedy

    def advantages(self, batch, greedy):
        tm = time_major(self.task, batch, self.critic.detach() if self.critic is not None else None)
        with torch.no_grad():
            old_logp = gather_logp(self.theta, batch.states, batch.tokens)
            ref_logp = gather_logp(self.theta_ref, batch.states, batch.tokens)
        rewards = tm["rewards"]
        if self.hp.kl_in_reward and self.hp.kl_beta > 0:  # InstructGPT: per-token penalty folded into the reward
            rewards = rewards - self.hp.kl_beta * kl_estimate(self.hp.kl_estimator, old_logp, ref_logp) * tm["mask"]
        ab = AdvantageBatch(rewards=rewards, terminated=tm["terminated"], truncated=tm["truncated"],
                            mask=tm["mask"], values=tm.get("values"), next_values=tm.get("next_values"),
                            greedy_scores=greedy, group_size=self.k if self.spec.needs_groups else None)
        out = self.spec(ab, self.est_params)
        return out.advantages * tm["mask"], out.returns, tm.get("values"), tm["mask"], old_logp, ref_logp

    def grad_cosine(self, batch, adv, mask, old_logp) -> float:
        """Cosine between this batch's policy-gradient estimate and the exact gradient."""
        th = self.theta.detach().clone().requires_grad_(True)
        logp = gather_logp(th, batch.states, batch.tokens)
        loss, _ = self.policy_loss(logp, old_logp, adv, mask, clip_eps=self.hp.clip_eps,
                                   agg=self.hp.loss_agg, norm_len=self.task.spec.length, with_metrics=False)
        (g,) = torch.autograd.grad(-loss, th)
        true = self.task.exact_gradient(self.theta.detach())
        den = float(g.norm() * true.norm())
        return float((g * true).sum()) / den if den > 0 else float("nan")

    def update(self, batch, adv, returns, old_values, mask, old_logp, ref_logp) -> dict[str, float]:
        h = self.hp
        N, L = batch.tokens.shape
        n_mb = max(1, min(h.minibatches, N))
        if h.normalize == "batch" or (h.normalize == "minibatch" and n_mb == 1):
            adv = whiten(adv, mask)
        use_kl_loss = h.kl_beta > 0 and not h.kl_in_reward
        stats: dict[str, list[float]] = {}
        for epoch in range(h.epochs):
            last = epoch == h.epochs - 1
            perm = torch.randperm(N, generator=self.gen) if n_mb > 1 else torch.arange(N)
            for idx in perm.chunk(n_mb):
                st, tk = batch.states[idx], batch.tokens[idx]
                m_mask, m_adv, m_old = mask[:, idx], adv[:, idx], old_logp[:, idx]
                if h.normalize == "minibatch" and n_mb > 1:
                    m_adv = whiten(m_adv, m_mask)
                logp = gather_logp(self.theta, st, tk)
                pl, metrics = self.policy_loss(logp, m_old, m_adv, m_mask, clip_eps=h.clip_eps,
                                               clip_eps_high=h.clip_eps_high, agg=h.loss_agg, norm_len=L,
                                               with_metrics=last)
                loss = pl
                if h.ent_coef > 0 or last:
                    ent_l, ent_m = entropy_bonus(token_entropy(self.theta, st), m_mask, agg=h.loss_agg)
                    if h.ent_coef > 0:
                        loss = loss + h.ent_coef * ent_l
                    metrics.update(ent_m)
                if self.critic is not None:
                    v = self.critic[st].T * m_mask
                    vl, vm = value_loss(v, returns[:, idx], m_mask, old_values=old_values[:, idx],
                                        clip_eps=h.vf_clip_eps)
                    loss = loss + h.vf_coef * vl
                    metrics.update(vm)
                if use_kl_loss:
                    target = ref_logp[:, idx] if h.kl_target == "ref" else m_old
                    kl_l, klm = kl_penalty(logp, target, m_mask, h.kl_estimator, agg=h.loss_agg)
                    loss = loss + h.kl_beta * kl_l
                    metrics["kl_loss"] = klm["kl"]
                self.optim.zero_grad()
                loss.backward()
                if h.max_grad_norm is not None:
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.params, h.max_grad_norm)
                else:
                    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.params]))
                self.optim.step()
                if last:
                    metrics["grad_norm"] = grad_norm
                    metrics["loss"] = loss.detach()
                    for k_, v_ in metrics.items():
                        stats.setdefault(k_, []).append(float(v_))
        out = {k_: sum(v_) / len(v_) for k_, v_ in stats.items()}
        n = mask.sum().clamp(min=1.0)
        a_mean = float((adv * mask).sum() / n)
        out["adv_mean"] = a_mean
        out["adv_std"] = float(((((adv - a_mean) ** 2) * mask).sum() / n).sqrt())
        # C14: spread of the advantage across the tokens of one response (0 for critic-free estimators)
        n_tok = mask.sum(0).clamp(min=1.0)
        col_mean = (adv * mask).sum(0) / n_tok
        out["adv_within_std"] = float(((((adv - col_mean) ** 2) * mask).sum(0) / n_tok).sqrt().mean())
        if self.critic is not None:
            ev = explained_variance(old_values, returns, mask)
            out["explained_variance"] = ev if math.isfinite(ev) else None
        return out

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        cfg = self.cfg
        budget, max_iters = cfg.budget.env_steps, cfg.budget.iterations
        t0 = time.time()
        bar = tqdm(total=budget or max_iters, disable=not cfg.progress, unit="seq" if budget else "it",
                   desc=f"{cfg.task.name}/{cfg.estimator} seed={self.seed}", dynamic_ncols=True, leave=False)
        iteration = 0
        status, reason = "completed", None
        try:
            while True:
                iteration += 1
                batch, greedy = self.collect()
                adv, returns, old_values, mask, old_logp, ref_logp = self.advantages(batch, greedy)
                cos = self.grad_cosine(batch, adv, mask, old_logp)
                stats = self.update(batch, adv, returns, old_values, mask, old_logp, ref_logp)
                reason = self._diverged(stats)
                done = (budget is not None and self.sequences >= budget) or (
                    max_iters is not None and iteration >= max_iters)
                row = self._row(iteration, time.time() - t0, batch, stats, cos)
                self.run_dir.log(row)
                if reason is not None:
                    status, reason = "diverged", f"{reason} at iteration {iteration}"
                    break
                if done:
                    break
                if iteration % 50 == 0:
                    self.run_dir.flush()
                bar.n = min(self.sequences, budget) if budget else iteration
                bar.set_postfix(J=f"{row['eval_return']:.3f}", refresh=False)
                bar.refresh()
        finally:
            bar.close()
        self.save_checkpoint(iteration)
        self.run_dir.finish(status, reason, time.time() - t0, extra={
            "sequences": self.sequences, "tokens": self.tokens, "env_steps_unit": "sampled sequences",
            "toy_spec": repr(self.task.spec)})

    def save_checkpoint(self, iteration: int) -> None:
        """The final policy for ``mode=probe`` (``probe.checkpoint=<run dir>``), as
        ``policy.safetensors`` through :mod:`harness.io.checkpoint` (no pickles)."""
        tensors = {"theta": self.theta.detach(), "theta_ref": self.theta_ref}
        if self.critic is not None:
            tensors["critic"] = self.critic.detach()
        ckpt.save(self.run_dir.path / POLICY_FILE, tensors, {"iteration": iteration, "spec": repr(self.task.spec)})

    def _diverged(self, stats) -> str | None:
        for k in ("loss", "grad_norm"):
            if k in stats and not math.isfinite(stats[k]):
                return f"non-finite {k}"
        if not all(torch.isfinite(p).all() for p in self.params):
            return "non-finite parameters"
        return None

    def _row(self, iteration, wall, batch, stats, cos) -> dict:
        cfg = self.cfg
        ex = self.task.exact_stats(self.theta.detach())
        with torch.no_grad():
            kl_ref = float(self.task.sequence_kl(self.theta.detach(), self.theta_ref))
        get = stats.get
        row = {
            "run_id": self.run_dir.run_id, "task": cfg.task.name, "estimator": cfg.estimator, "seed": self.seed,
            "iteration": iteration, "env_steps": int(self.sequences), "wall_time_s": float(wall),
            "episode_return": float(batch.reward.mean()), "eval_return": ex["J"],
            "gamma": float(cfg.gamma), "gae_lambda": float(cfg.gae_lambda),
            "clip_eps": None if cfg.clip_eps is None else float(cfg.clip_eps),
            "kl_beta": float(cfg.kl.beta), "n_steps": int(cfg.n_steps), "group_size": self.k, "lr": float(cfg.lr),
            "policy_loss": get("policy_loss"), "entropy": get("entropy"), "approx_kl": get("approx_kl"),
            "clip_frac": get("clip_frac"), "grad_norm": get("grad_norm"), "adv_mean": get("adv_mean"),
            "adv_std": get("adv_std"), "value_loss": get("value_loss"),
            "explained_variance": get("explained_variance"),
            "reward": float(batch.reward.mean()), "gold_reward": None, "kl_ref": kl_ref,
            "response_len": float(batch.length.double().mean()), "tokens": int(self.tokens),
            # toy extras (exact unless named otherwise)
            "grad_cos": cos, "adv_within_std": get("adv_within_std"), "kl_loss": get("kl_loss"),
            "exact_response_len": ex["response_len"], "wrong_len": ex["wrong_len"], "right_len": ex["right_len"],
            "success": ex["success"], "loss_agg": str(cfg.loss_agg),
        }
        for x, j in enumerate(ex["J_prompt"]):
            row[f"J_prompt{x}"] = j
        return row


def train(cfg: DictConfig, runs: list[RunDir]) -> None:
    validate_toy(cfg)
    # tiny tensors: intra-op threads only add synchronisation (as for control)
    torch.set_num_threads(int(cfg.threads or 1))
    task = build_task(cfg)
    for r in runs:
        t0 = time.time()
        try:
            ToyTrainer(r.cfg, task, r).run()
        except Exception as exc:  # record this member as failed, go on with the next
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.time() - t0)
            if len(runs) == 1:
                raise
