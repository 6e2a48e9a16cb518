"""Throughput of a whole RL iteration (sample, score, update): this harness's LM trainer vs TRL.

Both sides train the same tiny SFT policy (the cached pipeline's; TRL gets a fresh copy of the
model object and the harness's tokenizer) on the same prompts with the same settings,
in one process, interleaved round by round (the order alternates between rounds), on CPU in
fp32 with one intra-op thread:

* ``lm.prompts_per_iter`` = 8 prompts x ``group_size`` / ``num_generations`` = 4 samples = 32
  completions per iteration (one optimizer step), ``max_response_len`` / ``max_completion_length``
  = 16 tokens, temperature 1.0, one epoch (``num_iterations=1``), the GRPO advantage
  (group mean and std), clip 0.2, token-mean loss, the same learning rate (constant, Adam eps
  1e-5, no weight decay, grad-norm clip 1.0), KL beta to the frozen SFT reference as a k3 loss
  term (each ``--beta``);
* reward: the programmatic gold score (``harness.tasks.lm.gold_score``, a plain Python
  function) on both sides, so neither pays for a reward-model forward pass.

Harness side: ``harness.app.run`` with ``estimator=grpo epochs=1 minibatches=1 group_size=4
lm.reward=gold eval_every=0 budget.iterations=N``; per-iteration sampled tokens and time from
the run's ``metrics.parquet`` (``tokens``, ``iter_time_s``, ``wall_time_s``).
TRL side: ``trl.GRPOTrainer`` with the ``GRPOConfig`` that ``reference=trl`` translates the same
harness config to (:func:`harness.reference.trl.make_trainer`: prompts, reward function, settings);
TRL's models take their positions from the attention mask, as for ``reference=trl``
(:func:`harness.reference.trl.positions_from_mask`: a cumsum per forward pass);
a ``TrainerCallback`` times each optimizer step (generation, reward and update all happen inside
it) and the reward function counts the sampled completion tokens (EOS included, as the harness
counts them).

Rates per side, the first ``--warmup`` iterations of each run excluded:

* ``step`` (wall): sampled tokens / summed in-iteration wall time (harness ``iter_time_s``; TRL
  ``on_step_begin`` -> ``on_step_end``);
* ``cycle`` (wall): sampled tokens / wall time from the end of the last warm-up iteration to
  the end of the last one (adds per-iteration logging and data loading on both sides);
* ``cpu_step`` / ``cpu_cycle``: the same with this process's CPU time (``time.process_time``;
  the harness's iterations are bracketed by wrapping ``LMSource.collect`` and ``Loop._row`` here,
  nothing in the harness changes). With one intra-op thread an iteration's CPU time hardly
  moves when other jobs share the cores, so on a busy machine it is the steadier ratio.

Tokens/s also follows the response length each policy drifts to (both start from the SFT
policy, then sample on their own); the seconds-per-iteration columns are the length-free view.

Work that differs (what each trainer does, not a setting): at ``beta=0`` TRL loads no reference
model and the harness runs its reference for the ``kl_ref`` column on iterations 1, 11, 21
(``lm.kl_ref_every=10``, the task default; two of them fall in the timed iterations 6-30); in fp32
both take ``log pi_old`` without an extra policy pass (the harness from its sampler, TRL because
``num_iterations=1``). TRL samples with ``model.generate`` (each prompt repeated for its
``num_generations`` completions and prefilled per completion) and runs its teacher-forced passes
over every completion's full sequence; the harness prefills each distinct prompt once and shares
its KV cache with the group, in its own decode loop (a GPT-2's steps through the harness's own
step, :func:`harness.models.lm._gpt2_decode_step`, bit-identical to the model's), and its teacher-forced passes (reference,
update) run each distinct prompt once as well; a GPT-2's passes leave the padding out (the
prompts' left padding, the responses' padding after EOS: :func:`harness.models.lm._gpt2_packed_response`;
values equal, gradients to float rounding) and a group's responses attend to their prompt in one
block (values and gradients to float rounding), where TRL runs every completion padded to the
batch's longest, and in those passes the prompts' last layer runs past its keys and values at
each prompt's last column only (``last`` of :class:`harness.models.lm._PassLayout`; float rounding);
the harness's decoding stops running the rows that have finished (bit for bit the same samples);
the harness runs GPT-2's ``gelu_new`` as ``x sigmoid(2u)``
(``harness.models.lm.fast_gelu``: three elementwise kernels, the same function to float rounding), TRL as
transformers' Python ``NewGELUActivation``.

glibc's allocator: the process first sets it as ``python -m harness`` does
(:func:`harness.allocator.tune_allocator`: blocks from 16 MiB up mmapped, fixed thresholds),
for both sides, unless the environment tuned it (``MALLOC_*`` variables). Without that, glibc's
dynamic mmap threshold moves with whatever the process freed before, and TRL's larger
full-sequence tensors paid page faults or not depending on it: TRL's seconds per iteration
moved by up to 30% with the other side's allocations and the pipeline build, while the
harness's did not.

Usage::

    python benchmarks/lm_vs_trl.py [--iterations 30] [--warmup 5] [--rounds 3] [--beta 0.05 0]
        [--lr 1e-4] [--cache DIR] [--out results.json] [--floor] [--docs]

``--floor`` adds the harness iteration's kernel floor: one more harness run per beta with round 0's
seed (so the same samples and shapes as round 0's run), profiled (``torch.profiler``, shapes
recorded) over the timed iterations; each call of its compute kernels (matrix products, attention,
GELU, layer norm, forward and backward: :data:`FLOOR_KERNELS`) replayed alone on contiguous random
inputs of its shapes, best of 5, and summed per iteration. That is what the iteration would cost if
it were these kernels and nothing else; TRL's seconds per iteration over it is the highest ratio
the harness could reach while it does the same work (the same matrix products: shared prompts,
no padding run). It also splits the harness's iteration into parts
(:data:`PHASES`: sampling, the reference pass, the update and its backward, wrapped with timers in
every harness run and with profiler ranges in the profiled one) and gives each part's wall time
(round 0) beside its kernels' floor.

``--cache`` is the LM pipeline cache (default: a fresh temporary folder, where the SFT stage is
built first, about a minute or two); the stage used is read, never written, once it exists.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402
from harness.app import run as harness_run
from harness.config import register_configs
from harness.tasks.lm.pipeline import build_task

PROMPTS_PER_ITER = 8
GROUP_SIZE = 4
MAX_LEN = 16
TEMPERATURE = 1.0
CLIP = 0.2
MAX_GRAD_NORM = 1.0
KINDS = ("step", "cycle", "cpu_step", "cpu_cycle")  # rates: wall clock in-iteration / whole loop, CPU time the same


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "harness" / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def base_overrides(cache: Path, results: Path, iterations: int, lr: float, beta: float, seed: int) -> list[str]:
    return ["task=lm_summarize", "estimator=grpo", f"results_dir={results}", f"lm.cache_dir={cache}",
            "threads=1", "device=cpu", "lm.dtype=float32", "progress=false", "eval_every=0",
            "budget.tokens=null", f"budget.iterations={iterations}", "lm.reward=gold",
            f"lm.prompts_per_iter={PROMPTS_PER_ITER}", f"group_size={GROUP_SIZE}",
            f"lm.max_response_len={MAX_LEN}", f"lm.temperature={TEMPERATURE}", "lm.no_eos_penalty=0.0",
            "epochs=1", "minibatches=1", "update=clip", f"clip_eps={CLIP}", "std_normalize=true",
            "normalize_advantages=none", "loss_agg=token_mean", "ent_coef=0.0", f"max_grad_norm={MAX_GRAD_NORM}",
            f"lr={lr}", f"kl.beta={beta}", "kl.estimator=k3", "kl.in_reward=false", "kl.target=ref",
            "kl.adaptive=false", f"seed={seed}"]


# --------------------------------------------------------------------------- rates
def rates(tokens: list[int], step_s: list[float], ends: list[float], warmup: int) -> dict:
    """Tokens/s over iterations ``warmup..`` (0-based): ``step`` from the in-iteration times,
    ``cycle`` from the wall clock between the end of iteration ``warmup - 1`` and the last end."""
    n = len(tokens)
    if n <= warmup:
        raise ValueError(f"only {n} iterations recorded, warm-up is {warmup}")
    tok = sum(tokens[warmup:])
    step = sum(step_s[warmup:])
    start = ends[warmup - 1] if warmup > 0 else ends[0] - step_s[0]
    cycle = ends[-1] - start
    return {"iterations": n - warmup, "tokens": int(tok), "step_s": step, "cycle_s": cycle,
            "tok_per_s_step": tok / step, "tok_per_s_cycle": tok / cycle,
            "tokens_per_completion": tok / ((n - warmup) * PROMPTS_PER_ITER * GROUP_SIZE),
            "s_per_iter_step": step / (n - warmup)}


def all_rates(tokens, wall_step, wall_ends, cpu_step, cpu_ends, warmup: int) -> dict:
    """Wall-clock rates, plus the same from this process's CPU time (``cpu_*``): with one
    intra-op thread the CPU time of an iteration barely moves when other jobs share the cores,
    so it is the steadier of the two on a busy machine (it omits time spent waiting, e.g. I/O)."""
    r = rates(tokens, wall_step, wall_ends, warmup)
    c = rates(tokens, cpu_step, cpu_ends, warmup)
    r.update(cpu_step_s=c["step_s"], cpu_cycle_s=c["cycle_s"], tok_per_s_cpu_step=c["tok_per_s_step"],
             tok_per_s_cpu_cycle=c["tok_per_s_cycle"], cpu_s_per_iter_step=c["s_per_iter_step"])
    return r


# --------------------------------------------------------------------------- phases of an iteration
# Where a harness iteration's time goes (--floor): each is a call the harness makes once per
# iteration (backward inside update), wrapped while the benchmark runs; nothing in the harness changes.
PHASES = {"sample": ("harness.train.lm", "generate_groups"), "reference": ("harness.train.lm", "LMSource._ref_logp"),
          "update": ("harness.train.loop", "update"), "backward": ("torch", "Tensor.backward")}


@contextlib.contextmanager
def phase_hooks(wrap):
    """Replace each :data:`PHASES` callable ``fn`` by ``wrap(phase, fn)`` for the block's duration."""
    import importlib

    saved = []
    try:
        for phase, (module, attr) in PHASES.items():
            *path, name = attr.split(".")
            owner = importlib.import_module(module)
            for part in path:
                owner = getattr(owner, part)
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, wrap(phase, owner.__dict__[name]))
        yield
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


