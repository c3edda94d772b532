"""Keep the C allocator from returning every large numpy temporary to the OS.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``. Setting any glibc malloc
threshold switches off glibc's dynamic mmap threshold, so every array above 128 KiB is then
mmap-ed on allocation and unmapped on release, and each step of the engine page-faults its
temporaries back in: measured 4.4× slower simulations in a worker than in-process
(``benchmarks/pipeline.py``). :func:`tune` raises the mmap and trim thresholds of the running
process (glibc only; elsewhere it does nothing). Memory kept back: at most ``TRIM`` bytes of free
heap per process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

#: glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: arrays up to this size come from the heap (glibc's maximum for 64-bit: 32 MiB)
MMAP = 32 * 1024 * 1024
#: free heap kept before memory is returned to the OS
TRIM = 128 * 1024 * 1024


@functools.cache
def tune() -> bool:
    """Set the thresholds once per process; True when glibc accepted them."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM))
