"""sgdsweep: parameter sweeps of SGD on models with known physics.

Public entry points: the ``sgdsweep`` command (see ``sgdsweep --help``), the Snakemake workflow
(``Snakefile``), and :func:`open_ensemble` to read a finished sweep.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "open_ensemble"]


def open_ensemble(path, grid: bool = False):
    """Open ``results/<sweep>/ensemble.zarr`` as an ``xarray.Dataset``.

    With ``grid=True`` the ``point`` dimension is unstacked into one dimension per swept axis
    (only meaningful for cartesian sweeps; missing combinations become NaN).
    """
    from .aggregate import open_ensemble as _open

    return _open(path, grid=grid)