# --------------------------------------------------------------------------- harness side
def run_harness(cache: Path, scratch: Path, iterations: int, warmup: int, lr: float, beta: float, seed: int,
                tag: str, profiler=None, folder: str = "harness") -> dict:
    """One harness run of this benchmark's config: its rates (:func:`all_rates`), each part's wall time
    per iteration (:data:`PHASES`) and its outcomes. With a ``torch.profiler`` ``profiler`` (``--floor``),
    that is started at iteration ``warmup + 1`` and stopped at the end, each part inside a
    ``phase:<part>`` range."""
    results = scratch / folder / tag
    cfg = compose(base_overrides(cache, results, iterations, lr, beta, seed))
    # CPU-time probes (the parquet holds wall times only): an iteration starts with collect()
    # and its iter_time_s is taken just before _row() is entered
    from harness.train.lm import LMSource
    from harness.train.loop import Loop

    cpu_begin: list[float] = []
    cpu_end: list[float] = []
    orig_collect, orig_row = LMSource.collect, Loop._row

    def collect(self, *a, **k):
        cpu_begin.append(time.process_time())
        if profiler is not None and len(cpu_begin) == warmup + 1:
            profiler.start()
        return orig_collect(self, *a, **k)

    def row(self, *a, **k):
        cpu_end.append(time.process_time())
        return orig_row(self, *a, **k)

    phase_s: dict[str, list[tuple[int, float]]] = {phase: [] for phase in PHASES}  # (iteration, seconds)

    def span(phase):  # a profiler range around each part, when profiling
        return torch.profiler.record_function(f"phase:{phase}") if profiler is not None else contextlib.nullcontext()

    def timed(phase, fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                with span(phase):
                    return fn(*a, **k)
            finally:
                phase_s[phase].append((len(cpu_begin), time.perf_counter() - t))
        return call

    LMSource.collect, Loop._row = collect, row
    t0 = time.time()
    try:
        with phase_hooks(timed):
            counts = harness_run(cfg)
    finally:
        LMSource.collect, Loop._row = orig_collect, orig_row
        if profiler is not None and len(cpu_begin) > warmup:
            profiler.stop()
    wall = time.time() - t0
    paths = list((results / "lm_summarize" / "grpo").glob("seed*/metrics.parquet"))
    if len(paths) != 1:
        raise RuntimeError(f"harness run {tag}: expected one metrics.parquet, found {paths} (status {counts})")
    df = pd.read_parquet(paths[0]).sort_values("iteration")
    if len(df) != iterations:
        raise RuntimeError(f"harness run {tag}: {len(df)} of {iterations} iterations logged (status {counts})")
    if len(cpu_begin) != iterations or len(cpu_end) != iterations:
        raise RuntimeError(f"harness run {tag}: CPU probes saw {len(cpu_begin)}/{len(cpu_end)} iterations")
    tokens = df.tokens.diff().fillna(df.tokens.iloc[0]).astype(int).tolist()
    r = all_rates(tokens, df.iter_time_s.tolist(), df.wall_time_s.tolist(),
                  [e - b for b, e in zip(cpu_begin, cpu_end)], cpu_end, warmup)
    r["phase_s_per_iter"] = {phase: sum(dt for i, dt in v if i > warmup) / (iterations - warmup)
                             for phase, v in phase_s.items()}
    r.update(process_wall_s=wall, gold_first5=float(df.gold_reward.head(5).mean()),
             gold_last5=float(df.gold_reward.tail(5).mean()), kl_ref_last5=float(df.kl_ref.tail(5).mean()))
    return r


# --------------------------------------------------------------------------- TRL side
def make_trl_trainer(cache: Path, task, out_dir: Path, iterations: int, lr: float, beta: float, seed: int):
    """TRL's GRPOTrainer on the harness config of this run (:func:`base_overrides`), translated by
    :func:`harness.reference.trl.make_trainer` (the same SFT policy object, prompts, gold reward and
    settings as ``reference=trl``), with a callback that times each optimizer step."""
    from transformers import TrainerCallback

    from harness.reference.trl import check, make_trainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin = self.cpu_begin = 0.0
            self.tok0 = 0
            self.tokens: list[int] = []
            self.step_s: list[float] = []
            self.ends: list[float] = []
            self.cpu_step_s: list[float] = []
            self.cpu_ends: list[float] = []

        def on_train_begin(self, args, state, control, **kw):
            torch.set_num_threads(1)

        def on_step_begin(self, args, state, control, **kw):
            self.begin = time.perf_counter()
            self.cpu_begin = time.process_time()
            self.tok0 = counter.tokens

        def on_step_end(self, args, state, control, **kw):
            t, c = time.perf_counter(), time.process_time()
            self.step_s.append(t - self.begin)
            self.ends.append(t)
            self.cpu_step_s.append(c - self.cpu_begin)
            self.cpu_ends.append(c)
            self.tokens.append(counter.tokens - self.tok0)

    cfg = compose(base_overrides(cache, out_dir / "unused", iterations, lr, beta, seed))
    check(cfg)
    timer = StepTimer()
    trainer, counter, _ = make_trainer(cfg, task, out_dir, iterations, callbacks=[timer])
    return trainer, timer, counter, trainer.args


def run_trl(cache: Path, task, scratch: Path, iterations: int, warmup: int, lr: float, beta: float, seed: int,
            tag: str) -> dict:
    trainer, timer, counter, _ = make_trl_trainer(cache, task, scratch / "trl" / tag, iterations, lr, beta, seed)
    torch.set_num_threads(1)
    t0 = time.time()
    trainer.train()
    wall = time.time() - t0
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"TRL run {tag}: torch threads changed to {torch.get_num_threads()}")
    if len(timer.tokens) != iterations:
        raise RuntimeError(f"TRL run {tag}: {len(timer.tokens)} of {iterations} steps timed")
    if counter.completions != iterations * PROMPTS_PER_ITER * GROUP_SIZE:
        raise RuntimeError(f"TRL run {tag}: {counter.completions} completions scored, expected "
                           f"{iterations * PROMPTS_PER_ITER * GROUP_SIZE}")
    logged = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    r = all_rates(timer.tokens, timer.step_s, timer.ends, timer.cpu_step_s, timer.cpu_ends, warmup)
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    gold = [b["gold_reward"] for b in counter.batches]
    r.update(process_wall_s=wall, gold_first5=sum(gold[:5]) / 5, gold_last5=sum(gold[-5:]) / 5,
             kl_ref_last5=(sum(kls[-5:]) / len(kls[-5:])) if kls else None,
             logged_mean_length=(sum(logged[warmup:]) / len(logged[warmup:])) if len(logged) > warmup else None)
    del trainer
    gc.collect()
    return r


