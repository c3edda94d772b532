"""Incremental aggregation: a grown sweep's ensemble gets the new points' rows appended (only their
stores read), equal bit for bit to a full rebuild; a failed or killed append never replaces the
ensemble; what cannot be appended is rebuilt."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import REPO, cli, tiny_config

from sgdsweep.core.identity import content_hash
from sgdsweep.store import aggregate, aggregate_incremental, provenance
from sgdsweep.store import points as point_store
from sgdsweep.store.integrity import METADATA_ATTR


def _store(points_dir: Path, i: int, reps: int = 3, modes: int = 2, **params) -> dict:
    """A point store of point ``i`` (ragged: replica and mode counts as given); its spec entry."""
    rng = np.random.default_rng(i)
    arrays = {"weight_var_replica": (("replica",), rng.random(reps)),
              "diverged_step": (("replica",), np.where(rng.random(reps) < 0.3, 5, -1)),
              "weight_cov_eigenvalues": (("mode",), rng.random(modes)),
              "noise_cov_ratio": (("lag",), rng.random(2)), "lag": (("lag",), np.array([1, 2])),
              "singular_values_W": (("replica", "sv"), rng.random((reps, 2)))}
    summary = {"weight_var": float(rng.random()), "diverged": bool(i % 3 == 1), "burn_in": 10,
               "theory_formulas": {"weight_cov": f"formula {i % 2}"},
               "weight_var_theory": 0.5 if i % 4 else None,
               "theory_reasons": {} if i % 4 else {"weight_cov": f"reason {i % 8}"}}
    params = {"lr": 0.1 * (i + 1), "noise": "minibatch", **params}
    h = content_hash(params)
    point_store.write_point(point_store.point_path(points_dir, h), arrays,
                            {"summary": summary, "params": params, "point_hash": h, "simulation_seconds": 0.5 + i})
    return {"hash": h, "shard": f"s{i // 3}"}


def _spec(points_dir: Path, entries: list[dict], sweep_hash: str = "abc", model: str = "linear") -> dict:
    """The sweep spec of ``entries``; its grid (and so its sweep_hash) names the points' lr values."""
    return {"points_dir": str(points_dir), "points": entries, "coords": ["lr", "noise"], "sweep": "t",
            "sweep_hash": f"{sweep_hash}-{len(entries)}",
            "simulation_config": {"model": {"kind": model}, "grid": {"lr": len(entries)}}}


def _files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _root_attrs(path: Path) -> dict:
    attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    attrs.pop(METADATA_ATTR)
    for key in aggregate_incremental.TIME_ATTRS:  # the time of writing: documented to differ
        attrs.pop(key, None)
    return attrs


def assert_bitwise_equal(got: Path, want: Path) -> None:
    """Every file of the ensemble ``got`` is byte for byte that of ``want`` (chunks and each
    array's zarr.json), but the root zarr.json, whose attributes are equal but the time of writing."""
    a, b = _files(got), _files(want)
    assert sorted(a) == sorted(b)
    differ = sorted(k for k in a if a[k] != b[k])
    assert differ in ([], ["zarr.json"]), differ
    assert _root_attrs(got) == _root_attrs(want)
    record = [zarr.open_group(str(p), mode="r").attrs[METADATA_ATTR]["arrays"] for p in (got, want)]
    assert record[0] == record[1]
    ga, gb = (zarr.open_group(str(p), mode="r") for p in (got, want))
    for name, arr in ga.arrays():
        x, y = np.asarray(arr[...]), np.asarray(gb[name][...])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.dtype.kind in "fiub":
            assert x.tobytes() == y.tobytes(), name
        else:
            assert list(x.ravel()) == list(y.ravel()), name


def _full(spec: dict, path: Path) -> Path:
    aggregate.write_ensemble(aggregate.build_ensemble(spec), path)
    return path


