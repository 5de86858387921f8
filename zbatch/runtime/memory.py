"""Give large buffers back to the operating system when they are freed.

glibc's malloc serves an allocation above its mmap threshold with its own
``mmap``, which ``free`` returns at once; below it, memory comes from the heap
and stays with the process.  The threshold starts at 128 KiB but rises to the
size of each large block freed (up to 32 MiB), so after one burst of big
messages the next ones come from the heap, and a daemon that once held a
backlog of big payloads keeps that memory after they are gone.  Fixing the
threshold turns the adjustment off: every buffer above it is mapped and
unmapped on its own, so the resident size follows what is held.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_BYTES = 256 * 1024


def return_large_allocations(threshold: int = LARGE_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes; False where this is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
