"""Aggregation: point stores read through their public reader into the ensemble, which is
written with xarray (Zarr, zstd + CRC-32C) and checked on every read."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import as_directory_store

from sgdsweep.core.identity import content_hash
from sgdsweep.errors import StoreError
from sgdsweep.store import aggregate, variables
from sgdsweep.store import points as point_store
from sgdsweep.store.migrate import migrate_points


def _point(tmp_path, name="p0"):
    arrays = {"weight_var_replica": (("replica",), np.array([0.1, np.nan, 0.3])),
              "diverged_step": (("replica",), np.array([-1, 7, -1])),
              "escape_step": (("replica",), np.zeros(3, np.int64)),
              "flags": (("replica",), np.array([True, False, True])),
              "singular_values_W": (("replica", "sv"), np.arange(6.0).reshape(3, 2))}
    path = point_store.point_path(tmp_path, name)
    point_store.write_point(path, arrays, {"summary": {}, "params": {}})
    return path, {k: v[1] for k, v in arrays.items()}


def test_point_arrays_are_read_in_order_with_their_dtype(tmp_path):
    path, arrays = _point(tmp_path)
    got = point_store.read_arrays(path, ["absent", *arrays])
    assert list(got) == list(arrays)  # absent names left out, order kept
    for name, want in arrays.items():
        np.testing.assert_array_equal(got[name], want)
        assert got[name].dtype == want.dtype and got[name].flags.writeable
    assert list(point_store.read_arrays(path, ["flags"], prefixes=("singular_values_",))) == [
        "flags", "singular_values_W"]
    assert point_store.read_arrays(tmp_path / "absent.npz", ["weight_var_replica"]) == {}


def test_damaged_or_foreign_point_store_stops_aggregation_naming_it(tmp_path):
    spec = _sweep(tmp_path)
    victim = point_store.point_path(tmp_path, spec["points"][1]["hash"])
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 1
    victim.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match=f"point store {victim} is damaged"):
        aggregate.build_ensemble(spec)
    victim.write_bytes(b"not a zip")
    with pytest.raises(StoreError, match=f"point store {victim} is damaged"):
        aggregate.build_ensemble(spec)
    victim.unlink()
    with pytest.raises(StoreError, match=f"point store {victim} is missing or unreadable"):
        aggregate.build_ensemble(spec)


def test_the_catalogue_describes_every_ensemble_variable_without_xarray(tmp_path):
    """sgdsweep.store.variables names each variable's long name, units and dimensions, and is
    what simulation workers import (neither xarray nor Zarr comes with it)."""
    import subprocess
    import sys

    code = ("import sys; import sgdsweep.store.variables, sgdsweep.sim.results; "
            "print(sorted(m for m in ('xarray', 'zarr') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    ds = aggregate.build_ensemble(_sweep(tmp_path))
    for name, var in ds.data_vars.items():
        assert {"long_name", "description"} <= set(var.attrs), name
        assert ("units" in var.attrs) != (var.dtype.kind in "OTU"), name  # units for numbers, not for text
        if variables.ensemble_dims(name) is not None:
            assert var.dims == variables.ensemble_dims(name), name
        else:
            assert var.dims == ("point",) and name in variables.VARIABLES, name
    assert variables.describe("layer_cov_eigenvalues_W2")["long_name"] == "covariance eigenvalues of W2"
    assert variables.ensemble_dims("weight_cov") is None  # matrices stay in the point stores


def _sweep(tmp_path, n=3):
    rng = np.random.default_rng(1)
    entries = []
    for i in range(n):
        reps = 3 + i  # ragged replica counts and mode numbers: padded in the ensemble
        arrays = {"weight_var_replica": (("replica",), rng.random(reps)),
                  "diverged_step": (("replica",), np.where(rng.random(reps) < 0.3, 5, -1)),
                  "weight_cov_eigenvalues": (("mode",), rng.random(2 + i)),
                  "noise_cov_ratio": (("lag",), rng.random(2)), "lag": (("lag",), np.array([1, 2])),
                  "singular_values_W": (("replica", "sv"), rng.random((reps, 2))),
                  "layer_cov_eigenvalues_W2": (("mode",), rng.random(3))}
        summary = {"weight_var": float(rng.random()), "diverged": bool(i == 1), "burn_in": 10,
                   "theory_formulas": {"weight_cov": "exact"}, "weight_var_theory": 0.5}
        params = {"lr": 0.1 * (i + 1), "noise": "minibatch"}
        h = content_hash(params)  # the store's name is its point's hash, which it records
        point_store.write_point(point_store.point_path(tmp_path, h), arrays,
                                {"summary": summary, "params": params, "point_hash": h, "simulation_seconds": 0.5})
        entries.append({"hash": h, "shard": f"s{i % 2}"})
    return {"points_dir": str(tmp_path), "points": entries, "coords": ["lr", "noise"], "sweep": "t",
            "sweep_hash": "abc", "simulation_config": {"model": {}}}


def test_ensemble_of_npz_stores_equals_that_of_migrated_zarr_stores(tmp_path):
    """The same points stored as .npz and as Zarr directory stores (the first layout), migrated
    to .npz (sgdsweep.store.migrate, as a run does before it looks for points), aggregate to the
    same ensemble."""
    spec = _sweep(tmp_path)
    npz = aggregate.build_ensemble(spec)
    for entry in spec["points"]:
        as_directory_store(point_store.point_path(tmp_path, entry["hash"]))
    assert not list(tmp_path.glob("*.npz"))
    assert len(migrate_points(tmp_path).migrated) == len(spec["points"])
    directories = aggregate.build_ensemble(spec)
    for ds in (npz, directories):
        ds.attrs.pop("created_utc")
        ds.attrs.pop("history")  # its first line is dated too
    xr.testing.assert_identical(npz, directories)
    assert list(npz.data_vars) == list(directories.data_vars)
    assert npz.sizes["replica"] == 5 and npz["diverged_step"].dtype == np.float64  # NaN: did not diverge
    assert list(npz["lag"].values) == [1, 2]


def _ensemble(tmp_path):
    """An ensemble written by write_ensemble (one variable all NaN, the fill value); its path and dataset."""
    ds = aggregate.build_ensemble(_sweep(tmp_path / "points"))
    ds["all_fill"] = ("point", np.full(ds.sizes["point"], np.nan))
    path = tmp_path / "ensemble.zarr"
    aggregate.write_ensemble(ds, path)
    return path, ds


def _chunk_files(path, name):
    return sorted(p for p in (path / name).rglob("*") if p.is_file() and p.name != "zarr.json")


def test_ensemble_chunks_carry_checksums_and_all_exist(tmp_path):
    """Every array's chunks end with Zarr's CRC-32C, and every chunk is written (an all-NaN one
    too), so the chunk listing can tell a lost chunk file from an empty one."""
    path, ds = _ensemble(tmp_path)
    group = zarr.open_group(str(path), mode="r")
    for name, arr in group.arrays():
        assert [c.to_dict()["name"] for c in arr.compressors] == ["zstd", "crc32c"], name
        assert arr.nchunks_initialized == arr.nchunks, name
    assert _chunk_files(path, "all_fill")
    got = aggregate.load_ensemble(path)
    xr.testing.assert_identical(got.drop_encoding(), ds)
    assert aggregate.open_ensemble(path)["weight_var"].shape == (3,)


def test_missing_ensemble_chunk_is_refused_naming_it(tmp_path):
    """A deleted chunk file reads as NaN through Zarr; load_ensemble and open_ensemble refuse it,
    naming the array and its directory."""
    path, _ = _ensemble(tmp_path)
    for chunk in _chunk_files(path, "weight_var"):
        chunk.unlink()
    assert np.isnan(xr.open_zarr(path).load()["weight_var"].values).all()  # what Zarr alone gives
    for read in (aggregate.load_ensemble, aggregate.open_ensemble):
        with pytest.raises(StoreError, match=rf"array 'weight_var' has 1 of its 1 chunk.*{path / 'weight_var'}"):
            read(path)


def test_damaged_ensemble_chunk_is_refused_naming_it(tmp_path):
    """A flipped byte in a chunk fails its CRC-32C on every read (plain xarray too); load_ensemble
    names the array and the chunk."""
    path, _ = _ensemble(tmp_path)
    (chunk,) = _chunk_files(path, "weight_var")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 1
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        xr.open_zarr(path).load()
    with pytest.raises(StoreError, match=rf"damaged: array 'weight_var' chunk \(0,\) under {path / 'weight_var'}"):
        aggregate.load_ensemble(path)


def test_ensemble_write_keeps_the_old_one_until_the_new_is_complete(tmp_path):
    """A write that fails leaves the previous ensemble as it was; what killed writes left beside
    it goes: an old temporary before writing, a young one once a new ensemble is in place."""
    path, ds = _ensemble(tmp_path)
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    old_tmp, young_tmp, old_swap = (tmp_path / f".ensemble.zarr.{tag}" for tag in ("tmp-0badf00d", "tmp-live0001",
                                                                                    "old-0badf00d"))
    for leftover in (old_tmp, young_tmp, old_swap):
        leftover.mkdir()
        (leftover / "zarr.json").write_text("{}")
    past = (tmp_path / "ensemble.zarr").stat().st_mtime - point_store.STALE_TEMPORARY_SECONDS - 60
    for leftover in (old_tmp, old_swap):
        os.utime(leftover, (past, past))
    bad = ds.assign(unwritable=("point", np.array([{"a": 1}] * ds.sizes["point"], dtype=object)))
    with pytest.raises(Exception):  # noqa: B017 - whatever xarray/Zarr raise for an object array
        aggregate.write_ensemble(bad, path)
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before
    assert not old_tmp.exists() and not old_swap.exists() and young_tmp.exists()
    aggregate.write_ensemble(ds, path)
    assert sorted(os.listdir(tmp_path)) == ["ensemble.zarr", "points"]


def test_an_ensemble_written_without_checksums_still_opens(tmp_path):
    """Ensembles written before the checksums left all-fill chunks unwritten; they open as before
    (only arrays with the CRC-32C codec are held to every chunk existing)."""
    ds = aggregate.build_ensemble(_sweep(tmp_path / "points"))
    ds["all_fill"] = ("point", np.full(ds.sizes["point"], np.nan))
    path = tmp_path / "old.zarr"
    ds.to_zarr(path, zarr_format=3, consolidated=True)  # Zarr's defaults: no checksum, no fill chunks
    assert not _chunk_files(path, "all_fill")
    got = aggregate.load_ensemble(path)
    assert np.isnan(got["all_fill"].values).all()
    np.testing.assert_array_equal(got["weight_var"].values, ds["weight_var"].values)
