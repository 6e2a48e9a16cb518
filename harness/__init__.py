"""Benchmark and ablation harness for policy-gradient advantage estimators."""
import os

__version__ = "0.1.0"

# OpenMP threads that wait for work sleep instead of spinning, unless the user chose otherwise.
# torch's intra-op pool (a population's batched matmuls, ``threads`` > 1) spins by default;
# when another process shares the cores a spinning thread holds a core that its partner needs,
# and a population=16 control run took ~10x longer with 2 threads than with 1 on a shared
# 2-core machine (PASSIVE: the same as 1 thread there). OpenMP reads this once, when torch is
# first imported, so it only takes effect when ``harness`` is imported first (``python -m
# harness`` always does). How idle threads wait never changes a result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
