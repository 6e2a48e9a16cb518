"""The training loop's checkpoints: written and restored once for every task family.

``checkpoint.safetensors`` (:mod:`harness.io.checkpoint`: safetensors + JSON, atomic, never
unpickled) holds the learner's parameters, Adam state, the global and the source's RNG states,
each member's budget, KL beta, outcome and metric rows, and the source's own state. Restore
checks every tensor's name, shape and dtype against the live model and optimizer before it
touches anything; a checkpoint that does not fit is named in a log line and the run restarts
from zero. A resumed run equals an uninterrupted one bit for bit (CPU, same thread count).

:func:`save` and :func:`restore` read and set what a loop hands them through :class:`Checkpointed`
(the state :class:`harness.train.loop.Loop` holds; this module imports no loop); :func:`start` builds
a loop and resumes it from its members' newest valid checkpoint.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Protocol, TypeVar

import pyarrow as pa
import torch
from omegaconf import DictConfig

from ..io import RunDir, atomic_write_bytes, config_hash
from ..io import checkpoint as ckpt
from ..io import schema

log = logging.getLogger("harness")
CHECKPOINT_FORMAT = 2


def _seconds(x: Any) -> bool:
    """A wall time a checkpoint may record: a finite real number >= 0 (not a bool, not a string)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


class Checkpointed(Protocol):
    """What a checkpoint saves and restores: the state a training loop holds
    (:class:`harness.train.loop.Loop`). :func:`restore` sets ``kl_beta``, ``cost``, ``active``,
    ``last_eval``, ``init`` and ``outcome``; the parameters and Adam state are loaded in place."""

    cfg: DictConfig
    family: str  # the task kind whose loop saved it (a checkpoint of another kind does not fit)
    P: int  # population members
    max_iters: int | None
    learner: Any  # .params, .named_params(): the members' parameters
    opt: Any  # harness.train.update.MemberOptimizer: .optim, .state_tensors(named)
    source: Any  # harness.train.loop.Source: seeds, generators(), state(), load_state(), summary_extra()
    runs: list[RunDir]
    kl_beta: torch.Tensor
    cost: torch.Tensor
    active: torch.Tensor
    outcome: list[dict | None]
    last_eval: list[int]
    init: dict


def _named(loop: Checkpointed) -> list[tuple[str, torch.Tensor]]:
    return list(loop.learner.named_params())


def checkpoint_state(loop: Checkpointed, iteration: int, wall: float) -> tuple[dict[str, torch.Tensor], dict]:
    tensors: dict[str, torch.Tensor] = {f"param/{n}": p.data for n, p in _named(loop)}
    tensors.update(loop.opt.state_tensors(_named(loop)))
    rng_t, rng_m = ckpt.rng_state(loop.source.generators())
    tensors.update(rng_t)
    tensors.update({"loop/kl_beta": loop.kl_beta, "loop/cost": loop.cost, "loop/active": loop.active})
    src_t, src_m = loop.source.state()
    tensors.update({f"source/{k}": v for k, v in src_t.items()})
    meta = {
        "format": CHECKPOINT_FORMAT, "trainer": loop.family, "config_hash": config_hash(loop.cfg),
        "seeds": list(loop.source.seeds), "iteration": iteration, "wall_time_s": wall,
        "last_eval": [int(x) for x in loop.last_eval], "rng": rng_m, "init": loop.init, "source": src_m,
        "adam": sorted({k.split("/")[1] for k in tensors if k.startswith("adam/")}),
        "members": [{"run_id": r.run_id, "outcome": loop.outcome[p], "rows": r.rows}
                    for p, r in enumerate(loop.runs)],
    }
    return tensors, meta


def save(loop: Checkpointed, iteration: int, wall: float) -> None:
    """Flush each running writable member's metrics, then write the checkpoint into its run
    directory (one serialisation, one atomic write per directory)."""
    targets = [r for p, r in enumerate(loop.runs) if getattr(r, "writable", True) and loop.active[p]]
    if not targets:
        return
    for r in targets:
        r.flush()
    data = ckpt.dumps(*checkpoint_state(loop, iteration, wall))
    for r in targets:
        atomic_write_bytes(r.path / ckpt.CHECKPOINT_FILE, data)


