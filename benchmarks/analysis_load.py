"""How long analysis takes at sweep scale: ``analysis.load`` against a plain pyarrow
dataset read of the same metrics files, side by side, on a synthetic results folder.

    python benchmarks/analysis_load.py --runs 10000 [--report] [--rounds 4] [--fresh-rounds 4] [--docs]

The folder is built once under ``--folder`` (default a temp dir): one real run of the harness
(``task=cartpole estimator=ppo_gae``, 400 iterations, a few seconds), copied ``--runs`` times as
``cartpole/ppo_gae/seed<i>-copy<i>/``. Each round times ``analysis.load`` (every run checked by the
harness's finished definition, read, labelled and stacked) and ``pyarrow.dataset(files).to_table()``
(the same parquet files, no checks), interleaved, the order alternating between rounds, each result
freed before the next timing; the median ratio of wall times is printed, and of this process's
CPU times (user + system, every thread), which a machine shared with other work disturbs less.

The rounds above share one process, so each timing starts from what the one before left in the
memory allocators (Arrow's pool keeps freed memory; where a first touch of memory is dear, as on
the VM these ran on, the order of a round moves its ratio). ``--fresh-rounds`` also times each
of the two in a fresh interpreter of its own (this script with ``--one``: the imports and the file
list made before the clock starts), the order alternating as above: the state a user's
``python -m analysis report`` or first ``load`` in a notebook starts from. Both are printed.
``--report`` also times ``python -m analysis report`` on the folder as a whole process.

How dear a first touch of memory is, is measured too, before the rounds and after them: the time
a fresh interpreter takes to fill a new 1 GB numpy array (:func:`first_touch`). On the shared VM
where the benchmark first ran that took 14-16 s and the in-process median ratio was 1.51; on a
quiet machine it took under 3 s and the median was 1.18-1.19. So it is printed and written beside them.
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.docs import write_block  # noqa: E402

TEMPLATE = ["task=cartpole", "estimator=ppo_gae", "seed=0", "budget.iterations=400", "task.num_envs=2",
            "task.rollout_steps=16", "eval_every=20", "eval_episodes=1", "progress=false", "task.hidden=[16]",
            "threads=1"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_TOUCH = """
