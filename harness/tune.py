"""The number a tuning sweep (``hydra/sweeper=optuna``) optimises, defined once.

``objective(cfg)``: the report's final score (:func:`harness.io.scores.final_score`, which
:func:`analysis.stats.final_scores` uses too: the mean of a run's last ``LAST_N`` finite
``eval_return`` values, or of ``episode_return`` for a run that never evaluated) averaged over the runs this job covers (its population members). A job whose runs
were finished already (resume) reads them, so a rerun of the same study gets the same values.
A diverged run counts with the score it reached before it diverged; NaN when no run has a score
(e.g. one that failed before logging), which Optuna records as a failed trial.
"""
from __future__ import annotations

import math

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .config import member_configs
from .io.rundir import run_dir_for
from .io.scores import run_dir_scores

LAST_N = 5  # as ``python -m analysis report`` (--last-n 5)
DIRECTION = "maximize"  # higher return is better on every task (rewards, negated costs, gold score)


def objective(cfg: DictConfig) -> float:
    scores = []
    for m in member_configs(cfg):
        scores += [s for s in run_dir_scores(run_dir_for(m), LAST_N) if math.isfinite(s)]
    return float(sum(scores) / len(scores)) if scores else float("nan")


def wants_objective() -> bool:
    """True inside a job launched by a sweeper that optimises the return value (Optuna)."""
    try:
        return "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")).lower()
    except Exception:
        return False