@pytest.fixture(autouse=True)
def current_code_version():
    """The code version as it is now (the checkout may have moved since another test read it):
    another one makes the append rebuild."""
    provenance.code_version.cache_clear()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 2 points: the append fills a partial chunk, adds new ones and links whole ones."""
    monkeypatch.setattr(aggregate, "CHUNK_BYTES", 16)
    monkeypatch.setattr(aggregate, "MIN_CHUNK_POINTS", 2)


def test_appended_ensemble_is_bitwise_a_full_rebuild_and_the_old_one_is_never_written(tmp_path, small_chunks):
    """5 points, then 4 more (a new lr, new theory formulas and reasons, fewer replicas and modes:
    padded): only the new stores are read; every chunk and array metadata equals a full rebuild's;
    the old ensemble's files (observed through hard links of their own) keep their bytes."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(5)]
    path = _full(_spec(points, entries), tmp_path / "ensemble.zarr")
    before = _files(path)
    observer = tmp_path / "observer"
    for rel in before:
        (observer / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(path / rel, observer / rel)
    entries += [_store(points, 5 + i, reps=2 if i else 3, modes=1) for i in range(4)]
    spec = _spec(points, entries)
    read = []
    opened = point_store.PointStore.__init__

    def counting(self, where, *args, **kwargs):
        read.append(Path(where).name)
        opened(self, where, *args, **kwargs)

    point_store.PointStore.__init__ = counting
    try:
        n, how = aggregate_incremental.update_ensemble(spec, path)
    finally:
        point_store.PointStore.__init__ = opened
    assert (n, how) == (9, "appended 4 points")
    # the 4 new stores, and the first old and first new one again for the swept axes' values
    assert len(read) == 6 and {r.split(".")[0] for r in read} == {e["hash"] for e in [entries[0], *entries[5:]]}
    assert _files(observer) == before
    assert_bitwise_equal(path, _full(spec, tmp_path / "full.zarr"))
    ds = aggregate.load_ensemble(path)
    assert ds.sizes["point"] == 9 and json.loads(ds.attrs["swept_axes"]) == ["lr"]
    assert ds["weight_var_theory"].attrs["formula"] == "formula 0 | formula 1"
    assert ds["weight_var_theory"].attrs["missing_because"] == "reason 0 | reason 4"
    assert sorted(os.listdir(tmp_path)) == ["ensemble.zarr", "full.zarr", "observer", "points"]


def test_aggregate_job_appends_then_equals_a_full_rebuild(tmp_path):
    """The workflow's job (python -m sgdsweep aggregate … --receipt): the grown spec appends, logs
    it, writes the receipt; the result is a full rebuild's, bit for bit (default chunks)."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(4)]
    spec_path, path, receipt = tmp_path / "sweep.json", tmp_path / "ensemble.zarr", tmp_path / "ensemble.json"
    spec_path.write_text(json.dumps(_spec(points, entries)))
    first = cli("aggregate", str(spec_path), "--out", str(path), "--receipt", str(receipt))
    assert first.returncode == 0 and "rebuilt: no ensemble" in first.stderr, first.stderr
    entries += [_store(points, 4), _store(points, 5, noise="full")]
    spec_path.write_text(json.dumps(_spec(points, entries)))
    second = cli("aggregate", str(spec_path), "--out", str(path), "--receipt", str(receipt))
    assert second.returncode == 0 and "ensemble with 6 points" in second.stderr and "appended 2 points" in second.stderr
    assert json.loads(receipt.read_text())["points"] == 6
    full = _full(_spec(points, entries), tmp_path / "full.zarr")
    assert_bitwise_equal(path, full)
    assert json.loads(aggregate.load_ensemble(path).attrs["swept_axes"]) == ["lr", "noise"]


def test_a_killed_append_is_never_taken_as_current(tmp_path, small_chunks):
    """The aggregate job killed in the middle of an append (SIGKILL-like exit after one array
    grew): the ensemble in place is byte for byte the old one and loads; the receipt is gone, so
    the workflow reruns the job, which then appends and removes the leftover."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(5)]
    path, receipt, spec_path = tmp_path / "ensemble.zarr", tmp_path / "ensemble.json", tmp_path / "sweep.json"
    _full(_spec(points, entries), path)
    receipt.write_text("{}")
    before = _files(path)
    entries += [_store(points, 5 + i) for i in range(3)]
    spec_path.write_text(json.dumps(_spec(points, entries)))
    code = ("import os, sys, zarr\n"
            "from sgdsweep.store import aggregate\n"
            "aggregate.CHUNK_BYTES, aggregate.MIN_CHUNK_POINTS = 16, 2\n"
            "grow = zarr.Array.append\n"
            "def killed(self, *a, **k):\n"
            "    grow(self, *a, **k)\n"
            "    os._exit(9)\n"
            "zarr.Array.append = killed\n"
            "from sgdsweep.run.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code, "aggregate", str(spec_path), "--out", str(path),
                           "--receipt", str(receipt)], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 9, proc.stderr
    assert not receipt.exists()
    assert _files(path) == before
    assert aggregate.load_ensemble(path).sizes["point"] == 5
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".ensemble.zarr.tmp-")]
    assert len(leftovers) == 1
    n, how = aggregate_incremental.update_ensemble(_spec(points, entries), path)
    assert (n, how) == (8, "appended 3 points")
    assert_bitwise_equal(path, _full(_spec(points, entries), tmp_path / "full.zarr"))
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_failed_append_leaves_the_ensemble_as_it_was(tmp_path, small_chunks, monkeypatch):
    """A new point's store is damaged: the append fails naming it, the ensemble is unchanged."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(3)]
    path = _full(_spec(points, entries), tmp_path / "ensemble.zarr")
    before = _files(path)
    entries.append(_store(points, 3))
    victim = point_store.point_path(points, entries[-1]["hash"])
    victim.write_bytes(b"not a zip")
    with pytest.raises(Exception, match=str(victim)):
        aggregate_incremental.update_ensemble(_spec(points, entries), path)
    assert _files(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ensemble.zarr", "points"]


def _damage_chunk(path: Path) -> None:
    chunk = next(p for p in (path / "weight_var").rglob("*") if p.is_file() and p.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 1
    chunk.write_bytes(bytes(raw))


@pytest.mark.parametrize("case, reason", [
    ("removed", "points were removed, reordered or changed"),
    ("reordered", "points were removed, reordered or changed"),
    ("config", "simulation config other than the grid (seed, model, dynamics) changed"),
    ("damaged", "the ensemble is damaged"),
    ("wider", "wider along"),
    ("same", "no point to add"),
])
def test_what_cannot_be_appended_is_rebuilt(tmp_path, small_chunks, case, reason):
    """Removed or reordered points, another simulation config (sweep_hash), a damaged ensemble
    (a chunk failing its CRC-32C), new points with more replicas than the ensemble has, nothing
    new: the ensemble is rebuilt from every store, equal to a full rebuild."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(4)]
    path = _full(_spec(points, entries), tmp_path / "ensemble.zarr")
    sweep_hash, model = "abc", "linear"
    if case == "removed":
        entries = entries[1:] + [_store(points, 4)]
    elif case == "reordered":
        entries = [entries[1], entries[0], *entries[2:], _store(points, 4)]
    elif case == "config":
        sweep_hash, model = "other", "quadratic"
        entries.append(_store(points, 4))
    elif case == "damaged":
        _damage_chunk(path)
        entries.append(_store(points, 4))
    elif case == "wider":
        entries.append(_store(points, 4, reps=6))
    spec = _spec(points, entries, sweep_hash, model)
    n, how = aggregate_incremental.update_ensemble(spec, path)
    assert n == len(entries) and how.startswith("rebuilt: ") and reason in how, how
    assert_bitwise_equal(path, _full(spec, tmp_path / "full.zarr"))


