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

Seeds are a leading population axis ``P`` (control: batched weights; LM and toy: ``P = 1``, the
members train one after another). Everything per member is the member's own: learning-rate
schedule, adaptive KL beta, evaluation schedule, budget, divergence. A member that stops is
frozen (weights and Adam state kept) while its neighbours go on.

Checkpoints (``checkpoint_every``) are written and restored here, once for every family:
``checkpoint.safetensors`` (:mod:`harness.io.checkpoint`: safetensors + JSON, atomic, never
unpickled) holds the learner's parameters, Adam state, the global and the source's RNG states,
each member's budget, KL beta, outcome and metric rows, and the source's own state. Restore
checks every tensor's name, shape and dtype against the live model and optimizer before it
touches anything; a checkpoint that does not fit is named in a log line and the run restarts
from zero. A resumed run equals an uninterrupted one bit for bit (CPU, same thread count).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import pyarrow as pa
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from ..config import member_configs, task_kind
from ..estimators import AdvantageBatch, EstimatorParams, get_estimator
from ..io import RunDir, atomic_write_bytes, config_hash
from ..io import checkpoint as ckpt
from ..io import schema
from ..io.trackers import NoLog, make_logger
from ..losses import adaptive_kl_beta
from .update import MemberOptimizer, UpdateBatch, UpdateSettings, update

log = logging.getLogger("harness")
CHECKPOINT_FORMAT = 2


FLUSH_EVERY = 10  # iterations between metrics.parquet rewrites (and at every checkpoint)


