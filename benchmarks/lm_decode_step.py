"""The harness's own GPT-2 decode step against transformers' step, side by side in one process.

Runs the harness side of ``benchmarks/lm_vs_trl.py`` (same settings: 8 prompts x 4 samples, 16
tokens, GRPO, one update per iteration, one torch thread) with
:func:`harness.models.lm._gpt2_decode_step` on (the default) and off (every decoding step calls the
model, as before the step existed), interleaved round by round (the order alternates), and prints
the CPU seconds per iteration of each (iterations after ``--warmup``), their ratio (median over
rounds), and whether both sampled the same number of tokens in every round (a coarse check only:
that the step is bit-identical is ``tests/test_lm_model.py``'s).

Usage::

    python benchmarks/lm_decode_step.py [--beta 0.05 0] [--iterations 30] [--rounds 6] [--cache DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lm_vs_trl as B  # noqa: E402  (the harness side and its settings)


def main() -> None:
    ap = argparse.ArgumentParser()
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
    own_step = lm_mod._gpt2_decode_step
    for beta in args.beta:
        cpu: dict[str, list[float]] = {"on": [], "off": []}
        same_counts = True
        for r in range(args.rounds):
            tokens = {}
            for tag in (("on", "off") if r % 2 == 0 else ("off", "on")):
                lm_mod._gpt2_decode_step = own_step if tag == "on" else (lambda model, cache: None)
                try:
                    out = B.run_harness(cache, scratch / f"b{beta}-r{r}-{tag}-{time.time()}", args.iterations,
                                        args.warmup, args.lr, beta, r, tag)
                finally:
                    lm_mod._gpt2_decode_step = own_step
                cpu[tag].append(out["cpu_s_per_iter_step"])
                tokens[tag] = out["tokens"]
                print(f"beta={beta} round={r} step {tag}: {out['cpu_s_per_iter_step'] * 1e3:.1f} ms CPU per "
                      f"iteration, {out['tokens']} tokens sampled", flush=True)
            same_counts &= tokens["on"] == tokens["off"]
        ratios = [a / b for a, b in zip(cpu["on"], cpu["off"])]
        print(f"-> beta={beta}: own step / transformers' step, CPU per iteration: median "
              f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); "
              f"same number of tokens sampled in every round: {same_counts}", flush=True)


if __name__ == "__main__":
    main()
