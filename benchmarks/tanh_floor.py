"""How much of the control floors is ``torch.tanh``: the floors of ``benchmarks/control_speed.py``
with numpy's tanh in place of torch's, side by side in one process.

The lone and population floors (``update_floor``, ``population_floor`` in ``control_speed.py``) are
the plain PPO step written with torch's ops. On this 2-core CPU torch's float32 ``tanh`` costs far
more than numpy's (``np.tanh``: SIMD, within a float32 ulp of torch's), so part of each floor is one
kernel, not eager PyTorch's dispatch. Each round times, one torch thread, interleaved:

1. ``torch.tanh`` and ``np.tanh`` on the lone forward's ``[256, 64]`` and one worker's
   population forward's ``[8, 256, 64]`` (float32), and their largest difference;
2. the lone plain step (``floor_problem``, as ``update_floor`` times it) with ``nn.Tanh`` and with
   :class:`NumpyTanh` (the harness's :func:`harness.models.mlp.tanh`: forward ``np.tanh``,
   backward torch's own ``tanh_backward`` of that output);
3. the population step for 8 members (``population_problem``, as ``population_floor``) the same two ways.

It prints medians over rounds and the ratios numpy / torch, and the first 5 losses of the lone
step both ways (a different tanh moves them in float32's last digits, not more). The harness's
control networks use numpy's tanh since this measurement (:func:`harness.models.mlp.tanh`), so the
numpy column is the floor they are held to.

Usage: python benchmarks/tanh_floor.py [--rounds 3] [--docs]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402
from benchmarks.control_speed import floor_problem, harness_tanh, population_problem, time_step  # noqa: E402
from harness.models.mlp import tanh as numpy_tanh  # noqa: E402  (np.tanh on CPU tensors)

NumpyTanh = harness_tanh()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", action="store_true", help="write the tanh-floor block of docs/benchmarks.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    shapes = {"[256, 64]": (256, 64), "[8, 256, 64]": (8, 256, 64)}
    xs = {k: torch.randn(*v, generator=gen) * 2 for k, v in shapes.items()}
    t: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for name, x in xs.items():
            t.setdefault(f"torch.tanh {name}", []).append(time_step(lambda: torch.tanh(x), 2000))
            t.setdefault(f"np.tanh {name}", []).append(time_step(lambda: numpy_tanh(x), 2000))
        for label, act in (("torch", None), ("numpy", NumpyTanh)):
            t.setdefault(f"lone step, {label} tanh", []).append(time_step(floor_problem(100000, activation=act).step, 2000))
        for label, fn in (("torch", None), ("numpy", numpy_tanh)):
            t.setdefault(f"population step (8 members), {label} tanh", []).append(
                time_step(population_problem(8, tanh=fn).step, 500))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1] * 1e3:.3f} ms" for k, v in t.items()), flush=True)
    med = {k: statistics.median(v) for k, v in t.items()}
    diff = max(float((torch.tanh(x) - numpy_tanh(x)).abs().max()) for x in xs.values())
    losses = {label: [float(p.step().detach()) for _ in range(5)]
              for label, p in (("torch", floor_problem(100000)), ("numpy", floor_problem(100000, activation=NumpyTanh)))}
    rel = max(abs(a - b) / abs(a) for a, b in zip(losses["torch"], losses["numpy"]))
    rows = ["| what (one torch thread, float32) | torch's tanh, ms | numpy's tanh, ms | numpy / torch |",
            "| --- | --- | --- | --- |"]
    # (the row's label, the timing with torch's tanh, the same with numpy's)
    pairs = [*((f"tanh of {k}", f"torch.tanh {k}", f"np.tanh {k}") for k in shapes),
             *((f"the plain {w} (floor)", f"{w}, torch tanh", f"{w}, numpy tanh")
               for w in ("lone step", "population step (8 members)"))]
    for label, torch_key, numpy_key in pairs:
        a, b = med[torch_key], med[numpy_key]
        rows.append(f"| {label} | {a * 1e3:.3f} | {b * 1e3:.3f} | **{b / a:.2f}** |")
    text = "\n".join(rows) + (
        f"\n\nMedians of {args.rounds} interleaved rounds. Largest |torch.tanh - np.tanh| on these inputs: {diff:.2e}; "
        f"the lone step's first 5 losses differ by at most {rel:.1e} relative.")
    print(text)
    if args.docs:
        print(f"wrote {write_block('docs/benchmarks.md', 'tanh-floor', text)}")


if __name__ == "__main__":
    main()
