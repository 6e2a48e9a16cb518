"""``python -m harness.experiments claims DIR [--quick] [--only C3,C4]``: run what the claims need.

For the claims selected (all of ``harness/conf/claims.yaml`` by default): the exact claims' unit
tests (marked ``@pytest.mark.claim``), once, with pytest (outcomes per claim into
``DIR/exact_tests.json``), then every experiment the claims need, toy first, then control, then
LM: each config of its sweep (expanded by Hydra, see :mod:`harness.experiments`) through
:func:`harness.app.run`, finished run directories skipped; an experiment that measures memory
(:attr:`harness.experiments.Experiment.isolate`) runs each point in a fresh process of its own.
The LM experiments' pipelines (SFT policy, reward model) are built in a background process from
the start, beside the toy and control experiments (:func:`prepare_pipelines`).
``--quick``: the experiments' quick variants, LM skipped; ``--seed-offset K``: on seeds shifted
by K. ``python -m analysis claims DIR --run`` does this and then judges (with a second stage for
undecided claims).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ..allocator import tune_allocator
from ..app import describe, run
from ..config import member_configs
from ..io import RunDir, atomic_write_json
from . import (
    CLAIM_IDS, EXACT_CLAIMS, REPO, BadExperimentFile, Point, compose_points, experiments, experiments_for,
    left_out_of_run, lm_unavailable, point_done,
)

__all__ = ["WorkerDied", "describe", "main", "prepare_pipelines", "run_claims", "run_exact_tests", "run_isolated",
           "run_points"]


# What the fork server imports once, before any point: the training code and the LM's model module
# (transformers loads it lazily, at the first from_pretrained). A point's process is forked from it,
# so it pays its own run, not the seconds of importing torch, transformers and the harness again.
# Nothing of a run is ever in the server: it imports, nothing else.
_SERVER_PRELOAD = ("harness.app", "harness.train.lm", "harness.train.control", "transformers.models.gpt2.modeling_gpt2")


def run_isolated(cfg: Any, target: Callable[[Any], dict[str, int]] = run) -> dict[str, int]:
    """:func:`harness.app.run` on ``cfg`` in a fresh process: nothing an earlier point left in
    this process (resident memory, allocator caches, CUDA state) reaches it. The process is forked
    from multiprocessing's fork server, which has only imported :data:`_SERVER_PRELOAD` (a module
    it cannot import is skipped; the point imports it itself). Returns its counts; an exception
    there is raised here with its type and message (as in-process). A process that dies without
    one (killed, out of memory) raises :class:`WorkerDied` after its unfinished runs are recorded
    as failed. ``target``: what runs there (tests)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_SERVER_PRELOAD))  # read when the server starts (the first point)
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        future = pool.submit(target, cfg)
        try:
            return future.result()
        except BrokenProcessPool:
            reason = "the run's process died without an exception (killed, or out of memory)"
    t0 = time.perf_counter()
    for m in member_configs(cfg):
        r = RunDir(m)
        if r.status() is None and r.blocker() is None and r.claim():
            try:
                r.finish("failed", reason, time.perf_counter() - t0)
            finally:
                r.release()
    raise WorkerDied(reason)


class WorkerDied(RuntimeError):
    """The process of an isolated point ended without reporting back."""


def _build_pipelines(cfgs: list[Any]) -> None:
    """:func:`harness.tasks.lm.pipeline.build_task` of each config, on the ``threads`` intra-op
    threads :func:`harness.train.lm.train` sets before it (the SFT weights differ in their last
    bits with another count; the stages are cached, so what is built here is what the point would
    build); a failure is left to the point that needs the stage to report."""
    import torch

    from ..tasks.lm.pipeline import build_task

    for cfg in cfgs:
        try:
            torch.set_num_threads(int(cfg.threads))
            build_task(cfg)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"[claims] LM pipeline not prepared ahead ({reason}); the experiment builds it", file=sys.stderr)


