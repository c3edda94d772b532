"""sgdsweep: parameter sweeps of SGD on models with known physics.

Public entry points: the ``sgdsweep`` command (see ``sgdsweep --help``), the Snakemake workflow
(``Snakefile``), and :func:`open_ensemble` to read a finished sweep.

The packages follow the data flow:

- :mod:`sgdsweep.sweep`: from a YAML config to a validated sweep (schema, grid, identities, plan,
  cost);
- :mod:`sgdsweep.models`: the problems, one module per model, and :mod:`sgdsweep.theory`: their
  exact and approximate theory;
- :mod:`sgdsweep.sim`: simulating points (engine, compiled kernels, noise, random streams,
  observables, per-point estimators);
- :mod:`sgdsweep.store`: point stores, the aggregated ensemble, provenance, export and import;
- :mod:`sgdsweep.analysis`: fits, figures and the HTML report;
- :mod:`sgdsweep.run`: the command line, the Dask cluster, shard execution, locking, progress.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "open_ensemble"]


def open_ensemble(path, grid: bool = False):
    """Open ``results/<sweep>/ensemble.zarr`` as an ``xarray.Dataset``.

    With ``grid=True`` the ``point`` dimension is unstacked into one dimension per swept axis
    (only meaningful for cartesian sweeps; missing combinations become NaN).

    Before it returns, every array's metadata is compared with the digests recorded when the
    ensemble was written and every chunk file is listed; Zarr checks each chunk's CRC-32C as it
    reads it (:mod:`sgdsweep.store.integrity`).

    Raises:
        sgdsweep.errors.StoreError: naming the array whose metadata was edited or whose chunk is
            missing.
    """
    from sgdsweep.store.aggregate import open_ensemble as _open

    return _open(path, grid=grid)
