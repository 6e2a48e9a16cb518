"""The claim experiments: what each claim needs run, and each sweep expanded by Hydra.

``python -m harness.experiments claims DIR [--quick] [--only C3,C4]`` runs them
(:mod:`harness.experiments.run`); this package's top only describes and composes them, so
:mod:`analysis.claims` can find the evidence without importing anything that trains.

Each claim of docs/claims_list.md that needs data has one or more experiments, ``harness/conf/experiment/
claim_*.yaml``: a Hydra sweep over ``hydra.sweeper.params``. This module expands each sweep with
Hydra's own machinery (its override parser and the basic sweeper's cartesian product), composes
every config with ``results_dir=DIR/<experiment>``, and runs what is not finished yet through
:func:`harness.app.run` (train or ``mode=probe``, as the experiment says; finished run
directories are skipped), in the runner's process or, for an experiment that measures memory
(:attr:`Experiment.isolate`), each point in a fresh process of its own. The exact claims' unit tests run once with pytest and their outcomes go
to ``DIR/exact_tests.json``. Nothing here judges a claim: ``python -m analysis claims DIR`` reads
what this wrote and gives the verdicts.

``--quick`` runs the same experiments with smaller budgets (:attr:`Experiment.quick` replaces or
adds sweep parameters: fewer batches, seeds and steps) and skips the LM task; its runs land
beside the full ones (other config hashes) and ``python -m analysis claims DIR --quick`` reports
on them.

The claims themselves are data, ``harness/conf/claims.yaml`` (:data:`CLAIMS_FILE`): the ids, each claim's
experiments and which claims are exact. How each experiment runs (its task family, its --quick
variant, whether --quick skips it, whether each point needs its own process, whether a plain
``--run`` leaves it out, its sequential looks) is a comment block in its own file, read into
:data:`EXPERIMENTS` (:func:`load_experiments`)::

    # claim experiment:
    #   family: toy                      # toy | control | lm
    #   quick: {population: "3", budget.env_steps: "1920"}   # sweep params replaced/added by --quick
    #   looks: [20, 40]                  # seeds per arm at each look (training experiments)

(also ``quick_skip: "why"``, ``isolate: true``, ``opt_in: "why"``: :class:`Experiment`). A comment,
so Hydra never composes it: ``python -m harness -m experiment=<name>`` runs the file as before and
no run config or run hash holds it. Adding a claim is its entry in claims.yaml and its experiment
file, nothing else. :mod:`analysis.claims` reads both to find the evidence.
"""
from __future__ import annotations

import copy
import importlib.util
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from .. import losses as _losses  # noqa: F401  (registers the losses: their knobs are in the schema)
from ..config import bad_field, member_configs, register_configs
from ..io import run_dir_for, run_status
from ..io.rundir import FINISHED

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "harness" / "conf"
TESTS_DIR = REPO / "tests"

__all__ = ["BLOCK_HEAD", "BadExperimentFile", "CLAIMS_FILE", "CLAIM_EXPERIMENTS", "CLAIM_IDS", "EXACT_CLAIMS",
           "EXPERIMENTS", "Experiment", "NotComposed", "Point",
           "claims_of", "compose_points", "experiments", "experiments_for", "left_out_of_run", "lm_unavailable",
           "load_experiments", "point_done", "read_experiment", "run_command", "sweep_overrides", "sweep_params"]


FAMILY_ORDER = {"toy": 0, "control": 1, "lm": 2}  # Experiment.family, in the order they run


class NotComposed(Exception):
    """An experiment whose configs cannot be composed (e.g. its file is missing)."""


# ============================================================================ what each claim needs

@dataclass(frozen=True)
class Experiment:
    """How a claim experiment runs, from the ``# claim experiment:`` block of its file (:func:`read_experiment`)."""

    name: str
    family: str  # toy | control | lm
    quick: dict[str, str] = field(default_factory=dict)  # sweep params replaced/added under --quick
    quick_skip: str | None = None  # not run under --quick, and why
    # each point in a fresh process of its own (harness.experiments.run): for experiments that
    # measure a process-wide quantity (peak memory), which earlier points in the same process
    # would otherwise leave their mark on
    isolate: bool = False
    # not run by a plain ``--run`` (why: its cost); run when ``--only`` names one of its claims
    # (:func:`left_out_of_run`)
    opt_in: str | None = None
    # the group-sequential plan of a training experiment (analysis.claims.protocol): seeds per arm
    # at each look, the first being its YAML's population; () = one look, at that population
    looks: tuple[int, ...] = ()


