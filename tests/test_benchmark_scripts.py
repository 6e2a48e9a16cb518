"""Benchmark scripts' own parts, checked where CI runs (on CPU).

``benchmarks/gpu_determinism.py`` (meant for a GPU machine) rotted once unseen (its tiny LM config stopped yielding
preference pairs for the reward model, and a new measured column made every pair differ); it is
run here with ``--device cpu``, where runs are bitwise reproducible (docs/scale.md), so both
pairs must come out identical.

``benchmarks/lm_vs_trl.py --floor`` (the LM iteration's kernel floor and its split into parts): its
counting, its rebuilding of each recorded call, its sums and its hooks are checked on small
profiled programs and by hand.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_determinism_script_runs_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu_determinism.py", "--device", "cpu", "--iterations", "1",
                           "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == ["deterministic=true: two runs bitwise identical: True",
                                             "deterministic=false: two runs bitwise identical: True"], done.stdout


def _profiled(fn):
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return prof.events()


def test_lm_kernel_floor_counts_each_kernel_call_by_its_shapes():
    """``benchmarks/lm_vs_trl.py --floor``: the calls are counted per (kernel, shapes, scalars), and
    only the listed compute kernels (an add, a view, a softmax are not)."""
    import torch

    from benchmarks.lm_vs_trl import kernel_calls

    a, w, b = torch.randn(6, 4), torch.randn(4, 5), torch.randn(5)
    c = torch.randn(3, 4)

    def work():
        for _ in range(3):
            torch.addmm(b, a, w)
        torch.mm(c, w)
        torch.mm(c, w)
        torch.nn.functional.gelu(a, approximate="tanh")
        (a + 1).view(-1).softmax(0)

    calls = kernel_calls(_profiled(work))
    assert sorted((name, n, shapes) for (name, _, _), (n, shapes, _) in calls.items()) == [
        ("aten::addmm", 3, [[5], [6, 4], [4, 5], [], []]),
        ("aten::gelu", 1, [[6, 4], []]),
        ("aten::mm", 2, [[3, 4], [4, 5]]),
    ]


def test_lm_kernel_floor_replays_each_call_with_its_recorded_inputs():
    """Each recorded call is rebuilt with tensors of its shapes and its own scalars (attention's
    keyword-only mask and scale, layer norm's shape and eps, ``addcmul``'s 0-dimensional constant
    and its value), and runs: forward and backward of the kernels a GPT-2 block uses, with either
    GELU."""
    import torch
    import torch.nn.functional as F

    from benchmarks.lm_vs_trl import FLOOR_KERNELS, kernel_calls, replay_args, replay_seconds
    from harness.models.lm import SigmoidGELU

    ln = torch.nn.LayerNorm(8, eps=1e-4)

    def work():
        x = torch.randn(2, 3, 8, requires_grad=True)
        q = torch.randn(2, 2, 3, 4, requires_grad=True)
        k = torch.randn(2, 2, 5, 4)
        o = F.scaled_dot_product_attention(q, k, k, attn_mask=torch.ones(2, 1, 3, 5, dtype=torch.bool), scale=0.3)
        y = F.gelu(ln(x), approximate="tanh") @ torch.randn(8, 6)
        (o.sum() + y.sum() + SigmoidGELU()(x).sum()).backward()

    recorded = kernel_calls(_profiled(work))
    calls = {name: (shapes, scalars) for (name, _, _), (_, shapes, scalars) in recorded.items()}
    assert set(calls) == set(FLOOR_KERNELS) - {"aten::addmm", "aten::bmm"}  # @ of a 3-D input runs mm
    args, kwargs = replay_args("aten::_scaled_dot_product_flash_attention_for_cpu",
                               *calls["aten::_scaled_dot_product_flash_attention_for_cpu"])
    assert [tuple(t.shape) for t in args[:3]] == [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)]
    assert kwargs["scale"] == 0.3 and tuple(kwargs["attn_mask"].shape) == (2, 1, 3, 5)
    args, _ = replay_args("aten::native_layer_norm", *calls["aten::native_layer_norm"])
    assert args[1] == [8] and args[4] == 1e-4
    _, kwargs = replay_args("aten::gelu", *calls["aten::gelu"])
    assert kwargs == {"approximate": "tanh"}
    k2 = 0.044715 * 2 * (2 / 3.141592653589793) ** 0.5
    addcmul = sorted((tuple(args[0].shape), round(kwargs["value"], 6)) for args, kwargs in
                     (replay_args(name, shapes, scalars) for (name, _, _), (_, shapes, scalars) in recorded.items()
                      if name == "aten::addcmul"))  # sigmoid's argument, its slope, s (1 - s)
    assert addcmul == [((), round(k2, 6)), ((), round(3 * k2, 6)), ((2, 3, 8), -1)]
    for name, (shapes, scalars) in calls.items():
        assert 0 < replay_seconds(name, shapes, scalars, repeats=1) < 1, name


def test_lm_kernel_floor_is_calls_times_replayed_seconds_per_iteration(monkeypatch):
    """floor per group = sum over its calls of (calls x replayed seconds) / iterations, by hand."""
    from benchmarks import lm_vs_trl

    seconds = {"aten::addmm": 2.0, "aten::mm": 1.0, "aten::gelu": 0.5}
    monkeypatch.setattr(lm_vs_trl, "replay_seconds", lambda name, shapes, scalars: seconds[name])
    calls = {("aten::addmm", "s1", ""): [3, None, None], ("aten::addmm", "s2", ""): [1, None, None],
             ("aten::mm", "s3", ""): [2, None, None], ("aten::gelu", "s4", ""): [4, None, None]}
    floor = lm_vs_trl.kernel_floor(calls, iterations=2)
    assert floor["matrix products"] == (3 * 2.0 + 1 * 2.0 + 2 * 1.0) / 2
    assert floor["GELU"] == 4 * 0.5 / 2 and floor["attention"] == 0 and floor["layer norm"] == 0
    assert floor["total"] == 6.0


def test_lm_kernel_floor_of_the_parts_adds_up_to_the_whole(monkeypatch):
    """With one ``timed`` record, each call is replayed once: floors of disjoint parts of the
    calls add up to the floor of all of them, though every replay gives a different time."""
    import itertools

    import pytest

    from benchmarks import lm_vs_trl

    clock = itertools.count(1)
    monkeypatch.setattr(lm_vs_trl, "replay_seconds", lambda name, shapes, scalars: float(next(clock)))
    a = {("aten::addmm", "s1", ""): [3, None, None], ("aten::gelu", "s2", ""): [1, None, None]}
    b = {("aten::mm", "s3", ""): [2, None, None]}
    timed: dict = {}
    whole = lm_vs_trl.kernel_floor({**a, **b}, 5, timed)["total"]
    assert whole == pytest.approx((3 * 1 + 1 * 2 + 2 * 3) / 5, abs=1e-12)
    parts = lm_vs_trl.kernel_floor(a, 5, timed)["total"] + lm_vs_trl.kernel_floor(b, 5, timed)["total"]
    assert parts == pytest.approx(whole, abs=1e-12)
    assert lm_vs_trl.kernel_floor(a, 5)["total"] != pytest.approx((3 * 1 + 1 * 2) / 5)  # without it: replayed again


def test_lm_phase_hooks_wrap_each_part_and_put_it_back():
    """``phase_hooks`` replaces each part's callable by the wrapper's, given the original, and
    puts the originals back afterwards (also when the block raises)."""
    import pytest
    import torch

    import harness.train.lm as lm
    import harness.train.loop as loop
    from benchmarks.lm_vs_trl import PHASES, phase_hooks

    def target(phase):
        return {"sample": (lm, "generate_groups"), "reference": (lm.LMSource, "_ref_logp"),
                "update": (loop, "update"), "backward": (torch.Tensor, "backward")}[phase]

    before = {ph: target(ph)[0].__dict__[target(ph)[1]] for ph in PHASES}
    seen = {}

    def wrap(phase, fn):
        seen[phase] = fn
        return lambda *a, **k: fn(*a, **k)

    with pytest.raises(RuntimeError), phase_hooks(wrap):
        for ph in PHASES:
            owner, name = target(ph)
            assert owner.__dict__[name] is not before[ph]
        raise RuntimeError
    assert seen == before
    assert {ph: target(ph)[0].__dict__[target(ph)[1]] for ph in PHASES} == before


def test_lm_phase_table_splits_the_iteration():
    """The update's own part is the update less its backward; the rest is the iteration less the
    parts; kernels and op counts likewise (numbers by hand)."""
    from benchmarks.lm_vs_trl import phase_table

    wall = {"sample": 10.0, "reference": 5.0, "update": 20.0, "backward": 12.0}
    floor = {"sample": 4.0, "reference": 3.0, "update": 15.0, "backward": 10.0}
    ops = {"sample": 100, "reference": 30, "update": 80, "backward": 50}
    assert phase_table(wall, 40.0, floor, 25.0, ops, 260) == [
        ("sample", 10.0, 4.0, 100), ("reference", 5.0, 3.0, 30), ("update without backward", 8.0, 5.0, 30),
        ("backward", 12.0, 10.0, 50), ("rest", 5.0, 3.0, 50), ("iteration", 40.0, 25.0, 260)]


def test_lm_top_level_ops_are_the_calls_made_not_what_they_call():
    """An op counts once whatever it calls inside (``linear`` calls ``t`` and ``addmm``;
    ``softmax`` its ``_softmax``), ops inside a ``record_function`` range count, and the ops
    autograd's engine runs for a backward count (they are not called by another op)."""
    import torch

    from benchmarks.lm_vs_trl import top_level_ops

    x, w = torch.randn(3, 4), torch.randn(5, 4, requires_grad=True)

    def work():
        torch.nn.functional.linear(x, w)  # 1 (aten::linear; its t and addmm inside)
        with torch.profiler.record_function("phase:test"):
            x.softmax(0)  # 1
            x.view(-1)  # 1
        (x @ w.T).sum().backward()  # matmul and sum: 2, then the engine's backward ops

    names = [e.name for e in top_level_ops(_profiled(work))]
    assert names[:6] == ["aten::linear", "aten::softmax", "aten::view", "aten::numpy_T", "aten::matmul", "aten::sum"]
    assert "aten::_softmax" not in names and "aten::transpose" not in names and "aten::as_strided" not in names
    assert "aten::ones_like" in names[6:] and "aten::mm" in names[6:]  # the backward's: seed gradient, matmul's


