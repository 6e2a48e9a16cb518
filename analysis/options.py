"""Settings the command line checks its arguments against, defined here and re-exported by the
modules that use them (:mod:`analysis.stats`, :mod:`analysis.interop`, :mod:`analysis.report`).
This module imports nothing: ``python -m analysis`` refuses a bad argument before it imports
scipy, seaborn or matplotlib (:mod:`analysis.cli`)."""

#: Bootstrap replicates and seed of every interval (:mod:`analysis.stats`).
DEFAULT_REPS = 2000
DEFAULT_SEED = 0
#: How a diverged run is scored after its divergence (:mod:`analysis.stats`' docstring): ``worst``
#: its task's worst return, ``last`` its last evaluations carried forward.
DIVERGED_RULES = ("worst", "last")
DEFAULT_DIVERGED = "worst"
#: What :func:`analysis.interop.score_matrices` does with an estimator that has different numbers
#: of scored runs per task: refuse, or pad the short columns with NaN.
RAGGED = ("error", "nan")
#: What a results folder is expected to hold (in error messages and the command line's help).
EXPECTED = "a folder containing run directories with metrics.parquet"
