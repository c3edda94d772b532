"""Write a finished sweep's ensemble as one netCDF-4 file, for netCDF tools (``sgdsweep export
--format netcdf``).

The file is the ensemble as :func:`sgdsweep.store.aggregate.load_ensemble` reads it (checked
whole first), written by :meth:`xarray.Dataset.to_netcdf` with the netCDF4 or h5netcdf engine:
the same variables, coordinates and CF-1.11 attributes (docs/outputs.md), text as netCDF
strings, a missing step as its ``_FillValue``. One line is added to ``history``. The file is
written beside the destination under a temporary name and linked into place, so a destination
that exists is never overwritten and a failed write leaves nothing behind.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import uuid
from pathlib import Path

from sgdsweep.errors import StoreError, UsageError

#: netCDF-4 writers xarray can use, in order of preference (module → xarray engine).
ENGINES = {"netCDF4": "netcdf4", "h5netcdf": "h5netcdf"}


def netcdf_engine() -> str:
    """The xarray engine that writes netCDF-4 here.

    Raises:
        UsageError: neither netCDF4 nor h5netcdf is installed (naming both and how to install one).
    """
    for module, engine in ENGINES.items():
        if importlib.util.find_spec(module) is not None:
            return engine
    raise UsageError("export --format netcdf needs the netCDF4 (or h5netcdf) package, which is not installed; "
                     "install it with: pip install netCDF4")


def export_netcdf(sweep_dir: str | Path, dest: str | Path) -> Path:
    """Write the ensemble of ``sweep_dir`` (``results/<sweep>``) to the netCDF-4 file ``dest``.

    Returns:
        ``dest`` as a path.

    Raises:
        UsageError: ``dest`` does not end in ``.nc`` or exists; the sweep has no ensemble, or its
            ensemble fails its checks (naming it and the fix); no netCDF-4 writer is installed.
    """
    from sgdsweep.core.version import VERSION as __version__
    from sgdsweep.store.aggregate import load_ensemble

    dest = Path(dest)
    if dest.suffix != ".nc":
        raise UsageError(f"netCDF export destination {str(dest)!r} must end in .nc")
    if os.path.lexists(dest):
        raise UsageError(f"{dest} already exists; sgdsweep never overwrites a file. Remove it or choose another name")
    engine = netcdf_engine()
    ensemble = Path(sweep_dir) / "ensemble.zarr"
    if not ensemble.is_dir():
        raise UsageError(f"{sweep_dir} has no ensemble ({ensemble} not found); run the workflow before exporting")
    try:
        ds = load_ensemble(ensemble)
    except StoreError as exc:
        raise UsageError(f"{sweep_dir} is not exported: {exc}") from None
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    line = f"{now} sgdsweep export --format netcdf (sgdsweep {__version__})"
    ds.attrs["history"] = "\n".join(h for h in (ds.attrs.get("history"), line) if h)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        ds.to_netcdf(tmp, engine=engine, format="NETCDF4")
        try:
            os.link(tmp, dest)  # fails if dest appeared meanwhile: never overwritten
        except FileExistsError:
            raise UsageError(f"{dest} already exists; sgdsweep never overwrites a file. Remove it or choose "
                             "another name") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest
