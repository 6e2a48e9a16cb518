"""Checkpoints: one safetensors file, written atomically, never unpickled.

A checkpoint is a single ``.safetensors`` file: named tensors (weights, optimizer state, RNG
states as byte tensors, whatever else a trainer needs) plus a JSON document of plain values
(iteration, metric rows, python/numpy RNG states as lists of ints) in the file's
``__metadata__`` header under the key ``harness``. One file means one ``os.replace``
(:func:`harness.io.rundir.atomic_write_bytes`): a reader sees the previous checkpoint or the
new one, never half of one. Loading goes through ``safetensors`` and ``json`` only, so nothing
read from a results folder is ever unpickled.

Used by the training loop (:mod:`harness.train.loop`: ``checkpoint_every`` and resume, for every
task family) and by the toy trainer (its final ``policy.safetensors``, read by ``mode=probe``).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .files import RunFileError, loads_json, read_bytes
from .rundir import CHECKPOINT_NAME as CHECKPOINT_FILE
from .rundir import atomic_write_bytes

__all__ = ["CHECKPOINT_FILE", "CheckpointError", "dumps", "load", "random_state", "rng_state", "save",
           "set_random_state", "set_rng_state"]
_META_KEY = "harness"
_HEADER_LIMIT = 100_000_000  # safetensors' own bound on the JSON header


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, truncated, or from another run/config."""


def check_header(meta: dict[str, Any], trainer: str, fmt: int, config_hash: str) -> int:
    """Raise :class:`CheckpointError` unless ``meta`` was written by ``trainer`` in format
    ``fmt`` for the config with ``config_hash``; return its iteration (an int >= 1)."""
    if meta.get("format") != fmt or meta.get("trainer") != trainer:
        raise CheckpointError(f"format {meta.get('format')!r} of trainer {meta.get('trainer')!r}, expected "
                              f"{trainer} format {fmt}")
    if meta.get("config_hash") != config_hash:
        raise CheckpointError(f"config hash {meta.get('config_hash')!r} is not this run's {config_hash!r}")
    k = meta.get("iteration")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise CheckpointError(f"iteration {k!r}")
    return k


def dumps(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> bytes:
    """Serialize ``tensors`` and the JSON-able ``meta`` to safetensors bytes."""
    from safetensors.torch import save

    plain = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    return save(plain, metadata={_META_KEY: json.dumps(meta, allow_nan=True)})


def save(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write a checkpoint atomically (temp file in the same folder, then ``os.replace``)."""
    atomic_write_bytes(Path(path), dumps(tensors, meta))


def load(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, meta)`` of a checkpoint; :class:`CheckpointError` naming the file if it is
    missing, not a regular file, truncated, nested too deep or not one of ours. Read through
    :mod:`harness.io.files` (the one reader of run files: no symlink, FIFO or device; JSON within
    its depth bound); the trainer then checks every field of ``meta`` before using any."""
    from safetensors import SafetensorError
    from safetensors.torch import load as st_load

    path = Path(path)
    try:
        data = read_bytes(path, None)
        header_len = int.from_bytes(data[:8], "little")
        if not 2 <= header_len <= min(len(data) - 8, _HEADER_LIMIT):
            raise CheckpointError(f"{path}: unreadable checkpoint (header of {header_len} bytes in a file of "
                                  f"{len(data)})")
        header = loads_json(data[8:8 + header_len], path)
        meta = loads_json(header["__metadata__"][_META_KEY], path)
        tensors = st_load(data)
    except CheckpointError:
        raise
    except RunFileError as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc.reason})") from None
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: checkpoint metadata is not a JSON object")
    return tensors, meta


# ----------------------------------------------------------------------------- RNG states

def rng_state(generators: list[torch.Generator] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The global torch, numpy and python ``random`` states (and ``generators``'), as tensors
    and JSON values, for :func:`set_rng_state`."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    tensors = {"rng/torch": torch.get_rng_state(),
               "rng/numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64))}
    for i, g in enumerate(generators or []):
        tensors[f"rng/generator{i}"] = g.get_state()
    meta = {"numpy": [name, int(pos), int(has_gauss), float(cached)],
            "python": [version, list(internal), gauss_next]}
    return tensors, meta


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                  generators: list[torch.Generator] | None = None) -> None:
    """Restore what :func:`rng_state` saved (raises :class:`CheckpointError` if incomplete)."""
    try:
        torch.set_rng_state(tensors["rng/torch"])
        name, pos, has_gauss, cached = meta["numpy"]
        keys = tensors["rng/numpy_keys"].numpy().astype(np.uint32)
        np.random.set_state((name, keys, int(pos), int(has_gauss), float(cached)))
        version, internal, gauss_next = meta["python"]
        random.setstate((version, tuple(internal), gauss_next))
        for i, g in enumerate(generators or []):
            g.set_state(tensors[f"rng/generator{i}"])
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"RNG state incomplete or invalid ({type(exc).__name__}: {exc})") from None


def random_state(rng: random.Random) -> list:
    """The state of a ``random.Random`` instance as JSON values, for :func:`set_random_state`."""
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def set_random_state(rng: random.Random, state: Any) -> None:
    """Restore what :func:`random_state` saved (raises :class:`CheckpointError` if invalid)."""
    try:
        version, internal, gauss_next = state
        rng.setstate((version, tuple(internal), gauss_next))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"python RNG state invalid ({type(exc).__name__}: {exc})") from None
