"""Settings the command line checks its arguments against, defined here and re-exported by the
modules that use them (:mod:`analysis.stats`, :mod:`analysis.interop`, :mod:`analysis.report`).
This module imports nothing: ``python -m analysis`` refuses a bad argument before it imports
scipy, seaborn or matplotlib (:mod:`analysis.cli`)."""

#: Bootstrap replicates and seed of every interval (:mod:`analysis.stats`).
DEFAULT_REPS = 2000
DEFAULT_SEED = 0
#: At most this many replicates: each interval draws ``reps x runs`` indices at once (8 bytes
#: each; 100,000 x 1,000 runs of a task is 0.8 GB). rliable's own default is 2,000.
REPS_MAX = 100_000
#: ``claims --seed-offset`` at most 2**31 - 1: the experiments' seeds (offset + their own, each
#: < 2**31) stay within the harness's 32-bit seeds (``harness.config.SEED_MAX``).
SEED_OFFSET_MAX = 2**31 - 1
#: How a diverged run is scored after its divergence (:mod:`analysis.stats`' docstring): ``worst``
#: its task's worst return, ``last`` its last evaluations carried forward.
DIVERGED_RULES = ("worst", "last")
DEFAULT_DIVERGED = "worst"
#: What :func:`analysis.interop.score_matrices` does with an estimator that has different numbers
#: of scored runs per task: refuse, or pad the short columns with NaN.
RAGGED = ("error", "nan")
#: What a results folder is expected to hold (in error messages and the command line's help).
EXPECTED = "a folder containing run directories with metrics.parquet"
