"""The one training loop, over a rollout source per task family (control, LM, toy).

One iteration, the same for every task and estimator (the loop asks the
:class:`~harness.estimators.EstimatorSpec` what it needs and never its name):

1. each member's learning rate (``anneal_lr``: linear to 0 over the member's *own* budget);
2. ``source.collect()``: one rollout, with each member's budget cost (env steps, sampled tokens
   or sampled sequences: :attr:`Source.cost_unit`);
3. ``source.advantage_batch(ro)`` -> ``spec(batch, params)`` -> advantages (and critic targets);
4. :func:`harness.train.update.update` on ``source.update_batch(...)``;
5. per member: adaptive KL beta, divergence guard, budget, evaluation schedule, metric row
   (common columns here, the family's own from ``source.row_extras``; appended to the run and
   handed to the ``logger``, :mod:`harness.io.trackers`), finish, checkpoint, flush.

Seeds are a leading population axis ``P`` (control and toy: batched weights; LM: ``P = 1``, the
members train one after another). Everything per member is the member's own: learning-rate
schedule, adaptive KL beta, evaluation schedule, budget, divergence. A member that stops is
frozen (weights and Adam state kept) while its neighbours go on.

Checkpoints (``checkpoint_every``) are written and restored once for every family by
:mod:`.checkpointing`, which the loop hands its state (:class:`~.checkpointing.Checkpointed`); the
members are handed to loops as one population or one by one, in worker processes or not, by
:mod:`.workers`.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..estimators import AdvantageBatch, EstimatorParams
from ..io import RunDir
from ..io.trackers import NoLog, make_logger
from ..losses import adaptive_kl_beta
from ..plan import RunPlan
from . import checkpointing
from .update import MemberOptimizer, Members, UpdateBatch, UpdateSettings, update

log = logging.getLogger("harness")


FLUSH_EVERY = 10  # iterations between metrics.parquet rewrites (and at every checkpoint) ...
FLUSH_SECONDS = 1.0  # ... and at least this long after the last one: a run of 6-10 ms iterations (a2c
# on CartPole, 5 members a worker) rewrote its members' files every 60-100 ms (2-5 ms each) ...
FLUSH_SHARE = 0.1  # ... and longer when the last rewrite took more than this share of FLUSH_SECONDS: a
# toy population of 120 members rewrote 120 files (about 0.3 s) every second


def flush_due(iteration: int, last_flush: float, cost: float = 0.0) -> bool:
    """Whether metrics.parquet is rewritten after ``iteration``: every ``FLUSH_EVERY`` iterations,
    once ``FLUSH_SECONDS`` have passed since the last rewrite began (``time.perf_counter()``
    ``last_flush``), or ``cost / FLUSH_SHARE`` seconds where that rewrite took ``cost`` seconds (a
    population's files: the rewrites stay a tenth of the time). The rule of the training loop and
    of the SB3 and TRL references."""
    wait = max(FLUSH_SECONDS, cost / FLUSH_SHARE) if FLUSH_SECONDS > 0 else 0.0
    return iteration % FLUSH_EVERY == 0 and time.perf_counter() - last_flush >= wait


class Diverged(FloatingPointError):
    """Raised by a source when its rollout or evaluation cannot go on (e.g. NaN logits)."""


class Source:
    """A task family's rollout source. Subclasses set the attributes and implement the methods."""

    P: int
    seeds: list[int]
    learner: Any  # harness.train.update.Learner
    cost_unit: str  # "step" | "tok" | "seq": what budget and env_steps count
    budget: int | None  # in cost units (budget.env_steps or budget.tokens)
    norm_len: int | None  # Dr. GRPO's constant L for loss_agg=seq_mean_token_sum_norm
    uses_groups: bool  # group_size shapes the batch (logged as a column)
    fused_adam: bool = False
    kl_beta_now: torch.Tensor  # [P], set by the loop before each collect

    def generators(self) -> list[torch.Generator]:
        """The source's generators: minibatch order (``shuffle_generators``) and sampling; checkpointed."""
        raise NotImplementedError

    def shuffle_generators(self) -> list[torch.Generator]:
        raise NotImplementedError

    def collect(self):
        """One rollout with ``.cost`` (``[P]`` long: budget units taken per member)."""
        raise NotImplementedError

    def advantage_batch(self, ro) -> AdvantageBatch:
        """The estimator's input, ``[T, P*B]`` (members side by side)."""
        raise NotImplementedError

    def update_batch(self, ro, adv: torch.Tensor, returns, values) -> UpdateBatch:
        """The update step's input from the estimator's output (``[T, P*B]``)."""
        raise NotImplementedError

    def kl_to_reference(self, ro) -> torch.Tensor | None:
        """``[P]`` KL of the sampling policy to the reference (``kl.target=ref``), or None."""
        return None

    def before_update(self, ro, ub: UpdateBatch) -> list[dict]:
        """Per-member columns measured before the update (e.g. the toy's gradient cosine)."""
        return [{} for _ in range(self.P)]

    def evaluate(self, flags: list[bool]) -> list[dict | None]:
        """Evaluation columns (``eval_return`` ...) for the members with ``flags[p]``."""
        raise NotImplementedError

    def initial_evaluation(self) -> dict:
        """Summary fields scored before the first update (LM: the SFT policy)."""
        return {}

    def episode_return(self, p: int, ro) -> float | None:
        raise NotImplementedError

    def row_extras(self, p: int, ro, stats: dict, ev: dict | None, pre: dict, row: dict) -> dict:
        """The family's own metric columns for member ``p`` (``row``: the common ones so far)."""
        return {}

    def summary_extra(self, p: int) -> dict:
        return {}

    def on_finish(self, p: int, run: RunDir, iteration: int) -> None:
        """Write the member's final artefacts (before summary.json)."""

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The source's own checkpoint state (tensors, JSON values)."""
        return {}, {}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        pass

    def postfix(self, ro, rows: list[dict]) -> dict:
        """The progress bar's ``ret``: the mean of this iteration's episode returns over the members;
        an iteration without one says so (a mean of nothing is no return of 0)."""
        returns = [r["episode_return"] for r in rows if r.get("episode_return") is not None]
        return {"ret": f"{sum(returns) / len(returns):.3f}" if returns else "no episode ended"}

    def close(self) -> None:
        pass


def common_fields(cfg, uses_groups: bool) -> dict:
    """The metric row's columns that every iteration of a run repeats (its settings), as logged."""
    return {
        "task": cfg.task.name, "estimator": cfg.estimator, "gamma": float(cfg.gamma),
        "gae_lambda": float(cfg.gae_lambda), "clip_eps": None if cfg.clip_eps is None else float(cfg.clip_eps),
        "n_steps": int(cfg.n_steps), "group_size": int(cfg.group_size) if uses_groups else None,
        "update": str(cfg["update"]), "loss_agg": str(cfg.loss_agg),
    }


@dataclass(frozen=True)
class RowHead:
    """Where a trainer's metric row stands: which run (``run_id``, ``seed``) and ``iteration``, its
    budget use ``steps`` and ``wall`` time, its returns (``episode_return``, ``eval_return``; None
    where there is none), and the KL coefficient ``kl_beta`` and learning rate ``lr`` it used."""

    run_id: str
    seed: int
    iteration: int
    steps: int
    wall: float
    episode_return: float | None
    eval_return: float | None
    kl_beta: float
    lr: float


def metric_row(head: RowHead, common: dict) -> dict:
    """The columns every trainer's metric row starts with (the harness's loop, ``harness.reference``):
    ``head``'s run, iteration, budget use, wall time, returns and coefficients, and its settings
    (``common``: :func:`common_fields`), in the order ``metrics.parquet`` has always held them."""
    c, h = common, head
    return {"run_id": h.run_id, "task": c["task"], "estimator": c["estimator"], "seed": h.seed,
            "iteration": h.iteration, "env_steps": h.steps, "wall_time_s": h.wall,
            "episode_return": h.episode_return, "eval_return": h.eval_return, "gamma": c["gamma"],
            "gae_lambda": c["gae_lambda"], "clip_eps": c["clip_eps"], "kl_beta": h.kl_beta,
            "n_steps": c["n_steps"], "group_size": c["group_size"], "lr": h.lr, "update": c["update"],
            "loss_agg": c["loss_agg"]}


def eval_due(iteration: int, steps: int, last_eval: int, done: bool, eval_every: int,
             eval_every_steps: int | None) -> bool:
    """Whether a run evaluates after ``iteration`` (its budget use now ``steps``, at its last
    evaluation ``last_eval``): every ``eval_every`` iterations, each time ``steps`` crosses a
    multiple of ``eval_every_steps``, and at its end (``done``) when evaluation is on."""
    crossed = bool(eval_every_steps) and steps // eval_every_steps > last_eval // eval_every_steps
    periodic = eval_every > 0 and iteration % eval_every == 0
    last = done and (eval_every > 0 or bool(eval_every_steps))
    return periodic or crossed or last


@dataclass
class IterationRecord:
    """What one iteration produced for every member, from which each member's metric row is made:
    the rollout ``ro``, the update's ``stats``, each member's evaluation (``evals[p]``, None where it
    did not evaluate) and its source's pre-update extras ``pre[p]``, and the learning rates ``lr`` and
    KL coefficients ``kl_beta`` the update used (``[P]``)."""

    iteration: int
    wall: float
    ro: Any
    stats: dict
    evals: list[dict | None]
    pre: list[dict]
    lr: torch.Tensor
    kl_beta: torch.Tensor


class Loop:
    """Train ``runs`` (one per member of ``source``) to their budgets. Its state is what a checkpoint
    saves and restores (:class:`harness.train.checkpointing.Checkpointed`)."""

    def __init__(self, plan: RunPlan, source: Source, runs: list[RunDir]):
        cfg = plan.cfg
        self.cfg, self.source, self.runs, self.family = cfg, source, runs, plan.kind.name
        self.P = source.P
        self.spec = plan.estimator
        self.est_params = EstimatorParams.from_cfg(cfg)
        self.settings = UpdateSettings.from_plan(plan, source.norm_len)
        self.learner = source.learner
        self.opt = MemberOptimizer(self.learner.params, self.P, float(cfg.lr), fused=source.fused_adam)
        self.kl_beta = torch.full((self.P,), float(cfg.kl.beta), dtype=torch.float64)
        self.cost = torch.zeros(self.P, dtype=torch.long)
        self.active = torch.ones(self.P, dtype=torch.bool)
        self.writable = torch.tensor([getattr(r, "writable", True) for r in runs], dtype=torch.bool)
        self.outcome: list[dict | None] = [None] * self.P
        self.last_eval = [0] * self.P
        self.init: dict = {}
        self.logger = NoLog()  # run() opens cfg.logger's
        self.checkpoint_every = int(cfg.get("checkpoint_every", 0) or 0)
        # plain copies of what the hot loop reads
        self.lr0 = float(cfg.lr)
        self.anneal = bool(cfg.anneal_lr) and source.budget is not None
        self.max_iters = cfg.budget.iterations
        self.eval_every = int(cfg.eval_every)
        self.eval_every_steps = cfg.eval_every_steps
        self.common = common_fields(cfg, source.uses_groups)
        self.kl_adaptive = bool(cfg.kl.adaptive)

    # ------------------------------------------------------------------ schedules
    def member_lr(self) -> torch.Tensor:
        """``lr`` of each member this iteration: annealed linearly by its own budget use."""
        if not self.anneal:
            return torch.full((self.P,), self.lr0, dtype=torch.float64)
        budget = self.source.budget
        return torch.tensor([self.lr0 * max(1.0 - float(c) / budget, 0.0) for c in self.cost.tolist()],
                            dtype=torch.float64)

    def eval_flags(self, iteration: int, done: torch.Tensor, ok: list[bool]) -> list[bool]:
        """Per member: every ``eval_every`` iterations, each time its budget use crosses a multiple
        of ``eval_every_steps``, and at its end (when evaluation is on); never after divergence."""
        flags = []
        for p in range(self.P):
            steps = int(self.cost[p])
            due = eval_due(iteration, steps, self.last_eval[p], bool(done[p]), self.eval_every, self.eval_every_steps)
            flags.append(bool(self.active[p]) and ok[p] and due)
            if flags[-1]:
                self.last_eval[p] = steps
        return flags

    # ------------------------------------------------------------------ loop
    def run(self, resume: dict | None = None) -> None:
        cfg, src = self.cfg, self.source
        budget, max_iters = src.budget, self.max_iters
        t0 = time.perf_counter() - (resume["wall_time_s"] if resume else 0.0)
        iteration = resume["iteration"] if resume else 0
        flushed, flush_cost = time.perf_counter(), 0.0
        if not resume:
            self.init = src.initial_evaluation() if (self.eval_every > 0 or self.eval_every_steps) else {}
        bar = tqdm(total=budget or max_iters, disable=not cfg.progress, unit=src.cost_unit if budget else "it",
                   desc=f"{cfg.task.name}/{cfg.estimator} seed={src.seeds[0]}" + (f"+{self.P - 1}" if self.P > 1 else ""),
                   dynamic_ncols=True, leave=False)
        try:
            self.logger = make_logger(cfg, self.runs)  # logger=tensorboard: the rows the runs start with, again
            while bool((self.active & self.writable).any()):
                iteration += 1
                lr = self.member_lr()
                src.kl_beta_now = self.kl_beta  # the in-reward penalty's beta (LM, toy)
                try:
                    ro = src.collect()
                except Diverged as exc:  # the last update left weights that cannot be sampled
                    self._stop_all(f"{exc} at iteration {iteration}", time.perf_counter() - t0)
                    break
                self.cost += ro.cost.long() * self.active
                batch = src.advantage_batch(ro)
                batch.members = self.P  # [T, P*B]: batch-wide statistics stay per member
                out = self.spec(batch, self.est_params)
                ub = src.update_batch(ro, out.advantages, out.returns, batch.values)
                pre = src.before_update(ro, ub)
                beta_used = self.kl_beta.clone()
                stats = update(self.learner, self.opt, ub, self.settings,
                               Members(src.shuffle_generators(), self.active, lr, self.kl_beta))
                reasons = self._divergence(stats)
                self._adapt_kl(ro, stats, reasons)
                done = torch.zeros(self.P, dtype=torch.bool)
                if budget is not None:
                    done |= self.cost >= budget
                if max_iters is not None:
                    done |= torch.tensor(iteration >= max_iters)
                flags = self.eval_flags(iteration, done, [r is None for r in reasons])
                evals: list[dict | None] = [None] * self.P
                if any(flags):
                    try:
                        evals = src.evaluate(flags)
                    except Diverged as exc:
                        reasons = [f"{exc} (evaluation)" if f else r for f, r in zip(flags, reasons)]
                wall = time.perf_counter() - t0
                rec = IterationRecord(iteration, wall, ro, stats, evals, pre, lr, beta_used)
                rows = []
                for p, r in enumerate(self.runs):
                    if not self.active[p]:
                        continue
                    row = self._row(p, rec)
                    rows.append(row)
                    r.log(row)
                    self.logger.write(p, row)
                    if reasons[p] is not None or done[p]:
                        status = "diverged" if reasons[p] is not None else "completed"
                        reason = f"{reasons[p]} at iteration {iteration}" if reasons[p] is not None else None
                        self._finish(p, status, reason, wall, iteration)
                if self.checkpoint_every and iteration % self.checkpoint_every == 0:
                    checkpointing.save(self, iteration, wall)
                elif flush_due(iteration, flushed, flush_cost):
                    flushed = time.perf_counter()
                    for p, r in enumerate(self.runs):
                        if self.active[p]:
                            r.flush()
                    flush_cost = time.perf_counter() - flushed
                bar.n = min(int(self.cost.max()), budget) if budget else iteration
                bar.set_postfix(**src.postfix(ro, rows), refresh=False)
                bar.refresh()
        finally:
            bar.close()
            self.logger.close()
            src.close()

    def _stop_all(self, reason: str, wall: float) -> None:
        for p in range(self.P):
            if self.active[p]:
                self._finish(p, "diverged", reason, wall, None)

    def _finish(self, p: int, status: str, reason: str | None, wall: float, iteration: int | None) -> None:
        self.active[p] = False
        self.outcome[p] = {"status": status, "reason": reason, "wall_time_s": wall}
        r = self.runs[p]
        if getattr(r, "writable", True):
            self.source.on_finish(p, r, iteration)
        self.logger.close_member(p)  # its events on disk before summary.json marks it finished
        r.finish(status, reason, wall, extra={**self.source.summary_extra(p), **self.init} or None)
        r.remove_checkpoint()  # finished: summary.json is the record now

    def _divergence(self, stats: dict) -> list[str | None]:
        """Per member: ``non-finite loss | grad_norm | parameters`` or None."""
        codes = stats["nonfinite"]
        finite_params = self.learner.finite_members()
        out = []
        for p in range(self.P):
            if not self.active[p]:
                out.append(None)
            elif int(codes[p]) == 1:
                out.append("non-finite loss")
            elif int(codes[p]) == 2:
                out.append("non-finite grad_norm")
            elif not bool(finite_params[p]):
                out.append("non-finite parameters")
            else:
                out.append(None)
        return out

    def _adapt_kl(self, ro, stats: dict, reasons: list[str | None]) -> None:
        """The PPO paper's adaptive beta, per member, from the KL to the penalty's target."""
        if not self.kl_adaptive:
            return
        measured = self.source.kl_to_reference(ro) if self.cfg.kl.target == "ref" else stats.get("approx_kl")
        if measured is None:
            return
        target = float(self.cfg.kl.kl_target)
        for p in range(self.P):
            if self.active[p] and reasons[p] is None:
                self.kl_beta[p] = adaptive_kl_beta(float(self.kl_beta[p]), float(measured[p]), target)

    def _row(self, p: int, rec: IterationRecord) -> dict:
        """Member ``p``'s metric row of the iteration ``rec``."""
        ro, stats, ev, pre = rec.ro, rec.stats, rec.evals[p], rec.pre[p]

        def get(k):
            if k not in stats:
                return None
            v = float(stats[k][p])
            return v if math.isfinite(v) or k in ("loss", "policy_loss", "grad_norm") else None

        head = RowHead(self.runs[p].run_id, self.source.seeds[p], rec.iteration, int(self.cost[p]),
                       float(rec.wall), self.source.episode_return(p, ro),
                       None if ev is None else ev.get("eval_return"), float(rec.kl_beta[p]), float(rec.lr[p]))
        row = metric_row(head, self.common)
        row.update({
            "policy_loss": get("policy_loss"), "entropy": get("entropy"), "approx_kl": get("approx_kl"),
            "clip_frac": get("clip_frac"), "grad_norm": get("grad_norm"), "adv_mean": get("adv_mean"),
            "adv_std": get("adv_std"), "value_loss": get("value_loss"), "explained_variance": get("explained_variance"),
            "value_grad_norm": get("value_grad_norm"), "kl_loss": get("kl_loss"), "adv_within_std": get("adv_within_std"),
        })
        row.update(self.source.row_extras(p, ro, stats, ev, pre, row))
        return row
