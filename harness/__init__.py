"""Benchmark and ablation harness for policy-gradient advantage estimators."""
__version__ = "0.1.0"
