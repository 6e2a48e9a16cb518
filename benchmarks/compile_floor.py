"""Does ``torch.compile`` take the plain PPO update step below its eager floor on CPU?

``benchmarks/control_speed.py`` shows that a hand-written eager PPO step
(:func:`benchmarks.control_speed.update_floor`: the zoo's CartPole networks, batch, loss, clipping
and Adam) times the lone run's 7,820 minibatches, plus interpreter start-up, already costs more
than half of SB3's whole process. This script times that same step (built by
:func:`benchmarks.control_speed.floor_problem`, not a copy) under ``torch.compile`` (inductor's C++
backend on CPU), side by side in one process on one torch thread, over interleaved rounds:

- ``eager``: the step as :func:`update_floor` times it (Adam with torch's default implementation);
- ``eager_fused``: the same with ``Adam(fused=True)`` (what the harness's lone runs use);
- ``compile_loss``: ``torch.compile(loss)`` (forward and loss; AOTAutograd compiles the backward),
  then eager clipping and Adam;
- ``compile_loss_fused``: the same with the fused eager Adam;
- ``compile_step`` (``--whole-step``): ``torch.compile`` of the whole step function (dynamo breaks
  the graph at ``backward()``; the clipping and Adam after it are compiled as a second graph).

It prints, per variant: the steady time per minibatch (median over rounds), the compile time (the
first call's time less one steady call, cold: measured again in a fresh subprocess per variant with
its own empty ``TORCHINDUCTOR_CACHE_DIR``, after one eager step so that the imports every torch
PPO process pays are not counted to the compile), and whether its numbers equal eager's: the
loss and gradients of the first step and the loss and parameters after ``--check-steps`` steps on
fresh minibatches, ``torch.equal`` or the largest absolute difference, beside eager float32's own
distance from the same steps in float64 (what rounding alone moves). Then the projection of a lone
run's floor: compile time + 7,820 x per-minibatch time + start-up (:func:`startup_floor`, measured
here), over SB3's whole lone process (:func:`benchmarks.control_speed.sb3_process`, timed here
``--sb3-rounds`` times between the step timings and the start-up; median) and over the eager floor
measured here.

Usage: python benchmarks/compile_floor.py [--rounds 3] [--reps 1000] [--check-steps 50]
       [--modes default [max-autotune-no-cudagraphs]] [--whole-step] [--no-cold] [--sb3-rounds 1] [--docs]
``--docs`` writes the results into docs/benchmarks.md (block ``compile-floor``).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_variant(name: str, mode: str, steps: int):
    """``(problem, step)``: a fresh :func:`floor_problem` (same initial weights every time) and the
    zero-argument step of variant ``name`` on its fixed minibatch."""
    import torch

    from benchmarks.control_speed import floor_problem

    fused = name.endswith("_fused")
    prob = floor_problem(steps, fused_adam=fused)
    if name in ("eager", "eager_fused"):
        return prob, prob.step
    if name in ("compile_loss", "compile_loss_fused"):
        loss = torch.compile(prob.loss, mode=mode)
        return prob, lambda: prob.step(loss)
    if name == "compile_step":
        return prob, torch.compile(prob.step, mode=mode)
    raise ValueError(name)


def first_call(name: str, mode: str, steps: int) -> dict:
    """Seconds of the variant's first call and of its second (one eager step first, whose first
    Adam step imports ``torch._dynamo``, as every torch PPO process does)."""
    import torch

    from benchmarks.control_speed import floor_problem

    floor_problem(steps).step()
    prob, step = make_variant(name, mode, steps)
    t0 = time.perf_counter()
    step()
    t1 = time.perf_counter()
    step()
    t2 = time.perf_counter()
    del prob, torch
    return {"first": t1 - t0, "second": t2 - t1}


def cold_first_call(name: str, mode: str, steps: int) -> dict:
    """:func:`first_call` in a fresh interpreter with an empty inductor cache of its own (``first``,
    ``second``), then in another fresh interpreter on the cache the first one filled
    (``warm_first``: what a user's next run of the same step pays; dynamo still traces)."""
    res = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        for key in ("", "warm_"):
            out = subprocess.run([sys.executable, __file__, "--child", name, "--mode", mode, "--steps", str(steps)],
                                 env=env, check=True, capture_output=True, text=True).stdout
            res.update({key + k: v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
    return res


def equality(name: str, mode: str, steps: int, k: int) -> dict:
    """The variant against eager (same Adam kind), from equal weights on the same ``k`` fresh
    minibatches: first step's loss and gradients, every step's loss, the parameters after ``k``;
    and eager float32 against the same eager steps in float64 (rounding's own size)."""
    import torch

    ref, _ = make_variant("eager_fused" if name.endswith("_fused") else "eager", mode, steps)
    var, _ = make_variant(name, mode, steps)
    wide, _ = make_variant("eager", mode, steps)
    wide.pi.double(), wide.vf.double()
    compiled_loss = torch.compile(var.loss, mode=mode) if name.startswith("compile_loss") else var.loss
    compiled_step = torch.compile(var.step, mode=mode) if name == "compile_step" else var.step
    gen = torch.Generator().manual_seed(1)
    losses, first_grads = [], None
    for i in range(k):
        batch = ref.new_batch(gen)
        a = ref.step(ref.loss, batch)
        grads_a = [p.grad.clone() for p in ref.params] if i == 0 else None
        b = compiled_step(compiled_loss, batch) if name == "compile_step" else var.step(compiled_loss, batch)
        if i == 0:
            first_grads = [(g, p.grad.clone()) for g, p in zip(grads_a, var.params)]
            loss0 = (a.detach(), b.detach())
        w = wide.step(wide.loss, tuple(x.double() if x.is_floating_point() else x for x in batch))
        losses.append((a.detach(), b.detach(), w.detach()))

    def diff(pairs) -> float:
        return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in pairs)

    return {"loss0_equal": bool(torch.equal(*loss0)), "loss0_diff": diff([loss0]),
            "grads0_equal": all(torch.equal(x, y) for x, y in first_grads), "grads0_diff": diff(first_grads),
            "loss_diff": diff([(a, b) for a, b, _ in losses]),
            "params_equal": all(torch.equal(x, y) for x, y in zip(ref.params, var.params)),
            "params_diff": diff(zip(ref.params, var.params)),
            "f32_vs_f64_loss": diff([(a, w) for a, _, w in losses]),
            "f32_vs_f64_params": diff(zip(ref.params, wide.params))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000, help="env steps of the lone run (its minibatch count)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--reps", type=int, default=1000, help="minibatches per variant per round")
    ap.add_argument("--check-steps", type=int, default=50, help="steps of the equality check")
    ap.add_argument("--modes", nargs="+", default=["default"],
                    help="torch.compile modes (e.g. default max-autotune-no-cudagraphs)")
    ap.add_argument("--whole-step", action="store_true", help="also compile the whole step function")
    ap.add_argument("--no-cold", action="store_true", help="skip the fresh-subprocess compile timings")
    ap.add_argument("--sb3-rounds", type=int, default=1, help="SB3 lone processes to time (median); 0: no SB3 column")
    ap.add_argument("--docs", action="store_true", help="also write the results into docs/benchmarks.md's "
                    "compile-floor block, stamped with this command and today's date")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="default", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one cold first call, in the fresh process cold_first_call started
        import torch

        torch.set_num_threads(1)
        print(json.dumps(first_call(args.child, args.mode, args.steps)))
        return

    cache = tempfile.mkdtemp(prefix="compile_floor_inductor_")  # this process's compiles start from an empty cache
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    import torch
    import torch._dynamo

    from benchmarks.control_speed import sb3_process, startup_floor

    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64  # every variant and check compiles its own closure of one code
    med = statistics.median
    load = os.getloadavg()
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} cores; load average {load}; "
          f"inductor cache {cache}", flush=True)

    names = ["eager", "eager_fused"]
    for mode in args.modes:
        names += [f"compile_loss@{mode}", f"compile_loss_fused@{mode}"] + ([f"compile_step@{mode}"]
                                                                             if args.whole_step else [])
    variants, compile_warm = {}, {}
    for full in names:
        name, _, mode = full.partition("@")
        prob, step = make_variant(name, mode or "default", args.steps)
        t0 = time.perf_counter()
        step()
        compile_warm[full] = time.perf_counter() - t0
        variants[full] = (prob, step)
    n_mb = variants["eager"][0].n_minibatches

    times = {full: [] for full in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
        for full in order:
            step = variants[full][1]
            for _ in range(max(1, args.reps // 10)):  # warm-up
                step()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                step()
            times[full].append((time.perf_counter() - t0) / args.reps)
        print(f"round {r}: " + ", ".join(f"{f} {times[f][-1] * 1e3:.3f} ms" for f in names), flush=True)
    per_mb = {f: med(t) for f, t in times.items()}

    cold = {}
    if not args.no_cold:
        for full in names[2:]:
            name, _, mode = full.partition("@")
            cold[full] = cold_first_call(name, mode, args.steps)
            print(f"cold first call {full}: {cold[full]['first']:.2f} s (second {cold[full]['second'] * 1e3:.1f} ms); "
                  f"next process on its disk cache: {cold[full]['warm_first']:.2f} s", flush=True)
    sb3 = med([sb3_process(args.steps, 0)["wall"] for _ in range(args.sb3_rounds)]) if args.sb3_rounds else None
    if sb3:
        print(f"SB3 lone process (median of {args.sb3_rounds}): {sb3:.1f} s", flush=True)
    t_start = med([startup_floor() for _ in range(3)])
    print(f"start-up (python, import torch, first Adam; median of 3): {t_start:.2f} s", flush=True)

    eager_floor = per_mb["eager"] * n_mb + t_start
    doc = [f"torch {torch.__version__}, one torch thread, {os.cpu_count()} cores, load average at the start "
           f"{load[0]:.1f}; {args.rounds} interleaved rounds of {args.reps} minibatches per variant."]

    def say(line: str = "") -> None:
        print(line, flush=True)
        doc.append(line)

    say()
    sb3_text = (f"SB3's whole lone process, timed here (median of {args.sb3_rounds}): {sb3:.1f} s" if sb3 else
                "SB3 not timed (--sb3-rounds 0)")
    say(f"{n_mb} minibatches; {sb3_text}; the eager floor measured here: {eager_floor:.1f} s "
        f"(start-up {t_start:.2f} s).")
    say()
    if not cold:
        say("(--no-cold: each compiled variant's projection counts its mode's largest in-process compile time.)")
        say()
    say("| variant | per minibatch (median of rounds) | / eager | compile s: cold; warm disk cache; in-process "
        "| projected floor s: cold (warm cache) | / SB3 | / eager floor |")
    say("| --- | --- | --- | --- | --- | --- | --- |")
    # without a cold figure, a variant's compile is its mode's largest in-process one (a later variant
    # of a mode reuses what an earlier one compiled in this process, and would show none)
    in_process = {f: max(compile_warm[g] - per_mb[g] for g in names if g.endswith("@" + f.partition("@")[2]))
                  for f in names if f.startswith("compile")}
    for full in names:
        if full.startswith("compile"):
            comp = cold[full]["first"] - per_mb[full] if full in cold else in_process[full]
            warm = cold[full]["warm_first"] - per_mb[full] if full in cold else comp
            cs = (f"{comp:.2f}; {warm:.2f}" if full in cold else "-; -") + f"; {compile_warm[full] - per_mb[full]:.2f}"
        else:
            comp = warm = 0.0
            cs = "-"
        floor, floor_w = (c + per_mb[full] * n_mb + t_start for c in (comp, warm))
        say(f"| {full} | {per_mb[full] * 1e3:.3f} ms | {per_mb[full] / per_mb['eager']:.3f} | {cs} "
              f"| {floor:.1f} ({floor_w:.1f}) | {f'{floor / sb3:.2f} ({floor_w / sb3:.2f})' if sb3 else '-'} "
              f"| {floor / eager_floor:.3f} ({floor_w / eager_floor:.3f}) |")

    say()
    say(f"Numbers against eager (same Adam kind), {args.check_steps} steps on fresh minibatches from equal weights:")
    say()
    for full in names[2:]:
        name, _, mode = full.partition("@")
        eq = equality(name, mode, args.steps, args.check_steps)
        say(f"- {full}: first loss equal {eq['loss0_equal']} (diff {eq['loss0_diff']:.2e}), first grads equal "
              f"{eq['grads0_equal']} (max diff {eq['grads0_diff']:.2e}); over {args.check_steps} steps loss max diff "
              f"{eq['loss_diff']:.2e}, params equal {eq['params_equal']} (max diff {eq['params_diff']:.2e}); "
              f"eager float32 vs float64: loss {eq['f32_vs_f64_loss']:.2e}, params {eq['f32_vs_f64_params']:.2e}")
    if args.docs:
        from harness.docs import write_block

        print(f"wrote {write_block('docs/benchmarks.md', 'compile-floor', chr(10).join(doc))}")


if __name__ == "__main__":
    main()