def check(loop: Checkpointed, meta: dict) -> int:
    """Raise :class:`CheckpointError` unless ``meta`` is this population's, with consistent
    metric rows and an iteration within the budget; return its iteration."""
    def bad(msg):
        raise ckpt.CheckpointError(msg)

    k = ckpt.check_header(meta, loop.family, CHECKPOINT_FORMAT, config_hash(loop.cfg))
    if loop.max_iters is not None and k > loop.max_iters:
        bad(f"iteration {k} is past budget.iterations={loop.max_iters}")
    if meta.get("seeds") != list(loop.source.seeds):
        bad(f"saved by a population of seeds {meta.get('seeds')}, this one has {list(loop.source.seeds)}")
    if not _seconds(meta.get("wall_time_s")):
        bad(f"wall_time_s {meta.get('wall_time_s')!r} is not a number of seconds >= 0")
    members = meta.get("members")
    if not isinstance(members, list) or len(members) != loop.P:
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


def restore(loop: Checkpointed, tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """Load a checkpoint into this freshly built loop; returns the resume state. Raises
    :class:`CheckpointError` (nothing written yet; the loop is then unusable) if it does not fit."""
    check(loop, meta)
    named = _named(loop)
    try:
        for key, shape, dtype in (("loop/kl_beta", (loop.P,), loop.kl_beta.dtype),
                                  ("loop/cost", (loop.P,), loop.cost.dtype),
                                  ("loop/active", (loop.P,), loop.active.dtype)):
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
        for i, prm in enumerate(loop.learner.params):
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
        if not (isinstance(last_eval, list) and len(last_eval) == loop.P
                and all(isinstance(x, int) for x in last_eval)):
            raise ckpt.CheckpointError(f"last_eval {last_eval!r}")
        if not isinstance(meta["init"], dict):
            raise ckpt.CheckpointError(f"init {meta['init']!r}")
        # fits so far: load (the source checks its own state and raises before touching files)
        with torch.no_grad():
            for name, prm in named:
                prm.copy_(tensors[f"param/{name}"])
        sd = loop.opt.optim.state_dict()
        sd["state"] = state
        loop.opt.optim.load_state_dict(sd)  # moves the moments to the parameters' device
        ckpt.set_rng_state(tensors, meta["rng"], loop.source.generators())
        loop.source.load_state(src_t, meta["source"])
        loop.kl_beta = tensors["loop/kl_beta"].clone()
        loop.cost = tensors["loop/cost"].clone()
        loop.active = tensors["loop/active"].clone()
        loop.last_eval = list(last_eval)
        loop.init = dict(meta["init"])
    except KeyError as exc:
        raise ckpt.CheckpointError(f"missing {exc}") from None
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        if isinstance(exc, ckpt.CheckpointError):
            raise
        raise ckpt.CheckpointError(f"{type(exc).__name__}: {exc}") from None
    # fits: now (and only now) touch the run directories
    for p, (r, m) in enumerate(zip(loop.runs, meta["members"])):
        loop.outcome[p] = m.get("outcome")
        r.resume_rows(m["rows"])
        if loop.outcome[p] is not None and not loop.active[p]:  # stopped before the checkpoint
            o = loop.outcome[p]
            r.finish(o["status"], o["reason"], o["wall_time_s"], extra={**loop.source.summary_extra(p), **loop.init} or None)
            r.remove_checkpoint()
    return {"iteration": meta["iteration"], "wall_time_s": float(meta["wall_time_s"])}


def find_checkpoint(loop: Checkpointed) -> tuple[str, dict, dict] | None:
    """The newest checkpoint in any member's directory that fits ``loop``'s population, as
    ``(path, tensors, meta)``; unusable ones are named in a log line and passed over."""
    best = None
    for r in loop.runs:
        path = r.path / ckpt.CHECKPOINT_FILE
        if not path.is_file():
            continue
        try:
            tensors, meta = ckpt.load(path)
            check(loop, meta)
        except ckpt.CheckpointError as exc:
            log.warning("not resuming from %s: %s; starting from zero unless another member's checkpoint fits",
                        path, exc)
            continue
        if best is None or meta["iteration"] > best[2]["iteration"]:
            best = (str(path), tensors, meta)
    return best


L = TypeVar("L", bound=Checkpointed)


def start(cfg: DictConfig, make_loop: Callable[[], L], runs: list[RunDir]) -> tuple[L, dict | None]:
    """A loop for ``runs`` and its resume state: from the newest valid checkpoint, else from
    zero (progress discarded)."""
    loop = make_loop()
    found = find_checkpoint(loop)
    if found is not None:
        path, tensors, meta = found
        try:
            resume = restore(loop, tensors, meta)
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