def test_plan_lists_the_previous_points_first_in_their_order(tmp_path):
    """A grown sweep's spec (plan/sweep.json) keeps the points of the previous spec in their order
    and lists the new ones after them, in the sweep's order (so its ensemble grows by appending)."""
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import plan_texts, write_plan

    cfg = tiny_config(results_dir=str(tmp_path / "results"))
    first = build_sweep(cfg)
    files = write_plan(first)
    before = [e["hash"] for e in json.loads(files.sweep_spec.read_text())["points"]]
    cfg["grid"]["lr"] = [0.1, 0.2, 0.3, 0.4]
    grown = build_sweep(cfg)
    listed = [e["hash"] for e in json.loads(plan_texts(grown)[files.sweep_spec])["points"]]
    new = [p.hash for p in grown.points if p.hash not in set(before)]
    assert len(new) == 4 and listed == before + new
    cfg["grid"]["lr"] = [0.2, 0.3]  # removed points drop out; the rest keep their order
    fewer = build_sweep(cfg)
    kept = [e["hash"] for e in json.loads(plan_texts(fewer)[files.sweep_spec])["points"]]
    assert kept == [h for h in before if h in {p.hash for p in fewer.points}] + [
        p.hash for p in fewer.points if p.hash not in set(before)]


def test_stores_read_by_several_processes_give_the_same_ensemble_and_first_error(tmp_path, monkeypatch):
    """Many points are read by several processes (slices put back in order): the ensemble is the
    one read point by point, and a damaged store stops it naming the first such store in order."""
    from sgdsweep.errors import StoreError
    from sgdsweep.store import aggregate_read

    points = tmp_path / "points"
    entries = [_store(points, i, reps=2 + i % 3) for i in range(9)]
    one = aggregate_read.read_points(points, entries, workers=1)
    several = aggregate_read.read_points(points, entries, workers=2)
    assert [a["point_hash"] for a, _ in several] == [e["hash"] for e in entries]
    for (a1, r1), (a2, r2) in zip(one, several):
        assert a1 == a2 and list(r1) == [k for k in r2 if k != "lag" or k in r1]
        assert all(np.array_equal(r1[k], r2[k]) for k in r1)
    monkeypatch.setattr(aggregate_read, "readers", lambda n: 2)
    spec = _spec(points, entries)
    ds = aggregate.build_ensemble(spec)
    monkeypatch.setattr(aggregate_read, "readers", lambda n: 1)
    seq = aggregate.build_ensemble(spec)
    for name in ds.variables:
        assert np.array_equal(ds[name].values, seq[name].values, equal_nan=ds[name].dtype.kind == "f"), name
    for i in (6, 3):
        point_store.point_path(points, entries[i]["hash"]).write_bytes(b"not a zip")
    with pytest.raises(StoreError, match=entries[3]["hash"]):
        aggregate_read.read_points(points, entries, workers=2)