class BadExperimentFile(Exception):
    """A claim experiment block that cannot be read: its message is one line naming the file and
    the field (``python -m harness.experiments`` and ``python -m analysis claims`` print it and exit
    2). Not a ValueError, so that argparse (``--only``'s check imports the claims) does not swallow it."""


#: The line that opens an experiment file's claim experiment block: the YAML mapping on the
#: comment lines under it (each ``#`` and two or more spaces), read by :func:`read_experiment`.
#: A comment, so Hydra never composes it: no run config holds it and no run hash depends on it.
BLOCK_HEAD = "# claim experiment:"
BLOCK_FIELDS = ("family", "quick", "quick_skip", "isolate", "opt_in", "looks")


def _block_text(text: str, head: str = BLOCK_HEAD) -> str | None:
    """The YAML under the comment line ``head`` (:data:`BLOCK_HEAD`; a recipe's ``# recipe:``,
    :mod:`harness.docs.tables`) in ``text`` (the comment marks stripped), or None."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.rstrip() == head]
    if not heads:
        return None
    if len(heads) > 1:
        bad_field(head.strip("# :"), "one block per file", f"{len(heads)} blocks")
    body = []
    for line in lines[heads[0] + 1:]:
        if not line.startswith("#  "):
            break
        body.append(line[1:])
    return textwrap.dedent("\n".join(body))


def _check_block(raw: Any) -> dict:
    """The block's fields, checked (``ValueError`` naming the first field out of range)."""
    if not isinstance(raw, dict):
        bad_field("the claim experiment block", f"a mapping of {list(BLOCK_FIELDS)}", raw)
    unknown = sorted(set(raw) - set(BLOCK_FIELDS))
    if unknown:
        bad_field(str(unknown[0]), f"a field among {list(BLOCK_FIELDS)}", raw[unknown[0]])
    if raw.get("family") not in FAMILY_ORDER:
        bad_field("family", f"one of {list(FAMILY_ORDER)}", raw.get("family"))
    quick = raw.get("quick") or {}
    if not isinstance(quick, dict):
        bad_field("quick", "a mapping of sweep parameters to Hydra sweep values, each a quoted string", quick)
    for key, value in quick.items():
        if not isinstance(value, str) or not isinstance(key, str):
            bad_field(f"quick.{key}", 'a string (a Hydra sweep value, quoted: "4000", "0.0,1.0")', value)
    for key in ("quick_skip", "opt_in"):
        if raw.get(key) is not None and not (isinstance(raw[key], str) and raw[key].strip()):
            bad_field(key, "a sentence saying why (or absent)", raw[key])
    if not isinstance(raw.get("isolate", False), bool):
        bad_field("isolate", "true or false", raw["isolate"])
    looks = raw.get("looks") or []
    if not (isinstance(looks, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in looks)
            and all(a < b for a, b in zip(looks, looks[1:]))):
        bad_field("looks", "a list of increasing seed counts per arm, e.g. [20, 40] (or absent)", looks)
    return {**raw, "quick": dict(quick), "looks": tuple(looks)}


def read_experiment(path: Path) -> Experiment | None:
    """The claim experiment that ``path`` (``<conf>/experiment/<name>.yaml``) describes in its
    :data:`BLOCK_HEAD` comment block, or None when it has none (a plain named sweep). Raises
    :class:`BadExperimentFile` naming the file and the field when the block is malformed."""
    try:
        block = _block_text(path.read_text())
        if block is None:
            return None
        try:
            raw = yaml.safe_load(block)
        except yaml.YAMLError as exc:
            raise ValueError(f"the claim experiment block must be YAML: {' '.join(str(exc).split())}") from None
        return Experiment(path.stem, **_check_block(raw))
    except ValueError as exc:
        where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        raise BadExperimentFile(f"{where}: {exc}") from None


def load_experiments(conf_dir: Path = CONF_DIR) -> dict[str, Experiment]:
    """Every claim experiment of ``conf_dir/experiment/``: the files with a claim experiment block,
    by name. A new claim's experiment is its file; nothing else lists it."""
    found = (read_experiment(f) for f in sorted((Path(conf_dir) / "experiment").glob("*.yaml")))
    return {e.name: e for e in found if e is not None}


