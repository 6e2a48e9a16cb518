"""Toy rollout source: sample responses from a tabular softmax policy for the one training loop,
log the *exact* expected reward.

One iteration, the same for every estimator (:mod:`.loop` asks the :class:`EstimatorSpec`
what it needs and never its name), laid out like the LM task:

1. ``task.episodes_per_iter / group_size`` prompts drawn uniformly, each sampled
   ``group_size`` times (column ``g * group_size + j`` is sample ``j`` of prompt ``g``).
   ``spec.needs_greedy``: one greedy response per prompt as well (ReMax's baseline).
2. Reward on the last token, ``terminated`` there; a tabular critic ``V[state]`` when the
   spec needs one (regressed on the estimator's returns, built from ``V_old``).
3. The advantages go to :func:`harness.train.update.update` as ``[1, L, N]``, one response
   per column (``loss_agg=seq_mean_token_sum_norm`` divides by the constant ``L = toy
   length``); the KL term's target is ``kl.target``: ``ref`` = the initial policy, ``old`` =
   pre-update.

Sample budget: ``env_steps`` counts **sampled sequences** (greedy ones included); ``tokens``
counts sampled tokens (EOS included). ``eval_return`` is the exact ``J(theta)`` (``eval_every``,
every iteration in ``harness/conf/task/toy.yaml``); ``grad_cos`` is the cosine between the batch's
policy-gradient estimate (before the update) and the exact gradient; ``exact_entropy`` the exact
response entropy of the updated policy (``entropy`` is the update's mean token entropy over the
sampled tokens). ``toy.reward=random`` trains on :func:`harness.tasks.toy.random_rewards` (drawn
from the run's generator after the responses; ``reward`` and ``episode_return`` log them, while
``eval_return`` and the other exact columns stay those of the reward table); ``toy.log_prompts``
adds ``success_prompt<x>`` (before the update) and ``update_prompt<x>``
(:meth:`~harness.tasks.toy.ToyTask.prompt_update_norms` of the iteration's update) for every
prompt. Population members train one after another. With ``mode=probe`` the app calls
:func:`harness.probes.run_probe` instead.
"""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from ..estimators import AdvantageBatch, get_estimator, kl_estimate, kl_guards
from ..config import toy_settings_from_config
from ..io import RunDir
from ..io.schema import prompt_column
from ..io import checkpoint as ckpt
from ..losses import PolicyInputs, get_policy_loss, loss_settings
from ..tasks.toy import DTYPE, ToyTask, advantage_batch, build_task, random_rewards, validate_toy
from .loop import Source
from .workers import train_members
from .sampling import cat_rows, dynamic_sample, overlong_penalty, take_groups
from .update import UpdateBatch, clip_grad_groups, norms_finite

POLICY_FILE = "policy.safetensors"  # the final policy (older runs: policy.pt, a torch.save dict)


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


class ToyLearner:
    """The logits table and the optional tabular critic."""

    population = 1

    def __init__(self, theta: torch.Tensor, critic: torch.Tensor | None):
        self.theta, self.critic = theta, critic
        self.params = [theta] + ([critic] if critic is not None else [])

    def named_params(self):
        return [("theta", self.theta)] + ([("critic", self.critic)] if self.critic is not None else [])

    def forward(self, batch, idx, need_entropy):
        i = slice(None) if idx is None else idx[0]
        st, tk = batch.states[i], batch.tokens[i]
        logp = gather_logp(self.theta, st, tk).unsqueeze(0)
        entropy = token_entropy(self.theta, st).unsqueeze(0) if need_entropy else None
        values = None if self.critic is None else (self.critic[st] * batch.mask[i]).T.unsqueeze(0)
        return logp, entropy, values

    def clip_grads(self, max_norm, per_network):
        return clip_grad_groups([[self.theta], [self.critic] if self.critic is not None else []], max_norm,
                                per_network)

    @torch.no_grad()
    def finite_members(self) -> torch.Tensor:
        """``[1]``: every weight finite (fused norms first, :func:`~harness.train.update.norms_finite`)."""
        return torch.tensor([norms_finite(self.params) or all(bool(torch.isfinite(p).all()) for p in self.params)])


