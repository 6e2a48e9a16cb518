"""Analysis of a results folder: load runs, rliable statistics, seaborn figures, report.

    >>> import analysis
    >>> df = analysis.load("results/")             # one tidy frame, one row per iteration
    >>> runs = analysis.stats.run_table(df)         # one row per run: final score, AUC, ...
    >>> analysis.stats.stratified_bootstrap({"CartPole-v1": runs.score.values}, "iqm")

    >>> scores = analysis.rliable_scores("results/")  # rliable's {estimator: [runs x tasks]}

Command line: ``python -m analysis report RESULTS [--x env_steps|wall_time_s] [--last-n 5]``,
``python -m analysis rliable RESULTS [--out FILE.npz]``.
"""

# analysis.load is imported here, not on first use: the submodule and the function share the name
# ``load``, and importing the submodule (as stats and interop do) binds the attribute to it.
from .load import AnalysisWarning, find_run_dirs, load, load_runs

#: Names imported on first use, from the submodule given (``None``: the name is that submodule).
#: scipy (stats), seaborn and matplotlib take a second or more to import; ``python -m analysis``
#: checks its arguments before it needs them.
_LAZY = {
    "stats": None,
    **dict.fromkeys(["read_rliable_npz", "rliable_scores", "write_rliable_npz"], "interop"),
    **dict.fromkeys(["Interval", "aggregate_iqm", "aggregate_mean", "area_under_curve", "final_scores", "iqm",
                     "is_collapsed", "performance_profile", "probability_of_improvement",
                     "probability_of_improvement_interval", "run_table", "stratified_bootstrap"], "stats"),
}


def _submodule(name: str):
    """Import submodule ``name`` of :data:`_LAZY` (a plain import: ``from . import`` would ask
    this package for the attribute first, calling :func:`__getattr__` again)."""
    if name == "stats":
        import analysis.stats as module
    else:
        import analysis.interop as module
    return module


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _submodule(_LAZY[name] or name)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
