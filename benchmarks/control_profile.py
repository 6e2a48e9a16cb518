"""Where a control run's time goes: start-up, env stepping, the rollout, advantages, the update
step, evaluation, writing, exit, from the command line's start to the process's end.

Each case is ``python -m harness <overrides>`` run in a child process of this script (``--child``),
which wraps the callables of :func:`phases` with wall-clock timers (exclusive: a phase called
inside another is taken out of the outer one) and then runs the command line itself
(:func:`harness.__main__.cli`). Start-up is the time from the child's launch to the training
loop's start (interpreter, imports, Hydra's composition, validation, run folders, the networks and
envs); exit is the time from the loop's end to the process's end; "loop, other" is the rest of the
loop (row building, divergence checks, the learning-rate and KL schedules).

Cases: the rl-zoo CartPole PPO preset of ``benchmarks/control_speed.py`` (100k env steps) as a lone
run, and as a population of 16 in one process (``population_workers=1``: the phases of one process;
the default splits the members over one process per core, each with the same phases).

Usage: python benchmarks/control_profile.py [--steps 100000] [--rounds 1] [--docs]
(``--docs`` writes the table into docs/benchmarks.md, block ``control-profile``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.control_speed import ZOO  # noqa: E402  (after the sys.path line)

CASES = {"lone run": ["population=1"], "population of 16, one process": ["population=16", "population_workers=1"]}
ORDER = ["start-up", "env stepping", "rollout: policy forward, sampling, bookkeeping", "advantages", "update step",
         "evaluation", "writing: metric rows, flushes, checkpoints", "loop, other", "exit"]


def phases() -> dict[str, list[tuple[object, str]]]:
    """Phase -> the (owner, attribute) pairs whose calls it counts."""
    from harness.estimators.registry import EstimatorSpec
    from harness.io import RunDir
    from harness.tasks import control as tasks
    from harness.train import checkpointing, loop
    from harness.train import control as trainer

    return {
        "env stepping": [(tasks.MemberEnvs, "step"), (tasks.EpisodeEnvs, "step")],
        "rollout: policy forward, sampling, bookkeeping": [(tasks.StepCollector, "collect"),
                                                           (tasks.EpisodeCollector, "collect")],
        "advantages": [(EstimatorSpec, "__call__")],
        "update step": [(loop, "update")],
        "evaluation": [(trainer.ControlSource, "evaluate"), (trainer.ControlSource, "initial_evaluation")],
        "writing: metric rows, flushes, checkpoints": [(RunDir, "log"), (RunDir, "flush"), (RunDir, "finish"),
                                                        (checkpointing, "save")],
        "loop": [(loop.Loop, "run")],
    }


class Timers:
    """Exclusive wall time per phase: the time of a call minus that of the timed calls inside it."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self.stack: list[float] = []  # per open call: the time its inner timed calls took
        self.marks: dict[str, float] = {}

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            if phase == "loop":
                self.marks["loop_start"] = time.time()
            self.stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                inner = self.stack.pop()
                self.total[phase] = self.total.get(phase, 0.0) + spent - inner
                if self.stack:
                    self.stack[-1] += spent
                if phase == "loop":
                    self.marks["loop_end"] = time.time()
        return timed


def child(out: str, overrides: list[str]) -> None:
    """Run ``python -m harness <overrides>`` in this process with the phases timed; write the totals
    and the loop's start and end times to ``out``, then end the process as the command does."""
    timers = Timers()
    for phase, targets in phases().items():
        for owner, name in targets:
            setattr(owner, name, timers.wrap(phase, getattr(owner, name)))
    from harness.__main__ import cli
    from harness.interrupt import exit_without_teardown

    sys.argv = ["harness", *overrides]
    try:
        cli()
    finally:
        Path(out).write_text(json.dumps({"phases": timers.total, **timers.marks, "end": time.time()}))
    exit_without_teardown()


def profile(name: str, steps: int, results: Path) -> dict[str, float]:
    """One case, whole process: phase -> seconds (start-up and exit from the child's launch and end)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "phases.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out), *ZOO, *CASES[name],
               f"budget.env_steps={steps}", "seed=0", f"results_dir={results / str(list(CASES).index(name))}"]
        launched = time.time()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        ended = time.time()
        got = json.loads(out.read_text())
    t = dict(got["phases"])
    return {"start-up": got["loop_start"] - launched, **t, "loop, other": t.pop("loop"),
            "exit": ended - got["loop_end"], "whole process": ended - launched}


def table(rows: dict[str, dict[str, float]], steps: int, rounds: int) -> str:
    names = list(rows)
    head = "| phase | " + " | ".join(f"{n}: s (share)" for n in names) + " |"
    lines = [head, "| --- |" + " --- |" * len(names)]
    for phase in ORDER:
        cells = []
        for n in names:
            v, whole = rows[n].get(phase, 0.0), rows[n]["whole process"]
            cells.append(f"{v:.2f} ({100 * v / whole:.0f}%)")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append("| whole process | " + " | ".join(f"{rows[n]['whole process']:.2f}" for n in names) + " |")
    return (f"CartPole-v1, rl-zoo PPO preset (`benchmarks/control_speed.py`'s), {steps:,} env steps per member, "
            f"{'median of ' + str(rounds) + ' rounds' if rounds > 1 else 'one round'}, "
            f"{os.cpu_count()} cores, torch {__import__('torch').__version__}:\n\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of both cases, interleaved; the median is shown")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args(argv)
    import statistics

    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in CASES}
        for r in range(args.rounds):
            for name in CASES:
                runs[name].append(profile(name, args.steps, Path(tmp) / f"round{r}"))
                print(f"[profile] round {r + 1}: {name}: {runs[name][-1]['whole process']:.1f} s", flush=True)
    rows = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in runs.items()}
    text = table(rows, args.steps, args.rounds)
    print(text)
    if args.docs:
        from harness.docs import write_block

        write_block("docs/benchmarks.md", "control-profile", text)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
