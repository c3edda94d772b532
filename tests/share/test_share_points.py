"""An export's point stores (schema 2: one ``points/<hash>.npz`` member each): any store a run
reads exportable, held once in memory; schemas 1 and 2 kept apart, merged, imported and replayed
alike; stores swapped between points refused; an import's packs."""

from __future__ import annotations

import io
import json
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import test_share
import test_share_bounds
from conftest import cli, make_finished_sweep
from legacy_layouts import as_schema1
from store_forgery import (
    MiB,
    npz,
    point_member,
    verify_peak,
    with_big_array,
)
from test_share import _forged, _import_refused

from sgdsweep.share.archive import ShareError, export_sweep, import_sweep, merge_exports, verify
from sgdsweep.store.points import CHECKSUM_MARKER, PointStore, point_path

#: A finished tiny sweep's export, and a finished precision sweep's: the fixtures of the other share tests.
exported = test_share.exported
precise = test_share_bounds.precise


def test_a_point_store_larger_than_other_members_may_be_is_exported(exported, tmp_path, monkeypatch):
    """A point's store is one member, and a run reads stores up to MAX_POINT_BYTES (2 GiB) while
    other members may hold at most MAX_MEMBER_BYTES (1 GiB): a store above the member limit
    (lowered here to 3 MiB, for a 4 MiB store) is exported and verifies."""
    import shutil

    import sgdsweep.share.verify as verify_module

    sweep_dir, _, manifest = exported
    sweep = tmp_path / "results" / "tiny"
    shutil.copytree(sweep_dir, sweep)
    h = manifest["points"][0]
    path = point_path(sweep / "points", h)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    path.write_bytes(npz(with_big_array(members, 4 * MiB)))  # valid, complete, its point's own
    PointStore(path).check_identity(h)
    monkeypatch.setattr(verify_module, "MAX_MEMBER_BYTES", 3 * MiB)  # stands for 1 GiB
    dest = tmp_path / "out.zip"
    export_sweep(sweep, str(dest))
    assert verify(dest)["members"][f"points/{h}.npz"]["size"] > 3 * MiB
    members_path = tmp_path / "member.zip"  # any other member above the limit is still refused
    _forged(dest, members_path, add=[("figures/big.png", b"x" * (3 * MiB + 1))])
    with pytest.raises(ShareError, match="'figures/big.png' declares 3145729 bytes"):
        verify(members_path)


def test_an_export_that_fails_its_own_verify_is_not_left_at_its_destination(exported, tmp_path, monkeypatch):
    """Export verifies what it wrote before placing it: a file that fails is never left where it
    was asked to go (a retry would find it there and refuse)."""
    import sgdsweep.share.verify as verify_module

    sweep_dir, _, _ = exported
    monkeypatch.setattr(verify_module, "MAX_MEMBER_BYTES", 16)  # every member fails
    dest = tmp_path / "out.zip"
    with pytest.raises(ShareError):
        export_sweep(sweep_dir, str(dest))
    assert not dest.exists()


def test_verify_holds_one_copy_of_a_point_store(exported, tmp_path):
    """No member is held whole in memory but a point's store, one at a time, and that once: a
    48 MiB store is verified within 1.5 times its size."""
    _, dest, manifest = exported
    name, _, members = point_member(dest, manifest)
    size = 48 * MiB
    bad = _forged(dest, tmp_path / "big.zip", replace={name: npz(with_big_array(members, size))})
    peak = verify_peak(bad)
    assert peak < 1.5 * size, f"verify peak {peak / MiB:.0f} MiB for a {size / MiB:.0f} MiB point store"


def test_a_member_name_of_many_parts_is_refused_before_its_parts_are_walked(tmp_path):
    """A name of 16,000 parts (64 kB) is refused by its length before the check that no name is
    also another's directory, which builds every directory of every name."""
    bad = tmp_path / "deep.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("/".join(["a"] * 16000), b"")
    with pytest.raises(ShareError, match="is longer than 1024 characters or 32 parts"):
        verify(bad)


@pytest.mark.parametrize("case", ["v2 + zarr member", "v1 + npz member", "v2 labelled v1", "v1 labelled v2",
                                  "duplicate npz member", "another point's store", "zero-length metadata"])