def prepare_pipelines(points: list[Point]) -> multiprocessing.process.BaseProcess | None:
    """Start building the LM pipelines (data, SFT policy, reward model: the cached stages of
    :mod:`harness.tasks.lm.pipeline`) that ``points`` train from, in a background process (spawned;
    one build per distinct ``lm`` config), so the build runs beside the experiments before them
    instead of in front of the first LM point (the summarization task's SFT and reward model take
    minutes on one core). A point that needs a stage still being built waits for it (the
    stage's lock); one the process did not build (it failed, or was killed) builds it itself.
    A point with ``threads`` null is left to build its own (it builds on the thread count its
    process has then). None when there is nothing to build."""
    import json

    from omegaconf import OmegaConf

    cfgs: dict[str, Any] = {}
    for p in points:
        if p.cfg is None or p.error or p.cfg.task.family != "lm" or not p.cfg.threads or point_done(p):
            continue
        key = json.dumps([OmegaConf.to_container(p.cfg.lm, resolve=True), str(p.cfg.device), p.cfg.threads],
                         sort_keys=True, default=str)
        cfgs.setdefault(key, p.cfg)
    if not cfgs:
        return None
    proc = multiprocessing.get_context("spawn").Process(target=_build_pipelines, args=(list(cfgs.values()),),
                                                        name="claims-lm-pipelines", daemon=True)
    proc.start()
    return proc


def run_points(points: list[Point], progress: Callable[[str], None] = print,
               isolate: bool = False) -> dict[str, int]:
    """Run what is missing (finished run directories are skipped by the harness itself);
    ``isolate``: each point in a fresh process of its own (:func:`run_isolated`). Each point's
    line ends with the time left for the experiment's points still to run (:func:`time_left`)."""
    totals: dict[str, int] = {}
    runner = (lambda cfg: run_isolated(cfg)) if isolate else run  # looked up at call time (tests)
    to_run = sum(not p.error and not point_done(p) for p in points)
    took: list[float] = []
    for i, p in enumerate(points, 1):
        head = f"[claims] {p.experiment} ({i}/{len(points)}) {p.tag}"
        if p.error:
            progress(f"{head}: cannot compose: {p.error}")
            totals["error"] = totals.get("error", 0) + 1
            continue
        if point_done(p):
            progress(f"{head}: done already")
            totals["done already"] = totals.get("done already", 0) + 1
            continue
        t0 = time.perf_counter()
        try:
            counts = runner(p.cfg)
            desc = describe(counts)
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
        except Exception as exc:  # invalid config or import failure: recorded as this point's error
            p.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            desc = f"error: {p.error}"
            totals["error"] = totals.get("error", 0) + 1
            traceback.print_exc(file=sys.stderr)
        took.append(time.perf_counter() - t0)
        progress(f"{head}: {desc} ({took[-1]:.1f} s{time_left(took, to_run - len(took), p.experiment)})")
    return totals


def time_left(took: list[float], left: int, experiment: str) -> str:
    """``; about H:MM:SS left in <experiment>``: the ``left`` points still to run at the mean time of
    the points run so far (``took``, seconds; tqdm's interval format); empty when none is left."""
    if left <= 0 or not took:
        return ""
    from tqdm import tqdm

    return f"; about {tqdm.format_interval(sum(took) / len(took) * left)} left in {experiment}"


def run_exact_tests(claims: Iterable[str], out: Path, progress: Callable[[str], None] = print,
                    repo: Path = REPO, tests_dir: str = "tests") -> dict:
    """One pytest run over the tests marked ``@pytest.mark.claim`` (:mod:`.pytest_claims`);
    their outcomes per exact claim into ``out`` (JSON), which :mod:`analysis.claims` reads."""
    exact = [c for c in claims if c in EXACT_CLAIMS]
    xml = Path(out).with_suffix(".xml")
    t0 = time.perf_counter()
    results: dict[str, Any] = {c: {"nodes": [], "outcomes": []} for c in exact}
    unavailable = None
    if exact and not (Path(repo) / tests_dir).is_dir():  # an installed wheel: the tests are the clone's
        unavailable = (f"the exact claims' tests are in a clone's {tests_dir}/ folder, not in an installed package "
                       f"({Path(repo) / tests_dir} does not exist): run the claims from a clone")
        progress(f"[claims] exact tests not run: {unavailable}")
    elif exact:
        # only the files that mark a test (the marker, not the file, decides): importing every
        # test module would cost more than the tests themselves
        files = sorted(str(f.relative_to(repo)) for f in (Path(repo) / tests_dir).rglob("test_*.py")
                       if re.search(r"^\s*@pytest\.mark\.claim\(", f.read_text(errors="replace"), re.M))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "harness.experiments.pytest_claims",
               f"--junitxml={xml}", "-m", "claim", *(files or [tests_dir])]
        progress(f"[claims] exact tests: {' '.join(cmd[3:])}")
        path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
        env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": path}  # the plugin imports from this checkout
        subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env)
        if xml.is_file():
            for tc in ET.parse(xml).getroot().iter("testcase"):
                outcome = "passed"
                for child in tc:
                    if child.tag in ("failure", "error"):
                        outcome = "failed"
                    elif child.tag == "skipped":
                        outcome = "skipped"
                node = tc.get("classname", "").replace(".", "/") + ".py::" + tc.get("name", "")
                for prop in tc.iter("property"):
                    cid = prop.get("value")
                    if prop.get("name") == "claim" and cid in results:
                        results[cid]["nodes"].append(node)
                        results[cid]["outcomes"].append(outcome)
    payload = {"ran_at": time.strftime("%Y-%m-%d %H:%M:%S"), "duration_s": time.perf_counter() - t0, "claims": results}
    if unavailable:
        payload["unavailable"] = unavailable
    atomic_write_json(Path(out), payload)
    progress(f"[claims] exact tests done ({time.perf_counter() - t0:.1f} s)")
    return payload


