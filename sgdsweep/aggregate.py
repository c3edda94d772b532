"""Aggregate a sweep's point stores into ``ensemble.zarr`` (an xarray dataset).

Layout: dimension ``point`` (coordinate = point hash) with one coordinate per axis of the
sweep (``lr``, ``batch_size``, ``momentum``, ``samples_per_param``, ``noise``, …) along it,
and dimension ``replica`` for per-replica values. Measured values sit next to their theory
(``<name>``, ``<name>_se``, ``<name>_theory``). Every variable and coordinate carries
``long_name``, ``units`` and ``description``. The dataset attributes hold the provenance.

Points are read one at a time (only scalars and per-replica vectors are kept in memory).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from . import store
from .provenance import provenance
from .theory.linear import FORMULA

#: (long_name, units, description) of every variable the ensemble may hold.
VARIABLES: dict[str, tuple[str, str, str]] = {
    "weight_var": ("weight variance", "weight² (dimensionless)",
                   "mean per-coordinate stationary variance Tr E[(w-ŵ)(w-ŵ)ᵀ]/N after burn-in, averaged "
                   "over time and non-diverged replicas"),
    "weight_var_se": ("standard error of weight_var", "weight²",
                      "standard error from the spread of independent replicas' time averages"),
    "weight_var_theory": ("exact weight variance", "weight²", "Tr(M)/N with M from " + FORMULA),
    "loss": ("training loss", "label² ", "time- and replica-averaged L(w) = 1/(2P) Σ (wᵀx−y)² after burn-in"),
    "loss_se": ("standard error of loss", "label²", "standard error from the spread of replicas"),
    "loss_theory": ("exact training loss", "label²", "L(ŵ) + ½ Tr(H M) with M from " + FORMULA),
    "diverged": ("diverged", "1", "True if any replica of the point diverged (|w−ŵ|² beyond the bound "
                 "or not finite); such points are excluded from fits"),
    "diverged_replicas": ("diverged replicas", "1", "number of replicas that diverged"),
    "burn_in": ("burn-in", "steps", "updates discarded before measuring"),
    "measured_steps": ("measured steps", "steps", "updates averaged per replica after burn-in"),
    "simulation_seconds": ("simulation time", "s", "wall-clock seconds spent simulating the point"),
    "weight_var_replica": ("weight variance per replica", "weight²",
                           "per-replica time average of |w−ŵ|²/N; NaN for diverged or absent replicas"),
}
COORDS: dict[str, tuple[str, str, str]] = {
    "point": ("point hash", "1", "content hash of the point's fully resolved parameters"),
    "replica": ("replica index", "1", "index of the independent replica"),
    "shard": ("shard id", "1", "the shard (group of points sharing data) that simulated the point"),
    "lr": ("learning rate λ", "1", "SGD step size"),
    "batch_size": ("batch size S", "samples", "samples per gradient step"),
    "momentum": ("momentum μ", "1", "heavy-ball momentum"),
    "samples_per_param": ("samples per parameter P/N", "1", "data-set size over input dimension"),
    "hidden_width": ("hidden width N_h", "units", "hidden width of a two-layer network"),
    "noise": ("noise type", "1", "how the gradient noise is generated (physics.md §7)"),
    "n_inputs": ("input dimension N", "1", "number of inputs"),
    "label_noise": ("label noise σ_ε", "label", "standard deviation of the label noise"),
    "steps": ("steps", "steps", "updates per replica"),
    "replicas": ("replicas", "1", "replicas per point"),
}
SCALARS = ("weight_var", "weight_var_se", "weight_var_theory", "loss", "loss_se", "loss_theory",
           "diverged", "diverged_replicas", "burn_in", "measured_steps")


def _attrs(table: dict[str, tuple[str, str, str]], name: str) -> dict[str, str]:
    long_name, units, description = table[name]
    return {"long_name": long_name, "units": units, "description": description}


def build_ensemble(sweep_spec: dict[str, Any]) -> xr.Dataset:
    """The ensemble dataset of the points listed in ``sweep_spec`` (``plan/sweep.json``).

    Raises:
        StoreError: a point store is missing or incomplete.
    """
    points_dir = sweep_spec["points_dir"]
    entries = sweep_spec["points"]
    n = len(entries)
    scalars: dict[str, list[Any]] = {k: [] for k in SCALARS}
    coords: dict[str, list[Any]] = {c: [] for c in sweep_spec["coords"]}
    seconds, per_replica = [], []
    for entry in entries:
        path = store.point_path(points_dir, entry["hash"])
        attrs = store.read_attrs(path)
        summary = attrs["summary"]
        for k in SCALARS:
            v = summary.get(k)
            scalars[k].append(np.nan if v is None else v)
        for c in coords:
            coords[c].append(attrs["params"].get(c))
        seconds.append(attrs.get("simulation_seconds", np.nan))
        per_replica.append(store.read_array(path, "weight_var_replica"))
    n_rep = max((len(r) for r in per_replica), default=0)
    rep = np.full((n, n_rep), np.nan)
    for i, r in enumerate(per_replica):
        rep[i, : len(r)] = r

    data_vars: dict[str, Any] = {}
    for k in SCALARS:
        arr = np.asarray(scalars[k])
        if k == "diverged":
            arr = arr.astype(bool)
        elif k in ("diverged_replicas", "burn_in", "measured_steps"):
            arr = arr.astype(np.int64)
        else:
            arr = arr.astype(np.float64)
        data_vars[k] = ("point", arr, _attrs(VARIABLES, k))
    data_vars["simulation_seconds"] = ("point", np.asarray(seconds, float), _attrs(VARIABLES, "simulation_seconds"))
    data_vars["weight_var_replica"] = (("point", "replica"), rep, _attrs(VARIABLES, "weight_var_replica"))
    for k in ("weight_var_theory", "loss_theory"):
        data_vars[k][2]["formula"] = FORMULA
        data_vars[k][2]["approximation"] = "none (exact for the finite data set and sampling scheme)"

    coord_vars: dict[str, Any] = {
        "point": ("point", np.array([e["hash"] for e in entries], dtype=object), _attrs(COORDS, "point")),
        "replica": ("replica", np.arange(n_rep), _attrs(COORDS, "replica")),
        "shard": ("point", np.array([e["shard"] for e in entries], dtype=object), _attrs(COORDS, "shard")),
    }
    for c, values in coords.items():
        arr = np.asarray(values)
        if arr.dtype.kind in "OU":
            arr = arr.astype(object)  # variable-length UTF-8 strings in Zarr 3
        coord_vars[c] = ("point", arr, _attrs(COORDS, c))
    ds = xr.Dataset(data_vars=data_vars, coords=coord_vars)
    ds.attrs.update({
        "title": f"sgdsweep ensemble of sweep '{sweep_spec['sweep']}'",
        "sweep": sweep_spec["sweep"],
        "sweep_hash": sweep_spec["sweep_hash"],
        "config": json.dumps(sweep_spec["simulation_config"], sort_keys=True),
        "swept_axes": json.dumps([c for c in sweep_spec["coords"] if len(set(coords[c])) > 1]),
    })
    prov = provenance()
    ds.attrs.update({k: json.dumps(v) if isinstance(v, dict) else v for k, v in prov.items()})
    return ds


def write_ensemble(ds: xr.Dataset, path: str | Path) -> None:
    """Write ``ds`` to ``path`` (Zarr format 3, consolidated) atomically, replacing any old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with warnings.catch_warnings():  # consolidated metadata: not in the v3 spec, read by xarray
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            ds.to_zarr(tmp, mode="w", zarr_format=3, consolidated=True)
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


def open_ensemble(path: str | Path, grid: bool = False) -> xr.Dataset:
    """Open an ensemble; with ``grid=True`` unstack ``point`` into the swept axes."""
    ds = xr.open_zarr(path)
    if not grid:
        return ds
    axes = json.loads(ds.attrs.get("swept_axes", "[]"))
    if not axes:
        return ds
    others = [c for c in ds.coords if ds[c].dims == ("point",) and c not in axes and c != "point"]
    return ds.reset_coords(others, drop=True).set_index(point=axes).unstack("point")