import time, numpy as np
t = time.perf_counter(); a = np.ones(1 << 27); print(time.perf_counter() - t)
"""


def first_touch() -> float:
    """Seconds a fresh interpreter takes to fill a new 1 GB float64 array (its pages touched for
    the first time: the kernel zeroes each one)."""
    out = subprocess.run([sys.executable, "-c", _TOUCH], check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def build(folder: Path, runs: int) -> Path:
    """``folder/r`` with ``runs`` copies of one real run (made once, kept for later calls)."""
    results = folder / "r"
    have = len(glob.glob(str(results / "cartpole/ppo_gae/*/metrics.parquet")))
    if have == runs:
        return results
    shutil.rmtree(results, ignore_errors=True)
    src_root = folder / "template"
    if not list(src_root.glob("cartpole/ppo_gae/*/metrics.parquet")):
        subprocess.run([sys.executable, "-m", "harness", *TEMPLATE, f"results_dir={src_root}"], check=True, cwd=ROOT)
    (src,) = src_root.glob("cartpole/ppo_gae/*/")
    for i in range(runs):
        d = results / "cartpole" / "ppo_gae" / f"seed{i}-copy{i}"
        d.mkdir(parents=True)
        for name in ("metrics.parquet", "summary.json", "config.yaml"):
            shutil.copyfile(src / name, d / name)
    return results


def _timers(results: Path) -> dict:
    """``{"load": ..., "dataset": ...}``: each times its read of the metrics files under ``results``
    and returns (wall seconds, this process's CPU seconds: user + system, every thread, rows)."""
    import pyarrow.dataset as ds

    from analysis.load import load
    files = sorted(glob.glob(str(results / "**/metrics.parquet"), recursive=True))

    def timed(read) -> tuple[float, float, int]:
        c, t = _cpu(), time.perf_counter()
        n = read()
        return time.perf_counter() - t, _cpu() - c, n

    return {"load": lambda: timed(lambda: len(load(results))),
            "dataset": lambda: timed(lambda: ds.dataset(files, format="parquet").to_table().num_rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=4, help="an even number counts each order as often")
    ap.add_argument("--fresh-rounds", type=int, default=4,
                    help="rounds that time each read in a fresh interpreter of its own (0: none)")
    ap.add_argument("--one", choices=["load", "dataset"], help=argparse.SUPPRESS)  # a child of --fresh-rounds
    ap.add_argument("--folder", default=None, help="where to build (and keep) the synthetic folder")
    ap.add_argument("--report", action="store_true", help="also time `python -m analysis report` on it")
    ap.add_argument("--docs", action="store_true",
                    help="also write the results into docs/benchmarks.md's analysis-speed block, stamped with "
                         "this command and today's date")
    args = ap.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="analysis-load-"))
    results = build(folder, args.runs)

    time_one = _timers(results)
    if args.one:  # a child of --fresh-rounds: one timing in this fresh process
        print(json.dumps(time_one[args.one]()))
        return 0

    def time_here(which: str) -> tuple[float, float, int]:
        gc.collect()
        return time_one[which]()

    def time_fresh(which: str) -> tuple[float, float, int]:
        out = subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--folder", str(folder),
                              "--one", which], check=True, cwd=ROOT, capture_output=True, text=True).stdout
        return tuple(json.loads(out.splitlines()[-1]))

    touch = [first_touch()]
    print(f"first touch: a new 1 GB numpy array filled in {touch[0]:.2f} s (fresh process)", flush=True)
    # Each result is freed before the next timing, and the order alternates between rounds: the
    # second read in a round reuses memory the first one freed, which is cheaper than fresh pages.
    measured = {}
    for where, rounds, one in (("one process", args.rounds, time_here),
                               ("fresh processes", args.fresh_rounds, time_fresh)):
        ratios, cpu_ratios = [], []
        for r in range(rounds):
            if r % 2 == 0:
                (t_load, c_load, n_load), (t_ds, c_ds, n_ds) = one("load"), one("dataset")
            else:
                (t_ds, c_ds, n_ds), (t_load, c_load, n_load) = one("dataset"), one("load")
            ratios.append(t_load / t_ds)
            cpu_ratios.append(c_load / c_ds)
            first = "load first" if r % 2 == 0 else "dataset first"
            print(f"{where}, round {r + 1} ({first}): analysis.load {t_load:.2f} s (CPU {c_load:.1f} s, {n_load} "
                  f"rows), pyarrow dataset {t_ds:.2f} s (CPU {c_ds:.1f} s, {n_ds} rows): ratio "
                  f"{t_load / t_ds:.2f}, CPU ratio {c_load / c_ds:.2f}", flush=True)
        if rounds:
            measured[where] = ratios, cpu_ratios, n_load
    touch.append(first_touch())
    print(f"first touch after the rounds: {touch[1]:.2f} s", flush=True)
    rows = ["| measurement | measured | goal |", "| --- | --- | --- |"]
    for where, (ratios, cpu_ratios, n_rows) in measured.items():
        median, cpu_median = statistics.median(ratios), statistics.median(cpu_ratios)
        print(f"{args.runs} runs, {where}: analysis.load / pyarrow dataset read, median of {len(ratios)}: "
              f"{median:.2f} (goal <= 1.5); CPU time {cpu_median:.2f}")
        rows += [f"| `analysis.load` / `pyarrow.dataset(files).to_table()`, {args.runs} runs ({n_rows} rows), "
                 f"{where}, wall time, median of {len(ratios)} rounds | {median:.2f} (rounds: "
                 f"{', '.join(f'{r:.2f}' for r in ratios)}) | <= 1.5 |",
                 f"| the same, CPU time (user + system, all threads), median | {cpu_median:.2f} (rounds: "
                 f"{', '.join(f'{r:.2f}' for r in cpu_ratios)}) | |"]
    if args.report:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "analysis", "report", str(results), "--out", str(folder / "report")],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        t_report = time.perf_counter() - t
        print(f"python -m analysis report: {t_report:.1f} s (goal < 120 s)")
        rows.append(f"| `python -m analysis report` on the folder, whole process | {t_report:.0f} s | < 120 s |")
    if args.docs:
        head = (f"A synthetic folder of {args.runs} copies of one real cartpole run (400 iterations each); "
                f"{os.cpu_count()} cores, shared, so absolute times drift; each ratio is of two timings taken side "
                f"by side, in one process or each in a fresh one. A fresh process filled a new 1 GB numpy array in "
                f"{touch[0]:.2f} s before the rounds and {touch[1]:.2f} s after them (the first touch of memory; "
                f"where it is dear, the ratios rise).")
        print(f"wrote {write_block('docs/benchmarks.md', 'analysis-speed', head + chr(10) + chr(10) + chr(10).join(rows))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
