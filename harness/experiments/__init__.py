"""The claim experiments: what each claim needs run, and each sweep expanded by Hydra.

``python -m harness.experiments claims DIR [--quick] [--only C3,C4]`` runs them
(:mod:`harness.experiments.run`); this package's top only describes and composes them, so
:mod:`analysis.claims` can find the evidence without importing anything that trains.

Each claim of CLAIMS.md that needs data has one or more experiments, ``conf/experiment/
claim_*.yaml``: a Hydra sweep over ``hydra.sweeper.params``. This module expands each sweep with
Hydra's own machinery (its override parser and the basic sweeper's cartesian product), composes
every config with ``results_dir=DIR/<experiment>``, and runs what is not finished yet through
:func:`harness.app.run` (train or ``mode=probe``, as the experiment says; finished run
directories are skipped). The exact claims' unit tests run once with pytest and their outcomes go
to ``DIR/exact_tests.json``. Nothing here judges a claim: ``python -m analysis claims DIR`` reads
what this wrote and gives the verdicts.

``--quick`` runs the same experiments with smaller budgets (:attr:`Experiment.quick` replaces or
adds sweep parameters: fewer batches, seeds and steps) and skips the LM task; its runs land
beside the full ones (other config hashes) and ``python -m analysis claims DIR --quick`` reports
on them.

The tables here (:data:`EXPERIMENTS`, :data:`CLAIM_EXPERIMENTS`, :data:`EXACT_TESTS`) say what
each claim needs run; :mod:`analysis.claims` reads them to find the evidence.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from ..config import member_configs, register_configs
from ..io import run_dir_for, run_status
from ..io.rundir import FINISHED

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
TESTS_DIR = REPO / "tests"

__all__ = ["CLAIM_EXPERIMENTS", "CLAIM_IDS", "EXACT_TESTS", "EXPERIMENTS", "Experiment", "NotComposed", "Point",
           "compose_points", "experiments_for", "lm_unavailable", "point_done", "sweep_overrides", "sweep_params"]


class NotComposed(Exception):
    """An experiment whose configs cannot be composed (e.g. its file is missing)."""


# ============================================================================ what each claim needs

@dataclass(frozen=True)
class Experiment:
    name: str
    family: str  # toy | control | lm
    quick: dict[str, str] = field(default_factory=dict)  # sweep params replaced/added under --quick
    quick_skip: str | None = None  # not run under --quick, and why


_TOY_QUICK = {"++probe.batches": "2000"}
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("claim_c3", "toy", _TOY_QUICK),
    Experiment("claim_c3_control", "control", {"++probe.batches": "100"}),
    Experiment("claim_c4", "toy", _TOY_QUICK),
    Experiment("claim_c5", "toy", {**_TOY_QUICK, "gae_lambda": "0.0,1.0", "++probe.critic_noise": "0.3"}),
    Experiment("claim_c13", "toy", _TOY_QUICK),
    Experiment("claim_c14", "toy", {"++probe.batches": "200"}),
    Experiment("claim_c17", "toy", _TOY_QUICK),
    Experiment("claim_c18", "toy", {"population": "5", "loss_agg": "seq_mean_token_mean,seq_mean_token_sum_norm"}),
    Experiment("claim_c20", "toy", {"population": "3", "++probe.batches": "1000", "group_size": "2,8"}),
    Experiment("claim_c22", "toy", _TOY_QUICK),
    Experiment("claim_c26", "toy", {"population": "3", "budget.env_steps": "1280", "clip_eps": "0.2"}),
    Experiment("claim_c28", "toy", {"population": "3", "budget.env_steps": "1920"}),
    Experiment("claim_c8", "control", {"population": "3", "budget.env_steps": "12000", "clip_eps": "0.2,null",
                                       "epochs": "10", "eval_every_steps": "3000"}),
    Experiment("claim_c9", "control", {"population": "3", "budget.env_steps": "12000",
                                       "eval_every_steps": "3000"}),
    Experiment("claim_c11", "control", {"population": "3", "budget.env_steps": "12000", "ent_coef": "0.0,0.05",
                                        "eval_every_steps": "3000"}),
    Experiment("claim_c10", "lm", quick_skip="--quick skips the LM task (its SFT/reward-model pipeline alone "
                                             "takes minutes on CPU)"),
    Experiment("claim_c15", "lm", quick_skip="--quick skips the LM task"),
    Experiment("claim_c19", "lm", quick_skip="--quick skips the LM task"),
]}

#: Claim id -> its experiments (the first is required for a verdict, later ones add optional parts).
CLAIM_EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "C3": ("claim_c3", "claim_c3_control"), "C4": ("claim_c4",), "C5": ("claim_c5",), "C6": ("claim_c5",),
    "C8": ("claim_c8",), "C9": ("claim_c9",), "C10": ("claim_c10",), "C11": ("claim_c11",),
    "C13": ("claim_c13",), "C14": ("claim_c14",), "C15": ("claim_c15",), "C17": ("claim_c17",),
    "C18": ("claim_c18",), "C19": ("claim_c19",), "C20": ("claim_c20",), "C21": ("claim_c10",),
    "C22": ("claim_c22",),
    "C26": ("claim_c26",), "C28": ("claim_c28",),
}

#: Exact claims -> (pytest -k name prefixes, test file globs under tests/).
EXACT_TESTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "C1": (("test_c1_",), ("test_returns.py",)),
    "C2": (("test_c2_",), ("test_returns.py",)),
    "C7": (("test_c7_",), ("test_losses.py",)),
    "C12": (("test_c12",), ("test_lm*.py",)),
    "C16": (("test_c16_",), ("test_group_kl.py",)),
}

CLAIM_IDS = [f"C{i}" for i in range(1, 29)]
FAMILY_ORDER = {"toy": 0, "control": 1, "lm": 2}


def experiments_for(claims: Iterable[str]) -> list[str]:
    """The experiments of ``claims``, each once, toy first, then control, then LM."""
    names: list[str] = []
    for c in claims:
        for x in CLAIM_EXPERIMENTS.get(c, ()):
            if x not in names:
                names.append(x)
    return sorted(names, key=lambda x: FAMILY_ORDER[EXPERIMENTS[x].family])


def lm_unavailable() -> str | None:
    """Why the LM task cannot run here, or None."""
    if importlib.util.find_spec("harness.train.lm") is None:
        return "the LM task (harness/train/lm.py) is not present"
    if not (CONF_DIR / "task" / "lm_summarize.yaml").is_file():
        return "conf/task/lm_summarize.yaml is not present"
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

    @property
    def tag(self) -> str:
        """The sweep's own overrides (without experiment, results_dir, progress, the LM cache)."""
        return " ".join(o for o in self.overrides[3:] if not o.startswith("lm.cache_dir"))


def sweep_params(name: str, quick: bool) -> dict[str, str]:
    """``hydra.sweeper.params`` of ``conf/experiment/<name>.yaml``, with the --quick replacements."""
    path = CONF_DIR / "experiment" / f"{name}.yaml"
    if not path.is_file():
        raise NotComposed(f"no experiment file {path.relative_to(REPO)}")
    node = OmegaConf.load(path)
    params = OmegaConf.select(node, "hydra.sweeper.params") or {}
    params = {str(k): str(v) for k, v in OmegaConf.to_container(params).items()} if params else {}
    if quick:
        params.update(EXPERIMENTS[name].quick)
    return params


def sweep_overrides(params: dict[str, str]) -> list[list[str]]:
    """Every job of a sweep as its overrides: Hydra's override grammar and its basic sweeper's
    cartesian product (``BasicSweeper.split_arguments``), as ``python -m harness -m`` runs it."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return BasicSweeper.split_arguments(parsed, None)[0]


def compose_points(name: str, root: Path, quick: bool) -> list[Point]:
    """Compose every config of experiment ``name`` with ``results_dir=root/name``."""
    register_configs()
    root = Path(root)
    points = []
    base = [f"experiment={name}", f"results_dir={root / name}", "progress=false"]
    if EXPERIMENTS[name].family == "lm":
        base.append(f"lm.cache_dir={root / '.cache' / 'lm'}")  # one SFT/RM pipeline for every LM experiment
    combos = sweep_overrides(sweep_params(name, quick))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for combo in combos:
                p = Point(name, base + combo)
                try:
                    p.cfg = compose(config_name="config", overrides=p.overrides)
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