def _seconds(x: Any) -> bool:
    """A wall time a checkpoint may record: a finite real number >= 0 (not a bool, not a string)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


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
        returns = [r["episode_return"] for r in rows if r.get("episode_return") is not None]
        return {"ret": f"{sum(returns) / max(len(returns), 1):.3f}"}

    def close(self) -> None:
        pass


class Loop:
    """Train ``runs`` (one per member of ``source``) to their budgets."""

    def __init__(self, cfg: DictConfig, source: Source, runs: list[RunDir], family: str):
        self.cfg, self.source, self.runs, self.family = cfg, source, runs, family
        self.P = source.P
        self.spec = get_estimator(cfg.estimator)
        self.est_params = EstimatorParams.from_cfg(cfg)
        self.settings = UpdateSettings.from_cfg(cfg, source.norm_len)
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
        self.common = {
            "task": cfg.task.name, "estimator": cfg.estimator, "gamma": float(cfg.gamma),
            "gae_lambda": float(cfg.gae_lambda), "clip_eps": None if cfg.clip_eps is None else float(cfg.clip_eps),
            "n_steps": int(cfg.n_steps), "group_size": int(cfg.group_size) if source.uses_groups else None,
            "update": str(cfg["update"]), "loss_agg": str(cfg.loss_agg),
        }

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
            crossed = bool(self.eval_every_steps) and (
                steps // self.eval_every_steps > self.last_eval[p] // self.eval_every_steps)
            periodic = self.eval_every > 0 and iteration % self.eval_every == 0
            last = bool(done[p]) and (self.eval_every > 0 or bool(self.eval_every_steps))
            flags.append(bool(self.active[p]) and ok[p] and (periodic or crossed or last))
            if flags[-1]:
                self.last_eval[p] = steps
        return flags

    # ------------------------------------------------------------------ loop
    def run(self, resume: dict | None = None) -> None:
        cfg, src = self.cfg, self.source
        budget, max_iters = src.budget, self.max_iters
        t0 = time.time() - (resume["wall_time_s"] if resume else 0.0)
        iteration = resume["iteration"] if resume else 0
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
                    self._stop_all(f"{exc} at iteration {iteration}", time.time() - t0)
                    break
                self.cost += ro.cost.long() * self.active
                batch = src.advantage_batch(ro)
                batch.members = self.P  # [T, P*B]: batch-wide statistics stay per member
                out = self.spec(batch, self.est_params)
                ub = src.update_batch(ro, out.advantages, out.returns, batch.values)
                pre = src.before_update(ro, ub)
                beta_used = self.kl_beta.clone()
                stats = update(self.learner, self.opt, ub, self.settings, src.shuffle_generators(), self.active,
                               lr, self.kl_beta)
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
                wall = time.time() - t0
                rows = []
                for p, r in enumerate(self.runs):
                    if not self.active[p]:
                        continue
                    row = self._row(p, iteration, wall, ro, stats, evals[p], pre[p],
                                    float(lr[p]), float(beta_used[p]))
                    rows.append(row)
                    r.log(row)
                    self.logger.write(p, row)
                    if reasons[p] is not None or done[p]:
                        status = "diverged" if reasons[p] is not None else "completed"
                        reason = f"{reasons[p]} at iteration {iteration}" if reasons[p] is not None else None
                        self._finish(p, status, reason, wall, iteration)
                if self.checkpoint_every and iteration % self.checkpoint_every == 0:
                    self.save_checkpoint(iteration, wall)
                elif iteration % FLUSH_EVERY == 0:
                    for p, r in enumerate(self.runs):
                        if self.active[p]:
                            r.flush()
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
        if not self.cfg.kl.adaptive:
            return
        measured = self.source.kl_to_reference(ro) if self.cfg.kl.target == "ref" else stats.get("approx_kl")
        if measured is None:
            return
        target = float(self.cfg.kl.kl_target)
        for p in range(self.P):
            if self.active[p] and reasons[p] is None:
                self.kl_beta[p] = adaptive_kl_beta(float(self.kl_beta[p]), float(measured[p]), target)

    def _row(self, p, iteration, wall, ro, stats, ev, pre, lr, beta) -> dict:
        def get(k):
            if k not in stats:
                return None
            v = float(stats[k][p])
            return v if math.isfinite(v) or k in ("loss", "policy_loss", "grad_norm") else None

        run = self.runs[p]
        row = {
            "run_id": run.run_id, "task": self.common["task"], "estimator": self.common["estimator"],
            "seed": self.source.seeds[p], "iteration": iteration, "env_steps": int(self.cost[p]),
            "wall_time_s": float(wall), "episode_return": self.source.episode_return(p, ro),
            "eval_return": None if ev is None else ev.get("eval_return"),
            "gamma": self.common["gamma"], "gae_lambda": self.common["gae_lambda"], "clip_eps": self.common["clip_eps"],
            "kl_beta": beta, "n_steps": self.common["n_steps"], "group_size": self.common["group_size"], "lr": lr,
            "update": self.common["update"], "loss_agg": self.common["loss_agg"],
            "policy_loss": get("policy_loss"), "entropy": get("entropy"), "approx_kl": get("approx_kl"),
            "clip_frac": get("clip_frac"), "grad_norm": get("grad_norm"), "adv_mean": get("adv_mean"),
            "adv_std": get("adv_std"), "value_loss": get("value_loss"), "explained_variance": get("explained_variance"),
            "value_grad_norm": get("value_grad_norm"), "kl_loss": get("kl_loss"), "adv_within_std": get("adv_within_std"),
        }
        row.update(self.source.row_extras(p, ro, stats, ev, pre, row))
        return row

    # ------------------------------------------------------------------ checkpoints
    def _named(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.learner.named_params())

    def checkpoint_state(self, iteration: int, wall: float) -> tuple[dict[str, torch.Tensor], dict]:
        tensors: dict[str, torch.Tensor] = {f"param/{n}": p.data for n, p in self._named()}
        tensors.update(self.opt.state_tensors(self._named()))
        rng_t, rng_m = ckpt.rng_state(self.source.generators())
        tensors.update(rng_t)
        tensors.update({"loop/kl_beta": self.kl_beta, "loop/cost": self.cost, "loop/active": self.active})
        src_t, src_m = self.source.state()
        tensors.update({f"source/{k}": v for k, v in src_t.items()})
        meta = {
            "format": CHECKPOINT_FORMAT, "trainer": self.family, "config_hash": config_hash(self.cfg),
            "seeds": list(self.source.seeds), "iteration": iteration, "wall_time_s": wall,
            "last_eval": [int(x) for x in self.last_eval], "rng": rng_m, "init": self.init, "source": src_m,
            "adam": sorted({k.split("/")[1] for k in tensors if k.startswith("adam/")}),
            "members": [{"run_id": r.run_id, "outcome": self.outcome[p], "rows": r.rows}
                        for p, r in enumerate(self.runs)],
        }
        return tensors, meta

    def save_checkpoint(self, iteration: int, wall: float) -> None:
        """Flush each running writable member's metrics, then write the checkpoint into its run
        directory (one serialisation, one atomic write per directory)."""
        targets = [r for p, r in enumerate(self.runs) if getattr(r, "writable", True) and self.active[p]]
        if not targets:
            return
        for r in targets:
            r.flush()
        data = ckpt.dumps(*self.checkpoint_state(iteration, wall))
        for r in targets:
            atomic_write_bytes(r.path / ckpt.CHECKPOINT_FILE, data)

    def check_checkpoint(self, meta: dict) -> int:
        """Raise :class:`CheckpointError` unless ``meta`` is this population's, with consistent
        metric rows and an iteration within the budget; return its iteration."""
        def bad(msg):
            raise ckpt.CheckpointError(msg)

        k = ckpt.check_header(meta, self.family, CHECKPOINT_FORMAT, config_hash(self.cfg))
        if self.max_iters is not None and k > self.max_iters:
            bad(f"iteration {k} is past budget.iterations={self.max_iters}")
        if meta.get("seeds") != list(self.source.seeds):
            bad(f"saved by a population of seeds {meta.get('seeds')}, this one has {list(self.source.seeds)}")
        if not _seconds(meta.get("wall_time_s")):
            bad(f"wall_time_s {meta.get('wall_time_s')!r} is not a number of seconds >= 0")
        members = meta.get("members")
        if not isinstance(members, list) or len(members) != self.P:
            bad("member list does not match the population")
        for p, m in enumerate(members):
            rows = m.get("rows") if isinstance(m, dict) else None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                bad(f"member {p} rows are not a list of records")
            its = [row.get("iteration") for row in rows]
            if its != list(range(1, len(its) + 1)) or len(its) > k or (m.get("outcome") is None and len(its) != k):
                bad(f"member {p} rows hold iterations {its[:1]}..{its[-1:]} at checkpoint iteration {k}")
            try:  # the rows metrics.parquet will hold: each value of its column's type (the writer's check)
                schema.rows_table(rows)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                bad(f"member {p} rows do not fit the metric schema ({type(exc).__name__}: {exc})".splitlines()[0])
            o = m.get("outcome")
            if o is not None and not (isinstance(o, dict) and o.get("status") in ("completed", "diverged", "failed")
                                      and (o.get("reason") is None or isinstance(o.get("reason"), str))
                                      and _seconds(o.get("wall_time_s"))):
                bad(f"member {p} outcome {o!r} is not {{status: completed|diverged|failed, reason: str|null, "
                    "wall_time_s: seconds}")
        for key in ("last_eval", "rng", "init", "source", "adam"):
            if key not in meta:
                bad(f"missing {key}")
        return k

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict) -> dict:
        """Load a checkpoint into this freshly built loop; returns the resume state. Raises
        :class:`CheckpointError` (nothing written yet; the loop is then unusable) if it does not fit."""
        self.check_checkpoint(meta)
        named = self._named()
        try:
            for key, shape, dtype in (("loop/kl_beta", (self.P,), self.kl_beta.dtype),
                                      ("loop/cost", (self.P,), self.cost.dtype),
                                      ("loop/active", (self.P,), self.active.dtype)):
                t = tensors[key]
                if tuple(t.shape) != shape or t.dtype != dtype:
                    raise ckpt.CheckpointError(f"{key}: saved {tuple(t.shape)} {t.dtype}, expected {shape} {dtype}")
            for name, prm in named:
                t = tensors[f"param/{name}"]
                if t.shape != prm.shape or t.dtype != prm.dtype:
                    raise ckpt.CheckpointError(f"param/{name}: saved {tuple(t.shape)} {t.dtype}, "
                                               f"model has {tuple(prm.shape)} {prm.dtype}")
            extra = {k for k in tensors if k.startswith("param/")} - {f"param/{n}" for n, _ in named}
            if extra:
                raise ckpt.CheckpointError(f"parameters the model does not have: {sorted(extra)[:3]}")
            by_id = {id(p): n for n, p in named}
            with_state = meta["adam"]
            if not isinstance(with_state, list):
                raise ckpt.CheckpointError(f"adam {with_state!r}")
            state = {}
            for i, prm in enumerate(self.learner.params):
                name = by_id[id(prm)]
                prefix = f"adam/{name}/"
                st = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
                if bool(st) != (name in with_state):
                    raise ckpt.CheckpointError(f"Adam state of {name} {'missing' if not st else 'unexpected'}")
                if not st:
                    continue
                if set(st) != {"step", "exp_avg", "exp_avg_sq"}:
                    raise ckpt.CheckpointError(f"Adam state of {name}: keys {sorted(st)}")
                for key in ("exp_avg", "exp_avg_sq"):
                    if st[key].shape != prm.shape or st[key].dtype != prm.dtype:
                        raise ckpt.CheckpointError(f"adam/{name}/{key}: saved {tuple(st[key].shape)} {st[key].dtype}, "
                                                   f"parameter has {tuple(prm.shape)} {prm.dtype}")
                if st["step"].numel() != 1 or not torch.isfinite(st["step"].float()).all():
                    raise ckpt.CheckpointError(f"adam/{name}/step: {tuple(st['step'].shape)}")
                state[i] = {k: v.clone() for k, v in st.items()}
            src_t = {k[len("source/"):]: v for k, v in tensors.items() if k.startswith("source/")}
            last_eval = meta["last_eval"]
            if not (isinstance(last_eval, list) and len(last_eval) == self.P
                    and all(isinstance(x, int) for x in last_eval)):
                raise ckpt.CheckpointError(f"last_eval {last_eval!r}")
            if not isinstance(meta["init"], dict):
                raise ckpt.CheckpointError(f"init {meta['init']!r}")
            # fits so far: load (the source checks its own state and raises before touching files)
            with torch.no_grad():
                for name, prm in named:
                    prm.copy_(tensors[f"param/{name}"])
            sd = self.opt.optim.state_dict()
            sd["state"] = state
            self.opt.optim.load_state_dict(sd)  # moves the moments to the parameters' device
            ckpt.set_rng_state(tensors, meta["rng"], self.source.generators())
            self.source.load_state(src_t, meta["source"])
            self.kl_beta = tensors["loop/kl_beta"].clone()
            self.cost = tensors["loop/cost"].clone()
            self.active = tensors["loop/active"].clone()
            self.last_eval = list(last_eval)
            self.init = dict(meta["init"])
        except KeyError as exc:
            raise ckpt.CheckpointError(f"missing {exc}") from None
        except (ValueError, TypeError, RuntimeError, IndexError) as exc:
            if isinstance(exc, ckpt.CheckpointError):
                raise
            raise ckpt.CheckpointError(f"{type(exc).__name__}: {exc}") from None
        # fits: now (and only now) touch the run directories
        for p, (r, m) in enumerate(zip(self.runs, meta["members"])):
            self.outcome[p] = m.get("outcome")
            r.resume_rows(m["rows"])
            if self.outcome[p] is not None and not self.active[p]:  # stopped before the checkpoint
                o = self.outcome[p]
                r.finish(o["status"], o["reason"], o["wall_time_s"], extra={**self.source.summary_extra(p), **self.init} or None)
                r.remove_checkpoint()
        return {"iteration": meta["iteration"], "wall_time_s": float(meta["wall_time_s"])}


class ShadowRun(RunDir):
    """A population member trained for its neighbours' sake (already finished, or held by
    another sweep): rows are kept in memory (for checkpoints), nothing is written."""

    writable = False

    def start(self, keep_checkpoint: bool = False) -> None:
        pass

    def flush(self) -> None:
        pass

    def finish(self, status, reason, wall_time_s, extra=None) -> None:
        pass

    def discard_progress(self) -> None:
        self.rows = []

    def resume_rows(self, rows: list[dict]) -> None:
        self.rows = list(rows)

    def remove_checkpoint(self) -> None:
        pass


def find_checkpoint(loop: Loop) -> tuple[str, dict, dict] | None:
    """The newest checkpoint in any member's directory that fits ``loop``'s population, as
    ``(path, tensors, meta)``; unusable ones are named in a log line and passed over."""
    best = None
    for r in loop.runs:
        path = r.path / ckpt.CHECKPOINT_FILE
        if not path.is_file():
            continue
        try:
            tensors, meta = ckpt.load(path)
            loop.check_checkpoint(meta)
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s; starting from zero unless another member's checkpoint fits",
                        path, exc)
            continue
        if best is None or meta["iteration"] > best[2]["iteration"]:
            best = (str(path), tensors, meta)
    return best


def start(cfg: DictConfig, make_loop, runs: list[RunDir]) -> tuple[Loop, dict | None]:
    """A loop for ``runs`` and its resume state: from the newest valid checkpoint, else from
    zero (progress discarded)."""
    loop = make_loop()
    found = find_checkpoint(loop)
    if found is not None:
        path, tensors, meta = found
        try:
            resume = loop.restore(tensors, meta)
            log.info("resume %s from %s at iteration %d (metrics.parquet truncated to it)",
                     ", ".join(r.run_id for r in runs if getattr(r, "writable", True)), path, resume["iteration"])
            return loop, resume
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s; starting from zero", path, exc)
            loop.source.close()
            loop = make_loop()  # restore may have loaded part of it
    for r in loop.runs:
        r.discard_progress()
    return loop, None


def population_runs(cfg: DictConfig, runs: list[RunDir]) -> list[RunDir]:
    """All ``cfg.population`` members in seed order: ``runs`` where given, a :class:`ShadowRun`
    for each other member (finished already, or held by another sweep)."""
    members = member_configs(cfg)
    mine = {int(r.cfg.seed): r for r in runs}
    if not set(mine) <= {int(m.seed) for m in members}:  # not this config's members: as given
        return list(runs)
    return [mine.get(int(m.seed)) or ShadowRun(m) for m in members]


def train_members(cfg: DictConfig, runs: list[RunDir], make_source, family: str, workers: int = 1) -> None:
    """Train ``runs`` the way task kind ``family`` trains (its :class:`harness.config.TaskKind`
    entry): as one batched population (:func:`train_population`, over ``workers`` processes) or one
    after another (:func:`train_one_by_one`). ``make_source(cfg, runs)``: the kind's rollout source."""
    if task_kind(family).population:
        train_population(cfg, runs, make_source, family, workers=workers)
    else:
        train_one_by_one(cfg, runs, make_source, family)


