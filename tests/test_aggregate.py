"""Aggregation reads point stores without Zarr's per-array cost, and gets what Zarr gets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.codecs import BytesCodec

from sgdsweep import aggregate, store
from sgdsweep.errors import StoreError


def _point(tmp_path, name="p0"):
    arrays = {"weight_var_replica": (("replica",), np.array([0.1, np.nan, 0.3])),
              "diverged_step": (("replica",), np.array([-1, 7, -1])),
              "escape_step": (("replica",), np.zeros(3, np.int64)),  # all fill value: no chunk file
              "flags": (("replica",), np.array([True, False, True])),
              "singular_values_W": (("replica", "sv"), np.arange(6.0).reshape(3, 2))}
    path = store.point_path(tmp_path, name)
    store.write_point(path, arrays, {"summary": {}, "params": {}})
    return path, {k: v[1] for k, v in arrays.items()}


def test_point_arrays_match_zarr(tmp_path):
    path, arrays = _point(tmp_path)
    got = aggregate.read_point_arrays(path, ["absent", *arrays])
    assert list(got) == list(arrays)  # absent names left out, order kept
    for name, want in arrays.items():
        np.testing.assert_array_equal(got[name], want)
        np.testing.assert_array_equal(got[name], store.read_array(path, name))
        assert got[name].dtype == store.read_array(path, name).dtype and got[name].flags.writeable


def test_other_layouts_go_through_zarr(tmp_path):
    """Big-endian chunks are decoded directly; compressed or multi-chunk arrays are read by Zarr."""
    path, _ = _point(tmp_path)
    big = zarr.create_array(str(path / "big"), shape=(4,), dtype=">f8", chunks=(4,),
                            serializer=BytesCodec(endian="big"), compressors=None)
    big[...] = np.arange(4.0)
    packed = zarr.create_array(str(path / "packed"), shape=(10,), dtype="f8", chunks=(3,))  # default compressor
    packed[...] = np.linspace(0, 1, 10)
    assert aggregate._single_chunk(zarr.open_array(str(path / "packed")).metadata.to_dict()) is None
    got = aggregate.read_point_arrays(path, ["big", "packed"])
    np.testing.assert_array_equal(got["big"], np.arange(4.0))
    np.testing.assert_array_equal(got["packed"], np.linspace(0, 1, 10))


def test_point_stores_have_one_directory_per_array_and_the_earlier_layout_still_reads(tmp_path):
    """Chunk keys ``c.0.0`` (one directory per array); stores written before with ``c/0/0``
    (Zarr's default separator) read the same, directly and through Zarr."""
    path, arrays = _point(tmp_path)
    assert sorted(p.name for p in (path / "singular_values_W").iterdir()) == ["c.0.0", "zarr.json"]
    assert not any(p.is_dir() for a in path.iterdir() if a.is_dir() for p in a.iterdir())
    for name in arrays:  # rewrite as the earlier layout
        meta_path, chunk = path / name / "zarr.json", path / name / ("c." + ".".join("0" * arrays[name].ndim))
        meta = json.loads(meta_path.read_text())
        meta["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": "/"}}
        meta_path.write_text(json.dumps(meta))
        if chunk.exists():
            nested = path / name / "/".join(["c"] + ["0"] * arrays[name].ndim)
            nested.parent.mkdir(parents=True)
            chunk.rename(nested)
    got = aggregate.read_point_arrays(path, list(arrays))
    for name, want in arrays.items():
        np.testing.assert_array_equal(got[name], want)
        np.testing.assert_array_equal(store.read_array(path, name), want)


def test_damaged_chunk_raises_store_error(tmp_path):
    path, _ = _point(tmp_path)
    (path / "weight_var_replica" / "c.0").write_bytes(b"\0" * 5)  # truncated
    with pytest.raises(StoreError, match="weight_var_replica"):
        aggregate.read_point_arrays(path, ["weight_var_replica"])


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
        h = f"h{i}"
        store.write_point(store.point_path(tmp_path, h), arrays,
                          {"summary": summary, "params": {"lr": 0.1 * (i + 1), "noise": "minibatch"},
                           "simulation_seconds": 0.5})
        entries.append({"hash": h, "shard": f"s{i % 2}"})
    return {"points_dir": str(tmp_path), "points": entries, "coords": ["lr", "noise"], "sweep": "t",
            "sweep_hash": "abc", "simulation_config": {"model": {}}}


def test_ensemble_equals_the_zarr_read(tmp_path, monkeypatch):
    spec = _sweep(tmp_path)
    fast = aggregate.build_ensemble(spec)
    monkeypatch.setattr(aggregate, "_read_fast", lambda *a: None)  # every array through Zarr
    slow = aggregate.build_ensemble(spec)
    for ds in (fast, slow):
        ds.attrs.pop("created_utc")
    xr.testing.assert_identical(fast, slow)
    assert list(fast.data_vars) == list(slow.data_vars)
    assert fast.sizes["replica"] == 5 and fast["diverged_step"].dtype == np.int64
    assert list(fast["lag"].values) == [1, 2]
