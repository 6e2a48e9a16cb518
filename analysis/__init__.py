"""Analysis of a results folder: load runs, rliable statistics, seaborn figures, report.

    >>> import analysis
    >>> df = analysis.load("results/")             # one tidy frame, one row per iteration
    >>> runs = analysis.stats.run_table(df)         # one row per run: final score, AUC, ...
    >>> analysis.stats.stratified_bootstrap({"CartPole-v1": runs.score.values}, "iqm")

    >>> scores = analysis.rliable_scores("results/")  # rliable's {estimator: [runs x tasks]}

Command line: ``python -m analysis report RESULTS [--x env_steps|wall_time_s] [--last-n 5]``,
``python -m analysis rliable RESULTS [--out FILE.npz]``.
"""

from . import stats
from .interop import read_rliable_npz, rliable_scores, write_rliable_npz
from .load import AnalysisWarning, find_run_dirs, load, load_runs
from .stats import (
    Interval,
    aggregate_iqm,
    aggregate_mean,
    area_under_curve,
    final_scores,
    iqm,
    is_collapsed,
    performance_profile,
    probability_of_improvement,
    probability_of_improvement_interval,
    run_table,
    stratified_bootstrap,
)

__all__ = [
    "AnalysisWarning",
    "Interval",
    "aggregate_iqm",
    "aggregate_mean",
    "area_under_curve",
    "final_scores",
    "find_run_dirs",
    "iqm",
    "is_collapsed",
    "load",
    "load_runs",
    "performance_profile",
    "probability_of_improvement",
    "probability_of_improvement_interval",
    "read_rliable_npz",
    "rliable_scores",
    "run_table",
    "stats",
    "stratified_bootstrap",
    "write_rliable_npz",
]