class ToySource(Source):
    cost_unit = "seq"
    uses_groups = True

    def __init__(self, cfg: DictConfig, task: ToyTask):
        self.cfg, self.task, self.P = cfg, task, 1
        self.seed = int(cfg.seed)
        self.seeds = [self.seed]
        self.spec = get_estimator(cfg.estimator)
        self.gen = torch.Generator().manual_seed(self.seed)
        ts = toy_settings(cfg)
        self.theta = task.init_logits(ts["init_scale"], ts["init_seed"]).requires_grad_(True)
        self.theta_ref = self.theta.detach().clone()
        with torch.no_grad():  # the reference never changes: its leaf log-probs once, for the exact KL
            self.ref_log_probs = task.leaf_log_probs(self.theta_ref)
        self.critic = torch.zeros(task.n_states, dtype=DTYPE, requires_grad=True) if self.spec.needs_critic else None
        self.learner = ToyLearner(self.theta, self.critic)
        self.k = int(cfg.group_size)
        self.n_groups = int(cfg.task.episodes_per_iter) // self.k
        self.budget = cfg.budget.env_steps
        self.norm_len = int(task.spec.length)
        self.policy_loss, self.loss_settings = get_policy_loss(cfg["update"]), loss_settings(cfg)
        self.loss_agg = str(cfg.loss_agg)
        self.kl_estimator, self.kl_in_reward = str(cfg.kl.estimator), bool(cfg.kl.in_reward)
        self.kl_guards = kl_guards(cfg.kl)
        self.kl_ref_target = cfg.kl.target == "ref"
        settings = toy_settings_from_config(cfg)
        self.random_reward, self.log_prompts = settings.reward == "random", settings.log_prompts
        self.dynamic, self.max_draws = bool(cfg.dynamic_sampling), int(cfg.dynamic_sampling_max_draws)
        self.mask_truncated = bool(cfg.mask_truncated)
        self.overlong_cache = None if cfg.overlong_cache is None else int(cfg.overlong_cache)
        self.drawn = None
        self.sequences = 0
        self.tokens = 0
        self._exact: tuple[dict, float] | None = None

    def generators(self):
        return [self.gen]

    def shuffle_generators(self):
        return [self.gen]

    def _draw(self):
        """One generation batch: ``n_groups`` prompts, ``group_size`` responses each, scored
        (the random rewards drawn after the responses; DAPO's overlong penalty added)."""
        task = self.task
        prompts = torch.randint(task.n_prompts, (self.n_groups,), generator=self.gen)
        batch = task.sample(self.theta, prompts.repeat_interleave(self.k), self.gen)
        if self.random_reward:  # drawn after the responses, as many whatever they are
            batch.reward = random_rewards(batch.prompts.shape[0], self.gen)
        if self.overlong_cache is not None:
            batch.reward = batch.reward + overlong_penalty(batch.length, self.norm_len, self.overlong_cache)
        return batch

    def collect(self):
        self._exact = None  # this iteration's exact statistics, computed once after its update
        task = self.task
        if self.dynamic:  # DAPO: informative groups only; every drawn sequence counts
            batch, drawn = dynamic_sample(self._draw, lambda b: b.reward.view(-1, self.k),
                                          lambda b, g: take_groups(b, g, self.k), cat_rows, self.n_groups,
                                          self.max_draws)
            batches = drawn.batches
        else:
            batch = self._draw()
            batches, drawn = [batch], None
        self.drawn = drawn
        prompts = batch.prompts.view(-1, self.k)[:, 0]
        greedy = None
        n = sum(b.prompts.shape[0] for b in batches)
        self.tokens += sum(int(b.length.sum()) for b in batches)
        if self.spec.needs_greedy:
            leaves = task.greedy(self.theta)[prompts]
            greedy = random_rewards(len(prompts), self.gen) if self.random_reward else task.leaf_reward[leaves]
            if self.overlong_cache is not None:
                greedy = greedy + overlong_penalty(task.leaf_len[leaves], self.norm_len, self.overlong_cache)
            n += len(prompts)
            self.tokens += int(task.leaf_len[leaves].sum())
        self.sequences += n
        batch.greedy = greedy
        batch.cost = torch.tensor([n])
        return batch

    def advantage_batch(self, batch) -> AdvantageBatch:
        with torch.no_grad():
            batch.old_logp = gather_logp(self.theta, batch.states, batch.tokens)
            batch.ref_logp = gather_logp(self.theta_ref, batch.states, batch.tokens)
        beta = float(self.kl_beta_now[0])
        penalty = None
        if self.kl_in_reward and beta > 0:  # InstructGPT: per-token penalty folded into the reward
            penalty = beta * kl_estimate(self.kl_estimator, batch.old_logp, batch.ref_logp, **self.kl_guards)
        ab = advantage_batch(self.task, batch, self.critic.detach() if self.critic is not None else None,
                             batch.greedy, self.k if self.spec.needs_groups else None, penalty)
        batch.mask_tm = ab.mask
        return ab

    def truncated(self, batch) -> torch.Tensor:
        """``[N]`` bool: responses that reached the maximal length without EOS."""
        last = batch.tokens.gather(1, (batch.length - 1).clamp(min=0).view(-1, 1)).view(-1)
        return (batch.length >= self.norm_len) & (last != self.task.eos_token)

    def update_batch(self, batch, adv, returns, values) -> UpdateBatch:
        one = lambda x: None if x is None else x.unsqueeze(0)  # noqa: E731
        mask = batch.mask_tm
        if self.mask_truncated:  # TRL's mask_truncated_completions: scored, counted, not in the loss
            mask = mask * (~self.truncated(batch)).to(mask.dtype).view(1, -1)
        return UpdateBatch(adv=one(adv * mask), mask=one(mask), old_logp=one(batch.old_logp), inputs=batch,
                           returns=one(returns), old_values=one(values),
                           kl_target=one(batch.ref_logp if self.kl_ref_target else batch.old_logp))

    def before_update(self, batch, ub):
        """Cosine between this batch's policy-gradient estimate and the exact gradient; with
        ``log_prompts`` also the logits before the update and each prompt's exact success."""
        if self.log_prompts:
            self._before = self.theta.detach().clone()
            self._success_before = self.task.prompt_success(self._before)
        th = self.theta.detach().clone().requires_grad_(True)
        logp = gather_logp(th, batch.states, batch.tokens)
        x = PolicyInputs(logp, batch.old_logp, ub.adv[0], ub.mask[0], agg=self.loss_agg, norm_len=self.norm_len,
                         with_metrics=False)
        loss, _ = self.policy_loss(x, self.loss_settings)
        (g,) = torch.autograd.grad(-loss, th)
        true = self.task.exact_gradient(self.theta.detach())
        den = float(g.norm() * true.norm())
        return [{"grad_cos": float((g * true).sum()) / den if den > 0 else float("nan")}]

    def exact(self) -> tuple[dict, float]:
        """``(exact_stats, exact KL to the reference)`` of the updated policy, computed once per
        iteration (evaluation, adaptive KL and the metric row all read them)."""
        if self._exact is None:
            with torch.no_grad():
                stats = self.task.exact_stats(self.theta.detach(), self.ref_log_probs)
                self._exact = (stats, stats["kl_ref"])
        return self._exact

    def kl_to_reference(self, batch):
        return torch.tensor([self.exact()[1]])

    def evaluate(self, flags):
        return [{"eval_return": self.exact()[0]["J"]}]

    def episode_return(self, p, batch):
        return float(batch.reward.mean())

    def row_extras(self, p, batch, stats, ev, pre, row) -> dict:
        ex, kl_ref = self.exact()
        out = {
            "reward": float(batch.reward.mean()), "gold_reward": None, "kl_ref": kl_ref,
            "response_len": float(batch.length.double().mean()), "tokens": int(self.tokens),
            # toy extras (exact unless named otherwise)
            "grad_cos": pre["grad_cos"], "exact_response_len": ex["response_len"], "wrong_len": ex["wrong_len"],
            "right_len": ex["right_len"], "success": ex["success"], "exact_entropy": ex["entropy"],
        }
        if self.drawn is not None:  # dynamic sampling: generation batches drawn, their groups' zero-std share
            out["sample_draws"], out["zero_std_frac"] = self.drawn.draws, self.drawn.zero_std_frac
        if self.mask_truncated:
            out["truncated_frac"] = float(self.truncated(batch).double().mean())
        for x, j in enumerate(ex["J_prompt"]):
            out[f"J_prompt{x}"] = j
        if self.log_prompts:
            sizes = self.task.prompt_update_norms(self._before, self.theta)
            for x in range(self.task.n_prompts):
                out[prompt_column("success_prompt", x)] = self._success_before[x]
                out[prompt_column("update_prompt", x)] = float(sizes[x])
        return out

    def summary_extra(self, p) -> dict:
        return {"sequences": self.sequences, "tokens": self.tokens, "env_steps_unit": "sampled sequences",
                "toy_spec": repr(self.task.spec)}

    def on_finish(self, p, run, iteration) -> None:
        """The final policy for ``mode=probe`` (``probe.checkpoint=<run dir>``), as
        ``policy.safetensors`` through :mod:`harness.io.checkpoint` (no pickles)."""
        tensors = {"theta": self.theta.detach(), "theta_ref": self.theta_ref}
        if self.critic is not None:
            tensors["critic"] = self.critic.detach()
        ckpt.save(run.path / POLICY_FILE, tensors, {"iteration": iteration, "spec": repr(self.task.spec)})

    def postfix(self, batch, rows):
        return {"J": f"{rows[0]['eval_return']:.3f}"} if rows and rows[0].get("eval_return") is not None else {}

    def state(self):
        return {}, {"sequences": int(self.sequences), "tokens": int(self.tokens)}

    def load_state(self, tensors, meta):
        seqs, toks = meta.get("sequences"), meta.get("tokens")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (seqs, toks)):
            raise ckpt.CheckpointError(f"toy source state: sequences {seqs!r}, tokens {toks!r}")
        self.sequences, self.tokens = seqs, toks


def train(cfg: DictConfig, runs: list[RunDir]) -> None:
    validate_toy(cfg)
    # tiny tensors: intra-op threads only add synchronisation (as for control)
    torch.set_num_threads(int(cfg.threads or 1))
    task = build_task(cfg)
    train_members(cfg, runs, lambda c, rs: ToySource(c, task), "toy")
