"""Packs: a shard's point stores in one file, each checked alone; few files under points/."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, make_finished_sweep, run_cli, write_yaml

from sgdsweep.share.archive import export_sweep, import_sweep, verify
from sgdsweep.store import packs
from sgdsweep.store.aggregate import build_ensemble
from sgdsweep.store.leftovers import remove_pack_leftovers
from sgdsweep.store.points import PointStore, complete_points, is_complete, point_path, read_attrs
from sgdsweep.sweep.config import build_sweep
from sgdsweep.sweep.explain import explain
from sgdsweep.sweep.plan import PlanFiles, pending_points

LRS = [round(0.2 + 0.02 * i, 2) for i in range(packs.PACK_MIN_POINTS)]
#: Two data sets (samples_per_param 10 and 12), each with PACK_MIN_POINTS points: two shards.
GRID = {"lr": LRS, "batch_size": [2], "samples_per_param": [10, 12]}


def _config(root: Path) -> dict:
    from conftest import tiny_config

    return tiny_config(results_dir=str(root / "results"), dynamics={"steps": 1500, "replicas": 4}, grid=GRID)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A finished sweep of two shards (two data sets), its points single stores."""
    root = tmp_path_factory.mktemp("packs")
    sweep_dir = make_finished_sweep(root, grid=GRID)
    return root, sweep_dir


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def _files(points_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(points_dir).as_posix(): p.read_bytes() for p in points_dir.rglob("*") if p.is_file()}