@dataclass(frozen=True)
class ClaimStage:
    """Which look of the claims' sequential plans a :func:`run_claims` call runs. ``extensions``:
    only these experiments, each extended as given (a later look); ``reached``: the members each
    experiment's plan has already reached (a resumed run: every experiment runs at least to these,
    so a look a stopped run began is completed); ``timings``: each experiment's seconds (and
    ``exact tests``) are added to it."""

    extensions: dict[str, dict] | None = None
    reached: dict[str, dict] | None = None
    timings: dict[str, float] | None = None

    def add_time(self, name: str, seconds: float) -> None:
        if self.timings is not None:
            self.timings[name] = self.timings.get(name, 0.0) + seconds


def run_claims(root: str | Path, *, quick: bool = False, only: set[str] | None = None, seed_offset: int = 0,
               progress: Callable[[str], None] = print, stage: ClaimStage | None = None) -> dict[str, int]:
    """Run the exact tests and every experiment the claims (``only``: a subset) need, into ``root``
    (``seed_offset``: on seeds shifted by that much, :func:`~harness.experiments.compose_points`);
    ``stage``: the look of the sequential plans to run (None: stage one)."""
    # glibc's allocator as `python -m harness` sets it for its runs (and their forked population
    # workers): without it a population's activations were mapped and unmapped at every minibatch
    # (claim_c53's harness side: 4.7-5.0 s of system time against 0.6-0.7). The isolated points'
    # fork server is a fresh interpreter and keeps glibc's own settings (C15 measures memory there).
    tune_allocator()
    stage = stage or ClaimStage()
    root = Path(root).resolve()  # the exact tests run from the repository root
    root.mkdir(parents=True, exist_ok=True)
    claims = [c for c in CLAIM_IDS if only is None or c in only]
    totals: dict[str, int] = {}
    if stage.extensions is None and any(c in EXACT_CLAIMS for c in claims):
        # every exact claim, whatever --only asks: one pytest run covers them all, and the results
        # file is shared by every report of the folder (a subset would turn the others "not run")
        t_exact = time.perf_counter()
        run_exact_tests(EXACT_CLAIMS, root / "exact_tests.json", progress)
        stage.add_time("exact tests", time.perf_counter() - t_exact)
    names = experiments_for(claims)
    if stage.extensions is not None:
        names = [n for n in names if n in stage.extensions]
    points = _ClaimPoints(root, quick, only, seed_offset, stage)
    pipelines = _start_pipelines(points, [n for n in names if not points.skipped(n)])
    try:
        for name in names:
            _run_experiment(points, name, totals, progress)
    except BaseException:
        if pipelines is not None:  # stopped: the build is not waited for (its stage's lock dies with it)
            pipelines.terminate()
        raise
    finally:
        if pipelines is not None:
            pipelines.join()
    return totals


