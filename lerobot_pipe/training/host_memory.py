"""Keep freed host memory in the process: a training step's host tensors reuse pages, not fresh ones.

A training step on the CPU allocates and frees the same large tensors every step (activations,
gradients, the optimizer's temporaries). PyTorch's CPU allocator hands them to ``malloc``, and with
glibc's defaults a freed block above its ``mmap`` threshold, or a free region at the top of the
heap above its trim threshold, goes back to the kernel at once, so the next step's tensors land on
fresh pages and each page costs a page fault and a zero fill when first written. Measured on
Diffusion Policy with two cameras (batch 8, one thread): ~50,000 minor page faults a step (about
200 MB of new pages) and ~15 % of the step (docs/benchmarks.md §9, "Host memory kept between
steps"). LeRobot's trainer and a bare PyTorch loop have the same default.

:func:`keep_freed_host_memory` raises both thresholds of glibc's allocator with ``mallopt`` (the
``mmap`` threshold to glibc's maximum on 64 bits, 32 MiB, which also stops it adapting; the trim
threshold to 1 GiB), so freed blocks stay in the heap for the next step. The process's peak
memory is what its live tensors need, as before; what changes is that a process keeps that peak
mapped instead of returning it between steps. It touches nothing when the user has chosen the
allocator: ``GLIBC_TUNABLES`` naming a ``glibc.malloc.`` tunable, the ``MALLOC_*_`` variables, or
another allocator preloaded (jemalloc, tcmalloc, mimalloc); nor on a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from collections.abc import Mapping

log = logging.getLogger(__name__)

# mallopt parameters, glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = (
    32 * 1024 * 1024
)  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit glibc: the largest accepted
TRIM_THRESHOLD = 1024 * 1024 * 1024

_MALLOC_ENV = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)
_PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_applied = False


def user_allocator_choice(environ: Mapping[str, str]) -> str | None:
    """The environment variable by which the user chose the allocator's behaviour, or None."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc." in tunables:
        return "GLIBC_TUNABLES"
    for name in _MALLOC_ENV:
        if name in environ:
            return name
    preload = environ.get("LD_PRELOAD", "")
    if any(a in preload for a in _PRELOADED_ALLOCATORS):
        return "LD_PRELOAD"
    return None


def keep_freed_host_memory(environ: Mapping[str, str] | None = None) -> bool:
    """Raise glibc's trim and ``mmap`` thresholds for this process; True when they are set (now
    or by an earlier call), False when left alone (the user's choice, or not glibc)."""
    global _applied
    environ = os.environ if environ is None else environ
    chosen = user_allocator_choice(environ)
    if chosen is not None:
        log.debug("host allocator left as %s chooses", chosen)
        return False
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 when glibc refuses the value
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _applied = ok
    if ok:
        log.debug(
            "host allocator keeps freed memory (glibc mmap threshold %d MiB, trim threshold %d MiB)",
            MMAP_THRESHOLD >> 20,
            TRIM_THRESHOLD >> 20,
        )
    return ok
