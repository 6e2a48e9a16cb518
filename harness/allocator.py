"""glibc's allocator, as ``python -m harness`` sets it (:func:`tune_allocator`); importing this
module changes nothing."""
from __future__ import annotations

import os

MMAP_THRESHOLD = 16 * 2**20  # bytes: glibc allocates blocks at least this big with mmap
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # bytes of free heap top kept before giving it back (glibc's own ratio)
_ALLOCATOR_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """glibc's malloc: blocks from :data:`MMAP_THRESHOLD` up get their own ``mmap``, and up to
    :data:`TRIM_THRESHOLD` of free memory at the heap's top is kept (``mallopt``). Returns whether
    it was set: only under glibc, and not where the user tuned the allocator (:data:`_ALLOCATOR_ENV`).

    Why: glibc starts with both at 128 KiB and raises them only when a big mmapped block is freed.
    A population's activations and gradients are such blocks (``[8, 256, 64]`` float32 is 512 KiB),
    so every minibatch mapped and unmapped them afresh, and each new page faulted: 4-7 s of system
    time over a population=16 zoo run's two workers (about 30 s), against 0.7-0.8 s with these
    settings (and 1.3-2.4 s when an early import, ``torch._dynamo``'s, had happened to raise them).
    Where memory comes from changes no number a run computes
    (``tests/test_cli_startup.py::test_the_cli_run_is_the_in_process_run``); ``python -m harness``
    calls it first, and its forked workers inherit it."""
    import platform

    if platform.libc_ver()[0] != "glibc" or any(k in os.environ for k in _ALLOCATOR_ENV):
        return False
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