def test_npy_members_with_a_header_seen_before_read_as_numpy_reads_them():
    """A member whose header bytes were parsed before is read from its data alone: the same
    array as numpy.lib.format.read_array (data type, shape, order, bytes, writeable); a member
    whose data do not match that header, or holds objects, is refused as NumPy refuses it."""
    import io

    from conftest import npy

    from sgdsweep.store.npy import read_npy

    table = np.zeros(3, dtype=[("a", "<f8"), ("b", "<i8")])
    table["a"], table["b"] = [0.5, np.nan, 2.0], [1, -1, 3]
    arrays = [np.arange(5.0), np.asfortranarray(np.arange(6.0).reshape(2, 3)), table, np.array(b"{}"),
              np.arange(4, dtype=">i4").reshape(2, 2), np.zeros((0, 3))]
    for array in arrays:
        for _ in range(2):  # parsed, then from the remembered header
            raw = npy(array)
            got, want = read_npy(raw), np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes("A") == want.tobytes("A")
            assert got.flags.f_contiguous == want.flags.f_contiguous and got.flags.writeable
    for raw in (npy(np.arange(5.0))[:-8],
                npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)):
        with pytest.raises(ValueError):
            np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
        with pytest.raises(ValueError):
            read_npy(raw)


def test_a_grown_sweep_appends_its_new_points_to_its_ensemble(tmp_path):
    """A finished sweep (simulated stores) gains an lr value that sorts first: its plan lists the
    old points first, the aggregate job appends the new ones, equal to a full rebuild."""
    from conftest import make_finished_sweep

    from sgdsweep.run.execute import make_batches
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store.points import is_complete, point_path
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    root = make_finished_sweep(tmp_path)
    cfg = tiny_config(results_dir=str(tmp_path / "results"), dynamics={"steps": 1500, "replicas": 4})
    cfg["grid"]["lr"] = [0.1, 0.2, 0.4]
    files = write_plan(build_sweep(cfg))
    assert files.root == root
    spec = json.loads(files.sweep_spec.read_text())
    todo = [e["hash"] for e in spec["points"] if not is_complete(point_path(files.points_dir, e["hash"]))]
    assert [e["hash"] for e in spec["points"][-2:]] == todo  # the new points come last
    sweep = build_sweep(cfg)
    for batch in make_batches([p.spec() for p in sweep.points if p.hash in todo], 4):
        simulate_points(batch, str(files.points_dir))
    assert aggregate_incremental.update_ensemble(spec, files.ensemble) == (6, "appended 2 points")
    assert_bitwise_equal(files.ensemble, _full(spec, tmp_path / "full.zarr"))


def test_old_points_moved_to_other_shards_are_appended_to_with_their_new_shards(tmp_path, small_chunks):
    """A grown sweep may group its data sets into more shards, moving old points: the append
    rewrites the shard coordinate whole, equal to a full rebuild."""
    points = tmp_path / "points"
    entries = [_store(points, i) for i in range(5)]
    path = _full(_spec(points, entries), tmp_path / "ensemble.zarr")
    entries = [{**e, "shard": f"t{i % 2}"} for i, e in enumerate(entries)] + [_store(points, 5)]
    spec = _spec(points, entries)
    assert aggregate_incremental.update_ensemble(spec, path) == (6, "appended 1 point")
    assert_bitwise_equal(path, _full(spec, tmp_path / "full.zarr"))
    assert list(aggregate.load_ensemble(path)["shard"].values) == [e["shard"] for e in entries]