# --------------------------------------------------------------------------- kernel floor
# The compute kernels of an iteration, each replayed alone at the shapes the harness gave it (--floor):
# what the iteration would cost if it were these kernels and nothing else (no other op, no Python).
# Adam's one fused kernel per step (about 0.2 ms) is left out, so the floor is if anything low.
FLOOR_KERNELS = {
    "aten::addmm": "matrix products", "aten::mm": "matrix products", "aten::bmm": "matrix products",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention",
    "aten::gelu": "GELU", "aten::gelu_backward": "GELU",
    # the harness's GELU (harness.models.lm.SigmoidGELU); other in-place products and sums count
    # too, all on small tensors
    "aten::addcmul": "GELU", "aten::sigmoid_": "GELU", "aten::mul_": "GELU", "aten::add_": "GELU",
    "aten::native_layer_norm": "layer norm", "aten::native_layer_norm_backward": "layer norm",
}


def kernel_calls(events) -> dict:
    """``{(op, input shapes, scalar inputs): [calls, shapes, scalars]}`` over the profiler events of
    :data:`FLOOR_KERNELS` (``torch.profiler`` with ``record_shapes=True``)."""
    calls: dict = {}
    for e in events:
        if e.name in FLOOR_KERNELS:
            shapes, scalars = list(e.input_shapes), list(e.concrete_inputs)
            key = (e.name, repr(shapes), repr(scalars))
            calls.setdefault(key, [0, shapes, scalars])[0] += 1
    return calls