@dataclass
class _ClaimPoints:
    """The claim experiments' points of one :func:`run_claims` call, each composed once."""

    root: Path
    quick: bool
    only: set[str] | None
    seed_offset: int
    stage: ClaimStage
    composed: dict[str, list[Point]] = field(default_factory=dict)

    def skipped(self, name: str) -> str | None:
        """Why experiment ``name`` is not run here (None: it is)."""
        ex = experiments()[name]
        if self.quick and ex.quick_skip:
            return ex.quick_skip
        return left_out_of_run(name, self.only) or (lm_unavailable() if ex.family == "lm" else None)

    def of(self, name: str) -> list[Point]:
        if name not in self.composed:
            self.composed[name] = compose_points(name, self.root, self.quick, seed_offset=self.seed_offset,
                                                 extend=(self.stage.extensions or self.stage.reached or {}).get(name))
        return self.composed[name]


def _start_pipelines(points: _ClaimPoints, runnable: list[str]):
    """The LM pipelines of the runnable LM experiments, built in the background while the others
    run (None where the first experiment is an LM one: its first point would only wait for it)."""
    if not runnable or experiments()[runnable[0]].family == "lm":
        return None
    lm_points = []
    for name in runnable:
        if experiments()[name].family == "lm":
            try:
                lm_points += points.of(name)
            except Exception:  # reported where the experiment runs
                pass
    return prepare_pipelines(lm_points) if lm_points else None


def _run_experiment(points: _ClaimPoints, name: str, totals: dict[str, int], progress: Callable[[str], None]) -> None:
    """Run experiment ``name``'s points (or say why not), adding its outcomes to ``totals``."""
    ex = experiments()[name]
    reason = points.skipped(name)
    if reason:
        progress(f"[claims] experiment {name}: skipped ({reason})")
        return
    try:
        todo = points.of(name)
    except Exception as exc:
        progress(f"[claims] experiment {name}: cannot compose: {type(exc).__name__}: {exc}".splitlines()[0])
        totals["error"] = totals.get("error", 0) + 1
        return
    t0 = time.perf_counter()
    progress(f"[claims] experiment {name}: {len(todo)} config(s){', each in its own process' if ex.isolate else ''}")
    for k, v in run_points(todo, progress, isolate=ex.isolate).items():
        totals[k] = totals.get(k, 0) + v
    points.stage.add_time(name, time.perf_counter() - t0)
    progress(f"[claims] experiment {name} done in {time.perf_counter() - t0:.1f} s")


# ============================================================================ command line

def parse_only(text: str | None) -> set[str] | None:
    """``"C3, c5"`` -> ``{"C3", "C5"}``; ValueError naming unknown ids."""
    if not text:
        return None
    only = {c.strip().upper() for c in text.split(",") if c.strip()}
    unknown = sorted(only - set(CLAIM_IDS))
    if unknown:
        raise ValueError(f"unknown claim id(s) {unknown}; valid: {CLAIM_IDS[0]}-{CLAIM_IDS[-1]}")
    return only


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.experiments",
                                     description="Run named sets of experiments (finished runs are skipped).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("claims", help="run the claim experiments and the exact claims' tests",
                       description="Run what the claims of harness/conf/claims.yaml need into DIR: every sweep of "
                                   "harness/conf/experiment/claim_*.yaml (DIR/<experiment>/...) and the exact claims' "
                                   "unit tests (DIR/exact_tests.json). Then: python -m analysis claims DIR.")
    p.add_argument("results", metavar="DIR", help="folder for the claim experiments' runs")
    p.add_argument("--quick", action="store_true",
                   help="smaller budgets and wider intervals (about a minute on 2 cores, LM claims skipped)")
    p.add_argument("--only", default=None, metavar="IDS", help="comma-separated claim ids, e.g. C3,C5,C6")
    p.add_argument("--seed-offset", type=int, default=0, metavar="K",
                   help="run every experiment on seeds shifted by K (disjoint from the default ones for K >= 1000)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        only = parse_only(args.only)
        experiments()  # a malformed claim experiment file: one line naming it, before anything runs
    except (ValueError, BadExperimentFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    totals = run_claims(args.results, quick=args.quick, only=only, seed_offset=args.seed_offset, progress=print)
    print(f"[claims] runs: {describe(totals) or 'nothing to run'} ({time.perf_counter() - t0:.0f} s)")
    print(f"verdicts: python -m analysis claims {args.results}{' --quick' if args.quick else ''}"
          f"{' --only ' + args.only if args.only else ''}")
    return 0

