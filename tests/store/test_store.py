"""Point stores (atomic, complete-or-absent, checksummed, earlier layouts migrated) and the ensemble round trip."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
import zlib

import numpy as np
import pytest
import xarray as xr
from conftest import as_directory_store, checksummed_zip, npy, tiny_config, write_yaml, write_zarr_zip_point

from sgdsweep.errors import StoreError, UsageError
from sgdsweep.run.execute import make_batches, run_shard
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import leftovers, migrate
from sgdsweep.store import points as point_store
from sgdsweep.store.aggregate import build_ensemble, open_ensemble, write_ensemble
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.explain import explain
from sgdsweep.sweep.plan import write_plan

ARRAYS = {"x": (("replica",), np.arange(4.0)), "m": (("param", "param_t"), np.eye(2), {"units": "weight²"}),
          "n": (("replica",), np.array([1, 0, 2, -1]))}


def test_point_store_round_trip_and_atomicity(tmp_path):
    """A point store is one ``<hash>.npz`` that numpy alone opens (no pickle): a ``.npy`` member
    per matrix, one table (a structured array, a column per array) per dimension of the 1-d
    arrays, and the metadata as one JSON string; written once, never overwritten."""
    path = point_store.point_path(tmp_path, "abc123")
    assert path.name == "abc123.npz"
    assert point_store.write_point(path, ARRAYS, {"summary": {"weight_var": 1.5}, "params": {"lr": 0.1}})
    assert point_store.is_complete(path)
    assert point_store.read_attrs(path)["summary"]["weight_var"] == 1.5
    np.testing.assert_array_equal(point_store.read_array(path, "x"), np.arange(4.0))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left behind
    # an existing complete store is kept, not overwritten
    assert not point_store.write_point(path, {"x": (("replica",), np.zeros(4))}, {"summary": {}})
    np.testing.assert_array_equal(point_store.read_array(path, "x"), np.arange(4.0))
    assert os.listdir(tmp_path) == ["abc123.npz"]  # one file per point
    with np.load(path, allow_pickle=False) as npz:  # numpy's own reader
        assert sorted(npz.files) == ["m", "sgdsweep_meta", "table.replica.4"]
        np.testing.assert_array_equal(npz["m"], np.eye(2))
        np.testing.assert_array_equal(npz["table.replica.4"]["n"], [1, 0, 2, -1])
        meta = json.loads(bytes(npz["sgdsweep_meta"][()]))
    assert meta["attributes"]["sgdsweep_complete"] is True and meta["attributes"]["store_version"] == 3
    assert meta["arrays"]["m"] == {"dims": ["param", "param_t"], "attrs": {"units": "weight²"}}
    assert meta["arrays"]["x"] == {"dims": ["replica"], "attrs": {}, "table": "table.replica.4"}
    with point_store.PointStore(path) as store:
        assert store.arrays == {"x": (("replica",), {}), "m": (("param", "param_t"), {"units": "weight²"}),
                                "n": (("replica",), {})}
        assert list(store.read_many(["absent", "x"], prefixes=("m",))) == ["x", "m"]
        n = store.read("n")
        assert n.dtype == np.asarray(ARRAYS["n"][1]).dtype and n.flags.c_contiguous and n.flags.writeable
    assert point_store.has_array(path, "m") and not point_store.has_array(path, "absent")
    with pytest.raises(StoreError, match=f"point store {path} holds no array 'absent'"):
        point_store.read_array(path, "absent")
    with pytest.raises(ValueError, match=r"must end in \.npz"):
        point_store.write_point(tmp_path / "abc123.h5", ARRAYS, {})
    objects = np.array([{}, None], dtype=object)
    for bad in ({"sgdsweep_meta": ((), np.zeros(1))}, {"table.x": ((), np.zeros(1))}, {"o": (("i",), objects)}):
        with pytest.raises(ValueError, match="a reserved name or an object array"):
            point_store.write_point(point_store.point_path(tmp_path, "bad"), bad, {})
    with pytest.raises(ValueError, match=r"'x': 1 dimension names \('replica',\) for an array of shape \(2, 2\)"):
        point_store.write_point(point_store.point_path(tmp_path, "bad"), {"x": (("replica",), np.eye(2))}, {})


def test_stores_round_trip_every_kind_of_array(tmp_path):
    """0-d, integer, boolean, big-endian, empty and non-contiguous arrays and attributes with
    NaN, infinity and non-ASCII text read back exactly; the same point gives the same bytes."""
    rng = np.random.default_rng(0)
    arrays = {"v": (("replica",), rng.random(5), {"units": "1"}), "m": (("i", "j"), rng.random((3, 4)).T),
              "s": ((), np.array(rng.random())), "k": (("replica",), rng.integers(-5, 5, 5)),
              "b": (("replica",), rng.random(5).astype(">f8")), "e": (("mode",), np.zeros(0)),
              "f": (("replica",), np.array([True, False])), "z": (("replica", "sv"), np.zeros((3, 0)))}
    attrs = {"nested": {"x": [1.5, None, float("nan")], "ü": "µs"}, "ok": True, "inf": float("inf")}
    path = point_store.point_path(tmp_path, "p")
    assert point_store.write_point(path, arrays, attrs)
    got = point_store.read_attrs(path)
    assert got["nested"]["ü"] == "µs" and np.isnan(got["nested"]["x"][2]) and got["inf"] == float("inf")
    for name, (dims, data, *_) in arrays.items():
        back = point_store.read_array(path, name)
        np.testing.assert_array_equal(back, data)
        assert back.dtype == data.dtype and back.shape == data.shape and back.flags.writeable, name
    first = path.read_bytes()
    path.unlink()
    assert point_store.write_point(path, arrays, attrs) and path.read_bytes() == first


def test_incomplete_or_corrupt_store_is_detected(tmp_path):
    path = point_store.point_path(tmp_path, "dead")
    path.write_bytes(b"PK\x03\x04 truncated")
    assert not point_store.is_complete(path)
    with pytest.raises(StoreError, match="rerun the workflow"):
        point_store.read_attrs(path)
    path.unlink()
    assert point_store.place_members(path, {"x": np.ones(2)}, {"attributes": {"sgdsweep_complete": False},
                                                               "arrays": {"x": {"dims": ["replica"]}}})
    assert not point_store.is_complete(path)
    with pytest.raises(StoreError, match="incomplete"):
        point_store.read_attrs(path)
    # a rewrite replaces the incomplete store
    assert point_store.write_point(path, {"x": (("replica",), np.ones(2))}, {"summary": {}})
    assert point_store.is_complete(path)


def test_damaged_store_is_not_complete(tmp_path):
    """A store cut short, or with one byte flipped anywhere (an array, the metadata, the zip's
    directory, the checksum), is not complete, so the next run recomputes the point; read_attrs
    names the file."""
    values = np.arange(64.0)
    arrays = {"x": (("replica",), values), "m": (("i", "j"), np.eye(3))}
    path = point_store.point_path(tmp_path, "p")
    point_store.write_point(path, arrays, {"summary": {"weight_var": 1.0}})
    good = path.read_bytes()
    assert good.endswith(b"%08x" % zlib.crc32(good[:-8])) and point_store.CHECKSUM_MARKER in good[-30:]
    damaged = {"half": good[: len(good) // 2], "last member cut": good[: good.rindex(b"PK\x01\x02")],
               "end cut": good[:-3], "comment cut": good[: -len(point_store.CHECKSUM_MARKER) - 8]}
    spots = {"an array": good.index(values.tobytes()) + 100, "the metadata": good.index(b'"weight_var"') + 2,
             "the directory": good.rindex(b"PK\x01\x02") + 20, "the checksum": len(good) - 3}
    for what, at in spots.items():
        raw = bytearray(good)
        raw[at] ^= 1
        damaged[f"a byte of {what} flipped"] = bytes(raw)
    for what, raw in damaged.items():
        path.write_bytes(raw)
        assert not point_store.is_complete(path), what
        assert point_store.complete_points(tmp_path, ["p"]) == set(), what
        with pytest.raises(StoreError, match=f"point store {path} is (damaged|missing or unreadable)"):
            point_store.read_attrs(path)
        assert point_store.write_point(path, arrays, {"summary": {"weight_var": 1.0}}), what  # replaced
        assert path.read_bytes() == good


def test_crafted_stores_are_refused(tmp_path, monkeypatch):
    """Archives with a valid checksum but crafted contents are refused, naming the file: a member
    that is not ``.npy``, compressed members (a small file declaring far more: sgdsweep stores
    members uncompressed) and a file over MAX_POINT_BYTES (both refused before any member is
    read), a pickled object array (never unpickled), arrays their description does not list."""
    meta = {"attributes": {"sgdsweep_complete": True, "summary": {}, "params": {}},
            "arrays": {"x": {"dims": ["replica"]}}}
    meta_member = npy(np.array(json.dumps(meta).encode()))
    cases = {
        "foreign": ({"sgdsweep_meta.npy": meta_member, "x.npy": npy(np.ones(2)), "run.sh": b"rm -rf /"},
                    "every member must be '<array>.npy'"),
        "undescribed": ({"sgdsweep_meta.npy": meta_member, "x.npy": npy(np.ones(2)), "y.npy": npy(np.ones(2))},
                        "its arrays and their description differ"),
        "no metadata": ({"x.npy": npy(np.ones(2))}, "'sgdsweep_meta.npy' must be one"),
    }
    for name, (members, message) in cases.items():
        path = point_store.point_path(tmp_path, name.replace(" ", "_"))
        checksummed_zip(path, members)
        assert not point_store.is_complete(path), name
        with pytest.raises(StoreError, match=rf"point store {path}.*{re.escape(message)}"):
            point_store.read_attrs(path)
    pickled = point_store.point_path(tmp_path, "pickled")
    checksummed_zip(pickled, {"sgdsweep_meta.npy": meta_member,
                              "x.npy": npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)})
    with pytest.raises(StoreError, match=rf"array 'x' of point store {pickled} is unreadable .*allow_pickle"):
        point_store.read_array(pickled, "x")
    bomb = point_store.point_path(tmp_path, "bomb")  # a small file declaring 8 MB of members
    bomb_meta = {**meta, "arrays": {"x": {"dims": ["replica"]}}}
    checksummed_zip(bomb, {"sgdsweep_meta.npy": npy(np.array(json.dumps(bomb_meta).encode())),
                           "x.npy": npy(np.zeros(10**6))}, compression=zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 100_000
    big = point_store.point_path(tmp_path, "big")
    point_store.write_point(big, {"x": (("replica",), np.zeros(200_000))}, {})
    monkeypatch.setattr(point_store, "MAX_POINT_BYTES", 1_000_000)
    monkeypatch.setattr(np.lib.format, "read_array", None)  # nothing may be read
    for path, message in ((bomb, r"is not a store sgdsweep wrote \(member '[\w.]+' is compressed"),
                          (big, r"is \d+ bytes, more than 1000000")):
        assert not point_store.is_complete(path)
        with pytest.raises(StoreError, match=rf"point store {path} {message}"):
            point_store.read_attrs(path)


def _with_checksum(path):
    """Give the Zarr zip file ``path`` the sgdsweep checksum comment that the later layout-2
    stores carry (the CRC-32 of every byte before its digits)."""
    with zipfile.ZipFile(path, "a") as zf:
        zf.comment = point_store.CHECKSUM_MARKER + b"0" * 8
    raw = bytearray(path.read_bytes())
    raw[-8:] = b"%08x" % zlib.crc32(raw[:-8])
    path.write_bytes(bytes(raw))


def _legacy_config(tmp_path):
    return tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1000, "replicas": 3})


def _legacy_sweep(tmp_path):
    """A simulated tiny sweep whose four points are then stored in the three earlier layouts: a
    Zarr zip file without a checksum (two points), one with it, and a Zarr directory. Returns
    (sweep, plan files, the ensemble of the .npz stores, hash → what its store of an earlier
    layout holds, read through Zarr: arrays and attributes, hash → that store)."""
    sweep = build_sweep(_legacy_config(tmp_path))
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], 4):
        simulate_points(batch, str(files.points_dir))
    as_npz = build_ensemble(json.loads(files.sweep_spec.read_text()))
    hashes = [p.hash for p in sweep.points]
    original, legacy = {}, {}
    for i, h in enumerate(hashes):
        path = point_store.point_path(files.points_dir, h)
        with point_store.PointStore(path) as store:
            arrays = {name: (dims, store.read(name)) for name, (dims, _) in store.arrays.items()}
            attrs = store.attrs
        if i < 3:
            legacy[h] = write_zarr_zip_point(path.with_name(f"{h}.zarr.zip"), arrays, attrs)
            path.unlink()
            if i == 2:
                _with_checksum(legacy[h])
        else:
            legacy[h] = as_directory_store(path)
        with migrate.open_legacy(legacy[h]) as store:
            original[h] = ({n: (dims, attrs, store.read(n)) for n, (dims, attrs) in store.arrays.items()},
                           dict(store.attrs))
    return sweep, files, as_npz, original, legacy


def _same_as_original(path, original):
    """The .npz store ``path`` holds ``original`` (arrays with their dimension names, attributes
    and bytes; group attributes but the layout version, which is the current one)."""
    arrays, attrs = original
    with point_store.PointStore(path) as store:
        assert set(store.arrays) == set(arrays)
        for name, (dims, array_attrs, data) in arrays.items():
            got = store.read(name)
            assert store.arrays[name] == (tuple(dims), array_attrs), name
            assert got.dtype == data.dtype and got.shape == data.shape and got.tobytes() == data.tobytes(), name
        assert store.attrs["store_version"] == point_store.STORE_VERSION
        assert {k: v for k, v in store.attrs.items() if k != "store_version"} == \
               {k: v for k, v in attrs.items() if k != "store_version"}


def test_stores_of_earlier_layouts_are_migrated_and_reused(tmp_path):
    """Stores written by earlier sgdsweep versions (a Zarr group in a zip file, with or without
    the checksum comment, or in a directory) are not read where points are found: the shard job
    migrates them to .npz when it starts (sgdsweep.store.migrate), each bitwise equal to the
    original, and simulates none of them; the aggregation equals the one of the original .npz."""
    sweep, files, as_npz, original, legacy = _legacy_sweep(tmp_path)
    hashes = [p.hash for p in sweep.points]
    assert sorted(os.listdir(files.points_dir)) == sorted(p.name for p in legacy.values())
    assert point_store.complete_points(files.points_dir, hashes) == set()  # the readers read .npz only
    reasons = explain(sweep)  # what a plain snakemake's plan says before the shard job runs
    assert all(r.startswith(f"earlier layout ({legacy[h].name}: rewritten as {h}.npz") for h, r in reasons.items())
    (shard,) = sweep.shards
    receipt = run_shard(files.shard_spec(shard), tmp_path / "receipt.json", {})
    assert receipt["simulated"] == []  # reused, nothing simulated
    assert not any(p.exists() for p in legacy.values())
    assert point_store.complete_points(files.points_dir, hashes) == set(hashes)
    for h in hashes:
        _same_as_original(point_store.point_path(files.points_dir, h), original[h])
    as_migrated = build_ensemble(json.loads(files.sweep_spec.read_text()))
    for ds in (as_npz, as_migrated):
        ds.attrs.pop("created_utc")
        ds.attrs.pop("history")  # its first line is dated too
    xr.testing.assert_identical(as_migrated, as_npz)


def test_sgdsweep_run_migrates_before_it_plans(tmp_path, monkeypatch):
    """``sgdsweep run`` migrates the stores of earlier layouts once it holds the sweep's lock,
    before it plans and starts Snakemake: the plan it writes has nothing to simulate."""
    from sgdsweep.run import runner
    from sgdsweep.run.cli import build_parser

    sweep, files, _, original, legacy = _legacy_sweep(tmp_path)
    hashes = [p.hash for p in sweep.points]
    config = write_yaml(tmp_path / "tiny.yaml", _legacy_config(tmp_path))
    seen = {}

    def snakemake(cmd, lock, env, sweep, stored):  # what the workflow would find when it starts
        seen["stored"] = point_store.complete_points(files.points_dir, hashes)
        seen["shards"] = [json.loads(files.shard_spec(s).read_text())["repair"] for s in sweep.shards]
        return 0

    monkeypatch.setattr(runner, "_snakemake", snakemake)
    args = build_parser().parse_args(["run", str(config), "--cores", "1"])
    args.snakemake_args = []  # as sgdsweep.run.cli.main sets them
    assert runner.run_sweep(args, -1) == 0
    assert seen == {"stored": set(hashes), "shards": [0]}  # nothing pending: no shard to repair
    assert not any(p.exists() for p in legacy.values())
    for h in hashes:
        _same_as_original(point_store.point_path(files.points_dir, h), original[h])


def test_migration_is_idempotent_and_a_killed_one_keeps_the_old_store(tmp_path, monkeypatch):
    """A migration killed while it writes the .npz, before it removes the old store, or while it
    removes an old directory store leaves the old store readable under its name (or, once the
    .npz is complete and verified, a temporary that the cleaning of killed writes removes); the
    next migration finishes the job, and one more changes nothing."""
    sweep, files, _, original, legacy = _legacy_sweep(tmp_path)
    hashes = [p.hash for p in sweep.points]
    zipped, directory = legacy[hashes[0]], legacy[hashes[3]]

    class Killed(BaseException):
        pass

    def kill(*args, **kwargs):
        raise Killed

    def kill_midway(path, data):  # half the .npz written to its temporary file, then killed
        path.write_bytes(bytes(data[: len(data) // 2]))
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(point_store, "_write_file", kill_midway)
        with pytest.raises(Killed):
            migrate.migrate_points(files.points_dir)
    assert sorted(os.listdir(files.points_dir)) == sorted(p.name for p in legacy.values())  # no .npz
    for path in legacy.values():
        assert migrate.legacy_problem(path) is None  # the old store reads whole
    with monkeypatch.context() as m:  # killed once the .npz is verified, before the old store goes
        m.setattr(migrate, "_remove", kill)
        with pytest.raises(Killed):
            migrate.migrate_store(zipped)
    assert zipped.exists() and migrate.legacy_problem(zipped) is None
    _same_as_original(point_store.point_path(files.points_dir, hashes[0]), original[hashes[0]])
    with monkeypatch.context() as m:  # killed while the old directory store is removed
        m.setattr(migrate.shutil, "rmtree", kill)
        with pytest.raises(Killed):
            migrate.migrate_store(directory)
    assert not directory.exists()  # renamed aside first: no half-removed store under its name
    aside = [p for p in os.listdir(files.points_dir) if p.startswith(f".{directory.name}.tmp-")]
    assert len(aside) == 1
    result = migrate.migrate_points(files.points_dir)
    assert sorted(result.migrated) == sorted(hashes[1:3]) and result.superseded == [hashes[0]]
    assert not result.damaged
    assert sorted(leftovers.remove_stale_temporaries(files.points_dir, hashes, older_than=0.0)) == \
           [files.points_dir / aside[0]]
    assert sorted(os.listdir(files.points_dir)) == sorted(f"{h}.npz" for h in hashes)
    for h in hashes:
        _same_as_original(point_store.point_path(files.points_dir, h), original[h])
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files.points_dir.iterdir()}
    assert migrate.migrate_points(files.points_dir) == migrate.Migration()  # again: nothing to do
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files.points_dir.iterdir()} == before


def test_a_damaged_store_of_an_earlier_layout_is_not_migrated_but_recomputed(tmp_path, caplog):
    """An old-layout store with a byte changed (zip) or unreadable metadata (directory) is not
    migrated: it is kept, the plan names it corrupt, its point is simulated anew, and the shard
    job then removes it; the good ones are migrated."""
    sweep, files, _, original, legacy = _legacy_sweep(tmp_path)
    hashes = [p.hash for p in sweep.points]
    zipped, directory = legacy[hashes[2]], legacy[hashes[3]]
    raw = bytearray(zipped.read_bytes())
    raw[len(raw) // 3] ^= 1
    zipped.write_bytes(bytes(raw))
    (directory / "zarr.json").write_text("{")
    reasons = explain(sweep)
    for h, path in ((hashes[2], zipped), (hashes[3], directory)):
        assert reasons[h] == ("corrupt (incomplete or unreadable store of an earlier layout, "
                                           f"{path.name}: not migrated)")
    with caplog.at_level("WARNING", logger="sgdsweep.store.migrate"):
        result = migrate.migrate_points(files.points_dir)
    assert sorted(result.migrated) == sorted(hashes[:2]) and set(result.damaged) == set(hashes[2:])
    assert f"point store {zipped} is damaged" in result.damaged[hashes[2]]
    assert f"not migrated (its point is simulated anew): point store {zipped} is damaged" in caplog.text
    assert zipped.exists() and directory.exists()  # kept, as they are
    assert point_store.complete_points(files.points_dir, hashes) == set(hashes[:2])
    for batch in make_batches([p.spec() for p in sweep.points[2:]], 4):  # what the shard job does
        simulate_points(batch, str(files.points_dir))
    assert zipped.exists() and directory.exists()
    # then, with every point stored, what it removes (as it ends)
    assert sorted(migrate.remove_superseded(files.points_dir, hashes)) == sorted([zipped, directory])
    assert point_store.complete_points(files.points_dir, hashes) == set(hashes)
    for h in hashes[2:]:  # the same simulation: the same arrays
        with point_store.PointStore(point_store.point_path(files.points_dir, h)) as store:
            want = original[h][0]["weight_var_replica"][2]
            assert store.read("weight_var_replica").tobytes() == want.tobytes()


def test_stale_temporaries_of_killed_writes_are_removed(tmp_path):
    """What a killed write left (a temporary file, or an earlier layout's temporary zip or
    directory) is removed once it is older than STALE_TEMPORARY_SECONDS, for the points asked
    about only; a younger one may be a write in progress and stays, as do stores and other files."""
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
    stale = [make(".a1.npz.tmp-0badf00d"), make(".a1.zarr.zip.tmp-0badf00d"),
             make(".b2.zarr.tmp-12345678", directory=True)]
    kept = [make(".a1.npz.tmp-live0001", age=None),  # young: possibly being written
            make(".c3.npz.tmp-0badf00d"),  # not one of the points asked about
            make(".a1.npz.old-0badf00d"),  # not a store's temporary
            make("a1.npz.tmp-0badf00d")]
    removed = leftovers.remove_stale_temporaries(tmp_path, ["a1", "b2", "absent"])
    assert sorted(removed) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert point_store.is_complete(point_store.point_path(tmp_path, "a1"))
    assert leftovers.remove_stale_temporaries(tmp_path, ["a1", "b2"]) == []
    assert leftovers.remove_stale_temporaries(tmp_path / "absent", ["a1"]) == []


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
    one = ds.isel(point=[i for i, p in enumerate(sweep.points) if p.params["batch_size"] == 2])
    one.attrs["swept_axes"] = json.dumps(["lr"])  # one swept axis: lr becomes the dimension
    write_ensemble(one, tmp_path / "one.zarr")
    line = open_ensemble(tmp_path / "one.zarr", grid=True)
    assert line["weight_var"].dims == ("lr",) and sorted(line["lr"].values) == [0.2, 0.4]
    # rewriting replaces the ensemble atomically
    write_ensemble(ds.isel(point=[0]), files.ensemble)
    assert xr.open_zarr(files.ensemble).sizes["point"] == 1
    assert not [p for p in os.listdir(files.root) if p.startswith(".ensemble")]


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
