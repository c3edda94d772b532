"""This machine's compute hardware: the CPU cores this process may use and the CUDA devices that
CuPy sees. Detection only; what a sweep does with them is :mod:`sgdsweep.sweep.device`'s."""

from __future__ import annotations

import importlib.util
import os


def cpu_cores() -> int:
    """CPU cores available to this process (its affinity mask where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def cuda_devices() -> int:
    """CUDA devices that CuPy sees on this machine: 0 without CuPy, a driver or a device."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - CuPy raises several types without a driver or a device
        return 0


def describe_devices() -> str:
    """This machine's compute devices, for provenance: ``cpu (N cores); cuda: none`` or
    ``cpu (N cores); cuda: K device(s) (NAME, …)``."""
    cores = cpu_cores()
    count = cuda_devices()
    if not count:
        return f"cpu ({cores} cores); cuda: none"
    try:
        import cupy

        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
    except Exception:  # noqa: BLE001 - the names are a courtesy; the count is what matters
        names = []
    return f"cpu ({cores} cores); cuda: {count} device(s)" + (f" ({', '.join(names)})" if names else "")
