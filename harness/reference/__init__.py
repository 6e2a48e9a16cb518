"""Reference trainers: the library a user would otherwise pick, trained on a harness config.

``reference=sb3`` runs a control config through stable-baselines3's own PPO (``estimator=ppo_gae``)
or A2C (``estimator=a2c``); ``reference=trl`` an LM config through TRL's own trainer. The config's
settings are translated to the library's (each trainer's module says how, and what it cannot
translate is refused at validation), and the run is written in the harness's run-folder format
(:class:`harness.io.rundir.RunDir`: the same config.yaml, metric rows, summary.json), evaluated by
the harness's own evaluation (:func:`harness.tasks.control.evaluate`), so ``python -m analysis
report`` and the claims machinery read both sides alike. The learning-parity claims (C53-C56 of
harness/conf/claims.yaml) sweep ``reference: null,sb3``; C57-C58 (GRPO and RLOO against TRL,
harness/conf/experiment/claim_c57.yaml, claim_c58.yaml) ``reference: null,trl``.

The reference is part of the run's identity (hashed into its folder when set); the library is the
``bench`` extra (``pip install 'pg-advantage-harness[bench]'``), imported at validation (what its
trainer uses: a package installed but broken on import is refused there, in one line naming it,
before any run folder exists) and used when a reference run trains.

Every setting a reference trainer cannot honour is refused by name at validation
(:func:`check_reference`): the run settings neither trainer has (:data:`RUN_SETTINGS`), and each
library's own (its module's ``check``). A setting the estimator does not read on the harness's
side either (``group_size`` with ``estimator=ppo_gae``) is ignored on both sides alike.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from ..config import bad_field
from ..plan import RunPlan
from ..tasks.lm.validate import one_line
from . import sb3, trl


@dataclass(frozen=True)
class Reference:
    """A library's trainer: what it needs installed, where it runs, what it trains."""

    module: str  # the library's import name (its absence named as such at validation)
    trainer: Callable[[RunPlan, list], None]  # (plan, runs): trains and writes each RunDir
    check: Callable[[DictConfig], None]  # (cfg): refuses (bad_field) a setting it cannot translate
    library: Callable[[DictConfig], None]  # (cfg): imports what the trainer uses of the library (raises if broken)
    families: tuple[str, ...]  # task.family values it trains
    estimators: tuple[str, ...]  # the harness estimators it has a counterpart of


REFERENCES: dict[str, Reference] = {
    "sb3": Reference("stable_baselines3", sb3.train, sb3.check, sb3.library, ("control",), ("ppo_gae", "a2c")),
    "trl": Reference("trl", trl.train, trl.check, trl.library, ("lm",), ("grpo", "rloo")),
}

# run settings no reference trainer honours: their value off (the schema's default) and why
RUN_SETTINGS: dict[str, tuple[object, str]] = {
    "checkpoint_every": (0, "a reference trainer writes no checkpoints and resumes none"),
    "logger": ("none", "a reference trainer's metric rows go to the run folder alone, to no tracker"),
}


def check_reference(cfg: DictConfig) -> None:
    """``reference``: null or a name of :data:`REFERENCES`, for a task family and estimator it
    trains, the run settings of :data:`RUN_SETTINGS` off, every setting translatable (its own
    ``check``), and its library installed and importing (:func:`check_library`)."""
    name = cfg.get("reference")
    if name is None:
        return
    if name not in REFERENCES:
        bad_field("reference", f"null or one of {sorted(REFERENCES)}", name)
    ref = REFERENCES[name]
    if cfg.task.family not in ref.families:
        bad_field("reference", f"reference={name} trains task.family in {list(ref.families)}",
                  f"task.family={cfg.task.family}")
    if cfg.estimator not in ref.estimators:
        bad_field("reference", f"reference={name} trains estimator in {list(ref.estimators)}",
                  f"estimator={cfg.estimator}")
    if cfg.mode != "train":
        bad_field("reference", "mode=train (a reference library has no gradient probes)", f"mode={cfg.mode}")
    for key, (off, why) in RUN_SETTINGS.items():
        if cfg.get(key, off) != off:
            bad_field(key, f"{off!r} with reference={name} ({why})", cfg[key])
    ref.check(cfg)
    check_library(name, ref, cfg)


def check_library(name: str, ref: Reference, cfg: DictConfig) -> None:
    """The library of ``reference=name`` is installed and what its trainer uses imports
    (``ref.library``), or one line: not installed, or the package and the error its import
    raised (a broken install would otherwise fail every run after its folder was made)."""
    install = "pip install 'pg-advantage-harness[bench]'"
    try:
        missing = importlib.util.find_spec(ref.module) is None
    except (ImportError, ValueError):  # a parent package that fails, or a sys.modules entry without a spec
        missing = False
    if missing:
        bad_field("reference", f"{name} installed ({install})", f"{ref.module} not importable")
    try:
        ref.library(cfg)
    except (Exception, SystemExit) as exc:  # SystemExit: a package that exits on import
        error = one_line(f"{type(exc).__name__}: {exc}", 300)
        bad_field("reference", f"null here: {ref.module} is installed but importing it fails ({error}); "
                  f"reinstall it ({install})", name)


def reference_trainer(cfg: DictConfig):
    """The trainer of ``cfg.reference`` (a validated name)."""
    return REFERENCES[cfg.reference].trainer