def replay_args(name: str, shapes: list, scalars: list) -> tuple[list, dict]:
    """Positional and keyword inputs (by the op's schema) for one recorded call: a random tensor of
    each recorded shape, the recorded scalars and lists; GELU's ``approximate`` (a string the
    profiler does not record) is ``"tanh"``, GPT-2's activation. A tensor argument recorded with no
    shape is a 0-dimensional tensor (``addcmul``'s constant); ops with overloads are read by their
    ``Tensor`` overload's schema."""
    packet = getattr(torch.ops.aten, name.split("::", 1)[1])
    schema = (packet.default if "default" in packet.overloads() else packet.Tensor)._schema.arguments
    values = [c if c is not None else (torch.randn(s) if s else None) for s, c in zip(shapes, scalars)]
    values = [torch.randn(()) if v is None and isinstance(a.type, torch.TensorType) else v
              for a, v in zip(schema, values)] + values[len(schema):]
    if name in ("aten::gelu", "aten::gelu_backward"):
        values[-1] = "tanh"
    args = [v for a, v in zip(schema, values) if not a.kwarg_only]
    kwargs = {a.name: v for a, v in zip(schema, values) if a.kwarg_only}
    return args, kwargs


def best_seconds(op, args: tuple | list, kwargs: dict | None = None, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds of one call ``op(*args, **kwargs)`` without autograd, after 3
    warm-up calls, each repeat about 2 ms of calls."""
    kwargs = kwargs or {}
    with torch.no_grad():
        for _ in range(3):
            op(*args, **kwargs)
        t0 = time.perf_counter()
        op(*args, **kwargs)
        n = max(1, int(2e-3 / max(time.perf_counter() - t0, 1e-7)))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                op(*args, **kwargs)
            best = min(best, (time.perf_counter() - t0) / n)
    return best


def replay_seconds(name: str, shapes: list, scalars: list, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds of one call of ``name`` on contiguous inputs of the recorded shapes."""
    args, kwargs = replay_args(name, shapes, scalars)
    return best_seconds(getattr(torch.ops.aten, name.split("::", 1)[1]), args, kwargs, repeats)


def kernel_floor(calls: dict, iterations: int, timed: dict | None = None) -> dict:
    """Seconds per iteration by kernel group (and ``total``): each recorded call's replayed time x its
    calls / ``iterations``. ``timed`` keeps each call's replayed time by key, so that floors of
    parts of the same calls add up to the whole."""
    timed = {} if timed is None else timed
    floor = dict.fromkeys(dict.fromkeys(FLOOR_KERNELS.values()), 0.0)
    for key, (n, shapes, scalars) in calls.items():
        if key not in timed:
            timed[key] = replay_seconds(key[0], shapes, scalars)
        floor[FLOOR_KERNELS[key[0]]] += n * timed[key] / iterations
    floor["total"] = sum(floor.values())
    return floor


def top_level_ops(events) -> list:
    """The ``aten::`` events that no other ``aten::`` op called: one per op the harness's Python
    (or autograd's engine, in the backward) asked torch for, whatever it did inside."""
    out = []
    for e in events:
        if e.name.startswith("aten::"):
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            if parent is None:
                out.append(e)
    return out


def bare_op_seconds(repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds of one ``torch.add`` of two one-element tensors called from
    Python (:func:`best_seconds`): what an eager op costs with next to no kernel, the dispatch alone."""
    return best_seconds(torch.add, (torch.ones(1), torch.ones(1)), repeats=repeats)


def profile_harness(cache: Path, scratch: Path, iterations: int, warmup: int, lr: float, beta: float, seed: int,
                    tag: str) -> tuple[dict, dict, dict]:
    """:func:`run_harness` under ``torch.profiler`` (shapes recorded) over iterations ``warmup + 1 ..``
    (with the same seed it is the same run: same samples, same shapes). Returns its kernel calls,
    ``{"iteration": calls, <phase>: calls of the kernels that start inside that phase}``, its op
    calls (:func:`top_level_ops`) counted the same way, and the run's own result."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
    r = run_harness(cache, scratch, iterations, warmup, lr, beta, seed, tag, profiler=prof, folder="harness_profiled")
    events = prof.events()
    kernels = [e for e in events if e.name in FLOOR_KERNELS]
    tops = top_level_ops(events)
    out, ops = {"iteration": kernel_calls(kernels)}, {"iteration": len(tops)}
    for phase in PHASES:
        spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == f"phase:{phase}"]
        inside = lambda x: any(a <= x.time_range.start <= b for a, b in spans)  # noqa: E731
        out[phase] = kernel_calls(k for k in kernels if inside(k))
        ops[phase] = sum(1 for o in tops if inside(o))
    return out, ops, r


def phase_table(wall: dict, iteration_s: float, floor: dict, iteration_floor: float, ops: dict,
                iteration_ops: float) -> list[tuple[str, float, float, float]]:
    """``(part, wall s, kernel floor s, op calls)`` per iteration: sampling, the reference pass, the
    update without its backward (forward, loss, clipping, Adam), the backward, the rest of the
    iteration, the whole iteration (``backward`` runs inside ``update``)."""
    parts = [(part, wall[a] - (wall[b] if b else 0.0), floor[a] - (floor[b] if b else 0.0), ops[a] - (ops[b] if b else 0))
             for part, a, b in [("sample", "sample", None), ("reference", "reference", None),
                                ("update without backward", "update", "backward"), ("backward", "backward", None)]]
    rest_floor = round(iteration_floor - sum(p[2] for p in parts), 12) + 0.0  # kernels outside the parts; no -0.0
    parts.append(("rest", iteration_s - sum(p[1] for p in parts), rest_floor, iteration_ops - sum(p[3] for p in parts)))
    return [*parts, ("iteration", iteration_s, iteration_floor, iteration_ops)]


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=30, help="iterations (optimizer steps) per run")
    ap.add_argument("--warmup", type=int, default=5, help="first iterations of each run left out of the rates")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (harness run, TRL run) per beta")
    ap.add_argument("--beta", type=float, nargs="+", default=[0.05, 0.0], help="KL beta(s), each run on both sides")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate, both sides")
    ap.add_argument("--cache", default=None, help="LM pipeline cache folder (default: a fresh temporary one)")
    ap.add_argument("--scratch", default=None, help="folder for run outputs (default: a fresh temporary one)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--floor", action="store_true", help="also profile one harness run per beta (round 0's seed, "
                    "so the same samples) and replay its compute kernels alone at their shapes: the kernel floor")
    ap.add_argument("--docs", action="store_true", help="also write the table and the medians into docs/lm.md's "
                    "lm-vs-trl block, stamped with this command and today's date")
    args = ap.parse_args()
    if args.iterations <= args.warmup:
        ap.error("--iterations must exceed --warmup")

    from harness.allocator import tune_allocator

    allocator = "as python -m harness sets it" if tune_allocator() else "as the environment set it"
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    logging.getLogger("harness").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import transformers
    import trl

    t_start = time.time()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="lm-vs-trl-"))
    scratch.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache or scratch / ".cache" / "lm")

    # the pipeline (SFT policy, tokenizer, prompts), shared by both sides (TRL gets a fresh copy of the
    # SFT policy object and the harness's prompts as text, checked to tokenize back to the same ids:
    # harness.reference.trl.make_trainer)
    cfg = compose(base_overrides(cache, scratch / "harness", args.iterations, args.lr, args.beta[0], 0))
    t0 = time.time()
    task = build_task(cfg)
    pipeline_s = time.time() - t0

    header = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                    "allocator": allocator},
        "settings": {"prompts_per_iter": PROMPTS_PER_ITER, "group_size": GROUP_SIZE, "max_len": MAX_LEN,
                     "temperature": TEMPERATURE, "lr": args.lr, "epochs": 1, "clip": CLIP, "reward": "gold",
                     "kl_estimator": "k3 (loss term)", "iterations": args.iterations, "warmup": args.warmup,
                     "rounds": args.rounds, "betas": args.beta, "device": "cpu", "dtype": "float32"},
        "pipeline": {"policy_source": task.policy_source, "load_s": pipeline_s,
                     "sft_cached": task.meta.get("sft", {}).get("cached"),
                     "n_params": sum(p.numel() for p in task.load_policy().parameters())},
    }
    print(json.dumps(header, indent=2), flush=True)

    runs: list[dict] = []
    for beta in args.beta:
        for rnd in range(args.rounds):
            order = ("harness", "trl") if rnd % 2 == 0 else ("trl", "harness")
            row = {"beta": beta, "round": rnd, "order": "/".join(order)}
            for side in order:
                tag = f"b{beta:g}_r{rnd}"
                if side == "harness":
                    row["harness"] = run_harness(cache, scratch, args.iterations, args.warmup, args.lr, beta, rnd, tag)
                else:
                    row["trl"] = run_trl(cache, task, scratch, args.iterations, args.warmup, args.lr, beta, rnd, tag)
            for k in KINDS:
                row[f"ratio_{k}"] = row["harness"][f"tok_per_s_{k}"] / row["trl"][f"tok_per_s_{k}"]
            runs.append(row)
            h, t = row["harness"], row["trl"]
            print(f"beta={beta:g} round={rnd} ({row['order']}): harness {h['tok_per_s_step']:.0f} tok/s, "
                  f"TRL {t['tok_per_s_step']:.0f} tok/s, ratio {row['ratio_step']:.2f} "
                  f"(wall cycle {row['ratio_cycle']:.2f}, CPU {row['ratio_cpu_step']:.2f})", flush=True)

    summary = {}
    for beta in args.beta:
        rows = [r for r in runs if r["beta"] == beta]
        s = {}
        for k in KINDS:
            s[f"harness_tok_per_s_{k}"] = statistics.median(r["harness"][f"tok_per_s_{k}"] for r in rows)
            s[f"trl_tok_per_s_{k}"] = statistics.median(r["trl"][f"tok_per_s_{k}"] for r in rows)
            s[f"ratio_{k}_median"] = statistics.median(r[f"ratio_{k}"] for r in rows)
            s[f"ratio_{k}_min"] = min(r[f"ratio_{k}"] for r in rows)
            s[f"ratio_{k}_max"] = max(r[f"ratio_{k}"] for r in rows)
            s[f"ratio_{k}_of_medians"] = s[f"harness_tok_per_s_{k}"] / s[f"trl_tok_per_s_{k}"]
        for side in ("harness", "trl"):
            for key in ("tokens_per_completion", "s_per_iter_step", "cpu_s_per_iter_step"):
                s[f"{side}_{key}"] = statistics.median(r[side][key] for r in rows)
        summary[f"{beta:g}"] = s

    floors = {}
    if args.floor:
        for beta in args.beta:
            tag = f"b{beta:g}_r0"
            calls, ops, profiled = profile_harness(cache, scratch, args.iterations, args.warmup, args.lr, beta, 0, tag)
            r0 = next(r for r in runs if r["beta"] == beta and r["round"] == 0)["harness"]
            n, timed = args.iterations - args.warmup, {}
            whole = kernel_floor(calls["iteration"], n, timed)
            parts = {ph: kernel_floor(calls[ph], n, timed)["total"] for ph in PHASES}
            same = profiled["tokens"] == r0["tokens"]  # sampled tokens of the timed iterations
            floors[f"{beta:g}"] = {**whole, "same_samples": same, "harness_s_per_iter": r0["s_per_iter_step"],
                                   "trl_s_per_iter": summary[f"{beta:g}"]["trl_s_per_iter_step"],
                                   "bare_op_s": bare_op_seconds(),
                                   "phases": phase_table(r0["phase_s_per_iter"], r0["s_per_iter_step"], parts,
                                                         whole["total"], {ph: ops[ph] / n for ph in PHASES},
                                                         ops["iteration"] / n)}
            print(f"beta={beta:g} kernel floor: {json.dumps(floors[f'{beta:g}'])}", flush=True)

    total = time.time() - t_start

    def line(cells) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    md: list[str] = []
    md.append("")
    md.append(f"Sampled tokens/s of a whole RL iteration (sample + score + update), iterations {args.warmup + 1}-"
              f"{args.iterations} of each run.")
    md.append("wall = in-iteration wall time; cycle = wall clock of the whole loop (logging included); "
              "CPU = this process's CPU time in the iteration. ratio = harness / TRL. "
              f"glibc's allocator, both sides: {allocator}.")
    md.append("")
    cols = ["beta", "round", "order", "harness wall", "TRL wall", "ratio wall", "ratio cycle", "harness CPU",
            "TRL CPU", "ratio CPU", "tok/completion h / TRL", "s/iter wall h / TRL", "s/iter CPU h / TRL"]
    md.append(line(cols))
    md.append(line(["---"] * len(cols)))
    for r in runs:
        h, t = r["harness"], r["trl"]
        md.append(line([f"{r['beta']:g}", r["round"], r["order"], f"{h['tok_per_s_step']:.0f}", f"{t['tok_per_s_step']:.0f}",
                        f"{r['ratio_step']:.2f}", f"{r['ratio_cycle']:.2f}", f"{h['tok_per_s_cpu_step']:.0f}",
                        f"{t['tok_per_s_cpu_step']:.0f}", f"{r['ratio_cpu_step']:.2f}",
                        f"{h['tokens_per_completion']:.2f} / {t['tokens_per_completion']:.2f}",
                        f"{h['s_per_iter_step']:.3f} / {t['s_per_iter_step']:.3f}",
                        f"{h['cpu_s_per_iter_step']:.3f} / {t['cpu_s_per_iter_step']:.3f}"]))
    for beta, s in summary.items():
        md.append(line([beta, "median", "", f"{s['harness_tok_per_s_step']:.0f}", f"{s['trl_tok_per_s_step']:.0f}",
                        f"{s['ratio_step_median']:.2f}", f"{s['ratio_cycle_median']:.2f}",
                        f"{s['harness_tok_per_s_cpu_step']:.0f}", f"{s['trl_tok_per_s_cpu_step']:.0f}",
                        f"{s['ratio_cpu_step_median']:.2f}",
                        f"{s['harness_tokens_per_completion']:.2f} / {s['trl_tokens_per_completion']:.2f}",
                        f"{s['harness_s_per_iter_step']:.3f} / {s['trl_s_per_iter_step']:.3f}",
                        f"{s['harness_cpu_s_per_iter_step']:.3f} / {s['trl_cpu_s_per_iter_step']:.3f}"]))
    md.append("")
    for beta, s in summary.items():
        md.append(f"- beta={beta}: harness / TRL tokens/s, median over {args.rounds} rounds: wall {s['ratio_step_median']:.2f}x "
                  f"(range {s['ratio_step_min']:.2f}-{s['ratio_step_max']:.2f}), CPU time {s['ratio_cpu_step_median']:.2f}x "
                  f"(range {s['ratio_cpu_step_min']:.2f}-{s['ratio_cpu_step_max']:.2f}); goal >= 3x")
    if floors:
        groups = list(dict.fromkeys(FLOOR_KERNELS.values()))
        md.append("")
        md.append(f"Kernel floor (`--floor`): one more harness run per beta with round 0's seed (the same samples: "
                  f"{all(f['same_samples'] for f in floors.values())}), profiled over the same iterations; each call "
                  f"of its compute kernels replayed alone on contiguous inputs of its shapes (best of 5), summed: the "
                  f"iteration if it were these kernels and nothing else. ms per iteration.")
        md.append("")
        cols = ["beta", *groups, "floor", "harness (round 0)", "floor / harness", "TRL (median)", "TRL / floor"]
        md.append(line(cols))
        md.append(line(["---"] * len(cols)))
        for beta, f in floors.items():
            md.append(line([beta, *(f"{1e3 * f[g]:.1f}" for g in groups), f"{1e3 * f['total']:.1f}",
                            f"{1e3 * f['harness_s_per_iter']:.1f}", f"{f['total'] / f['harness_s_per_iter']:.2f}",
                            f"{1e3 * f['trl_s_per_iter']:.1f}", f"{f['trl_s_per_iter'] / f['total']:.2f}"]))
        md.append("")
        md.append("Where the harness's iteration goes (round 0, ms per iteration; wall from timers around each part, "
                  "kernels from the profiled run; the update's forward, loss, clipping and Adam are one part; ops: "
                  "the torch ops the part calls per iteration, each counted once whatever it calls inside; per op: "
                  "the time outside kernels over them):")
        md.append("")
        cols = ["beta", "part", "wall", "kernels", "outside kernels", "ops", "outside kernels per op, us"]
        md.append(line(cols))
        md.append(line(["---"] * len(cols)))
        for beta, f in floors.items():
            for part, w, k, o in f["phases"]:
                md.append(line([beta, part, f"{1e3 * w:.1f}", f"{1e3 * k:.1f}", f"{1e3 * (w - k):.1f}", f"{o:.0f}",
                                f"{1e6 * (w - k) / o:.1f}" if o else "-"]))
        md.append("")
        for beta, f in floors.items():
            it = f["phases"][-1]
            budget = f["trl_s_per_iter"] / 3 - f["total"]
            md.append(f"- beta={beta}: 3x TRL is {1e3 * f['trl_s_per_iter'] / 3:.1f} ms an iteration, the kernel floor "
                      f"{1e3 * f['total']:.1f} ms of it; the {it[3]:.0f} ops would have {1e6 * budget / it[3]:.1f} us "
                      f"each outside kernels (now {1e6 * (it[1] - it[2]) / it[3]:.1f}); a bare op call from Python "
                      f"(`torch.add` of two one-element tensors, best of 5) takes {1e6 * f['bare_op_s']:.1f} us")
    print("\n".join(md))
    if args.docs:
        print(f"wrote {write_block('docs/lm.md', 'lm-vs-trl', chr(10).join(md), command=header['command'])}")
    print(f"command: {header['command']}")
    print(f"total wall time: {total:.0f} s")
    report = {**header, "runs": runs, "summary": summary, "floors": floors, "total_wall_s": total}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