def test_crafted_layouts_are_refused(exported, tmp_path, case):
    """Point members of one schema in a file of the other, a store with a member twice, another
    point's store, a store of empty members: refused naming the member (exit 2)."""
    _, dest, manifest = exported
    name, raw, members = point_member(dest, manifest)
    h = manifest["points"][0]
    v1 = as_schema1(dest, tmp_path / "v1.zip")

    def version(v):
        return lambda m: m.__setitem__("schema_version", v)

    if case == "v2 + zarr member":
        bad = _forged(dest, tmp_path / "c.zip", add=[(f"points/{h}.zarr/zarr.json", b"{}")])
    elif case == "v1 + npz member":
        bad = _forged(v1, tmp_path / "c.zip", add=[(name, raw)])
    elif case == "v2 labelled v1":
        bad = _forged(dest, tmp_path / "c.zip", change=version("sgdsweep-export/1"))
    elif case == "v1 labelled v2":
        bad = _forged(v1, tmp_path / "c.zip", change=version("sgdsweep-export/2"))
    elif case == "duplicate npz member":
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            for n, d in members.items():
                z.writestr(n, d)
            with pytest.warns(UserWarning, match="Duplicate name"):
                z.writestr("sgdsweep_meta.npy", members["sgdsweep_meta.npy"])
            z.comment = CHECKSUM_MARKER + b"0" * 8
        d = out.getvalue()
        bad = _forged(dest, tmp_path / "c.zip", replace={name: d[:-8] + b"%08x" % zlib.crc32(d[:-8])})
    elif case == "another point's store":
        _, other, _ = point_member(dest, manifest, 1)
        bad = _forged(dest, tmp_path / "c.zip", replace={name: other})
    else:
        bad = _forged(dest, tmp_path / "c.zip", replace={name: npz({n: b"" for n in members})})
    with pytest.raises(ShareError, match="member 'points/"):
        verify(bad)
    proc = cli("verify", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_merge_of_schema_1_and_2_keeps_every_store(tmp_path):
    """Merging an export of schema 1 with one of schema 2 writes schema 2, whose imported stores
    hold what the originals hold, array for array."""
    a_dir = make_finished_sweep(tmp_path / "a", grid={"lr": [0.2, 0.4], "batch_size": [2]})
    b_dir = make_finished_sweep(tmp_path / "b", grid={"lr": [0.4, 0.3], "batch_size": [2]})
    export_sweep(a_dir, str(tmp_path / "a.zip"))
    export_sweep(b_dir, str(tmp_path / "b.zip"))
    as_schema1(tmp_path / "b.zip", tmp_path / "b1.zip")
    merged = merge_exports([str(tmp_path / "a.zip"), str(tmp_path / "b1.zip")], str(tmp_path / "ab.zip"))
    assert merged["schema_version"] == "sgdsweep-export/2" and len(merged["points"]) == 3
    target = import_sweep(tmp_path / "ab.zip", tmp_path / "imported")
    for h in merged["points"]:
        orig = next(p for p in (point_path(d / "points", h) for d in (a_dir, b_dir)) if p.exists())
        with PointStore(orig) as want, PointStore(point_path(target / "points", h)) as got:
            assert want.attrs == got.attrs and want.arrays == got.arrays
            for k in want.arrays:
                a, b = want.read(k), got.read(k)
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def test_precision_export_in_both_schemas_verifies_and_imports(tmp_path, monkeypatch):
    """A precision sweep's export replays its rounds from its stores in either schema; an import
    reads each point's store three times (hash, check, place: the replay uses the attributes the
    check read), so a URL read in place stays within its read budget."""
    from collections import Counter

    from conftest import precise_config, run_rounds

    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.core.paths import atomic_write_text
    from sgdsweep.share import archive, point_members, rounds
    from sgdsweep.share import verify as verify_module
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble
    from sgdsweep.sweep.plan import write_plan

    finished = run_rounds(precise_config(tmp_path / "here"))
    files = write_plan(finished)
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    atomic_write_text(files.fits, json.dumps(fit_ensemble(ds, finished.config["fit"])))
    export_sweep(files.root, str(tmp_path / "p2.zip"))
    as_schema1(tmp_path / "p2.zip", tmp_path / "p1.zip")
    reads: Counter[str] = Counter()
    original = verify_module.member_blocks

    def counted(zf, name, *args, **kwargs):
        reads[name] += 1
        return original(zf, name, *args, **kwargs)

    for module in (verify_module, point_members, rounds, archive):
        monkeypatch.setattr(module, "member_blocks", counted)
    for f in ("p2.zip", "p1.zip"):
        reads.clear()
        m = verify(tmp_path / f)
        target = import_sweep(tmp_path / f, tmp_path / f"R-{f}")
        for h in m["points"]:
            PointStore(point_path(target / "points", h)).check_identity(h)
        if f == "p2.zip":
            assert {reads[f"points/{h}.npz"] for h in m["points"]} == {5}  # verify 2, import 3


def test_import_packs_its_points_in_files_of_even_sizes(exported, tmp_path, monkeypatch):
    """An import hands its points to the packer in runs of sizes differing by one at most, each
    at most IMPORT_PACK_POINTS, every point once, in order."""
    from sgdsweep.share import archive

    _, dest, manifest = exported
    runs: list[list[str]] = []
    monkeypatch.setattr(archive, "pack_points", lambda directory, label, hashes: runs.append(list(hashes)))
    monkeypatch.setattr(archive, "IMPORT_PACK_POINTS", 3)
    import_sweep(dest, tmp_path / "R")
    assert [len(r) for r in runs] == [2, 2] and [h for r in runs for h in r] == manifest["points"]


def test_incomplete_point_group_of_schema_1_is_refused_on_import(exported, tmp_path):
    """In an export of schema 1 (point stores as Zarr groups), a group not marked complete is
    refused by the import, which reads the stores; nothing is written."""
    _, dest, manifest = exported
    old = as_schema1(dest, tmp_path / "schema1.zip")
    name = f"points/{manifest['points'][0]}.zarr/zarr.json"
    with zipfile.ZipFile(old) as zf:
        meta = zf.read(name)
    assert b'"sgdsweep_complete": true' in meta
    bad = _forged(old, tmp_path / "incomplete.zip",
                  replace={name: meta.replace(b'"sgdsweep_complete": true', b'"sgdsweep_complete": false')})
    verify(bad)  # a consistent file: only the import, which reads the stores, can tell
    work = tmp_path / "work"
    work.mkdir()
    proc = cli("import", str(bad), "--results-dir", "R", cwd=work)
    assert proc.returncode == 2 and "is not marked complete" in proc.stderr, proc.stderr
    assert list((work / "R").iterdir()) == []


def _swapped(src: Path, dest: Path, a: str, b: str) -> Path:
    """A copy of the export ``src`` with the point stores of points ``a`` and ``b`` swapped (each
    member of one under the other's name: ``points/<hash>.npz``, or each key of a schema-1 Zarr
    group ``points/<hash>.zarr/<key>``), its manifest and checksum made to match."""
    with zipfile.ZipFile(src) as zf:
        stores = {n: zf.read(n) for n in zf.namelist() if n.startswith("points/")}
    replace = {}
    for x, y in ((a, b), (b, a)):
        for name in stores:
            for form in ("points/{}.npz", "points/{}.zarr/"):
                twin = name.replace(form.format(x), form.format(y), 1)
                if name.startswith(form.format(x)) and twin in stores:
                    replace[name] = stores[twin]
    return _forged(src, dest, replace=replace)


@pytest.mark.parametrize("schema", [2, 1])
def test_swapped_point_stores_are_refused(exported, tmp_path, schema):
    """Two points' stores swapped in an export, its manifest rewritten to match, would verify,
    import and run with each point's hash labelling the other's results: verify and import refuse
    it (exit 2) naming the member and whose results it holds, and the import writes nothing; in
    an export of the earlier schema 1 too."""
    _, dest, manifest = exported
    if schema == 1:
        dest = as_schema1(dest, tmp_path / "schema1.zip")
    a, b = manifest["points"][:2]
    bad = _swapped(dest, tmp_path / "swapped.zip", a, b)
    name = f"points/{a}.npz" if schema == 2 else f"points/{a}.zarr/zarr.json"
    message = (rf"member '{name}': the point store under point {a}'s name is not that "
               rf"point's \(it holds the results of point {b}\)")
    _import_refused(bad, tmp_path, message)
    proc = cli("verify", str(bad))
    assert proc.returncode == 2 and re.search(message, proc.stderr), proc.stderr


def test_an_export_of_schema_1_imports_the_same_point_stores(exported, tmp_path):
    """An export written before point stores were one member each (schema 1: Zarr groups)
    verifies and imports to point stores holding what an import of the current schema holds,
    array for array and attribute for attribute, and its sweep re-runs without simulating."""
    sweep_dir, dest, manifest = exported
    old = as_schema1(dest, tmp_path / "schema1.zip")
    assert verify(old)["schema_version"] == "sgdsweep-export/1"
    new_target, old_target = import_sweep(dest, tmp_path / "new"), import_sweep(old, tmp_path / "old")
    for h in manifest["points"]:
        with (PointStore(point_path(new_target / "points", h)) as a,
              PointStore(point_path(old_target / "points", h)) as b):
            assert a.raw == _point_bytes(sweep_dir, h)
            assert a.attrs == b.attrs and a.arrays == b.arrays
            for array in a.arrays:
                np.testing.assert_array_equal(a.read(array), b.read(array), strict=True)


def _point_bytes(sweep_dir: Path, h: str) -> bytes:
    with PointStore(point_path(sweep_dir / "points", h)) as store:
        return store.raw
