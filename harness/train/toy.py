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
prompt. With ``mode=probe`` the app calls :func:`harness.probes.run_probe` instead.

Population members train as one batched population (:func:`harness.train.workers.train_population`):
member ``p`` is the lone run of seed ``seed + p`` (its own logits ``theta[p]``, critic, generator,
budget, learning rate, KL beta); each member samples, draws its random rewards and shuffles its
minibatches from its own generator in the order of its lone run (a loop over the members), the
advantages, the update and the batch's policy-gradient estimate run on all members' ``[P, ...]``
tensors at once, and the exact statistics and gradients are worked out member by member. A member
equals its lone run to float rounding (``tests/test_toy.py``: the same samples, every estimator,
with annealing and adaptive KL, and a member that diverges). With ``dynamic_sampling`` a member's
batch can end short of the others' (``dynamic_sampling_max_draws``), so such runs train one after
another.
"""
from __future__ import annotations

import dataclasses

import torch

from ..estimators import AdvantageBatch, kl_estimate, kl_guards
from ..config import toy_settings_from_config
from ..io import RunDir
from ..io.schema import prompt_column
from ..io import checkpoint as ckpt
from ..losses import PolicyInputs
from ..plan import RunPlan
from ..tasks.toy import DTYPE, ToyBatch, ToyTask, advantage_batch, build_task, random_rewards
from .loop import Source
from .workers import train_members, train_one_by_one
from .sampling import cat_rows, dynamic_sample, overlong_penalty, take_groups
from .update import UpdateBatch, clip_grad_groups, clip_grad_norms, norms_finite

POLICY_FILE = "policy.safetensors"  # the final policy (older runs: policy.pt, a torch.save dict)


def gather_logp(theta: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t | s_t)`` time-major: ``[L, N]`` from a table ``theta [S, V]`` and batch-major
    states/tokens ``[N, L]``; ``[P, L, N]`` from a population's tables ``[P, S, V]`` and ``[P, N, L]``."""
    return _time_major(_rows(torch.log_softmax(theta, dim=-1), states, tokens))


