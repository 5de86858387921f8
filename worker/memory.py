"""Keep the memory a batch frees for the next batch, instead of handing it back to the system.

A forward pass allocates its activations and frees them when it ends.  glibc serves every block above its
mmap threshold (at most 32 MiB; a batch of 32 long texts has attention maps of about 100 MiB) with a fresh
``mmap`` and unmaps it on ``free``, and trims the heap's top once more than 128 KiB is free there.  The next
batch then faults the same amount back in, page by page: on the CPU the worker spent a fifth of its time in
the kernel doing that.  With ``keep``, the worker tells glibc at start never to ``mmap`` a block, never to
trim, and to serve every thread from one arena (the threads a worker starts later would otherwise get arenas
of their own, made of 64 MiB heaps that glibc still unmaps), so freed activations stay in the heap and the
next batch reuses them.  Resident memory then stays at
the largest batch's peak, which ``--max-batch-size`` and the input limits bound, rather than falling back
between batches.

Settings a user made through the environment (``MALLOC_*_``, ``GLIBC_TUNABLES``, a preloaded allocator)
win: the worker leaves malloc alone then.  Other C libraries (musl, macOS) have no ``mallopt``: nothing done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

FREED_MEMORY = ("keep", "return")

# mallopt(3) parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

# Bytes free at the heap's top before glibc trims it: the most an int holds, never in practice.
NEVER_TRIM = 2**31 - 1

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


def apply(setting: str, environ: Mapping[str, str]) -> bool:
    """Make this process keep freed memory when ``setting`` is ``keep``; True if malloc was changed."""
    if setting != "keep":
        return False
    choice = users_own_choice(environ)
    if choice:
        log.info("freed memory: left to malloc as %s sets it (--freed-memory keep applies only without it)",
                 choice)
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        log.debug("freed memory: this C library has no glibc mallopt; left as it is")
        return False
    if not (mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) and mallopt(M_ARENA_MAX, 1)):
        log.warning("freed memory: glibc refused mallopt; freed activations go back to the system")
        return False
    log.info("freed memory: kept for the next batch (glibc: one arena, no mmap'd blocks, no trimming)")
    return True


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``int mallopt(int, int)``, or None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it; musl and macOS raise AttributeError
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
