"""An export's point stores (schema 2: one ``points/<hash>.npz`` member each): checked as a run
checks its own stores and more (every array from its header), held once in memory, any store a
run reads exportable; schemas 1 and 2 apart, merged and replayed alike."""

from __future__ import annotations

import io
import json
import re
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import test_share_bounds
from conftest import cli, make_finished_sweep
from legacy_layouts import as_schema1
from test_share import _forged, _import_refused, _store_with

from sgdsweep.share.archive import ShareError, export_sweep, import_sweep, merge_exports, verify
from sgdsweep.store.points import CHECKSUM_MARKER, PointStore, point_path

MiB = 1 << 20
#: A finished precision sweep's export, the fixture of the bounds tests.
precise = test_share_bounds.precise


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("adv")
    sweep_dir = make_finished_sweep(root)
    dest = root / "tiny.zip"
    manifest = export_sweep(sweep_dir, str(dest))
    return sweep_dir, dest, manifest


def _point(dest: Path, manifest: dict, i: int = 0) -> tuple[str, bytes, dict[str, bytes]]:
    name = f"points/{manifest['points'][i]}.npz"
    with zipfile.ZipFile(dest) as zf:
        raw = zf.read(name)
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        members = {info.filename: z.read(info) for info in z.infolist()}
    return name, raw, members


