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
``bench`` extra (``pip install 'pg-advantage-harness[bench]'``), imported only when a reference
run trains.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from ..config import bad_field
from ..plan import RunPlan
from . import sb3, trl


@dataclass(frozen=True)
class Reference:
    """A library's trainer: what it needs installed, where it runs, what it trains."""

    module: str  # the library's import name (checked installed at validation, imported when training)
    trainer: Callable[[RunPlan, list], None]  # (plan, runs): trains and writes each RunDir
    check: Callable[[DictConfig], None]  # (cfg): refuses (bad_field) a setting it cannot translate
    families: tuple[str, ...]  # task.family values it trains
    estimators: tuple[str, ...]  # the harness estimators it has a counterpart of


REFERENCES: dict[str, Reference] = {
    "sb3": Reference("stable_baselines3", sb3.train, sb3.check, ("control",), ("ppo_gae", "a2c")),
    "trl": Reference("trl", trl.train, trl.check, ("lm",), ("grpo", "rloo")),
}


def check_reference(cfg: DictConfig) -> None:
    """``reference``: null or a name of :data:`REFERENCES`, for a task family and estimator it
    trains, its library installed, and every setting translatable (its own ``check``)."""
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
    if importlib.util.find_spec(ref.module) is None:
        bad_field("reference", f"{name} installed (pip install 'pg-advantage-harness[bench]')",
                  f"{ref.module} not importable")
    ref.check(cfg)


def reference_trainer(cfg: DictConfig):
    """The trainer of ``cfg.reference`` (a validated name)."""
    return REFERENCES[cfg.reference].trainer