def train_population(cfg: DictConfig, runs: list[RunDir], make_source, family: str, workers: int = 1) -> None:
    """Train every member of ``cfg.population`` as one batched population (members that are
    already finished or held elsewhere as write-nothing shadows: the batch shapes, which couple
    members, stay those of an uninterrupted run).

    ``workers > 1``: the members are split into that many contiguous slices
    (:func:`worker_slices`), each trained as its own batched population by a forked process
    (:func:`_slice_worker`, with this process's torch thread count); this process waits for them.
    Members share nothing but batch shapes, so a member's run is the same whatever the split, up
    to float rounding (as it is its lone run's). Each slice checkpoints and resumes on its own:
    a resumed run with the same split continues, one with another split restarts the slices
    whose checkpoint does not fit (named in a log line)."""
    full = population_runs(cfg, runs)
    slices = worker_slices(len(full), workers)
    if len(slices) == 1:
        train_slice(cfg, full, make_source, family)
        return
    import multiprocessing

    threads = torch.get_num_threads()
    log.info("population of %d: %d worker processes (seeds %s), %d torch thread(s) each", len(full), len(slices),
             ", ".join(f"{full[i.start].cfg.seed}-{full[i.stop - 1].cfg.seed}" for i in slices), threads)
    ctx = multiprocessing.get_context("fork")  # the children need nothing re-imported or pickled
    procs = []
    try:
        for idx in slices:
            part = [full[i] for i in idx]
            if not any(getattr(r, "writable", True) for r in part):
                continue  # every member finished or held elsewhere
            show = cfg.progress and not procs  # one progress bar: the first slice's
            procs.append((ctx.Process(target=_slice_worker, args=(cfg, part, make_source, family, show, threads),
                                      name=f"population-worker-{part[0].cfg.seed}", daemon=True), part))
            procs[-1][0].start()
        for proc, _ in procs:
            proc.join()
    except BaseException:  # e.g. Ctrl-C: stop every worker before going
        for proc, _ in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
        raise
    lost = [f"seeds {part[0].cfg.seed}-{part[-1].cfg.seed} (exit code {proc.exitcode})"
            for proc, part in procs if proc.exitcode != 0]
    if lost:
        raise RuntimeError(f"population worker(s) failed: {', '.join(lost)}")