_EXPERIMENTS: dict[str, Experiment] | None = None


def experiments() -> dict[str, Experiment]:
    """:data:`EXPERIMENTS`: read from the experiment files on first use (:func:`load_experiments`),
    so that importing this package never fails on a malformed file; the commands that read them
    report it (:class:`BadExperimentFile`)."""
    global _EXPERIMENTS
    if _EXPERIMENTS is None:
        _EXPERIMENTS = load_experiments(CONF_DIR)
    return _EXPERIMENTS


def __getattr__(name: str):
    """``EXPERIMENTS`` (experiment name -> :class:`Experiment`) is :func:`experiments`, read on first use."""
    if name == "EXPERIMENTS":
        return experiments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CLAIMS_FILE = CONF_DIR / "claims.yaml"  # the claims as data; analysis.claims judges them


def _claim_table() -> dict[str, dict]:
    return yaml.safe_load(CLAIMS_FILE.read_text())["claims"]


_TABLE = _claim_table()
#: Claim ids in the order of harness/conf/claims.yaml.
CLAIM_IDS: list[str] = list(_TABLE)
#: Claim id -> its experiments (the first is required for a verdict, later ones add optional parts).
CLAIM_EXPERIMENTS: dict[str, tuple[str, ...]] = {c: tuple(e.get("experiments") or ()) for c, e in _TABLE.items()
                                                 if e.get("experiments")}
#: Exact claims: judged by the unit tests marked ``@pytest.mark.claim("<id>")``.
EXACT_CLAIMS: list[str] = [c for c, e in _TABLE.items() if e.get("exact")]


def experiments_for(claims: Iterable[str]) -> list[str]:
    """The experiments of ``claims``, each once, toy first, then control, then LM."""
    names: list[str] = []
    for c in claims:
        for x in CLAIM_EXPERIMENTS.get(c, ()):
            if x not in names:
                names.append(x)
    return sorted(names, key=lambda x: FAMILY_ORDER[experiments()[x].family])


def claims_of(name: str) -> list[str]:
    """The claims (in harness/conf/claims.yaml's order) that use experiment ``name``."""
    return [c for c in CLAIM_IDS if name in CLAIM_EXPERIMENTS.get(c, ())]


def run_command(name: str) -> str:
    """The command that runs experiment ``name`` into DIR: ``--run``, with ``--only`` and its
    claims for an opt-in experiment (which a plain ``--run`` leaves out)."""
    ex = experiments().get(name)
    only = f" --only {','.join(claims_of(name))}" if ex is not None and ex.opt_in else ""
    return f"python -m analysis claims DIR --run{only}"


def left_out_of_run(name: str, only: Iterable[str] | None) -> str | None:
    """Why ``--run`` (with ``--only`` ``only``, None for all claims) leaves experiment ``name``
    out, or None when it runs it: an opt-in experiment runs only when ``only`` names one of its
    claims, so a plain ``--run`` keeps to its time budget."""
    ex = experiments().get(name)
    if ex is None or not ex.opt_in or (only is not None and set(only) & set(claims_of(name))):
        return None
    return f"{ex.opt_in}: {run_command(name)}"


def lm_unavailable() -> str | None:
    """Why the LM task cannot run here, or None."""
    if importlib.util.find_spec("harness.train.lm") is None:
        return "the LM task (harness/train/lm.py) is not present"
    if not (CONF_DIR / "task" / "lm_summarize.yaml").is_file():
        return "harness/conf/task/lm_summarize.yaml is not present"
    return None  # an import or run failure is recorded per run (failed, with its reason)


# ============================================================================ sweeps, by Hydra

@dataclass
class Point:
    """One config of an experiment's sweep and the run directories it makes."""

    experiment: str
    overrides: list[str]
    cfg: Any = None
    run_dirs: list[Path] = field(default_factory=list)
    error: str | None = None
    sweep: list[str] = field(default_factory=list)  # this point's own sweep overrides

    @property
    def tag(self) -> str:
        """The sweep's own overrides (and the shifted seed, under a seed offset)."""
        return " ".join(o for o in self.overrides[3:] if not o.startswith("lm.cache_dir"))


