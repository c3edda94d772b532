"""The allocator tuning that keeps Dask workers as fast as in-process runs."""

from __future__ import annotations

import pytest


def test_allocator_tuning_is_accepted_once_per_process():
    """glibc accepts the raised mmap/trim thresholds (the Dask-worker slowdown fix); a second
    call is free (cached)."""
    import platform

    from sgdsweep.sim import allocator
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc-specific")
    assert allocator.tune() is True and allocator.tune() is True
    assert allocator.tune.cache_info().misses == 1
