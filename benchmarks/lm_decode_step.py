"""The harness's own GPT-2 code against transformers' calls, side by side in one process.

Runs the harness side of ``benchmarks/lm_vs_trl.py`` (same settings: 8 prompts x 4 samples, 16
tokens, GRPO, one update per iteration, one torch thread) with the harness's own GPT-2 code on
(the default) and one part of it off, interleaved round by round (the order alternates), and
prints the CPU seconds per iteration of each (iterations after ``--warmup``), their ratio (median
over rounds), and whether both sampled the same number of tokens in every round (a coarse check
only: that the own code is bit-identical is ``tests/test_lm_model.py``'s). ``--off`` picks the part:

* ``step``: the decode step (:func:`harness.models.lm._gpt2_decode_step`); off, every decoding
  step calls the model, as before the step existed;
* ``passes``: the prompts' prefill before decoding and the teacher-forced passes (the update's
  forward, the reference's, a critic's: :func:`harness.models.lm._gpt2_pass`); off, they call the
  model; the decode step stays on;
* ``packing``: the packed passes (:func:`harness.models.lm._gpt2_packed_response` and
  :func:`harness.models.lm._gpt2_prompt_states`: neither the prompts' left padding nor the
  responses' padding run); off, the own passes run the padding (gradients
  differ at float rounding, so the two sides' samples may part after an update).

* ``gelu``: GPT-2's activation as ``x sigmoid(2u)`` (:class:`harness.models.lm.SigmoidGELU`); off,
  PyTorch's fused tanh-GELU kernel (values to float rounding);
* ``drop``: decoding stops running the rows that have finished (``_DROP_*``); off, every row runs
  every step (bit-identical);
* ``group``: a group's responses attend to their prompt in one block (``groups`` of
  :func:`harness.models.lm._gpt2_pass`); off, the prompts' keys and values are gathered to the
  rows (float rounding);
* ``last``: in the teacher-forced passes the prompts' last layer runs its attention, projection
  and MLP at each prompt's last column only (``last_only`` of
  :func:`harness.models.lm._gpt2_prompt_states`); off, at every column (float rounding).

``--per-iteration`` switches between on and off at every iteration inside each run (one run per
round, the seeds of the rounds), so both see the same moments of a noisy machine, and prints the
mean wall time of each part of an iteration (``lm_vs_trl.PHASES``) on and off, iterations after
``--warmup``.

Usage::

    python benchmarks/lm_decode_step.py [--off step|passes|packing|gelu|drop|group|last] [--per-iteration]
        [--beta 0.05 0] [--iterations 30] [--rounds 6] [--cache DIR]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lm_vs_trl as B  # noqa: E402  (the harness side and its settings)
import torch  # noqa: E402


LABELS = {"step": ("own step", "transformers' step"), "passes": ("own passes", "transformers' passes"),
          "packing": ("packed", "padded"), "gelu": ("x sigmoid(2u)", "fused tanh-GELU"),
          "drop": ("finished rows dropped", "every row decoded"), "group": ("grouped attention", "gathered cache"),
          "last": ("prompts' last layer at their last column", "prompts' last layer at every column")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", choices=list(LABELS), default="step",
                    help="the part of the harness's own GPT-2 code turned off in the 'off' runs")
    ap.add_argument("--per-iteration", action="store_true",
                    help="switch on / off at every iteration inside each run; print each part's mean wall time")
    ap.add_argument("--beta", type=float, nargs="+", default=[0.05, 0.0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--cache", default=None, help="LM pipeline cache folder (default: a fresh temporary one)")
    args = ap.parse_args()
    from harness.models import lm as lm_mod

    scratch = Path(tempfile.mkdtemp(prefix="lm_decode_step_"))
    cache = Path(args.cache) if args.cache else scratch / ".cache" / "lm"
    own_step, own_trunk, own_packed = lm_mod._gpt2_decode_step, lm_mod._gpt2_trunk, lm_mod._gpt2_packed_response
    own_prompts = lm_mod._gpt2_prompt_states
    padded_prompts = functools.partial(own_prompts, pack=False)

    def every_column(*a, **k):  # the prompts' last layer at every column
        return own_prompts(*a, **{**k, "last_only": False})

    def step_on_trunk(model, cache):  # the decode step sees the real trunk check while the passes see none
        lm_mod._gpt2_trunk = own_trunk
        try:
            return own_step(model, cache)
        finally:
            lm_mod._gpt2_trunk = no_trunk

    def no_trunk(model):
        return None

    own_gelu, own_pass, drop_rows = lm_mod.SigmoidGELU.forward, lm_mod._gpt2_pass, lm_mod._DROP_MIN_ROWS

    def fused_gelu(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    def gathered_pass(*a, layout=lm_mod._PassLayout(), past=None, **k):  # the grouped past gathered to every row
        if layout.groups > 1:
            rows = torch.arange(past[0][0].shape[0], device=past[0][0].device).repeat_interleave(layout.groups)
            past = [(key.index_select(0, rows), value.index_select(0, rows)) for key, value in past]
            layout = replace(layout, groups=1)
        return own_pass(*a, past=past, layout=layout, **k)

    def switch(on: bool) -> None:
        lm_mod.SigmoidGELU.forward = own_gelu if on or args.off != "gelu" else fused_gelu
        lm_mod._DROP_MIN_ROWS = drop_rows if on or args.off != "drop" else 1 << 30
        lm_mod._gpt2_pass = own_pass if on or args.off != "group" else gathered_pass
        packed = on or args.off != "packing"
        lm_mod._gpt2_packed_response = own_packed if packed else (lambda *a, **k: None)
        lm_mod._gpt2_prompt_states = (own_prompts if packed else padded_prompts) if on or args.off != "last" \
            else every_column
        if on or args.off != "passes":
            lm_mod._gpt2_trunk = own_trunk
            lm_mod._gpt2_decode_step = own_step if on or args.off != "step" else (lambda model, cache: None)
        else:
            lm_mod._gpt2_trunk, lm_mod._gpt2_decode_step = no_trunk, step_on_trunk
    if args.per_iteration:
        for beta in args.beta:
            per_iteration(args, cache, scratch, beta, switch)
        return
    for beta in args.beta:
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        counts: dict[str, list[int]] = {"on": [], "off": []}
        same_counts = True
        for r in range(args.rounds):
            tokens = {}
            for tag in (("on", "off") if r % 2 == 0 else ("off", "on")):
                switch(tag == "on")
                try:
                    out = B.run_harness(cache, scratch / f"b{beta}-r{r}-{tag}-{time.time()}", args.iterations,
                                        args.warmup, args.lr, beta, r, tag)
                finally:
                    switch(True)
                cpu[tag].append(out["cpu_s_per_iter_step"])
                tokens[tag] = out["tokens"]
                counts[tag].append(out["tokens"])
                print(f"beta={beta} round={r} {args.off} {tag}: {out['cpu_s_per_iter_step'] * 1e3:.1f} ms CPU per "
                      f"iteration, {out['tokens']} tokens sampled", flush=True)
            same_counts &= tokens["on"] == tokens["off"]
        ratios = [a / b for a, b in zip(cpu["on"], cpu["off"])]
        per_token = [(a / ta) / (b / tb) for a, b, ta, tb in zip(cpu["on"], cpu["off"], counts["on"], counts["off"])]
        on_name, off_name = LABELS[args.off]
        print(f"-> beta={beta}: {on_name} / {off_name}, CPU per iteration: median "
              f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); per sampled token: "
              f"median {statistics.median(per_token):.3f} (rounds {min(per_token):.3f}-{max(per_token):.3f}); "
              f"same number of tokens sampled in every round: {same_counts}", flush=True)


def per_iteration(args, cache: Path, scratch: Path, beta: float, switch) -> None:
    """``args.rounds`` harness runs (seeds 0, 1, ...), the part on at even iterations and off at odd
    ones (the other way round in odd runs); the mean wall time of each part on and off."""
    from harness.train.lm import LMSource

    state = {"iteration": 0, "on": True}
    times = {tag: {phase: [] for phase in B.PHASES} for tag in ("on", "off")}
    collect = LMSource.collect

    def switching_collect(self, *a, **k):
        state["iteration"] += 1
        state["on"] = (state["iteration"] + state["run"]) % 2 == 0
        switch(state["on"])
        return collect(self, *a, **k)

    def timed(phase, fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if state["iteration"] > args.warmup:
                    times["on" if state["on"] else "off"][phase].append(time.perf_counter() - t)
        return call

    LMSource.collect = switching_collect
    try:
        with B.phase_hooks(timed):
            for r in range(args.rounds):
                state.update(iteration=0, run=r)
                B.harness_run(B.compose(B.base_overrides(cache, scratch / f"b{beta}-r{r}-{time.time()}",
                                                         args.iterations, args.lr, beta, r)))
    finally:
        LMSource.collect = collect
        switch(True)
    on_name, off_name = LABELS[args.off]
    for phase in B.PHASES:
        on, off = times["on"][phase], times["off"][phase]
        if on and off:
            a, b = statistics.mean(on), statistics.mean(off)
            print(f"-> beta={beta} {phase}: {on_name} {a * 1e3:.2f} ms, {off_name} {b * 1e3:.2f} ms, ratio {a / b:.3f} "
                  f"({len(on)} / {len(off)} calls)", flush=True)


if __name__ == "__main__":
    main()
