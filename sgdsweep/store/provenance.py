"""Provenance: package versions, code version, host, devices and time, for the attrs of every output."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import platform
import subprocess

from sgdsweep.core.identity import SIMULATION_VERSION
from sgdsweep.core.paths import workflow_root
from sgdsweep.core.version import VERSION as __version__

PACKAGES = ("sgdsweep", "numpy", "scipy", "numba", "xarray", "zarr", "dask", "distributed", "snakemake")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that produce or read the results."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``sgdsweep <version> (sim v<N>)``, plus the git commit (and ``-dirty``) of a checkout."""
    text = f"sgdsweep {__version__} (simulation v{SIMULATION_VERSION})"
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                             cwd=workflow_root(), capture_output=True, text=True, timeout=5, check=False)
        if out.returncode == 0 and out.stdout.strip():
            text += f" git {out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    return text


def provenance() -> dict[str, object]:
    """Provenance attributes: versions, code version, host, its devices
    (:func:`sgdsweep.core.hardware.describe_devices`) and UTC time."""
    from sgdsweep.core.hardware import describe_devices

    return {
        "package_versions": package_versions(),
        "code_version": code_version(),
        "host": platform.node(),
        "devices": describe_devices(),
        "python": platform.python_version(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