def _verify_peak(path: Path, refused: str | None = None) -> int:
    """Peak bytes Python allocates verifying ``path``; with ``refused``, verify must refuse it so."""
    tracemalloc.start()
    try:
        if refused is None:
            verify(path)
        else:
            with pytest.raises(ShareError, match=refused):
                verify(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def _npy_header(descr: str, shape: tuple) -> bytes:
    """A .npy (1.0) header declaring ``descr`` and ``shape``, with no data after it."""
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def _npz(members: dict[str, bytes]) -> bytes:
    """A point store of ``members`` (stored), its CRC-32 comment made to match (as a forger would)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.comment = CHECKSUM_MARKER + b"0" * 8
    data = out.getvalue()
    return data[:-8] + b"%08x" % zlib.crc32(data[:-8])


def _with_big_array(members: dict[str, bytes], nbytes: int) -> dict[str, bytes]:
    """``members`` plus a valid float64 array ``big`` of ``nbytes`` bytes, described in the metadata."""
    meta = json.loads(np.lib.format.read_array(io.BytesIO(members["sgdsweep_meta.npy"]))[()])
    meta["arrays"]["big"] = {"dims": ["x"], "attrs": {}}
    return {**members, "sgdsweep_meta.npy": _npy(np.array(json.dumps(meta).encode())),
            "big.npy": _npy(np.zeros(nbytes // 8))}


@pytest.mark.parametrize("case", ["pickled object array", "not an npy file", "zero-length member",
                                  "shape beyond its data"])
def test_point_store_arrays_sgdsweep_never_writes_are_refused(exported, tmp_path, case):
    """Every array member of an export's point store is checked from its ``.npy`` header and size
    before anything is imported: a pickled object array, bytes that are not ``.npy``, an empty
    member, a header declaring 2 GiB over 128 bytes of data are refused naming the member (exit 2),
    and nothing is written. Opening a store reads its metadata only, so without this check they
    would be placed as point stores and found by their first reader."""
    _, dest, manifest = exported
    name, raw, members = _point(dest, manifest)
    array = next(n for n in members if n != "sgdsweep_meta.npy")
    data = {"pickled object array": _npy(np.array([{"a": 1}], dtype=object), allow_pickle=True),
            "not an npy file": b"this is not a .npy member",
            "zero-length member": b"",
            "shape beyond its data": _npy_header("<f8", (1 << 28,))}[case]  # 2 GiB declared, 128 bytes held
    bad = _forged(dest, tmp_path / "bad.zip", replace={name: _store_with(raw, replace={array: data})})
    _import_refused(bad, tmp_path, re.escape(f"member '{name}', the store of point ") + ".*is not a store sgdsweep "
                    + re.escape(f"wrote (member '{array}': "))


def test_an_array_header_declaring_gigabytes_is_refused_without_allocating_them(exported, tmp_path):
    """A 2 GiB shape declared over 128 bytes of data: verify refuses it from the header (NumPy
    would allocate the declared shape before reading), holding far less than the file's size."""
    _, dest, manifest = exported
    name, raw, members = _point(dest, manifest)
    array = next(n for n in members if n != "sgdsweep_meta.npy")
    bad = _forged(dest, tmp_path / "bad.zip",
                  replace={name: _store_with(raw, replace={array: _npy_header("<f8", (1 << 28,))})})
    assert _verify_peak(bad, refused="its header declares shape") < 64 * MiB


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
    path.write_bytes(_npz(_with_big_array(members, 4 * MiB)))  # valid, complete, its point's own
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
    name, _, members = _point(dest, manifest)
    size = 48 * MiB
    bad = _forged(dest, tmp_path / "big.zip", replace={name: _npz(_with_big_array(members, size))})
    peak = _verify_peak(bad)
    assert peak < 1.5 * size, f"verify peak {peak / MiB:.0f} MiB for a {size / MiB:.0f} MiB point store"


def test_metadata_header_declaring_gigabytes_is_refused_without_allocating_them(exported, tmp_path):
    """A store whose metadata member (100 bytes of data) declares float64 shape (2**28,) is
    refused from its header, before NumPy would allocate the 2 GiB it declares."""
    _, dest, manifest = exported
    name, _, members = _point(dest, manifest)
    members["sgdsweep_meta.npy"] = _npy_header("<f8", (1 << 28,)) + b"x" * 100
    bad = _forged(dest, tmp_path / "meta.zip", replace={name: _npz(members)})
    peak = _verify_peak(bad, refused=re.escape(f"member '{name}'"))
    assert peak < 64 * MiB, f"verify of a {bad.stat().st_size} byte file allocated {peak / MiB:.0f} MiB"


def test_refused_point_store_message_gives_an_export_readers_fix(exported, tmp_path):
    """A refused store of an export tells its reader what to do with a file received from someone
    else (not to use it), not what to do with a sweep's own store (rerun the workflow)."""
    _, dest, manifest = exported
    name, _, members = _point(dest, manifest)
    bad = _forged(dest, tmp_path / "zero.zip", replace={name: _npz({n: b"" for n in members})})
    proc = cli("verify", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rerun the workflow" not in proc.stderr and "do not use it" in proc.stderr, proc.stderr


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
    name, raw, members = _point(dest, manifest)
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
        _, other, _ = _point(dest, manifest, 1)
        bad = _forged(dest, tmp_path / "c.zip", replace={name: other})
    else:
        bad = _forged(dest, tmp_path / "c.zip", replace={name: _npz({n: b"" for n in members})})
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


def _raw(dest: Path, h: str) -> bytes:
    with zipfile.ZipFile(dest) as zf:
        return zf.read(f"points/{h}.npz")


def _members(raw: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _resigned(data: bytes) -> bytes:
    """``data`` (a point store whose comment ends in the CRC-32 digits) with its CRC-32 made to match."""
    return data[:-8] + b"%08x" % zlib.crc32(data[:-8])


def _meta(raw: bytes) -> dict:
    return json.loads(np.lib.format.read_array(io.BytesIO(_members(raw)["sgdsweep_meta.npy"]))[()])


def _with_meta_text(raw: bytes, text: str, replace: dict[str, bytes] | None = None) -> bytes:
    """The store ``raw`` with its metadata member's JSON text ``text`` (and members ``replace``), re-signed."""
    members = _members(raw)
    members["sgdsweep_meta.npy"] = _npy(np.array(text.encode()))
    members.update(replace or {})
    return _npz(members)



def _peak(path: Path) -> int:
    return _verify_peak(path)


def test_verify_holds_one_point_store_attributes_at_a_time(exported, tmp_path):
    """Verify holds one store's parsed attributes at a time (JSON such as ``[[], [], ...]`` parses
    to ~16 times its size, and a store's metadata may hold 16 MiB): 4 stores of 1 MB attributes
    each cost verify less than twice what one does."""
    _, dest, manifest = exported
    junk = [[] for _ in range(250_000)]  # ~1 MB of JSON, ~16 MB parsed

    def forged(which, name):
        return _forged(dest, tmp_path / name,
                       replace={f"points/{h}.npz": _store_with(_raw(dest, h), {"junk": junk}) for h in which})

    none, one, every = (forged(w, n) for w, n in [((), "none.zip"), (manifest["points"][:1], "one.zip"),
                                                 (manifest["points"], "all.zip")])
    verify(none)  # warm up (imports, caches)
    base, single, all_ = _peak(none), _peak(one), _peak(every)
    assert all_ - base < 2 * (single - base), (
        f"verify peak {all_ / MiB:.0f} MiB with junk attributes on 4 stores vs {single / MiB:.0f} MiB on one "
        f"(baseline {base / MiB:.0f} MiB): every store's attributes are held at once")


@pytest.mark.parametrize("case", ["no summary", "summary not a dict", "summary value a string"])
def test_a_precision_store_with_a_crafted_summary_is_refused_not_a_crash(precise, tmp_path, case):
    """A re-signed precision export whose store lacks a summary, or holds one of the wrong type,
    is refused (the rounds, replayed from the stores' attributes, cannot read it), never a
    traceback."""
    _, dest, manifest = precise
    h = manifest["points"][0]
    raw = _raw(dest, h)
    meta = _meta(raw)
    attrs = meta["attributes"]
    if case == "no summary":
        attrs.pop("summary")
    elif case == "summary not a dict":
        attrs["summary"] = "x"
    else:
        attrs["summary"]["weight_var"] = "x"
    bad = _forged(dest, tmp_path / "s.zip", replace={f"points/{h}.npz": _with_meta_text(raw, json.dumps(meta))})
    with pytest.raises(ShareError):
        verify(bad)


def test_a_precision_store_whose_summary_misses_its_target_is_refused(precise, tmp_path):
    """A store's summary edited so that its target is unmet (the rounds read the attributes verify
    read) is refused as a point the import would simulate."""
    finished, dest, _ = precise
    h = next(h for h, p in finished.rounds["points"].items() if p["status"] == "met")
    summary = dict(_meta(_raw(dest, h))["attributes"]["summary"])
    summary["weight_var_se"] = abs(summary["weight_var"])  # 100 % relative SE
    bad = _forged(dest, tmp_path / "unmet.zip",
                  replace={f"points/{h}.npz": _store_with(_raw(dest, h), {"summary": summary})})
    with pytest.raises(ShareError, match="which a run of the import would simulate"):
        verify(bad)


def test_an_export_store_with_an_array_no_reader_reads_is_refused(exported, tmp_path):
    """An array of shape (-2, -3) over 48 bytes, which no reader reads, is refused by verify."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    raw = _raw(dest, h)
    member = _npy_header("<f8", (-2, -3)) + np.arange(6.0).tobytes()
    bad = _forged(dest, tmp_path / "neg.zip",
                  replace={f"points/{h}.npz": _store_with(raw, replace={"weight_cov.npy": member})})
    with pytest.raises(ShareError):
        verify(bad)


def _zip_entry(raw: bytes, name: str, central: bool) -> int:
    """Offset of member ``name``'s central (or local) header in the zip ``raw``."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        info = z.getinfo(name)
    if not central:
        return info.header_offset
    i = raw.find(b"PK\x01\x02")
    while raw[i + 46:i + 46 + int.from_bytes(raw[i + 28:i + 30], "little")] != name.encode():
        i = raw.find(b"PK\x01\x02", i + 4)
    return i


def _data_offset(raw: bytes, name: str) -> int:
    i = _zip_entry(raw, name, central=False)
    return i + 30 + int.from_bytes(raw[i + 26:i + 28], "little") + int.from_bytes(raw[i + 28:i + 30], "little")


def _tampered(raw: bytes, case: str) -> bytes:
    b = bytearray(raw)
    name = "weight_cov.npy"
    if case == "encrypted flag":
        b[_zip_entry(raw, name, central=True) + 8] |= 1
    elif case == "local name differs":
        b[_zip_entry(raw, name, central=False) + 30] ^= 0x20
    else:  # its data's last byte changed: its member CRC-32 fails
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            size = z.getinfo(name).file_size
        b[_data_offset(raw, name) + size - 1] ^= 1
    return _resigned(bytes(b))


@pytest.mark.parametrize("case", ["encrypted flag", "local name differs", "member CRC-32 fails"])
def test_a_store_member_zipfile_cannot_open_is_refused_not_a_crash(exported, tmp_path, case):
    """A member flagged encrypted, one whose local header names another file, or one failing its
    own CRC-32 is refused (ShareError, exit 2), never a traceback."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    bad = _forged(dest, tmp_path / "z.zip", replace={f"points/{h}.npz": _tampered(_raw(dest, h), case)})
    with pytest.raises(ShareError):
        verify(bad)


def test_a_large_store_member_failing_its_crc_is_refused(exported, tmp_path):
    """A large member whose own CRC-32 fails, the store's whole-file CRC-32 re-signed as a forger
    would, is refused: every member is read to its end, where zipfile checks its CRC-32."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    raw = _raw(dest, h)
    meta = _meta(raw)
    meta["arrays"]["big"] = {"dims": ["x"], "attrs": {}}
    members = {**_members(raw), "sgdsweep_meta.npy": _npy(np.array(json.dumps(meta).encode())),
               "big.npy": _npy(np.zeros(1 << 17))}
    store = bytearray(_npz(members))
    with zipfile.ZipFile(io.BytesIO(bytes(store))) as z:
        size = z.getinfo("big.npy").file_size
    store[_data_offset(bytes(store), "big.npy") + size - 1] ^= 1
    store = _resigned(bytes(store))
    with PointStore("x", raw=store) as s, pytest.raises(Exception, match="Bad CRC-32"):
        s.read("big")
    bad = _forged(dest, tmp_path / "crc.zip", replace={f"points/{h}.npz": store})
    with pytest.raises(ShareError):
        verify(bad)


def test_attributes_nested_deeper_than_sgdsweep_writes_are_refused(exported, tmp_path):
    """Attributes nested 40 lists deep are refused: JSON parses deep nesting only as far as the
    stack allows, so a run, reading at another depth, could find a store verify accepted
    unreadable and simulate its point again."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    raw = _raw(dest, h)
    meta = _meta(raw)
    meta["attributes"]["deep"] = json.loads("[" * 40 + "0" + "]" * 40)
    bad = _forged(dest, tmp_path / "deep.zip", replace={f"points/{h}.npz": _with_meta_text(raw, json.dumps(meta))})
    _import_refused(bad, tmp_path, "has attributes nested deeper than 32 levels")


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