def worker_slices(n: int, workers: int) -> list[range]:
    """Members ``0..n-1`` as ``min(workers, n)`` contiguous slices, sizes differing by at most one
    (the larger first)."""
    k = max(1, min(int(workers), n))
    q, extra = divmod(n, k)
    out, lo = [], 0
    for w in range(k):
        hi = lo + q + (w < extra)
        out.append(range(lo, hi))
        lo = hi
    return out


def train_slice(cfg: DictConfig, runs: list[RunDir], make_source, family: str) -> None:
    """Train ``runs`` as one batched population, resuming from their newest valid checkpoint."""
    loop, resume = start(cfg, lambda: Loop(cfg, make_source(cfg, runs), runs, family), runs)
    loop.run(resume)


def _slice_worker(cfg: DictConfig, runs: list[RunDir], make_source, family: str, progress: bool,
                  threads: int) -> None:
    """A worker process's :func:`train_slice`, on ``threads`` torch threads, with or without its
    progress bar. If it raises, its unfinished members are recorded as failed with the exception
    (the parent sees only an exit code), then the worker exits non-zero."""
    torch.set_num_threads(threads)
    if progress != cfg.progress:
        cfg = cfg.copy()
        cfg.progress = progress
    t0 = time.time()
    try:
        train_slice(cfg, runs, make_source, family)
    except Exception as exc:
        log.exception("%s population worker (seeds %s-%s) failed", family, runs[0].cfg.seed, runs[-1].cfg.seed)
        for r in runs:  # a shadow's finish writes nothing
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.time() - t0)
        raise


def train_one_by_one(cfg: DictConfig, runs: list[RunDir], make_source, family: str) -> None:
    """Train the members one after another, each a lone run of its own seed (``P = 1``); a
    member that raises is recorded as failed and the next one goes on."""
    for r in runs:
        t0 = time.time()
        loop = None  # the previous member's trainer is freed before this one is built (and measured)
        try:
            loop, resume = start(r.cfg, lambda: Loop(r.cfg, make_source(r.cfg, [r]), [r], family), [r])
            loop.run(resume)
            loop = None
        except Exception as exc:  # record this member as failed, go on with the next
            loop = None
            log.exception("%s run %s failed", family, r.run_id)
            if r.status() is None:
                r.finish("failed", f"{type(exc).__name__}: {exc}", time.time() - t0)
            if len(runs) == 1:
                raise