def test_lm_population_stand_in_batches_the_members_lone_passes():
    """``benchmarks/lm_population.py`` compares equal work: its pass over ``P`` members' stacked
    weights is each member's lone pass (the same loss summed, each member's own gradients), for
    the teacher-forced shapes and the decode step alike."""
    import torch

    from benchmarks.lm_population import WIDTH, block_stack, stacked

    P, B, T, vocab = 3, 2, 5, 11
    blocks, head = stacked(P, vocab, seed=3)
    x = torch.randn(P, B * T, WIDTH, generator=torch.Generator().manual_seed(4))
    together = block_stack(blocks, head, x, P, B, T)
    together.backward()
    total = 0.0
    for p in range(P):
        one = lambda t: t[p:p + 1].detach().clone().requires_grad_()  # noqa: E731
        mine = [{k: one(v) for k, v in b.items()} for b in blocks]
        my_head = one(head)
        loss = block_stack(mine, my_head, x[p:p + 1], 1, B, T)
        loss.backward()
        total += loss.item()
        torch.testing.assert_close(my_head.grad, head.grad[p:p + 1])
        for b, m in zip(blocks, mine):
            for k in b:
                torch.testing.assert_close(m[k].grad, b[k].grad[p:p + 1])
    assert abs(together.item() - total) <= 1e-4 * abs(total)
    # the decode step: each member's new token against its own rows of the cache
    cache = [tuple(torch.randn(P * B, 4, 7, WIDTH // 4) for _ in range(2)) for _ in blocks]
    step = x[:, :B]
    with torch.no_grad():
        whole = float(block_stack(blocks, head, step, P, B, 1, cache))
        parts = sum(float(block_stack([{k: v[p:p + 1] for k, v in b.items()} for b in blocks], head[p:p + 1],
                                      step[p:p + 1], 1, B, 1, [(k[p * B:(p + 1) * B], v[p * B:(p + 1) * B])
                                                               for k, v in cache]))
                    for p in range(P))
    assert abs(whole - parts) <= 1e-4 * abs(parts)


def test_control_profile_timers_count_each_phase_without_the_timed_phases_inside_it(monkeypatch):
    """``Timers``: an outer call from t=0 to t=10 holding an inner one from t=2 to t=5 and another
    from t=6 to t=7 gives the outer 10 - 3 - 1 = 6 s and the inner phase 3 + 1 = 4 s (a fake clock)."""
    from benchmarks import control_profile

    clock = iter([0.0, 2.0, 5.0, 6.0, 7.0, 10.0])
    monkeypatch.setattr(control_profile.time, "perf_counter", lambda: next(clock))
    timers = control_profile.Timers()
    inner = timers.wrap("inner", lambda: None)

    def body():
        inner()
        inner()

    timers.wrap("outer", body)()
    assert timers.total == {"inner": 4.0, "outer": 6.0}
    assert set(control_profile.ORDER) >= {*control_profile.phases(), "start-up", "exit", "loop, other"} - {"loop"}
