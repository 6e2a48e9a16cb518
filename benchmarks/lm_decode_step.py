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
  model, as before 2026-12-06; the decode step stays on;
* ``packing``: the packed passes (:func:`harness.models.lm._gpt2_packed_response` and
  :func:`harness.models.lm._gpt2_prompt_states`: neither the prompts' left padding nor the
  responses' padding run); off, the own passes run the padding, as before 2026-12-06 (gradients
  differ at float rounding, so the two sides' samples may part after an update).

Usage::

    python benchmarks/lm_decode_step.py [--off step|passes|packing] [--beta 0.05 0] [--iterations 30] [--rounds 6]
        [--cache DIR]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lm_vs_trl as B  # noqa: E402  (the harness side and its settings)


LABELS = {"step": ("own step", "transformers' step"), "passes": ("own passes", "transformers' passes"),
          "packing": ("packed", "padded")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--off", choices=["step", "passes", "packing"], default="step",
                    help="the part of the harness's own GPT-2 code turned off in the 'off' runs")
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

    def step_on_trunk(model, cache):  # the decode step sees the real trunk check while the passes see none
        lm_mod._gpt2_trunk = own_trunk
        try:
            return own_step(model, cache)
        finally:
            lm_mod._gpt2_trunk = no_trunk

    def no_trunk(model):
        return None

    def switch(on: bool) -> None:
        packed = on or args.off != "packing"
        lm_mod._gpt2_packed_response = own_packed if packed else (lambda *a, **k: None)
        lm_mod._gpt2_prompt_states = own_prompts if packed else padded_prompts
        if on or args.off in ("step", "packing"):
            lm_mod._gpt2_trunk = own_trunk
            lm_mod._gpt2_decode_step = own_step if on or args.off != "step" else (lambda model, cache: None)
        else:
            lm_mod._gpt2_trunk, lm_mod._gpt2_decode_step = no_trunk, step_on_trunk
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


if __name__ == "__main__":
    main()
