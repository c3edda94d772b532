"""Aggregate a sweep's point stores into ``ensemble.zarr`` (an xarray dataset).

Layout: dimension ``point`` (coordinate = point hash) with one coordinate per axis of the
sweep (``lr``, ``batch_size``, ``momentum``, ``samples_per_param``, ``noise``, …) along it,
and dimension ``replica`` for per-replica values. Measured values sit next to their theory
(``<name>``, ``<name>_se``, ``<name>_theory``); ``missing_because`` (point, theory_column)
says why a point has no value of a theory column (empty where it has one). Every variable and
coordinate carries ``long_name``, ``units`` and ``description``. The dataset attributes hold
the provenance.

Points are read in order through :class:`sgdsweep.store.points.PointStore`, by several
processes for many points (:mod:`sgdsweep.store.aggregate_read`; only scalars, per-replica and
per-mode vectors are kept in memory); which arrays are copied, along which dimensions and with
which attributes is said by :mod:`sgdsweep.store.variables`. A grown sweep's ensemble is
appended to rather than rebuilt (:mod:`sgdsweep.store.aggregate_incremental`).

Integrity (:mod:`sgdsweep.store.integrity`): every chunk of the ensemble ends with its CRC-32C
(Zarr's ``crc32c`` codec, after ``zstd``), which Zarr checks on every read, also when the
ensemble is opened with plain xarray; every chunk is written, even one that holds only the fill
value (``write_empty_chunks``), so :func:`check_ensemble` can tell a deleted chunk file from an
empty one; and the root attribute ``sgdsweep_metadata_sha256`` records the digest of every
array's metadata, so that an edited ``zarr.json`` is found too. :func:`load_ensemble` and
:func:`open_ensemble` run that check and name the array (and chunk) that fails it. Each point
store is checked to be its point's own (:meth:`~sgdsweep.store.points.PointStore.check_identity`).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from sgdsweep.core.identity import points_digest
from sgdsweep.errors import StoreError
from sgdsweep.store import points as point_store
from sgdsweep.store.aggregate_read import read_points
from sgdsweep.store.integrity import METADATA_ATTR, check_ensemble, damaged_chunk, record_metadata
from sgdsweep.store.provenance import code_version, provenance
from sgdsweep.store.variables import (
    COORDS,
    FILL_VALUES,
    INT_SCALARS,
    MODEL_UNITS,
    SCALAR_COORDS,
    THEORY_COLUMNS,
    VARIABLES,
    ancillary_variables,
    describe,
    describe_dimension,
    ensemble_dims,
    theory_entries,
    theory_source,
)


def _pad(rows: list[np.ndarray], fill: float) -> np.ndarray:
    width = max((r.shape[-1] for r in rows), default=0)
    out = np.full((len(rows), width), fill, dtype=np.float64 if fill != -1 else np.int64)
    for i, r in enumerate(rows):
        out[i, : r.shape[-1]] = r
    return out


#: The metadata conventions the ensemble follows (its ``Conventions`` attribute).
CONVENTIONS = "CF-1.11 ACDD-1.3"
_LIU = "Liu, Ziyin & Ueda (2021), Noise and fluctuation of finite learning rate stochastic gradient descent"
_GROSS = ("Gross, Raulf & Räth (2024), Weight fluctuations in deep linear neural networks and a derivation of "
          "the inverse-variance flatness relation")
_HAN = "Han, Park, Lee & Han (2021), Fluctuation-dissipation-type theorem in stochastic linear learning"
_KRAMERS = "Kramers (1940), Brownian motion in a field of force and the diffusion model of chemical reactions"
_VESCOVI = ("Vescovi (2024), Statistical-mechanics approach to optimization algorithms for machine learning "
            "(thesis, Università degli Studi di Padova)")
#: model kind → the papers whose theory its columns hold (the ``references`` attribute; docs/physics.md).
REFERENCES: dict[str, tuple[str, ...]] = {
    "quadratic": (_LIU, _GROSS),
    "linear": (_LIU, _GROSS, _HAN),
    "two_layer": (_GROSS,),
    "matrix": ("Park, Favoni, Lucini & Aarts (2024), Random matrix theory for stochastic gradient descent",),
    "landscape": (_KRAMERS, "Mori, Liu, Ziyin & Ueda (2022), Power-law escape rate of SGD", _VESCOVI),
    "digits": (_HAN,),
}
#: key of the config's ``metadata`` section → the dataset attribute it fills (CF and ACDD names).
METADATA_ATTRIBUTES = {"institution": "institution", "creator": "creator_name", "creator_email": "creator_email",
                       "license": "license", "comment": "comment"}

#: The row of an array a point does not hold (read only).
_EMPTY = np.zeros(0)

#: why a point's theory column is empty when its point recorded no reason
NO_FINITE_VALUE = "the formula gives no finite value here (see 'formula'), e.g. beyond the float range"


def _missing_because(columns: list[str], data_vars: dict[str, Any],
                     reasons: list[dict[str, str]]) -> np.ndarray:
    """(point, column) strings: why the point has no finite value of the theory column (its
    recorded reason, or :data:`NO_FINITE_VALUE`); empty where it has one."""
    out = np.full((len(reasons), len(columns)), "", dtype=object)
    for j, k in enumerate(columns):
        values = np.asarray(data_vars[k][1], float).reshape(len(reasons), -1)
        for i in np.flatnonzero(~np.isfinite(values).any(axis=1)):
            out[i, j] = reasons[i].get(theory_source(k)) or NO_FINITE_VALUE
    return out


def build_ensemble(sweep_spec: dict[str, Any]) -> xr.Dataset:
    """The ensemble dataset of the points listed in ``sweep_spec`` (``plan/sweep.json``).

    Points are read in order (by several processes for many points:
    :func:`sgdsweep.store.aggregate_read.read_points`); only scalars, per-replica and per-mode
    vectors are kept.

    Raises:
        StoreError: a point store is missing, incomplete, or not its point's own (a store
            copied or renamed onto another point's name).
    """
    points_dir = sweep_spec["points_dir"]
    entries = sweep_spec["points"]
    n = len(entries)
    summaries: list[dict[str, Any]] = []
    coords: dict[str, list[Any]] = {c: [] for c in sweep_spec["coords"]}
    seconds: list[float] = []
    formulas: dict[str, set[str]] = {}
    reasons: list[dict[str, str]] = []
    per_replica: dict[str, list[np.ndarray]] = {}
    vectors: dict[str, list[np.ndarray]] = {}
    sv_dims: dict[str, str] = {}
    lag_values = None
    for i, (attrs, arrays) in enumerate(read_points(points_dir, entries)):
        summary = attrs["summary"]
        summaries.append(summary)
        for k, v in theory_entries(summary.get("theory_formulas", {})).items():
            formulas.setdefault(k, set()).add(v)
        reasons.append(theory_entries(summary.get("theory_reasons", {})))
        for c, values in coords.items():
            values.append(attrs["params"].get(c))
        seconds.append(attrs.get("simulation_seconds", np.nan))
        if "lag" in arrays:  # the first point's that has it
            lag = arrays.pop("lag")
            lag_values = lag if lag_values is None else lag_values
        for name, arr in arrays.items():
            dims = ensemble_dims(name)
            if dims is not None and len(dims) == 3:  # a layer's singular values, per replica
                sv_dims[name] = dims[2]
                table, empty = per_replica, None
            elif dims is not None and dims[1] != "replica":
                table, empty = vectors, _EMPTY
            else:
                table, empty = per_replica, _EMPTY
            if name not in table:  # one list of n rows per array, made once (not at every point)
                table[name] = [empty] * n
            table[name][i] = arr

    data_vars: dict[str, Any] = {}
    scalar_names = [k for k in VARIABLES if any(k in s for s in summaries)]
    for k in scalar_names:
        values = [s.get(k) for s in summaries]
        if k == "diverged":  # a CF flag (0/1) of the same type as its flag_values
            arr = np.asarray([bool(v) for v in values], dtype=np.int64)
        elif k in INT_SCALARS:
            arr = np.asarray([-1 if v is None else v for v in values], dtype=np.int64)
        else:
            arr = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        data_vars[k] = ("point", arr, describe(k))
    data_vars["simulation_seconds"] = ("point", np.asarray(seconds, float), describe("simulation_seconds"))
    n_rep = 0
    for name, rows in per_replica.items():
        if name in sv_dims:
            width = max((r.shape[1] for r in rows if r is not None), default=0)
            reps = max((r.shape[0] for r in rows if r is not None), default=0)
            arr = np.full((n, reps, width), np.nan)
            for i, r in enumerate(rows):
                if r is not None:
                    arr[i, : r.shape[0], : r.shape[1]] = r
            data_vars[name] = (("point", "replica", sv_dims[name]), arr, describe(name))
            continue
        fill = -1 if name in FILL_VALUES else np.nan
        arr = _pad(rows, fill)
        if name in FILL_VALUES:  # "did not happen" is missing: NaN here, the fill value on disk
            arr = np.where(arr == FILL_VALUES[name], np.nan, arr.astype(np.float64))
        n_rep = max(n_rep, arr.shape[1])
        data_vars[name] = (("point", "replica"), arr, describe(name))
    for name, rows in vectors.items():
        data_vars[name] = (ensemble_dims(name), _pad(rows, np.nan), describe(name))
    for name, (dims, arr, attrs) in list(data_vars.items()):
        if "replica" in dims and arr.shape[dims.index("replica")] < n_rep:
            pad = [(0, 0)] * arr.ndim
            pad[dims.index("replica")] = (0, n_rep - arr.shape[dims.index("replica")])
            data_vars[name] = (dims, np.pad(arr, pad, constant_values=-1 if arr.dtype.kind == "i" else np.nan), attrs)
    columns = [k for k in THEORY_COLUMNS if k in data_vars]
    why = _missing_because(columns, data_vars, reasons)
    for j, k in enumerate(columns):
        attrs = data_vars[k][2]
        if theory_source(k) in formulas:
            attrs["formula"] = " | ".join(sorted(formulas[theory_source(k)]))
        distinct = sorted({r for r in why[:, j] if r})
        if distinct:
            attrs["missing_because"] = " | ".join(distinct)
    if columns:
        data_vars["missing_because"] = (("point", "theory_column"), why, describe("missing_because"))

    coord_vars: dict[str, Any] = {
        "point": ("point", np.array([e["hash"] for e in entries], dtype=object), describe("point", COORDS)),
        "replica": ("replica", np.arange(n_rep), describe("replica", COORDS)),
        "shard": ("point", np.array([e["shard"] for e in entries], dtype=object), describe("shard", COORDS)),
    }
    for c, values in coords.items():
        arr = np.asarray(values)
        if arr.dtype.kind in "OU":
            arr = arr.astype(object)  # variable-length UTF-8 strings in Zarr 3
        coord_vars[c] = ("point", arr, describe(c, COORDS))
    if columns:
        coord_vars["theory_column"] = ("theory_column", np.array(columns, dtype=object),
                                       describe("theory_column", COORDS))
    ds = xr.Dataset(data_vars=data_vars, coords=coord_vars)
    for dim in ("mode", "q_mode"):
        if dim in ds.dims:
            ds = ds.assign_coords({dim: (dim, np.arange(ds.sizes[dim]), describe(dim, COORDS))})
    if "lag" in ds.dims and lag_values is not None and lag_values.size == ds.sizes["lag"]:
        ds = ds.assign_coords(lag=("lag", lag_values, describe("lag", COORDS)))
    ds = ds.assign_coords({name: ((), np.array(value, dtype=object), describe(name, COORDS))  # cell_methods names
                           for name, value in SCALAR_COORDS.items()})
    for dim in ds.dims:  # a coordinate for every dimension (CF): an index where it has no values
        if dim not in ds.coords:
            ds = ds.assign_coords({dim: (dim, np.arange(ds.sizes[dim]), describe_dimension(dim))})
    for name in ds.data_vars:
        linked = ancillary_variables(name, ds.data_vars)
        if linked:
            ds[name].attrs["ancillary_variables"] = " ".join(linked)
    ds.attrs.update(dataset_attributes(sweep_spec, n))
    ds.attrs.update({
        "sweep": sweep_spec["sweep"],
        "sweep_hash": sweep_spec["sweep_hash"],
        "config": json.dumps(sweep_spec["simulation_config"], sort_keys=True),
        "swept_axes": json.dumps([c for c in sweep_spec["coords"] if len(set(map(str, coords[c]))) > 1]),
        "points_digest": points_digest(e["hash"] for e in entries),
    })
    prov = provenance()
    ds.attrs.update({k: json.dumps(v) if isinstance(v, dict) else v for k, v in prov.items()})
    ds.attrs["history"] = (f"{prov['created_utc']} sgdsweep aggregate: built from {n} point stores "
                           f"({prov['code_version']})")
    return ds


def dataset_attributes(sweep_spec: dict[str, Any], n_points: int) -> dict[str, str]:
    """The CF and ACDD attributes of the ensemble of ``sweep_spec``: ``Conventions``, ``title``,
    ``source`` (sgdsweep's version and the simulation method), ``references`` (the papers of the
    model's theory, :data:`REFERENCES`), ``model_units`` (:data:`~sgdsweep.store.variables.MODEL_UNITS`)
    and, when the config's ``metadata`` section gives them, ``institution``, ``creator_name``,
    ``creator_email``, ``license``, ``comment``; ``history`` is set by :func:`build_ensemble`."""
    sim = sweep_spec.get("simulation_config", {})
    kind = sim.get("model", {}).get("kind", "linear")
    method = sim.get("dynamics", {}).get("method", "sgd")
    engine = ("stochastic gradient descent simulated step by step" if method != "sde"
              else "Euler–Maruyama integration of the SGD's stochastic differential equation")
    out = {
        "Conventions": CONVENTIONS,
        "title": f"sgdsweep ensemble of sweep '{sweep_spec['sweep']}' ({n_points} points, model {kind})",
        "source": f"{code_version()}: {engine} (dynamics.method {method})",
        "references": "; ".join(REFERENCES.get(kind, ())),
        "model_units": MODEL_UNITS,
    }
    for key, attr in METADATA_ATTRIBUTES.items():
        value = sweep_spec.get("metadata", {}).get(key)
        if value:
            out[attr] = str(value)
    return out


#: Codecs after the ``bytes`` serialiser of every ensemble array: zstd (Zarr's default) and
#: the CRC-32C of the compressed chunk, which Zarr verifies whenever it reads the chunk.
ENSEMBLE_COMPRESSORS = (zarr.codecs.ZstdCodec(level=0), zarr.codecs.Crc32cCodec())
#: About how many bytes (uncompressed) one chunk of an ensemble array holds along ``point``.
CHUNK_BYTES = 1 << 17
#: The fewest points in a chunk of an array along ``point``.
MIN_CHUNK_POINTS = 64


def ensemble_chunks(dims: tuple[str, ...], shape: tuple[int, ...], itemsize: int) -> tuple[int, ...] | None:
    """The chunk shape of an ensemble array along ``point``, None for one without it: whole along
    every other dimension, and along ``point`` the largest power of two of rows that holds at most
    :data:`CHUNK_BYTES` (at least :data:`MIN_CHUNK_POINTS`; ``itemsize`` in bytes, 16 for a string).
    It does not depend on the number of points, so an ensemble grown by appending rows
    (:mod:`sgdsweep.store.aggregate_incremental`) is chunked as one written whole."""
    if "point" not in dims:
        return None
    row = max(int(itemsize), 1) * int(np.prod([s for d, s in zip(dims, shape) if d != "point"], dtype=np.int64))
    rows = max(MIN_CHUNK_POINTS, 1 << max(int(CHUNK_BYTES // max(row, 1)).bit_length() - 1, 0))
    return tuple(rows if d == "point" else max(int(s), 1) for d, s in zip(dims, shape))


#: Name patterns of what a killed :func:`write_ensemble` leaves beside ``<name>``.
_TEMPORARY_TAGS = (".tmp-", ".old-")


def write_zarr(ds: xr.Dataset, store: Any) -> None:
    """Write ``ds`` into ``store`` (a path or a Zarr store; Zarr format 3, consolidated) as every
    ensemble is written: each array with :data:`ENSEMBLE_COMPRESSORS`, its declared fill value
    (:data:`~sgdsweep.store.variables.FILL_VALUES`) and :func:`ensemble_chunks`, every chunk
    written, even one holding only the fill value; a metadata record in ``ds.attrs`` left out."""
    ds = ds.drop_encoding()
    ds.attrs = {k: v for k, v in ds.attrs.items() if k != METADATA_ATTR}  # one read back: recorded anew
    encoding: dict[str, dict[str, Any]] = {name: {"compressors": ENSEMBLE_COMPRESSORS} for name in ds.variables}
    for name, fill in FILL_VALUES.items():  # "did not happen": a declared fill value, read back as NaN
        if name in ds.variables:
            encoding[name].update({"_FillValue": fill, "dtype": "int64"})
    for name, var in ds.variables.items():  # chunks that appending rows keeps as they are
        chunks = ensemble_chunks(var.dims, var.shape, 16 if var.dtype.kind in "OUS" else var.dtype.itemsize)
        if chunks is not None:
            encoding[name]["chunks"] = chunks
    with warnings.catch_warnings():  # consolidated metadata: not in the v3 spec, read by xarray
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        ds.to_zarr(store, mode="w", zarr_format=3, consolidated=True, encoding=encoding, write_empty_chunks=True)


def write_ensemble(ds: xr.Dataset, path: str | Path) -> None:
    """Write ``ds`` to ``path`` (Zarr format 3, consolidated) atomically, replacing any old one.

    The new ensemble is written whole into ``.<name>.tmp-*`` beside ``path`` and renamed into
    place; an existing ensemble is kept until then. Every chunk is written with its CRC-32C
    (:data:`ENSEMBLE_COMPRESSORS`), empty ones too, and the digests of the metadata are recorded
    (:func:`sgdsweep.store.integrity.record_metadata`). What killed writes left beside ``path``
    (``.<name>.tmp-*``, ``.<name>.old-*``) is removed: before writing, what is older than
    :data:`sgdsweep.store.points.STALE_TEMPORARY_SECONDS` (a younger one may be another write in
    progress), and, once the new ensemble is in place, whatever its age.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphan_temporaries(path, older_than=point_store.STALE_TEMPORARY_SECONDS)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write_zarr(ds, tmp)
        record_metadata(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    remove_orphan_temporaries(path, older_than=0.0)


def remove_orphan_temporaries(path: str | Path, older_than: float) -> list[Path]:
    """Remove the temporaries of :func:`write_ensemble` beside ``path`` (``.<name>.tmp-*``,
    ``.<name>.old-*``) last modified ``older_than`` seconds ago or earlier; return them."""
    path = Path(path)
    cutoff = time.time() - older_than
    removed = []
    for tag in _TEMPORARY_TAGS:
        for leftover in path.parent.glob(f".{glob.escape(path.name)}{tag}*"):
            try:
                if leftover.lstat().st_mtime > cutoff:
                    continue
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
            except FileNotFoundError:  # removed meanwhile
                continue
            removed.append(leftover)
    return removed


def load_ensemble(path: str | Path) -> xr.Dataset:
    """The whole ensemble read into memory as NumPy arrays (the fits and the report use all of
    it: opening it without Dask chunks skips building and computing a task graph).

    Raises:
        StoreError: a chunk is missing or an array's metadata was edited (:func:`check_ensemble`),
            or a chunk fails its CRC-32C, naming it.
    """
    check_ensemble(path)
    try:
        ds = xr.open_zarr(path, chunks=None).load()
    except ValueError as exc:  # Zarr: "Stored and computed checksum do not match", or a bad chunk
        raise StoreError(f"ensemble {path} is damaged: {damaged_chunk(path)}; delete it and rerun "
                         "the workflow (the aggregate step rebuilds it from the point stores)") from exc
    ds.attrs.pop(METADATA_ATTR, None)  # checked: the record is not part of the results
    return ds


def open_ensemble(path: str | Path, grid: bool = False) -> xr.Dataset:
    """Open an ensemble on this machine lazily (its metadata checked and its chunks listed
    first: :func:`check_ensemble`; each chunk's CRC-32C is checked by Zarr when it is read);
    with ``grid=True`` unstack ``point`` into the swept axes (:func:`as_grid`). A URL of a shared
    sweep is opened by :func:`sgdsweep.open_ensemble` (:mod:`sgdsweep.share.remote`)."""
    check_ensemble(path)
    return opened(xr.open_zarr(path), grid)


def opened(ds: xr.Dataset, grid: bool = False) -> xr.Dataset:
    """An ensemble just opened, as its reader sees it: without the record of its metadata's
    digests (checked already; not part of the results), and with ``grid=True`` its ``point``
    dimension unstacked into one dimension per swept axis."""
    ds.attrs.pop(METADATA_ATTR, None)  # checked: the record is not part of the results
    if not grid:
        return ds
    axes = json.loads(ds.attrs.get("swept_axes", "[]"))
    if not axes:
        return ds
    others = [c for c in ds.coords if ds[c].dims == ("point",) and c not in axes and c != "point"]
    ds = ds.reset_coords(others, drop=True)
    if len(axes) == 1:  # one swept axis: it becomes the dimension (a MultiIndex needs two levels)
        return ds.swap_dims(point=axes[0]).reset_coords("point", drop=True)
    return ds.set_index(point=axes).unstack("point")