def _rows(logpi: torch.Tensor, states: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``logpi[states]`` (with ``tokens``: entries ``logpi[states, tokens]``) of one table
    ``[S, V]`` or of each member's own table ``[P, S, V]`` (``states [P, N, L]``), batch-major."""
    if logpi.dim() == 2:
        return logpi[states] if tokens is None else logpi[states, tokens]
    rows = torch.arange(logpi.shape[0]).view(-1, 1, 1)
    return logpi[rows, states] if tokens is None else logpi[rows, states, tokens]


def _time_major(x: torch.Tensor) -> torch.Tensor:
    """Batch-major ``[N, L]`` (or ``[P, N, L]``) as a time-major view ``[L, N]`` (``[P, L, N]``)."""
    return x.transpose(-1, -2)


def toy_settings(cfg) -> dict:
    node = cfg.get("toy") if "toy" in cfg else None
    node = node or {}
    return {"init_scale": float(node.get("init_scale", 0.0) or 0.0),
            "init_seed": int(node.get("init_seed", 0) or 0)}


class ToyLearner:
    """Each member's logits table ``theta [P, S, V]`` and optional tabular critic ``[P, S]``."""

    def __init__(self, theta: torch.Tensor, critic: torch.Tensor | None):
        self.theta, self.critic = theta, critic
        self.population = theta.shape[0]
        self.params = [theta] + ([critic] if critic is not None else [])

    def named_params(self):
        return [("theta", self.theta)] + ([("critic", self.critic)] if self.critic is not None else [])

    def forward(self, batch, idx, need_entropy):
        """``batch.states`` / ``tokens`` / ``mask`` ``[P, N, L]``; ``idx [P, b]``: each member's
        sequences of the minibatch."""
        st, tk, mk = batch.states, batch.tokens, batch.mask
        if idx is not None:
            rows = idx.unsqueeze(-1).expand(-1, -1, st.shape[-1])
            st, tk, mk = st.gather(1, rows), tk.gather(1, rows), mk.gather(1, rows)
        logpi = torch.log_softmax(self.theta, dim=-1)
        logp = _time_major(_rows(logpi, st, tk))
        entropy = None
        if need_entropy:  # the entropy of pi(. | s_t) at every sampled state
            lp = _rows(logpi, st)  # [P, b, L, V]
            entropy = _time_major(-(lp.exp() * lp).sum(-1))
        values = None
        if self.critic is not None:
            values = _time_major(self.critic.gather(1, st.reshape(st.shape[0], -1)).view(st.shape) * mk)
        return logp, entropy, values

    def clip_grads(self, max_norm, per_network):
        if self.population == 1:  # a lone run: its tensors as they are (no unbinding of [1, ...] blocks)
            return clip_grad_groups([[self.theta], [self.critic] if self.critic is not None else []], max_norm,
                                    per_network)
        grads = [(net, p.grad) for net, p in enumerate(self.params) if p.grad is not None]
        return clip_grad_norms([g for _, g in grads], max_norm, per_network, self.population,
                               first_net=[net for net, _ in grads])

    @torch.no_grad()
    def finite_members(self) -> torch.Tensor:
        """``[P]``: every weight of member ``p`` finite (fused norms first, :func:`~harness.train.update.norms_finite`)."""
        ok = torch.ones(self.population, dtype=torch.bool)
        if norms_finite(self.params):
            return ok
        for prm in self.params:
            ok &= torch.isfinite(prm.reshape(self.population, -1)).all(dim=1)
        return ok


def stack_members(batches: list[ToyBatch]) -> ToyBatch:
    """The members' batches ``[N, ...]`` stacked ``[P, N, ...]`` (every member has ``N`` rows)."""
    first = batches[0]
    return dataclasses.replace(first, **{f.name: torch.stack([getattr(b, f.name) for b in batches])
                                         for f in dataclasses.fields(first)})


def flat_members(batch: ToyBatch) -> ToyBatch:
    """A stacked batch ``[P, N, ...]`` as ``[P * N, ...]`` rows, member-major."""
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).flatten(0, 1)
                                         for f in dataclasses.fields(batch)})


class ToySource(Source):
    cost_unit = "seq"
    uses_groups = True

    def __init__(self, plan: RunPlan, task: ToyTask, runs: list[RunDir] | None = None):
        """``runs``: the members (a :class:`~harness.train.workers.ShadowRun` for one that only rides
        along); None: the lone run of ``plan.cfg.seed``."""
        cfg = plan.cfg
        self.cfg, self.task = cfg, task
        self.seeds = [int(cfg.seed)] if runs is None else [int(r.cfg.seed) for r in runs]
        self.P = len(self.seeds)
        self.spec = plan.estimator
        self.gens = [torch.Generator().manual_seed(s) for s in self.seeds]
        ts = toy_settings(cfg)
        init = task.init_logits(ts["init_scale"], ts["init_seed"])  # the same start for every member
        self.theta = init.expand(self.P, *init.shape).clone().requires_grad_(True)
        self.theta_ref = self.theta.detach().clone()
        with torch.no_grad():  # the reference never changes: its leaf log-probs once, for the exact KL
            self.ref_log_probs = task.leaf_log_probs(init)
        self.critic = (torch.zeros(self.P, task.n_states, dtype=DTYPE, requires_grad=True)
                       if self.spec.needs_critic else None)
        self.learner = ToyLearner(self.theta, self.critic)
        self.k = int(cfg.group_size)
        self.n_groups = int(cfg.task.episodes_per_iter) // self.k
        self.budget = cfg.budget.env_steps
        self.norm_len = int(task.spec.length)
        self.policy_loss, self.loss_settings = plan.loss, plan.loss_settings
        self.loss_agg = str(cfg.loss_agg)
        self.kl_estimator, self.kl_in_reward = str(cfg.kl.estimator), bool(cfg.kl.in_reward)
        self.kl_guards = kl_guards(cfg.kl)
        self.kl_ref_target = cfg.kl.target == "ref"
        settings = toy_settings_from_config(cfg)
        self.random_reward, self.log_prompts = settings.reward == "random", settings.log_prompts
        self.dynamic, self.max_draws = bool(cfg.dynamic_sampling), int(cfg.dynamic_sampling_max_draws)
        if self.dynamic and self.P > 1:
            raise ValueError("dynamic_sampling: a member's batch can end short of the others'; "
                             "train such members one after another (harness.train.toy.train does)")
        self.mask_truncated = bool(cfg.mask_truncated)
        self.overlong_cache = None if cfg.overlong_cache is None else int(cfg.overlong_cache)
        self.drawn = [None] * self.P
        self.sequences = [0] * self.P
        self.tokens = [0] * self.P
        self._exact: list[tuple[dict, float]] | None = None

    def generators(self):
        return self.gens

    def shuffle_generators(self):
        return self.gens

    def _draw(self, p: int):
        """One generation batch of member ``p``: ``n_groups`` prompts, ``group_size`` responses each,
        scored (the random rewards drawn after the responses; DAPO's overlong penalty added)."""
        task, gen = self.task, self.gens[p]
        prompts = torch.randint(task.n_prompts, (self.n_groups,), generator=gen)
        batch = task.sample(self.theta.detach()[p], prompts.repeat_interleave(self.k), gen)
        if self.random_reward:  # drawn after the responses, as many whatever they are
            batch.reward = random_rewards(batch.prompts.shape[0], gen)
        if self.overlong_cache is not None:
            batch.reward = batch.reward + overlong_penalty(batch.length, self.norm_len, self.overlong_cache)
        return batch

    def _collect_member(self, p: int) -> tuple[ToyBatch, torch.Tensor | None, int]:
        """Member ``p``'s batch, its greedy scores (ReMax) and the sequences it sampled."""
        task = self.task
        if self.dynamic:  # DAPO: informative groups only; every drawn sequence counts
            batch, drawn = dynamic_sample(lambda: self._draw(p), lambda b: b.reward.view(-1, self.k),
                                          lambda b, g: take_groups(b, g, self.k), cat_rows, self.n_groups,
                                          self.max_draws)
            batches = drawn.batches
        else:
            batch = self._draw(p)
            batches, drawn = [batch], None
        self.drawn[p] = drawn
        prompts = batch.prompts.view(-1, self.k)[:, 0]
        greedy = None
        n = sum(b.prompts.shape[0] for b in batches)
        self.tokens[p] += sum(int(b.length.sum()) for b in batches)
        if self.spec.needs_greedy:
            leaves = task.greedy(self.theta.detach()[p])[prompts]
            greedy = random_rewards(len(prompts), self.gens[p]) if self.random_reward else task.leaf_reward[leaves]
            if self.overlong_cache is not None:
                greedy = greedy + overlong_penalty(task.leaf_len[leaves], self.norm_len, self.overlong_cache)
            n += len(prompts)
            self.tokens[p] += int(task.leaf_len[leaves].sum())
        self.sequences[p] += n
        return batch, greedy, n

    def collect(self):
        """Every member's batch, stacked ``[P, N, ...]``; ``greedy [P * n_groups]`` member-major."""
        self._exact = None  # this iteration's exact statistics, computed once after its update
        members = [self._collect_member(p) for p in range(self.P)]
        batch = stack_members([b for b, _, _ in members])
        batch.greedy = None if members[0][1] is None else torch.cat([g for _, g, _ in members])
        batch.cost = torch.tensor([n for _, _, n in members])
        return batch

    def advantage_batch(self, batch) -> AdvantageBatch:
        with torch.no_grad():
            batch.old_logp = gather_logp(self.theta, batch.states, batch.tokens)  # [P, L, N]
            batch.ref_logp = gather_logp(self.theta_ref, batch.states, batch.tokens)
        P, L, N = batch.old_logp.shape
        side_by_side = lambda x: x.transpose(0, 1).reshape(L, P * N)  # noqa: E731  [P, L, N] -> [L, P * N]
        penalty = None
        beta = self.kl_beta_now.to(DTYPE)
        if self.kl_in_reward and bool((beta > 0).any()):  # InstructGPT: per-token penalty folded into the reward
            k = kl_estimate(self.kl_estimator, batch.old_logp, batch.ref_logp, **self.kl_guards)
            b = beta.view(P, 1, 1)
            penalty = side_by_side(torch.where(b > 0, b * k, 0.0))  # a member at beta 0 has none
        ab = advantage_batch(self.task, flat_members(batch), self.critic.detach() if self.critic is not None else None,
                             batch.greedy, self.k if self.spec.needs_groups else None, penalty)
        batch.mask_tm = ab.mask
        return ab

    def truncated(self, batch) -> torch.Tensor:
        """``[..., N]`` bool: responses that reached the maximal length without EOS."""
        last = batch.tokens.gather(-1, (batch.length - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return (batch.length >= self.norm_len) & (last != self.task.eos_token)

    def update_batch(self, batch, adv, returns, values) -> UpdateBatch:
        P, L, N = batch.old_logp.shape
        members = lambda x: None if x is None else x.reshape(L, P, N).transpose(0, 1)  # noqa: E731  [P, L, N]
        mask = members(batch.mask_tm)
        if self.mask_truncated:  # TRL's mask_truncated_completions: scored, counted, not in the loss
            batch.cut = self.truncated(batch)  # [P, N], also each member's truncated_frac
            mask = mask * (~batch.cut).to(mask.dtype).view(P, 1, N)
        return UpdateBatch(adv=members(adv) * mask, mask=mask, old_logp=batch.old_logp, inputs=batch,
                           returns=members(returns), old_values=members(values),
                           kl_target=batch.ref_logp if self.kl_ref_target else batch.old_logp)

    def before_update(self, batch, ub):
        """Cosine between each member's policy-gradient estimate on this batch and the exact
        gradient; with ``log_prompts`` also the logits before the update and each prompt's exact
        success."""
        if self.log_prompts:
            self._before = self.theta.detach().clone()
            self._success_before = [self.task.prompt_success(t) for t in self._before]
        th = self.theta.detach().clone().requires_grad_(True)
        logp = gather_logp(th, batch.states, batch.tokens)
        x = PolicyInputs(logp, batch.old_logp, ub.adv, ub.mask, agg=self.loss_agg, norm_len=self.norm_len,
                         with_metrics=False)
        loss, _ = self.policy_loss(x, self.loss_settings)
        (g,) = torch.autograd.grad(-loss.sum(), th)  # members' losses are apart: each its own gradient
        exact = self.task.exact_gradient(self.theta.detach())  # [P, S, V], each member's own
        out = []
        for p in range(self.P):
            true = exact[p]
            den = float(g[p].norm() * true.norm())
            out.append({"grad_cos": float((g[p] * true).sum()) / den if den > 0 else float("nan")})
        return out

    def exact(self) -> list[tuple[dict, float]]:
        """Per member ``(exact_stats, exact KL to the reference)`` of the updated policy, computed
        once per iteration (evaluation, adaptive KL and the metric row all read them)."""
        if self._exact is None:
            self._exact = [(stats, stats["kl_ref"])
                           for stats in self.task.exact_stats_of(self.theta.detach(), self.ref_log_probs)]
        return self._exact

    def kl_to_reference(self, batch):
        return torch.tensor([kl for _, kl in self.exact()])

    def evaluate(self, flags):
        return [{"eval_return": ex["J"]} if f else None for (ex, _), f in zip(self.exact(), flags)]

    def episode_return(self, p, batch):
        return float(batch.reward[p].mean())

    def row_extras(self, p, batch, stats, ev, pre, row) -> dict:
        ex, kl_ref = self.exact()[p]
        out = {
            "reward": float(batch.reward[p].mean()), "gold_reward": None, "kl_ref": kl_ref,
            "response_len": float(batch.length[p].double().mean()), "tokens": int(self.tokens[p]),
            # toy extras (exact unless named otherwise)
            "grad_cos": pre["grad_cos"], "exact_response_len": ex["response_len"], "wrong_len": ex["wrong_len"],
            "right_len": ex["right_len"], "success": ex["success"], "exact_entropy": ex["entropy"],
        }
        drawn = self.drawn[p]
        if drawn is not None:  # dynamic sampling: generation batches drawn, their groups' zero-std share
            out["sample_draws"], out["zero_std_frac"] = drawn.draws, drawn.zero_std_frac
        if self.mask_truncated:
            out["truncated_frac"] = float(batch.cut[p].double().mean())
        for x, j in enumerate(ex["J_prompt"]):
            out[f"J_prompt{x}"] = j
        if self.log_prompts:
            sizes = self.task.prompt_update_norms(self._before[p], self.theta.detach()[p])
            for x in range(self.task.n_prompts):
                out[prompt_column("success_prompt", x)] = self._success_before[p][x]
                out[prompt_column("update_prompt", x)] = float(sizes[x])
        return out

    def summary_extra(self, p) -> dict:
        return {"sequences": self.sequences[p], "tokens": self.tokens[p], "env_steps_unit": "sampled sequences",
                "toy_spec": repr(self.task.spec)}

    def on_finish(self, p, run, iteration) -> None:
        """Member ``p``'s final policy for ``mode=probe`` (``probe.checkpoint=<run dir>``), as
        ``policy.safetensors`` through :mod:`harness.io.checkpoint` (no pickles)."""
        tensors = {"theta": self.theta[p].detach().clone(), "theta_ref": self.theta_ref[p].clone()}
        if self.critic is not None:
            tensors["critic"] = self.critic[p].detach().clone()
        ckpt.save(run.path / POLICY_FILE, tensors, {"iteration": iteration, "spec": repr(self.task.spec)})

    def postfix(self, batch, rows):
        return {"J": f"{rows[0]['eval_return']:.3f}"} if rows and rows[0].get("eval_return") is not None else {}

    def state(self):
        return {}, {"sequences": list(self.sequences), "tokens": list(self.tokens)}

    def load_state(self, tensors, meta):
        seqs, toks = meta.get("sequences"), meta.get("tokens")
        if self.P == 1 and not isinstance(seqs, list) and not isinstance(toks, list):  # a lone run's, before lists
            seqs, toks = [seqs], [toks]
        if not (isinstance(seqs, list) and isinstance(toks, list) and len(seqs) == len(toks) == self.P
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seqs + toks)):
            raise ckpt.CheckpointError(f"toy source state: sequences {seqs!r}, tokens {toks!r}")
        self.sequences, self.tokens = list(seqs), list(toks)


def train(plan: RunPlan, runs: list[RunDir]) -> None:
    """Train ``runs`` (claimed and started by :func:`harness.app.run`) as one population (one by one
    with ``dynamic_sampling``), each resuming from its checkpoint if it has one."""
    cfg = plan.cfg
    # tiny tensors: intra-op threads only add synchronisation (as for control)
    torch.set_num_threads(int(cfg.threads or 1))
    task = build_task(cfg)
    make = lambda member, rs: ToySource(member, task, rs)  # noqa: E731
    workers = int(cfg.population_workers or 1)  # default one: a whole toy population is a few small tensors
    if cfg.dynamic_sampling:  # a member's batch can end short of the others' (ToySource)
        train_one_by_one(plan, runs, make, workers=workers)
    else:
        train_members(plan, runs, make, workers=workers)
