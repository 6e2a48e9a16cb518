"""The second stage of a claims run: the group-sequential looks, fixed in advance, by runs.

A training experiment may register looks (``harness.experiments.EXPERIMENTS[name].looks``, e.g.
``(40, 80)`` seeds per arm; the first is its YAML's population). Stage one runs every experiment
at its first look. After judging, an experiment goes to its next look when at least one claim
whose primary test it holds is tested (evidence present, checks passed) and has not crossed its
stopping boundary yet (:mod:`.protocol`: O'Brien-Fleming-type boundaries at the Bonferroni level
``alpha / m_registered``); its members are extended (``population``: the first ones are the
earlier look's runs, already finished) and the claims are judged again, until every experiment
has stopped or reached its last look. No clock enters: the same command gives the same runs and
the same verdicts on a busy and on a quiet machine, and the most a full run can cost is every
experiment at its last look. Probe experiments have one look (their batches are registered at a
number that decides their claims). The looks reached are kept in ``DIR/plan_claims*.json`` so
that judging again (without ``--run``) reads the same runs. A ``--run`` stopped during a look is
completed by the next one (its stage one runs every experiment to the look the plan reached); until
then a claim whose reached look lacks runs is pending, never judged on the runs that happen to exist.
"""
from __future__ import annotations

from pathlib import Path

from harness.experiments import EXPERIMENTS
from harness.io import atomic_write_json
from harness.io.files import read_json


def variant(quick: bool, seed_offset: int) -> str:
    """The suffix that tells a report's files apart: ``_quick`` for ``--quick``, ``_seed<K>`` for
    ``--seed-offset K`` (nothing for the full run at offset 0). The one place it is built: the plan,
    the report, its JSON and its figures folder all use it."""
    return ("_quick" if quick else "") + (f"_seed{seed_offset}" if seed_offset else "")


def plan_path(root: Path, quick: bool, seed_offset: int) -> Path:
    return Path(root) / f"plan_claims{variant(quick, seed_offset)}.json"


def looks_of(name: str) -> tuple[int, ...]:
    """The registered looks of experiment ``name`` (seeds per arm); () = one look at its YAML's n."""
    ex = EXPERIMENTS.get(name)
    return tuple(ex.looks) if ex else ()


def read_plan(root: Path, quick: bool, seed_offset: int) -> dict:
    if quick:  # a pilot never goes past its first look
        return {"experiments": {}}
    try:
        plan = read_json(plan_path(root, quick, seed_offset))  # harness.io.files: regular, bounded
        return plan if isinstance(plan, dict) and isinstance(plan.get("experiments"), dict) else {"experiments": {}}
    except (OSError, ValueError):
        return {"experiments": {}}


def extensions(plan: dict) -> dict[str, dict]:
    """``{experiment: {"population": N}}``: the members each extended experiment has reached."""
    out = {}
    for name, e in plan.get("experiments", {}).items():
        looks, k = looks_of(name), int(e.get("reached", 0))
        if looks and 0 < k < len(looks):
            out[name] = {"population": looks[k]}
    return out


def next_looks(verdicts, claims: dict, plan: dict) -> dict:
    """The plan after one more look for every experiment that still has a *pending* claim: one
    whose checks passed and whose primary has not crossed its stopping boundary at the
    experiment's current look, below its last look (:func:`analysis.claims.evaluate_claim`)."""
    out = {"experiments": {k: dict(v) for k, v in plan.get("experiments", {}).items()}}
    for v in verdicts:
        if not getattr(v, "pending", False) or v.primary is None:
            continue
        name = claims[v.claim].primary.experiment
        looks = looks_of(name)
        reached = int(out["experiments"].get(name, {}).get("reached", 0))
        if len(looks) < 2 or v.primary.look < reached or reached >= len(looks) - 1:
            continue  # one look, stopped at an earlier look, or at the last one already
        e = out["experiments"].setdefault(name, {"looks": list(looks), "reached": reached, "why": []})
        e["reached"] = reached + 1
        e.setdefault("why", []).append(f"{v.claim} had not crossed its boundary at {looks[reached]} seeds")
    return out


def write_plan(root: Path, quick: bool, seed_offset: int, plan: dict) -> None:
    atomic_write_json(plan_path(root, quick, seed_offset), plan)
