"""What glibc's malloc does with a daemon's freed memory: give it back, or keep it for the next use.

``return`` (the broker and the gateway; a worker with ``--freed-memory return``).  glibc serves an allocation
above its mmap threshold with its own ``mmap``, which ``free`` returns at once; below it, memory comes from
the heap and stays with the process.  The threshold starts at 128 KiB but rises to the size of each large
block freed (up to 32 MiB), so after one burst of big messages the next ones come from the heap, and a
daemon that once held a backlog of big payloads keeps that memory after they are gone.  Fixing the
threshold turns the adjustment off: every buffer above it is mapped and unmapped on its own, so the
resident size follows what is held.

``keep`` (a worker, by default).  A forward pass allocates its activations and frees them when it ends;
a batch of 32 long texts has attention maps of about 100 MiB, beyond any mmap threshold, so with
``return`` the next batch faults them all back in, page by page (on the CPU, a large share of a worker's time
went to the kernel doing that: BENCHMARKS.md, Analysis).  ``keep`` tells glibc never to ``mmap`` a block, never
to trim the heap, and to serve every thread from one arena (a thread started later would otherwise get an arena
of its own, made of 64 MiB heaps that glibc still unmaps), so the next batch reuses the memory.  Resident memory
then stays at the largest batches' peak, which the worker's batch and input limits bound.

Settings the user made through the environment (``MALLOC_*``, ``GLIBC_TUNABLES``, a preloaded allocator)
win over both.  Other C libraries (musl, macOS) have no ``mallopt``: nothing is done there.

Python's cyclic garbage collector, once the daemon has started (:func:`collect_off_the_hot_path`): everything alive
then (modules, the model, the tokenizer, the settings) lives until the process ends, yet each full collection
walks all of it again; and the young generation, collected after every few hundred container allocations,
runs every request or two on a serving path that allocates hundreds per request.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
from collections.abc import Callable, Mapping

FREED_MEMORY = ("keep", "return")

# mallopt(3) parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8

LARGE_BYTES = 256 * 1024  # return: blocks above this go back to the system when freed
# keep: bytes free at the heap's top before glibc trims it; the most an int holds, never in practice.
NEVER_TRIM = 2**31 - 1

# The collector's thresholds while serving: the young generation is collected after this many container allocations
# (net of frees) instead of Python's few hundred; the older generations keep Python's ratios (and its rule that a
# full collection waits until a quarter of the long-lived objects are new).
YOUNG_THRESHOLD = 50_000
OLDER_THRESHOLDS = (10, 10)

POLICIES: dict[str, tuple[tuple[int, int], ...]] = {
    "return": ((M_MMAP_THRESHOLD, LARGE_BYTES),),
    "keep": ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM), (M_ARENA_MAX, 1)),
}

USER_CHOICES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                "MALLOC_TOP_PAD_")


def users_own_choice(environ: Mapping[str, str]) -> str:
    """The environment setting through which the user already chose how malloc behaves ('' if none)."""
    for name in USER_CHOICES:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc: they ignore glibc's mallopt
        return "LD_PRELOAD"
    return ""


def apply(policy: str, environ: Mapping[str, str], log: logging.Logger) -> bool:
    """Set this process's malloc to ``policy`` (``keep`` or ``return``); True if malloc was changed."""
    choice = users_own_choice(environ)
    if choice:
        log.info("freed memory: left to malloc as %s sets it, not %r", choice, policy)
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        log.debug("freed memory: this C library has no glibc mallopt; left as it is")
        return False
    if not all(mallopt(parameter, value) for parameter, value in POLICIES[policy]):
        log.warning("freed memory: glibc refused mallopt for %r; its defaults stay", policy)
        return False
    if policy == "keep":
        log.info("freed memory: kept for the next batch (glibc: one arena, no mmap'd blocks, no trimming)")
    return True


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``int mallopt(int, int)``, from the C library this process already runs on; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl raises AttributeError
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def collect_off_the_hot_path(log: logging.Logger) -> int:
    """Once the daemon has started: collect once, freeze what is left and collect the young generation less often.

    ``gc.freeze`` moves every object alive after the start into the permanent generation, which no collection
    walks again: the start's objects live as long as the process, so walking them was pure cost (one that dies
    later is still freed by refcounting; in a cycle it stays, a leak no larger than the start's heap).  Collecting
    first keeps the start's own garbage out of it.  A young collection costs in proportion to the young objects
    still alive, which on a serving path are the requests in flight; collecting it after :data:`YOUNG_THRESHOLD`
    allocations rather than a few hundred pays that cost far less often, and promotes fewer in-flight objects
    to the older generations, which then fill (and are collected) more slowly too.  Cyclic garbage waits longer
    to be freed; what refcounting frees, almost everything, is freed at once as before.

    Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    frozen = gc.get_freeze_count()
    log.info("garbage collector: the %d objects alive after the start are frozen out of its collections, and the "
             "young generation is collected every %d allocations", frozen, YOUNG_THRESHOLD)
    return frozen