def sweep_params(name: str, quick: bool) -> dict[str, str]:
    """``hydra.sweeper.params`` of ``harness/conf/experiment/<name>.yaml``, with the --quick replacements."""
    path = CONF_DIR / "experiment" / f"{name}.yaml"
    if not path.is_file():
        raise NotComposed(f"no experiment file {path.relative_to(REPO)}")
    node = OmegaConf.load(path)
    params = OmegaConf.select(node, "hydra.sweeper.params") or {}
    params = {str(k): str(v) for k, v in OmegaConf.to_container(params).items()} if params else {}
    if quick:
        params.update(experiments()[name].quick)
    return params


def sweep_overrides(params: dict[str, str]) -> list[list[str]]:
    """Every job of a sweep as its overrides: Hydra's override grammar and its basic sweeper's
    cartesian product (``BasicSweeper.split_arguments``), as ``python -m harness -m`` runs it."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return BasicSweeper.split_arguments(parsed, None)[0]


def _replace(overrides: list[str], key: str, value) -> list[str]:
    """``overrides`` with every override of ``key`` (any ``+``/``++`` prefix) replaced by one."""
    kept = [o for o in overrides if o.partition("=")[0].lstrip("+~") != key]
    return kept + [f"++{key}={value}" if key.startswith("probe.") else f"{key}={value}"]


_COMPOSED: dict[tuple[str, ...], Any] = {}  # overrides -> composed config, for this process


def _compose(overrides: list[str]):
    """Hydra's ``compose`` of the primary config with ``overrides``, once per process: a claims
    run composes every point to run it and again to judge it (about 0.2 s a point on 2 cores).
    Each call gets its own copy. Call inside ``initialize_config_dir(CONF_DIR)``."""
    key = (str(CONF_DIR), *overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = compose(config_name="config", overrides=list(overrides))
    return copy.deepcopy(_COMPOSED[key])


def compose_points(name: str, root: Path, quick: bool, seed_offset: int = 0,
                   extend: dict | None = None) -> list[Point]:
    """Compose every config of experiment ``name`` with ``results_dir=root/name``.

    ``seed_offset`` K shifts every config's ``seed`` by K (its members' seeds follow: seed + i),
    so the same experiment runs on seeds disjoint from the default ones (K >= the largest
    population); the runs land beside the others (the seed is part of a run's config hash).

    ``extend`` (a claims report's second stage, :mod:`analysis.claims`): ``{"population": N}``
    gives every training config N seeds (members ``seed .. seed + N - 1``: the first ones are the
    stage-one runs, already finished), ``{"batches": N}`` gives every probe config N batches."""
    register_configs()
    root = Path(root)
    extend = extend or {}
    points = []
    base = [f"experiment={name}", f"results_dir={root / name}", "progress=false"]
    if experiments()[name].family == "lm":
        base.append(f"lm.cache_dir={root / '.cache' / 'lm'}")  # one SFT/RM pipeline for every LM experiment
    combos = sweep_overrides(sweep_params(name, quick))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for combo in combos:
                p = Point(name, base + combo, sweep=list(combo))
                try:
                    p.cfg = _compose(p.overrides)
                    changed, values = list(p.overrides), {}
                    if seed_offset:
                        values["seed"] = int(p.cfg.seed) + int(seed_offset)
                    if p.cfg.mode == "train" and extend.get("population"):
                        values["population"] = int(extend["population"])
                    for key, value in values.items():
                        changed = _replace(changed, key, value)
                    if p.cfg.mode == "probe" and extend.get("batches"):
                        changed = _replace(changed, "probe.batches", int(extend["batches"]))
                        p.overrides, p.cfg = changed, _compose(changed)
                    elif changed != p.overrides:
                        # plain values of the schema: set on the composed config, which is what composing
                        # it again with them as overrides gives (tests/test_claims.py), at no second
                        # compose (0.11 s a point: 18 s of every claims command at a seed offset)
                        p.overrides = changed
                        for key, value in values.items():
                            p.cfg[key] = value
                    p.run_dirs = [run_dir_for(m) for m in member_configs(p.cfg)]
                except Exception as exc:  # missing task config, schema error, ...
                    p.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                points.append(p)
    finally:
        GlobalHydra.instance().clear()
    return points


def point_done(p: Point) -> bool:
    """Every run directory finished (and, for a probe, holding its probe.parquet)."""
    return all(run_status(d) in FINISHED and (p.cfg.mode != "probe" or (d / "probe.parquet").is_file())
               for d in p.run_dirs)
