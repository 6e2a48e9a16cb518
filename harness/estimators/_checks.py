"""Argument checks shared by the estimator functions.

Every check raises ``ValueError`` naming the argument, so a bad call fails loudly
instead of broadcasting into a silently wrong number.
"""
from __future__ import annotations

import math

import torch


def check_same_shape(**tensors: torch.Tensor) -> tuple[int, ...]:
    """All tensors must be 2-D and share one shape; the message prints every shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        listed = ", ".join(f"{k}={list(v)}" for k, v in shapes.items())
        raise ValueError(f"expected equal 2-D [T, B] shapes, got {listed}")
    return first


def check_gamma(gamma: float) -> None:
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and 0.0 < gamma <= 1.0):
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")


def check_lam(lam: float) -> None:
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")


def check_finite(name: str, x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).sum().item()
        raise ValueError(f"{name} must be finite, found {bad} non-finite value(s)")


def check_groups(name: str, scores: torch.Tensor, min_size: int) -> None:
    if scores.dim() != 2:
        raise ValueError(f"{name} must be [n_groups, group_size], got shape {list(scores.shape)}")
    if scores.shape[1] < min_size:
        raise ValueError(
            f"group_size (the second dim of {name}) must be >= {min_size}, got {scores.shape[1]}"
        )
    check_finite(name, scores)
