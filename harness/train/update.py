"""The one update step: ``epochs`` x ``minibatches`` of the policy loss looked up by name, plus
value loss, entropy bonus and KL penalty, per-member gradient clipping, per-member learning
rates and the divergence guard. Every task family (control, LM, toy) calls :func:`update`.

Layout (docs/design.md, "Tensor conventions"): every tensor of an :class:`UpdateBatch` is
``[P, T, B]``: ``P`` population members (1 for the LM task, whose members train one after
another), ``T`` steps of a column, ``B`` columns. Minibatches are drawn over the ``B``
columns, per member from the member's own generator. The LM and toy tasks put one sequence
per column; the control task puts one *step* per column (``T = 1``, ``B = steps``: CleanRL's and
SB3's step-level minibatches) and names each step's sequence in ``seq_id`` (an episode for
whole-episode collectors, a segment of one env column between resets for step-based ones), so
that ``loss_agg`` aggregates by sequence there too (:func:`harness.losses.aggregate`).

One meaning for every diagnostic (every task): values of the **last epoch**, averaged over its
minibatches; ``grad_norm`` is the policy's gradient norm before clipping, ``value_grad_norm``
the critic's; ``adv_mean``/``adv_std`` describe the advantages before whitening.

A member whose loss or gradient is non-finite in a minibatch takes no optimizer step from then
on in this update (weights and Adam state kept), and its minibatch statistics of the update are
NaN; the caller marks it diverged.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch.optim.adam import adam as adam_functional  # Adam.step's own call, without its wrappers

from ..losses import (KLTerm, PolicyInputs, entropy_bonus, explained_variance, kl_penalty, masked_mean_std,
                      value_loss, whiten, whitening_plan, within_sequence_std)
from ..estimators.kl import kl_guards
from ..models.mlp import member_view
from ..plan import RunPlan

ADAM_EPS = 1e-5  # every trainer's Adam (SB3's and CleanRL's PPO default)


@dataclass
class UpdateSettings:
    """Plain-Python copies of the update knobs (OmegaConf access is slow in the hot loop)."""

    policy_loss: Callable  # a registered harness.losses.PolicyLoss
    loss_settings: Any  # its settings dataclass (harness.losses.loss_settings)
    epochs: int
    minibatches: int
    normalize: str
    vf_clip_eps: float | None
    loss_agg: str
    norm_len: int | None
    ent_coef: float
    vf_coef: float
    max_grad_norm: float | None
    clip_per_network: bool
    kl_loss: bool
    kl_estimator: str
    kl_guards: dict | None = None  # kl.log_ratio_clamp, kl.value_clamp (harness.estimators.kl.kl_guards)

    @classmethod
    def from_plan(cls, plan: RunPlan, norm_len: int | None) -> "UpdateSettings":
        """The update knobs of ``plan.cfg``, with the plan's policy loss and its settings.
        ``norm_len``: the constant length of ``loss_agg=seq_mean_token_sum_norm`` (Dr. GRPO's L)."""
        cfg = plan.cfg
        return cls(
            policy_loss=plan.loss, loss_settings=plan.loss_settings, epochs=int(cfg.epochs),
            minibatches=int(cfg.minibatches), normalize=str(cfg.normalize_advantages),
            vf_clip_eps=cfg.vf_clip_eps, loss_agg=str(cfg.loss_agg), norm_len=norm_len,
            ent_coef=float(cfg.ent_coef), vf_coef=float(cfg.vf_coef),
            max_grad_norm=None if cfg.max_grad_norm is None else float(cfg.max_grad_norm),
            clip_per_network=cfg.grad_clip == "per_network",
            kl_loss=not cfg.kl.in_reward and (float(cfg.kl.beta) > 0 or bool(cfg.kl.adaptive)),
            kl_estimator=str(cfg.kl.estimator), kl_guards=kl_guards(cfg.kl))


@dataclass
class UpdateBatch:
    """One iteration's samples, ``[P, T, B]`` (see the module docstring)."""

    adv: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor
    inputs: Any  # what the learner needs to recompute log-probs/values of chosen columns
    returns: torch.Tensor | None = None  # critic targets (A + V_old)
    old_values: torch.Tensor | None = None
    kl_target: torch.Tensor | None = None  # log-probs of the KL penalty's target policy
    seq_id: torch.Tensor | None = None  # [P, T, B] long: sequence of each step when a column is not one
    columns: list[int] | None = None  # per member, how many leading columns are its own (the rest
    # is padding that only the population's shared shape adds); None: all B


class Learner(Protocol):
    """What a task family's model offers the update step."""

    population: int
    params: list[torch.Tensor]  # in the optimizer's order

    def forward(self, inputs: Any, idx: torch.Tensor | None, need_entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(logp, entropy or None, values or None)``, each ``[P, T, b]``, for columns ``idx [P, b]``
        (``None``: all columns)."""

    def clip_grads(self, max_norm: float | None, per_network: bool) -> torch.Tensor:
        """Clip per member (:func:`clip_grad_norms`); return the pre-clip norms ``[k, P]`` (row 0:
        policy, row 1: critic)."""


def adam_without_dynamo(params: list[torch.Tensor], **kwargs) -> torch.optim.Adam:
    """``torch.optim.Adam(params, **kwargs)``, made without importing ``torch._dynamo``.

    ``Optimizer.add_param_group`` is wrapped in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` on its first call (to mark the function as not traced), and that import is
    most of a second of a process (0.85-0.92 s here, beside a CartPole run's ~9 s). Nothing here
    is traced, so the wrapper's function is called as itself, by handing it the one it would
    make and cache (its ``__dynamo_disable`` attribute) for the duration of the constructor and
    taking it back after, so that the wrapper works as before for everything else. Where torch
    has no such wrapper or ``torch._dynamo`` is imported already, the plain constructor.
    The parameter groups and settings are the constructor's own
    (``tests/test_one_path.py::test_adam_made_without_dynamo_is_adams_own``)."""
    fn = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if fn is None or "torch._dynamo" in sys.modules or hasattr(fn, "__dynamo_disable"):
        return torch.optim.Adam(params, **kwargs)
    setattr(fn, "__dynamo_disable", fn)
    try:
        return torch.optim.Adam(params, **kwargs)
    finally:
        delattr(fn, "__dynamo_disable")


def _all_finite(x: torch.Tensor) -> bool:
    """Every entry of ``x`` finite; one value (a lone run's loss or norm) read as a Python float,
    which spares the two tensor ops of ``isfinite(x).all()`` on every minibatch."""
    return math.isfinite(x.item()) if x.numel() == 1 else bool(torch.isfinite(x.detach()).all())


@torch.no_grad()
def norms_finite(tensors: list[torch.Tensor]) -> bool:
    """True when one fused norm per tensor (``torch._foreach_norm``) is finite for every tensor:
    a norm is finite only when every entry is, so this proves them all finite with a few ops and
    one read, where ``isfinite(t).all()`` per tensor costs two ops and a read each. False does
    not prove a non-finite entry (a huge finite tensor's norm overflows to inf): the caller then
    checks entry by entry."""
    return not tensors or bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors))).all())


def _select(x: torch.Tensor | None, idx: torch.Tensor | None) -> torch.Tensor | None:
    """Columns ``idx [P, b]`` of ``x [P, T, B, ...]``."""
    if x is None or idx is None:
        return x
    P, T = x.shape[:2]
    index = idx.view(P, 1, -1, *([1] * (x.dim() - 3))).expand(P, T, -1, *x.shape[3:])
    return x.gather(2, index)


class MemberOptimizer:
    """Adam over a population's parameters with per-member learning rates and frozen members.

    Adam is elementwise, so one optimizer over batched weights keeps per-member moments. A
    member's learning rate ``lr[p]`` is applied by stepping with the largest active rate and
    scaling the other members' parameter change by ``lr[p] / lr_max`` (exact for a lone run;
    within float rounding otherwise); a frozen member keeps its weights and moments."""

    def __init__(self, params: list[torch.Tensor], population: int, lr: float, fused: bool = False):
        self.params, self.P, self.fused = params, population, fused
        # fused Adam over tensors of one device and dtype: its kernel called as Adam.step calls it;
        # otherwise Adam's functional form (torch.optim.adam.adam), called as Adam.step calls it
        self.direct = not fused or len({(p.device, p.dtype) for p in params}) == 1
        self.optim = adam_without_dynamo(params, lr=lr, eps=ADAM_EPS, **({"fused": True} if fused else {}))
        # the direct step's increment of Adam's float32 steps, one 1.0 per step (the list form of
        # _foreach_add_: the scalar form wraps and converts 1 for every tensor, 8 us against 3 a step)
        self._ones = [torch.ones((), device=params[0].device)] * len(params) if self.direct and fused else []

    def _adam_step(self) -> None:
        """``self.optim.step()``. With fused Adam over one device and dtype, once every parameter
        has a gradient: what ``torch.optim.Adam.step`` does then (``_init_group``: a parameter
        without state gets a step of 0, float32 on its device, and zero moments; ``_fused_adam``:
        each state step + 1, then ``torch._fused_adam_`` with the group's settings), without its
        wrappers (profiler scope, hooks, state and device checks, grouping by device, and the
        import of ``torch._dynamo`` for its graph breaks: :func:`adam_without_dynamo`), which
        cost about 20 us a step on the CPU (a lone control minibatch is about 800 us). The same
        kernel with the same arguments: the same weights and moments bit for bit, from the first
        step (``tests/test_one_path.py::test_direct_adam_is_adams_own_step``).

        Without fused Adam (the toy task's optimizer: one loop per tensor on the CPU), the same:
        ``_init_group``'s state for a parameter without one (a float32 step of 0 on the CPU, zero
        moments), then ``torch.optim.adam.adam`` with every argument ``Adam.step`` gives it, so
        the same implementation runs on the same tensors (57 against 99 us a step for the toy's
        [84, 4] table, measured alternating in one process); the same bit for bit
        (``tests/test_one_path.py::test_direct_adam_is_adams_own_step``)."""
        if self.direct and all(p.grad is not None for p in self.params):
            state, g = self.optim.state, self.optim.param_groups[0]
            with torch.no_grad():
                if len(state) != len(self.params):  # Adam's lazy initialisation (_init_group)
                    for p in self.params:
                        if not state.get(p):
                            step = (torch.zeros((), dtype=torch.float32, device=p.device) if self.fused else
                                    torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                                 else torch.float32))
                            state[p] = {"step": step,
                                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                sts = [state[p] for p in self.params]
                grads, steps = [p.grad for p in self.params], [st["step"] for st in sts]
                exp_avgs, exp_avg_sqs = [st["exp_avg"] for st in sts], [st["exp_avg_sq"] for st in sts]
                if self.fused:
                    torch._foreach_add_(steps, self._ones)
                    torch._fused_adam_(self.params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                                       lr=g["lr"], beta1=g["betas"][0], beta2=g["betas"][1],
                                       weight_decay=g["weight_decay"], eps=g["eps"], maximize=False,
                                       grad_scale=None, found_inf=None)
                else:
                    adam_functional(
                        self.params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=g["amsgrad"],
                        has_complex=any(torch.is_complex(p) for p in self.params), beta1=g["betas"][0],
                        beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"], eps=g["eps"],
                        maximize=g["maximize"], foreach=g["foreach"], capturable=g["capturable"],
                        differentiable=g["differentiable"], fused=g["fused"], grad_scale=None, found_inf=None,
                        decoupled_weight_decay=g["decoupled_weight_decay"])
                return
        self.optim.step()

    def zero_grad(self) -> None:
        """``optim.zero_grad(set_to_none=True)``, without its per-call profiler scope and hooks
        (none are registered): a measurable share of a tiny model's minibatch (the toy task)."""
        for p in self.params:
            p.grad = None

    def prepare(self, lr: torch.Tensor, frozen: torch.Tensor) -> None:
        """Fix this update's learning rates ``lr [P]`` and frozen members ``frozen [P]`` (bool) for
        :meth:`step_prepared` (worked out once per update, not per minibatch)."""
        self.plan = self._plan(lr, frozen)

    def step_prepared(self) -> None:
        self._apply(self.plan)

    def step(self, lr: torch.Tensor, frozen: torch.Tensor) -> None:
        """One Adam step; ``lr [P]`` float64, ``frozen [P]`` bool."""
        self._apply(self._plan(lr, frozen))

    def _plan(self, lr: torch.Tensor, frozen: torch.Tensor) -> dict | None:
        moving = ~frozen
        if not bool(moving.any()):
            return None  # nothing moves
        lr_max = float(lr[moving].max())
        scale = (lr / lr_max) if lr_max > 0 else torch.zeros_like(lr)
        rescale = moving & (scale != 1.0)
        frozen_idx = frozen.nonzero().flatten() if bool(frozen.any()) else None
        mix = None
        if bool(rescale.any()):  # per parameter, each row's factor f and 1 - f ([k*P, 1, ...])
            mix = []
            for prm in self.params:
                f = scale.to(prm.dtype).repeat(prm.shape[0] // self.P).view(-1, *([1] * (prm.dim() - 1)))
                mix.append((f, 1.0 - f))
        return {"lr": lr_max, "frozen": frozen_idx, "mix": mix}

    def _apply(self, plan: dict | None) -> None:
        if plan is None:
            return
        for g in self.optim.param_groups:
            g["lr"] = plan["lr"]
        if plan["frozen"] is None and plan["mix"] is None:  # every lone run; populations without annealing
            self._adam_step()
            return
        P, frozen = self.P, plan["frozen"]
        saved = []
        if frozen is not None:  # weights and moments of the frozen members, put back after the step
            for p in self.params:
                st = self.optim.state.get(p, {})
                saved.append((member_view(p.data, P)[:, frozen].clone(),
                              {k: member_view(v, P)[:, frozen].clone() for k, v in st.items()
                               if torch.is_tensor(v) and v.dim() > 0}))
        old = [p.detach().clone() for p in self.params] if plan["mix"] is not None else None
        self._adam_step()
        if old is not None:  # a member's change scaled by f = lr[p] / lr_max: f new + (1 - f) old
            for p, o, (f, g) in zip(self.params, old, plan["mix"]):
                p.data.mul_(f).addcmul_(o, g)
        for p, (data, st) in zip(self.params, saved):
            member_view(p.data, P)[:, frozen] = data
            for k, v in st.items():
                member_view(self.optim.state[p][k], P)[:, frozen] = v

    # checkpoints
    def state_tensors(self, named: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        out = {}
        for name, prm in named:
            for key, value in self.optim.state.get(prm, {}).items():
                if torch.is_tensor(value):
                    out[f"adam/{name}/{key}"] = value
        return out


@torch.no_grad()
def clip_grad_norms(grads: list[torch.Tensor], max_norm: float | None, per_network: bool, population: int = 1,
                    first_net: list[int] | None = None) -> torch.Tensor:
    """The one gradient-norm clipping of every learner (control populations, LM, toy): scales the
    gradients in place and returns their norms before clipping ``[k, P]`` (row 0: the policy,
    row 1: the critic).

    ``grads[i]`` stacks ``kv`` blocks of ``population`` rows (:func:`~harness.models.mlp.member_view`:
    ``[kv * P, ...]``); block ``j`` is of network ``first_net[i] + j`` (0: policy, 1: critic; every
    network up to the last has a block). ``first_net=None``: every tensor starts at network 0, the
    control agent's stacked actor and critic rows.

    The rule is ``torch.nn.utils.clip_grad_norm_``'s: the global 2-norm of the gradients, scaled by
    ``min(1, max_norm / (norm + 1e-6))``. ``per_network=False`` takes one norm over every network
    (SB3, CleanRL), ``True`` clips each network by its own, so a large value-loss gradient cannot
    shrink the policy's step; ``max_norm=None`` measures only. Members are clipped apart.
    ``population == 1``: the norm of a network from fused per-tensor norms (``torch._foreach_norm``,
    as torch does), the joint norm the norm of the networks' norms. ``population > 1``: all members'
    norms at once from per-member sums of squares, one pass per tensor; equal to the lone run's to
    float rounding.
    """
    P = population
    first = first_net or [0] * len(grads)
    k = max(f + g.shape[0] // P for f, g in zip(first, grads))
    if P == 1:  # a network's tensors are the rows of its blocks (unbind: one op per tensor)
        blocks: list[list[torch.Tensor]] = [[] for _ in range(k)]
        for f, g in zip(first, grads):
            for j, row in enumerate(g.unbind(0)):
                blocks[f + j].append(row)
        return _clip_networks(blocks, max_norm, per_network)
    views = [member_view(g, P) for g in grads]
    sq = torch.zeros(k, P, dtype=views[0].dtype, device=views[0].device)
    for f, v in zip(first, views):
        sq[f:f + v.shape[0]] += v.pow(2).reshape(v.shape[0], P, -1).sum(dim=-1)
    norms = sq.sqrt()
    if max_norm is not None:
        total = norms if per_network else sq.sum(dim=0, keepdim=True).sqrt().expand(k, P)
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for f, v in zip(first, views):
            v.mul_(scale[f:f + v.shape[0]].view(v.shape[0], P, *([1] * (v.dim() - 2))))
    return norms


def _clip_networks(blocks: list[list[torch.Tensor]], max_norm: float | None, per_network: bool) -> torch.Tensor:
    """:func:`clip_grad_norms` of a lone run (``P = 1``) whose networks' gradients are ``blocks``
    (one list of tensors per network): the norms ``[k, 1]``."""
    k = len(blocks)
    norms = torch.stack([torch.linalg.vector_norm(torch.stack(torch._foreach_norm(b))) for b in blocks])
    if max_norm is not None:
        if per_network or k == 1:
            scaled = zip(blocks, norms.unbind(0))
        else:  # one joint norm: one scale for every block
            scaled = [([x for b in blocks for x in b], torch.linalg.vector_norm(norms))]
        for b, n in scaled:
            torch._foreach_mul_(b, (max_norm / (n + 1e-6)).clamp(max=1.0))
    return norms.view(k, 1)


def clip_grad_groups(groups: list[list[torch.Tensor]], max_norm: float | None, per_network: bool) -> torch.Tensor:
    """:func:`clip_grad_norms` of a lone run (``P = 1``) whose parameters form ``groups`` (policy,
    then critic); parameters without a gradient, and groups with none, are left out. The same
    tensors :func:`clip_grad_norms` would see as the rows of ``[1, ...]`` blocks, without making
    and unbinding those blocks (two ops per tensor)."""
    return _clip_networks([gs for gs in ([p.grad for p in g if p.grad is not None] for g in groups) if gs],
                          max_norm, per_network)


@dataclass(frozen=True)
class Members:
    """Each population member's part in one update, ``[P]`` each: ``gens`` its minibatch shuffle
    generator, ``active`` whether it still trains (the others' weights are frozen), ``lr`` its
    learning rate (float64), ``kl_beta`` its KL coefficient."""

    gens: list[torch.Generator]
    active: torch.Tensor
    lr: torch.Tensor
    kl_beta: torch.Tensor


def update(learner: Learner, opt: MemberOptimizer, batch: UpdateBatch, s: UpdateSettings,
           members: Members) -> dict[str, torch.Tensor]:
    """``s.epochs`` passes over ``batch`` in ``s.minibatches`` column minibatches.

    ``members``: which members still train, and each one's generator, learning rate and KL
    coefficient. Returns ``[P]`` diagnostics (last epoch, see the module docstring) plus
    ``nonfinite`` (``[P]`` codes: 0 finite, 1 loss, 2 gradient)."""
    plan = _MinibatchPlan.of(batch, s.minibatches)
    run = _UpdateRun(learner, opt, batch, s, members, plan)
    opt.prepare(members.lr, ~members.active)
    for epoch in range(s.epochs):
        last_epoch = epoch == s.epochs - 1
        for idx, valid, empty in plan.minibatches(members.gens, run.mask):
            if not run.minibatch(idx, valid, empty, last_epoch):
                return run.diagnostics()  # nothing left to learn from this batch
    return run.diagnostics()


@dataclass
class _MinibatchPlan:
    """How one update cuts the ``B`` columns into minibatches: ``n_mb`` of ``mb_size`` columns; with
    ``ragged`` members (their own batch sizes ``cols`` differ: whole episodes in a population), each
    member's ``n_mb_p[p]`` minibatches of ``mb_p[p]`` columns as its lone run draws them, padded
    with masked entries."""

    B: int
    cols: list[int]
    n_mb: int
    mb_size: int
    ragged: bool
    n_mb_p: list[int] | None = None
    mb_p: list[int] | None = None

    @classmethod
    def of(cls, batch: UpdateBatch, minibatches: int) -> _MinibatchPlan:
        P, _, B = batch.adv.shape
        cols = batch.columns or [B] * P
        n_mb = max(1, min(minibatches, B))
        plan = cls(B, cols, n_mb, math.ceil(B / n_mb), len(set(cols)) > 1)
        if plan.ragged:
            plan.n_mb_p = [max(1, min(minibatches, c)) for c in cols]
            plan.mb_p = [math.ceil(c / n) for c, n in zip(cols, plan.n_mb_p)]
            plan.n_mb = max(plan.n_mb_p)
        return plan

    def minibatches(self, gens: list[torch.Generator], mask: torch.Tensor):
        """One epoch's minibatches ``(idx [P, b] or None: all columns, valid [P, 1, b] or None,
        empty [P] or None: members without entries)``; every member's permutation is drawn from its
        own generator when the epoch starts."""
        if self.ragged:
            yield from self._ragged(gens, mask)
            return
        perm = torch.stack([torch.randperm(self.B, generator=g) for g in gens]).to(mask.device) \
            if self.n_mb > 1 else None
        for i in range(self.n_mb):
            idx = None if perm is None else perm[:, i * self.mb_size:(i + 1) * self.mb_size]
            if idx is not None and idx.shape[1] == 0:
                continue
            yield idx, None, None

    def _ragged(self, gens: list[torch.Generator], mask: torch.Tensor):
        P, device = mask.shape[0], mask.device
        perms = [torch.randperm(c, generator=g) if n > 1 else torch.arange(c)
                 for c, n, g in zip(self.cols, self.n_mb_p, gens)]
        for i in range(self.n_mb):
            parts = [q[i * m:(i + 1) * m] for q, m in zip(perms, self.mb_p)]
            width = max(len(q) for q in parts)
            if width == 0:
                continue
            idx = torch.zeros(P, width, dtype=torch.long)
            valid = torch.zeros(P, 1, width, dtype=mask.dtype)
            for p, q in enumerate(parts):
                idx[p, :len(q)] = q
                valid[p, 0, :len(q)] = 1.0
            yield idx.to(device), valid.to(device), torch.tensor([len(q) == 0 for q in parts])


class _UpdateRun:
    """One update's state across its minibatches: the whitened advantages, each member's first
    non-finite kind (``bad``), and the last epoch's minibatch statistics."""

    def __init__(self, learner: Learner, opt: MemberOptimizer, batch: UpdateBatch, s: UpdateSettings,
                 members: Members, plan: _MinibatchPlan):
        self.learner, self.opt, self.batch, self.s, self.plan = learner, opt, batch, s, plan
        P = batch.adv.shape[0]
        device = batch.adv.device
        self.P, self.active, self.lr = P, members.active, members.lr
        self.mask = batch.mask * members.active.to(device).view(P, 1, 1).to(batch.mask.dtype)
        whiten_batch, self.normalize_each = whitening_plan(s.normalize, plan.n_mb)
        self.adv = whiten(batch.adv, self.mask) if whiten_batch else batch.adv
        self.agg = {"agg": s.loss_agg, "norm_len": s.norm_len}
        self.critic = batch.returns is not None
        self.bad = torch.zeros(P, dtype=torch.long)  # first non-finite kind per member
        self.any_bad = False
        self.beta = members.kl_beta.to(device)
        self.stats: dict[str, list[torch.Tensor]] = {}
        self.present: list[torch.Tensor] = []  # per recorded minibatch, the members it had entries for

    def minibatch(self, idx: torch.Tensor | None, valid: torch.Tensor | None, empty: torch.Tensor | None,
                  last_epoch: bool) -> bool:
        """One optimizer step on columns ``idx``; False when no active member is left finite."""
        loss, metrics = self._loss(idx, valid, last_epoch)
        bad, active = self.bad, self.active
        if not _all_finite(loss):  # rare: find the members
            loss_ok = torch.isfinite(loss.detach()).cpu()
            self.bad = bad = torch.where((bad == 0) & ~loss_ok & active, torch.ones_like(bad), bad)
            self.any_bad = True
            if not bool(((bad == 0) & active).any()):  # nothing left to learn from this batch
                self.stats.setdefault("loss", []).append(loss.detach().cpu())
                return False
        self.opt.zero_grad()
        loss.sum().backward()
        norms = self.learner.clip_grads(self.s.max_grad_norm, self.s.clip_per_network)
        if not _all_finite(norms):
            grad_ok = torch.isfinite(norms.detach()).all(dim=0).cpu()
            self.bad = bad = torch.where((bad == 0) & ~grad_ok & active, torch.full_like(bad, 2), bad)
            self.any_bad = True
        if self.any_bad or empty is not None:
            self.opt.step(self.lr, ~active | (bad != 0) | (empty if empty is not None else False))
        else:
            self.opt.step_prepared()
        if last_epoch:
            metrics["grad_norm"] = norms[0]
            if self.critic and norms.shape[0] > 1:
                metrics["value_grad_norm"] = norms[1]
            metrics["loss"] = loss.detach()
            for k, v in metrics.items():
                self.stats.setdefault(k, []).append(v)
            self.present.append(torch.ones(self.P) if empty is None else (~empty).double())
        return True

    def _loss(self, idx: torch.Tensor | None, valid: torch.Tensor | None,
              last_epoch: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The minibatch's ``[P]`` loss: the policy loss, the entropy bonus, the value loss and the
        KL penalty; and its metrics."""
        s, batch, agg = self.s, self.batch, self.agg
        m_mask, m_adv, m_old = _select(self.mask, idx), _select(self.adv, idx), _select(batch.old_logp, idx)
        if valid is not None:
            m_mask = m_mask * valid
        seq = _select(batch.seq_id, idx)
        if self.normalize_each:
            m_adv = whiten(m_adv, m_mask)
        need_entropy = s.ent_coef > 0 or last_epoch
        logp, entropy, values = self.learner.forward(batch.inputs, idx, need_entropy)
        pl, metrics = s.policy_loss(PolicyInputs(logp, m_old, m_adv, m_mask, seq_id=seq, with_metrics=last_epoch,
                                                 **agg), s.loss_settings)
        loss = pl
        if need_entropy:
            ent_l, ent_m = entropy_bonus(entropy, m_mask, seq_id=seq, **agg)
            if s.ent_coef > 0:
                loss = loss + s.ent_coef * ent_l
            metrics.update(ent_m)
        if self.critic:
            vl, vm = value_loss(values, _select(batch.returns, idx), m_mask,
                                old_values=_select(batch.old_values, idx), clip_eps=s.vf_clip_eps)
            loss = loss + s.vf_coef * vl
            metrics.update(vm)
        if s.kl_loss:
            kl_l, klm = kl_penalty(logp, _select(batch.kl_target, idx), m_mask,
                                   KLTerm(s.kl_estimator, s.kl_guards), seq_id=seq, **agg)
            loss = loss + self.beta * kl_l
            metrics["kl_loss"] = klm["kl"]
        return loss, metrics

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """The last epoch's minibatch statistics averaged per member (NaN for a member whose update
        went non-finite), the advantages' moments, the critic's explained variance, ``nonfinite``."""
        P, batch, mask, stats, present = self.P, self.batch, self.mask, self.stats, self.present
        if self.plan.ragged and present:  # a member's mean over the minibatches it had entries in (as its lone run)
            w = torch.stack(present)
            out = {k: (torch.stack([x.reshape(P).cpu().double() for x in v]) * w).sum(0) / w.sum(0).clamp(min=1)
                   for k, v in stats.items() if len(v) == len(present)}
        else:
            out = {k: torch.stack([x.reshape(P).cpu() for x in v]).mean(0) for k, v in stats.items()}
        if self.any_bad:  # a member whose update went non-finite: its minibatch statistics are empty (a lone
            # run stops at its first non-finite loss, a population goes on past it: the same row either way)
            gone = self.bad != 0
            out = {k: torch.where(gone, float("nan"), v) for k, v in out.items()}
        a_mean, a_std = masked_mean_std(batch.adv, mask)
        out["adv_mean"], out["adv_std"] = a_mean.cpu().double(), a_std.cpu().double()
        if batch.adv.shape[1] > 1:  # columns are sequences (LM, toy); control columns are single steps
            out["adv_within_std"] = within_sequence_std(batch.adv, mask).cpu()
        if self.critic:
            out["explained_variance"] = torch.tensor(
                [explained_variance(batch.old_values[p], batch.returns[p], mask[p]) for p in range(P)],
                dtype=torch.float64)
        out["nonfinite"] = self.bad
        return out
