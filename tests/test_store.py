"""Point stores (atomic, complete-or-absent) and the ensemble round trip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
import zlib

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import as_directory_store, tiny_config

from sgdsweep.errors import StoreError, UsageError
from sgdsweep.run.execute import make_batches
from sgdsweep.sim.simulate import simulate_points
from sgdsweep.store import aggregate
from sgdsweep.store import points as point_store
from sgdsweep.store.aggregate import build_ensemble, open_ensemble, write_ensemble
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.plan import write_plan


def test_point_store_round_trip_and_atomicity(tmp_path):
    path = point_store.point_path(tmp_path, "abc123")
    arrays = {"x": (("replica",), np.arange(4.0)), "m": (("param", "param_t"), np.eye(2))}
    assert point_store.write_point(path, arrays, {"summary": {"weight_var": 1.5}, "params": {"lr": 0.1}})
    assert point_store.is_complete(path)
    assert point_store.read_attrs(path)["summary"]["weight_var"] == 1.5
    np.testing.assert_array_equal(point_store.read_array(path, "x"), np.arange(4.0))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left behind
    # an existing complete store is kept, not overwritten
    assert not point_store.write_point(path, {"x": (("replica",), np.zeros(4))}, {"summary": {}})
    np.testing.assert_array_equal(point_store.read_array(path, "x"), np.arange(4.0))
    assert os.listdir(tmp_path) == ["abc123.zarr.zip"]  # one file per point
    with zarr.storage.ZipStore(path, mode="r") as zipped:  # point stores open with plain xarray too
        ds = xr.open_zarr(zipped, consolidated=False).load()
    assert ds["m"].dims == ("param", "param_t")
    np.testing.assert_array_equal(ds["x"].values, np.arange(4.0))
    assert point_store.has_array(path, "m") and not point_store.has_array(path, "absent")
    with pytest.raises(ValueError, match=r"\.zarr\.zip"):
        point_store.write_point(tmp_path / "abc123.zarr", arrays, {})


def test_incomplete_or_corrupt_store_is_detected(tmp_path):
    path = point_store.point_path(tmp_path, "dead")
    path.write_bytes(b"PK\x03\x04 truncated")
    assert not point_store.is_complete(path)
    with pytest.raises(StoreError, match="rerun the workflow"):
        point_store.read_attrs(path)
    files = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()}
    path.unlink()
    assert point_store.place_point(path, files)
    with pytest.raises(StoreError, match="incomplete"):
        point_store.read_attrs(path)
    # a rewrite replaces the incomplete store
    assert point_store.write_point(path, {"x": (("replica",), np.ones(2))}, {"summary": {}})
    assert point_store.is_complete(path)
    # the group's metadata is read from the first member's local header; a zip written otherwise
    # (zarr.json not first) is read through its central directory, and a damaged one is refused
    meta = path.read_bytes()
    other = point_store.point_path(tmp_path, "other")
    with zipfile.ZipFile(path) as zf, zipfile.ZipFile(other, "w") as out:
        for name in sorted(zf.namelist(), reverse=True):
            out.writestr(name, zf.read(name))
    assert point_store.read_attrs(other) == point_store.read_attrs(path)
    big = point_store.point_path(tmp_path, "big")  # a group's zarr.json longer than a few kB
    point_store.write_point(big, {"x": (("replica",), np.ones(2))}, {"summary": {"text": "x" * 10_000}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zipfile.ZipFile, "read", None)  # sliced from the local header, not through zipfile
        assert point_store.read_attrs(big)["summary"]["text"] == "x" * 10_000
    at = meta.index(b'"sgdsweep_complete": true')
    path.write_bytes(meta[:at] + meta[at:].replace(b"true", b"TRUE", 1))  # the CRC no longer matches
    with pytest.raises(StoreError, match="damaged"):
        point_store.read_attrs(path)


def _flip(path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 1
    path.write_bytes(bytes(raw))


def test_damaged_zip_store_is_not_complete(tmp_path):
    """A store cut short, or with one byte flipped anywhere (a chunk, its directory, the end),
    is not complete, so the next run recomputes the point; read_attrs and PointFiles name the
    file. A store written without the checksum comment is checked member by member."""
    values = np.arange(64.0)
    arrays = {"x": (("replica",), values), "m": (("i", "j"), np.eye(3))}
    path = point_store.point_path(tmp_path, "p")
    point_store.write_point(path, arrays, {"summary": {"weight_var": 1.0}})
    good = path.read_bytes()
    assert good.endswith(b"%08x" % zlib.crc32(good[:-8])) and point_store.CHECKSUM_MARKER in good[-30:]
    chunk_at = good.index(values.tobytes()) + 100
    damaged = {"half": good[: len(good) // 2], "last member cut": good[: good.rindex(b"PK\x01\x02")],
               "end cut": good[:-3]}
    for at in (chunk_at, len(good) - 40, len(good) - 3):  # a chunk, the directory, the checksum
        raw = bytearray(good)
        raw[at] ^= 1
        damaged[f"byte {at} flipped"] = bytes(raw)
    for what, raw in damaged.items():
        path.write_bytes(raw)
        assert not point_store.is_complete(path), what
        assert point_store.complete_points(tmp_path, ["p"]) == set(), what
        with pytest.raises(StoreError, match=f"point store {path} is (damaged|missing or unreadable)"):
            point_store.read_attrs(path)
        with pytest.raises(zipfile.BadZipFile):
            point_store.PointFiles(path)
        assert point_store.write_point(path, arrays, {"summary": {"weight_var": 1.0}}), what  # replaced
        assert path.read_bytes() == good
    # cut exactly before its comment, every member intact: read as a store without checksum
    path.write_bytes(good[: -len(point_store.CHECKSUM_MARKER) - 8])
    assert point_store.is_complete(path)
    # a zip written without the comment (by zipfile alone): every member's CRC-32 is checked
    with point_store.PointFiles(path) as files:
        members = dict(files)
    with zipfile.ZipFile(path, "w") as zf:
        for key, data in sorted(members.items(), key=lambda kv: kv[0] != "zarr.json"):
            zf.writestr(key, data)
    assert point_store.is_complete(path)
    _flip(path, path.read_bytes().index(values.tobytes()) + 100)
    assert not point_store.is_complete(path)
    with pytest.raises(StoreError, match="member 'x/c.0' fails its CRC-32"):
        point_store.read_attrs(path)



def test_point_files_slice_stored_members_and_check_them(tmp_path):
    """A zip store's members are sliced from its bytes at their local headers (not through
    zipfile.ZipFile.read); a flipped byte fails the CRC-32 and is reported as zipfile reports
    it; compressed members (a zip sgdsweep did not write) are read by zipfile."""
    path = point_store.point_path(tmp_path, "p")
    values = np.arange(4.0)
    point_store.write_point(path, {"x": (("replica",), values)}, {"summary": {}})
    with point_store.PointFiles(path) as files, pytest.MonkeyPatch.context() as mp:
        mp.setattr(zipfile.ZipFile, "read", None)
        np.testing.assert_array_equal(np.frombuffer(files["x/c.0"]), values)
        members = {key: files[key] for key in files}
        with pytest.raises(KeyError):
            files["y/c.0"]
    deflated = point_store.point_path(tmp_path, "deflated")
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as out:
        for key, data in members.items():
            out.writestr(key, data)
    with point_store.PointFiles(deflated) as files:
        assert {key: files[key] for key in files} == members
    raw = path.read_bytes()
    at = raw.index(values.tobytes())
    path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    with pytest.raises(zipfile.BadZipFile, match="CRC"):  # the store is checked whole when opened
        point_store.PointFiles(path)

def test_directory_stores_of_layout_1_are_read_and_kept(tmp_path):
    """Stores written by earlier sgdsweep versions (a directory per point) are found, read and
    never overwritten; an incomplete one is replaced by a zip store."""
    arrays = {"x": (("replica",), np.arange(3.0)), "m": (("i", "j"), np.eye(2))}
    for h in ("old", "broken"):
        point_store.write_point(point_store.point_path(tmp_path, h), arrays, {"summary": {"h": h}})
        as_directory_store(point_store.point_path(tmp_path, h))
    old, broken = point_store.point_path(tmp_path, "old"), point_store.point_path(tmp_path, "broken")
    assert old.is_dir() and old.name == "old.zarr"
    (broken / "zarr.json").write_text("{")
    assert point_store.complete_points(tmp_path, ["old", "broken", "absent"]) == {"old"}
    assert point_store.read_attrs(old)["summary"] == {"h": "old"} and point_store.has_array(old, "m")
    np.testing.assert_array_equal(point_store.read_array(old, "x"), np.arange(3.0))
    np.testing.assert_array_equal(aggregate.read_point_arrays(old, ["m"])["m"], np.eye(2))
    with point_store.PointFiles(old) as files:
        assert list(files) == ["m/c.0.0", "m/zarr.json", "x/c.0", "x/zarr.json", "zarr.json"]
        assert len(files) == 5 and "x/c.0" in files and "x/c.1" not in files
    zipped = tmp_path / "old.zarr.zip"
    assert not point_store.write_point(zipped, {"x": (("replica",), np.zeros(3))}, {})  # the same point: kept
    assert not zipped.exists()
    assert point_store.write_point(tmp_path / "broken.zarr.zip", arrays, {"summary": {"h": "new"}})
    assert not broken.exists() and point_store.read_attrs(point_store.point_path(tmp_path, "broken"))["summary"] == {"h": "new"}


def test_stale_temporaries_of_killed_writes_are_removed(tmp_path):
    """What a killed write left (a temporary zip, or a layout-1 temporary directory) is removed
    once it is older than STALE_TEMPORARY_SECONDS, for the points asked about only; a younger
    one may be a write in progress and stays, as do stores and other files."""
    old = os.path.getmtime(tmp_path) - point_store.STALE_TEMPORARY_SECONDS - 60

    def make(name: str, age: float | None = old, directory: bool = False):
        path = tmp_path / name
        if directory:
            path.mkdir()
            (path / "zarr.json").write_text("{}")
        else:
            path.write_bytes(b"PK partial")
        if age is not None:
            os.utime(path, (age, age))
        return path

    point_store.write_point(point_store.point_path(tmp_path, "a1"), {"x": (("replica",), np.ones(2))}, {})
    stale = [make(".a1.zarr.zip.tmp-0badf00d"), make(".b2.zarr.tmp-12345678", directory=True)]
    kept = [make(".a1.zarr.zip.tmp-live0001", age=None),  # young: possibly being written
            make(".c3.zarr.zip.tmp-0badf00d"),  # not one of the points asked about
            make(".a1.zarr.zip.old-0badf00d"),  # not a store's temporary
            make("a1.zarr.zip.tmp-0badf00d")]
    removed = point_store.remove_stale_temporaries(tmp_path, ["a1", "b2", "absent"])
    assert sorted(removed) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert point_store.is_complete(point_store.point_path(tmp_path, "a1"))
    assert point_store.remove_stale_temporaries(tmp_path, ["a1", "b2"]) == []
    assert point_store.remove_stale_temporaries(tmp_path / "absent", ["a1"]) == []


def test_simulate_aggregate_round_trip(tmp_path):
    cfg = tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1500, "replicas": 4})
    sweep = build_sweep(cfg)
    files = write_plan(sweep)
    specs = [p.spec() for p in sweep.points]
    for batch in make_batches(specs, 3):
        simulate_points(batch, str(files.points_dir))
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    back = xr.open_zarr(files.ensemble)
    assert back.sizes["point"] == 4 and back.sizes["replica"] == 4
    for name in ("weight_var", "weight_var_se", "weight_var_theory", "loss", "diverged"):
        assert name in back and back[name].dims == ("point",)
        assert {"long_name", "units", "description"} <= set(back[name].attrs)
    assert "formula" in back["weight_var_theory"].attrs
    for axis in ("lr", "batch_size", "momentum", "samples_per_param", "noise"):
        assert back[axis].dims == ("point",)
    assert list(back["point"].values) == [p.hash for p in sweep.points]
    np.testing.assert_array_equal(back["weight_var"].values, ds["weight_var"].values)
    assert json.loads(back.attrs["config"])["model"]["n_inputs"] == 4
    assert back.attrs["sweep_hash"] == sweep.sweep_hash
    assert "numpy" in json.loads(back.attrs["package_versions"])
    grid = open_ensemble(files.ensemble, grid=True)
    assert grid["weight_var"].sizes == {"lr": 2, "batch_size": 2}
    # rewriting replaces the ensemble atomically
    write_ensemble(ds.isel(point=[0]), files.ensemble)
    assert xr.open_zarr(files.ensemble).sizes["point"] == 1
    assert not [p for p in os.listdir(files.root) if p.startswith(".ensemble")]


def test_repeated_signatures_write_the_same_stores_as_zarr(tmp_path):
    """Arrays whose signature was seen before reuse Zarr's metadata with their own bytes; Zarr
    (and xarray) read them back exactly, including 0-d, integer, big-endian and empty arrays."""

    def arrays(seed):
        rng = np.random.default_rng(seed)
        return {"v": (("replica",), rng.random(5), {"units": "1"}),
                "m": (("i", "j"), rng.random((3, 4)).T),  # not C-contiguous
                "s": ((), np.array(rng.random())),
                "k": (("replica",), rng.integers(-5, 5, 5)),
                "b": (("replica",), rng.random(5).astype(">f8")),
                "e": (("mode",), np.zeros(0)),
                "z": (("replica",), np.zeros(5))}  # all fill value: Zarr writes no chunk
    for seed in range(3):
        path = point_store.point_path(tmp_path, f"p{seed}")
        assert point_store.write_point(path, arrays(seed), {"seed": seed, "x": [1.5, None]})
        with zarr.storage.ZipStore(path, mode="r") as zipped:
            group = zarr.open_group(zipped, mode="r")
            for name, (dims, data, *_) in arrays(seed).items():
                np.testing.assert_array_equal(group[name][...], data)
                assert list(group[name].metadata.dimension_names or ()) == list(dims)
            assert group["v"].attrs["units"] == "1"
            ds = xr.open_zarr(zipped, consolidated=False).load()
        assert point_store.read_attrs(path)["seed"] == seed
        np.testing.assert_array_equal(ds["m"].values, arrays(seed)["m"][1])
    learnt = {key[0] for key in point_store._TEMPLATES}
    assert {"v", "m", "s", "k", "e"} <= learnt and "b" not in learnt  # the fast path ran, and only there


def test_stores_assembled_without_zarr_are_byte_identical_to_zarrs(tmp_path, monkeypatch):
    """Once every signature is learnt, a store is assembled from templates without Zarr; its
    files are exactly the bytes Zarr writes for the same arrays and attributes."""
    import asyncio

    def arrays(seed):
        rng = np.random.default_rng(seed)
        return {"v": (("replica",), rng.random(5), {"units": "1"}), "m": (("i", "j"), rng.random((3, 4)).T),
                "s": ((), np.array(rng.random())), "k": (("replica",), rng.integers(-5, 5, 5)),
                "e": (("mode",), np.zeros(0))}

    def attrs(seed):
        return {"seed": seed, "nested": {"x": [1.5, None, float("nan")], "ü": "µs"}, "ok": True,
                "inf": float("inf")}

    encode = point_store._encode
    point_store.write_point(point_store.point_path(tmp_path, "first"), arrays(0), attrs(0))
    assert point_store._GROUP_JSON_CHECKED[0]
    monkeypatch.setattr(point_store, "_encode", None)  # any call to Zarr fails
    fast = point_store._point_files(arrays(1), attrs(1))
    monkeypatch.setattr(point_store, "_encode", encode)
    monkeypatch.setattr(point_store, "_TEMPLATES", {})  # Zarr builds every array again
    assert fast == asyncio.run(point_store._encode(arrays(1), attrs(1)))
    monkeypatch.setattr(point_store, "_TEMPLATES", {})
    monkeypatch.setattr(point_store, "_GROUP_JSON_CHECKED", [False])
    calls = []
    monkeypatch.setattr(point_store, "_encode", lambda *a: calls.append(1) or asyncio.sleep(0, {}))
    point_store._point_files(arrays(2), attrs(2))
    assert calls  # nothing learnt: Zarr builds the store


def test_unwritable_points_directory_is_named(tmp_path):
    """Writing into a directory that refuses writes is a clear error naming it and the fix, not
    a raw traceback. Tests run as root, where permission bits do not stop writes: the directory is
    made immutable (``chattr +i``, what a careful admin or a backup tool may set), and a path whose
    parent is a regular file stands for a directory that cannot be made."""
    points = tmp_path / "points"
    points.mkdir()
    arrays = {"x": (("replica",), np.ones(2))}
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(points)], check=False).returncode:
        pytest.skip("chattr +i is not available here (needs root on ext4/xfs/btrfs)")
    try:
        with pytest.raises(UsageError, match=rf"directory {points} is not writable .*'chattr -i {points}'"):
            point_store.write_point(point_store.point_path(points, "a1"), arrays, {})
    finally:
        subprocess.run(["chattr", "-i", str(points)], check=True)
    assert os.listdir(points) == []
    assert point_store.write_point(point_store.point_path(points, "a1"), arrays, {})
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match=rf"cannot write point store {tmp_path / 'file' / 'p' / 'a1'}"):
        point_store.write_point(point_store.point_path(tmp_path / "file" / "p", "a1"), arrays, {})