def _shard_job(root: Path, sweep, points, name: str) -> dict:
    """Run the real shard job (``python -m sgdsweep simulate-shard``) on a spec holding
    ``points`` (here: several data sets' points in one shard); its receipt."""
    spec = root / f"{name}.json"
    spec.write_text(json.dumps({"shard": name, "points": [p.spec() for p in points],
                                "points_dir": str(PlanFiles(sweep.directory).points_dir)}))
    execution = root / "execution.json"
    execution.write_text(json.dumps({"workers": 1, "points_per_task": 8}))
    receipt = root / f"{name}.receipt.json"
    proc = run_cli("simulate-shard", str(spec), "--receipt", str(receipt), "--execution", str(execution),
                   cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(receipt.read_text())


def _flip_in_array(pack: Path, point_hash: str) -> None:
    """Flip one bit inside an array of point ``point_hash``'s member of ``pack`` (the pack's own
    zip directory intact)."""
    with zipfile.ZipFile(pack) as zf:
        info = zf.getinfo(f"{point_hash}.npz")
        member = zf.read(info)
    with PointStore(packs.member_path(pack, point_hash)) as store:
        chunk = store.read("weight_cov").tobytes()
    raw = bytearray(pack.read_bytes())
    start = raw.index(member)  # stored uncompressed: the member's bytes appear as they are
    raw[start + member.index(chunk) + 3] ^= 0x10
    pack.write_bytes(bytes(raw))


def test_a_shard_job_packs_and_reruns_only_a_damaged_member(stored, tmp_path):
    """The shard job packs a multi-data-set shard's stores into one file (the single stores
    removed); a bit flipped inside one member's array makes only that point corrupt in the plan,
    and the next shard job simulates only it, the other members' bytes unchanged."""
    _, original = stored
    sweep_dir = _copy(original, tmp_path / "results" / "tiny")
    cfg = _config(tmp_path)
    sweep = build_sweep(cfg)
    assert sweep.directory == sweep_dir and len(sweep.shards) == 2
    points = list(sweep.points)
    points_dir = PlanFiles(sweep_dir).points_dir
    first = _shard_job(tmp_path, sweep, points, "both-data-sets")
    assert first["simulated"] == []
    files = _files(points_dir)
    assert [n for n in files if not n.startswith("packs/")] == []  # every single store packed
    (pack_name,) = [n for n in files if n.startswith("packs/")]
    pack = points_dir / pack_name
    assert packs.PACK_NAME.match(pack.name).group(1) == "both-data-sets"
    assert complete_points(points_dir, (p.hash for p in points)) == {p.hash for p in points}
    assert pending_points(sweep) == {} and explain(sweep) == {}
    with zipfile.ZipFile(pack) as zf:  # members: the stores' bytes unchanged, uncompressed
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
        before = {n: zf.read(n) for n in zf.namelist()}
    assert before == {n: (original / "points" / n).read_bytes() for n in before}

    victim = points[3]
    _flip_in_array(pack, victim.hash)
    assert not is_complete(point_path(points_dir, victim.hash))
    assert explain(sweep) == {victim.hash: "corrupt (incomplete or unreadable store)"}
    assert pending_points(sweep) == {victim.shard: [victim.hash]}
    plan = cli("plan", str(write_yaml(tmp_path / "t.yaml", cfg)), cwd=tmp_path)
    assert f"{len(points)} points, {len(points) - 1} stored, 1 to simulate (1 corrupt)" in plan.stdout, plan.stdout

    second = _shard_job(tmp_path, sweep, points, "both-data-sets")
    assert second["simulated"] == [victim.hash]
    files = _files(points_dir)
    (new_name,) = [n for n in files if n.startswith("packs/")]
    assert len(files) == 1 and new_name != pack_name  # one pack replaced the old one
    with zipfile.ZipFile(points_dir / new_name) as zf:
        after = {n: zf.read(n) for n in zf.namelist()}
    assert set(after) == set(before)
    assert {n: b for n, b in after.items() if n != f"{victim.hash}.npz"} == {
        n: b for n, b in before.items() if n != f"{victim.hash}.npz"}
    assert complete_points(points_dir, (p.hash for p in points)) == {p.hash for p in points}


def test_packed_stores_read_aggregate_export_and_import(stored, tmp_path, monkeypatch):
    """Packed stores read as single ones: the ensemble built from them is bitwise the one built
    from single stores; a packed sweep exports, verifies and imports (the import packed too, at
    most IMPORT_PACK_POINTS stores to a pack, in packs of even sizes, each store's bytes
    unchanged), and the file count under points/ stays at one per shard."""
    from sgdsweep.share import archive

    monkeypatch.setattr(archive, "IMPORT_PACK_POINTS", 20)
    _, original = stored
    sweep_dir = _copy(original, tmp_path / "results" / "tiny")
    sweep = build_sweep(_config(tmp_path))
    points_dir = PlanFiles(sweep_dir).points_dir
    spec = json.loads(PlanFiles(sweep_dir).sweep_spec.read_text())
    single = build_ensemble(spec)
    for shard, points in sweep.shards.items():
        assert packs.pack_points(points_dir, packs.label_for(shard), (p.hash for p in points)) is not None
    assert len(_files(points_dir)) == len(sweep.shards) == 2
    assert all(isinstance(point_path(points_dir, p.hash), packs.MemberPath) for p in sweep.points)
    assert read_attrs(point_path(points_dir, sweep.points[0].hash))["point_hash"] == sweep.points[0].hash
    packed = build_ensemble(spec)
    for ds in (single, packed):  # when each was built
        for when in ("created_utc", "history"):
            ds.attrs.pop(when, None)
    assert packed.identical(single)
    for name in single.data_vars:
        np.testing.assert_array_equal(packed[name].values, single[name].values)

    manifest = export_sweep(sweep_dir, str(tmp_path / "packed.zip"))
    assert len(manifest["points"]) == len(sweep.points)
    assert verify(tmp_path / "packed.zip")["points"] == manifest["points"]
    with zipfile.ZipFile(tmp_path / "packed.zip") as zf:
        assert sum(n.startswith("points/") for n in zf.namelist()) == len(sweep.points)  # one member a point
        for p in sweep.points:  # each the bytes of its store, packed or single
            with PointStore(point_path(points_dir, p.hash)) as store:
                assert zf.read(f"points/{p.hash}.npz") == store.raw
    imported = import_sweep(str(tmp_path / "packed.zip"), tmp_path / "elsewhere" / "results") / "points"
    assert [n for n in _files(imported) if not n.startswith("packs/")] == []  # 32 points: packed
    assert sorted(len(names) for _, names in packs.listing(imported)) == [16, 16]  # two packs of even sizes
    for p in sweep.points:
        with PointStore(point_path(imported, p.hash)) as a, PointStore(point_path(points_dir, p.hash)) as b:
            assert a.raw == b.raw
    assert complete_points(imported, (p.hash for p in sweep.points)) == {p.hash for p in sweep.points}
    for p in sweep.points[:3]:
        with PointStore(point_path(imported, p.hash)) as a, PointStore(point_path(points_dir, p.hash)) as b:
            assert a.attrs == b.attrs
            np.testing.assert_array_equal(a.read("weight_cov"), b.read("weight_cov"))


def test_few_points_stay_single_and_many_loose_stores_are_packed(stored, tmp_path):
    """A shard with fewer than PACK_MIN_POINTS single stores and no pack keeps them (a small
    sweep has one file per point); a later addition to a packed shard is packed with the old
    members into a new pack (a repack), the old pack removed."""
    _, original = stored
    points_dir = _copy(original / "points", tmp_path / "points")
    hashes = sorted(p.name[:-4] for p in points_dir.glob("*.npz"))
    assert packs.pack_points(points_dir, "few", hashes[:3]) is None  # 3 < PACK_MIN_POINTS: kept single
    first = packs.pack_points(points_dir, "s", hashes[:packs.PACK_MIN_POINTS])
    assert first is not None and sorted(_files(points_dir)).count(f"packs/{first.name}") == 1
    late = hashes[packs.PACK_MIN_POINTS]
    assert (points_dir / f"{late}.npz").is_file()
    second = packs.pack_points(points_dir, "s", [*hashes[:packs.PACK_MIN_POINTS], late])
    assert second is not None and not first.exists() and not (points_dir / f"{late}.npz").exists()
    assert complete_points(points_dir, hashes) == set(hashes)
    with zipfile.ZipFile(second) as zf:
        assert len(zf.namelist()) == packs.PACK_MIN_POINTS + 1


def test_killed_packings_leave_nothing_that_is_read_wrong(stored, tmp_path):
    """A pack written but whose old pack and single stores were not yet removed (a killed
    packing) is read either way and merged by the next packing; a cut-short pack's points count
    as missing; a pack's stale temporary is removed."""
    _, original = stored
    points_dir = _copy(original / "points", tmp_path / "points")
    hashes = sorted(p.name[:-4] for p in points_dir.glob("*.npz"))[: packs.PACK_MIN_POINTS]
    keep = {h: (points_dir / f"{h}.npz").read_bytes() for h in hashes}
    pack = packs.pack_points(points_dir, "s", hashes)
    for h, raw in keep.items():  # the single stores back, as if their removal was killed
        (points_dir / f"{h}.npz").write_bytes(raw)
    assert complete_points(points_dir, hashes) == set(hashes)
    twin = pack.with_name("s.000000000000.zip")  # and a second pack of the shard
    twin.write_bytes(pack.read_bytes())
    merged = packs.pack_points(points_dir, "s", hashes)
    assert merged is not None and [p.name for p, _ in packs.listing(points_dir)] == [merged.name]
    assert not any((points_dir / f"{h}.npz").exists() for h in hashes)
    assert complete_points(points_dir, hashes) == set(hashes)
    merged.write_bytes(merged.read_bytes()[: merged.stat().st_size // 2])  # cut short
    assert complete_points(points_dir, hashes) == set()
    tmp = packs.packs_dir(points_dir) / ".s.0123456789ab.zip.tmp-1a2b3c4d"
    tmp.write_bytes(b"partial")
    os.utime(tmp, (time.time() - 3600, time.time() - 3600))
    assert remove_pack_leftovers(points_dir) == [tmp] and not tmp.exists()


def test_zarr_groups_the_tests_write_for_earlier_layouts_are_zarrs_own(stored, tmp_path):
    """A point's store as a Zarr group's keys, written in memory (as exports of schema 1 held
    points, which the share tests craft with it), is byte for byte what Zarr's own API writes into
    a directory, for single and packed stores."""
    from legacy_layouts import write_zarr_group, zarr_group_keys

    _, original = stored
    points_dir = _copy(original / "points", tmp_path / "points")
    hashes = sorted(p.name[:-4] for p in points_dir.glob("*.npz"))
    single = {h: dict(zarr_group_keys(point_path(points_dir, h))) for h in hashes[:2]}
    packs.pack_points(points_dir, "s", hashes)
    for h in hashes[:2]:
        path = point_path(points_dir, h)
        assert isinstance(path, packs.MemberPath)
        group = tmp_path / f"{h}.zarr"
        write_zarr_group(path, group)
        on_disk = {f.relative_to(group).as_posix(): f.read_bytes() for f in group.rglob("*") if f.is_file()}
        assert dict(zarr_group_keys(path)) == on_disk == single[h]
