"""sgdsweep: parameter sweeps of SGD on models with known physics.

Public entry points: the ``sgdsweep`` command (see ``sgdsweep --help``), the Snakemake workflow
(``Snakefile``), and :func:`open_ensemble` to read a finished sweep.

The packages are layers, bottom first; each imports only those below it (pyproject.toml's
``[tool.importlinter]``, checked by ``lint-imports``):

- :mod:`sgdsweep.errors` and :mod:`sgdsweep.core`: errors, a point's identity, paths and atomic
  writes, the noise-type registry, hardware detection;
- :mod:`sgdsweep.theory`: exact and approximate theory, pure functions of arrays;
- :mod:`sgdsweep.models`: the problems, one module per model, and the dispatchers (predict,
  stability edge) that ask each model's hooks;
- :mod:`sgdsweep.sim`: simulating replicas (engine, compiled kernels, noise, random streams,
  observables, per-point estimators);
- :mod:`sgdsweep.store`: point stores, lanes, the aggregated ensemble, provenance;
- :mod:`sgdsweep.sweep`: from a YAML config to a validated sweep (schema, grid, plan, cost, rounds);
- :mod:`sgdsweep.analysis`: fits, figures and the HTML report;
- :mod:`sgdsweep.share`: export, verify, import and merge shared sweeps;
- :mod:`sgdsweep.run`: the command line, the Dask cluster and its task body, shard execution,
  locking, progress.
"""

from __future__ import annotations

from sgdsweep.core.version import VERSION as __version__

__all__ = ["__version__", "open_ensemble"]


def open_ensemble(path, grid: bool = False):
    """Open ``results/<sweep>/ensemble.zarr`` as an ``xarray.Dataset``.

    ``path`` may also be the URL of a shared sweep, ``zip::https://…/SWEEP.zip`` or an export
    directory over http(s) (:mod:`sgdsweep.share.remote`).

    With ``grid=True`` the ``point`` dimension is unstacked into one dimension per swept axis
    (only meaningful for cartesian sweeps; missing combinations become NaN).

    Before it returns, every array's metadata is compared with the digests recorded when the
    ensemble was written and every chunk file is listed; Zarr checks each chunk's CRC-32C as it
    reads it (:mod:`sgdsweep.store.integrity`).

    Raises:
        sgdsweep.errors.StoreError: naming the array whose metadata was edited or whose chunk is
            missing.
    """
    if isinstance(path, str) and "://" in path:  # a shared sweep where it lies
        from sgdsweep.share.remote import open_remote_ensemble
        from sgdsweep.store.aggregate import opened

        return opened(open_remote_ensemble(path), grid=grid)
    from sgdsweep.store.aggregate import open_ensemble as _open

    return _open(path, grid=grid)
