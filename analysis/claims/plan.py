"""The second stage of a claims run: extend the experiments of undecided claims, when it fits.

Design (two stages, stated in the report): stage one runs every experiment at its stated n
(``conf/experiment/*.yaml``). Each undecided part's power computation (:func:`.rules.needed_n`:
80% power at the 95% level, from stage one's own interval) gives the n that would decide it; an
experiment is extended once - every training config to that many seeds (``population``), every
probe config to that many batches - when that is at most :data:`MAX_FACTOR` times its stated n
and the time it is estimated to take (stage one's recorded wall time, scaled) fits the budget
left. Cheapest first. The verdicts are then judged on the extended runs (a probe's stage-one run
is replaced by the longer one; a training config keeps its stage-one seeds and gains the rest).
An experiment not extended keeps its verdict, and the report says "undecided at n = .., deciding
needs about n = ..". Stopping rule: one extension per ``--run``; a later ``--run`` may extend again
from the extended data. The plan is kept in ``DIR/plan_<report>.json`` so that judging again
(without ``--run``) reads the same runs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from harness.experiments import ONE_BY_ONE_FAMILIES, left_out_of_run
from harness.io import atomic_write_json

from .evidence import ExpData, wall_seconds

MAX_FACTOR = 25.0


def variant(quick: bool, seed_offset: int) -> str:
    """The suffix that tells a report's files apart: ``_quick`` for ``--quick``, ``_seed<K>`` for
    ``--seed-offset K`` (nothing for the full run at offset 0). The one place it is built: the plan,
    the report, its JSON and its figures folder all use it."""
    return ("_quick" if quick else "") + (f"_seed{seed_offset}" if seed_offset else "")


def plan_path(root: Path, quick: bool, seed_offset: int) -> Path:
    return Path(root) / f"plan_claims{variant(quick, seed_offset)}.json"


def read_plan(root: Path, quick: bool, seed_offset: int) -> dict:
    try:
        plan = json.loads(plan_path(root, quick, seed_offset).read_text())
        return plan if isinstance(plan, dict) and isinstance(plan.get("experiments"), dict) else {"experiments": {}}
    except (OSError, ValueError):
        return {"experiments": {}}


def extensions(plan: dict) -> dict[str, dict]:
    """``{experiment: {"population": N?, "batches": N?}}`` for the extensions a plan ran."""
    return {name: {k: e[k] for k in ("population", "batches") if e.get(k)}
            for name, e in plan.get("experiments", {}).items() if e.get("status") == "run"}


def _stage_one(e: ExpData) -> dict:
    """Per mode: the stated n (population or batches) and stage one's wall time. A point's time
    is the sum of its members' recorded wall times when its family trains them one after another
    (toy, LM), and the longest one when they train as one batch (control: each member records
    the batch's time)."""
    out = {"train": {"n": 0, "cost": 0.0}, "probe": {"n": 0, "cost": 0.0}}
    for p in e.points:
        if p.cfg is None:
            continue
        mode = "probe" if p.cfg.mode == "probe" else "train"
        n = int(p.cfg.population) if mode == "train" else int(p.cfg.probe.batches or 0)
        out[mode]["n"] = max(out[mode]["n"], n)
        walls = [wall_seconds(d) for d in p.run_dirs] or [0.0]  # a probe point has one run: sum = max
        out[mode]["cost"] += sum(walls) if p.cfg.task.family in ONE_BY_ONE_FAMILIES else max(walls)
    return out


def make_plan(verdicts, data: dict[str, ExpData], budget_left_s: float, previous: dict | None = None,
              only: set[str] | None = None) -> dict:
    """Which experiments to extend (and to what n) for the undecided claims, within the budget;
    ``only``: the claims ``--only`` named (None: all), which decides whether an opt-in experiment
    may run at all (:func:`harness.experiments.left_out_of_run`)."""
    wants: dict[str, dict] = {}
    for v in verdicts:
        if v.verdict != "inconclusive" or v.not_run:
            continue
        for p in v.parts:
            if p.verdict != "inconclusive" or not p.n_needed or not p.n_units or p.experiment not in data:
                continue
            if left_out_of_run(p.experiment, only):
                continue
            mode = "probe" if p.unit == "batches" else "train"
            w = wants.setdefault(p.experiment, {"probe": 1.0, "train": 1.0, "parts": []})
            w[mode] = max(w[mode], p.n_needed / p.n_units)
            w["parts"].append(f"{v.claim}: {p.name} (n = {p.n_units:g} {p.unit}, needs about {p.n_needed:g})")
    out = dict((previous or {}).get("experiments", {}))
    candidates = []
    for name, w in wants.items():
        s1 = _stage_one(data[name])
        entry: dict = {"parts": w["parts"], "factor": round(max(w["probe"], w["train"]), 2)}
        cost = 0.0
        if w["train"] > 1 and s1["train"]["n"]:
            entry["population"] = int(math.ceil(s1["train"]["n"] * w["train"]))
            cost += s1["train"]["cost"] * (w["train"] - 1)
        if w["probe"] > 1 and s1["probe"]["n"]:
            entry["batches"] = int(math.ceil(s1["probe"]["n"] * w["probe"]))
            cost += s1["probe"]["cost"] * w["probe"]
        entry["cost_s"] = round(cost, 1)
        if not (entry.get("population") or entry.get("batches")):
            continue
        if entry.get("population") and any(o.partition("=")[0].lstrip("+") == "seed" for pt in data[name].points
                                           for o in pt.sweep):
            entry.update(status="declined", why="its seeds are swept, one run per config (to measure each alone): "
                                                "more seeds means more values in its sweep")
            out[name] = entry
            continue
        if entry["factor"] > MAX_FACTOR:
            entry.update(status="declined", why=f"needs {entry['factor']:g}x the stated n (more than {MAX_FACTOR:g}x)")
            out[name] = entry
            continue
        candidates.append((cost, name, entry))
    left = budget_left_s
    for cost, name, entry in sorted(candidates, key=lambda c: c[0]):
        if cost <= left:
            entry["status"] = "run"
            left -= cost
        else:
            entry.update(status="declined", why=f"estimated {cost / 60:.1f} min, {max(left, 0) / 60:.1f} min of the "
                                                f"budget left")
        out[name] = entry
    return {"budget_left_s": round(budget_left_s, 1), "max_factor": MAX_FACTOR, "experiments": out}


def write_plan(root: Path, quick: bool, seed_offset: int, plan: dict) -> None:
    atomic_write_json(plan_path(root, quick, seed_offset), plan)
