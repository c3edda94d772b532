"""What an export's point store may hold: checked as a run checks its own stores and more (every
array from its header and CRC-32, attributes of a bounded depth, a summary the rounds can read),
before anything is read or imported; a refusal tells the reader not to use the file."""

from __future__ import annotations

import io
import json
import re
import zipfile

import numpy as np
import pytest
import test_share
import test_share_bounds
from conftest import cli
from store_forgery import (
    MiB,
    npy_bytes,
    npy_header,
    npz,
    point_member,
    raw_store,
    resigned,
    store_members,
    store_meta,
    store_with,
    verify_peak,
    with_meta_text,
)
from test_share import _forged, _import_refused

from sgdsweep.share.archive import ShareError, verify
from sgdsweep.store.points import PointStore

#: A finished tiny sweep's export, and a finished precision sweep's: the fixtures of the other share tests.
exported = test_share.exported
precise = test_share_bounds.precise


@pytest.mark.parametrize("case", ["pickled object array", "not an npy file", "zero-length member",
                                  "shape beyond its data"])
def test_point_store_arrays_sgdsweep_never_writes_are_refused(exported, tmp_path, case):
    """Every array member of an export's point store is checked from its ``.npy`` header and size
    before anything is imported: a pickled object array, bytes that are not ``.npy``, an empty
    member, a header declaring 2 GiB over 128 bytes of data are refused naming the member (exit 2),
    and nothing is written. Opening a store reads its metadata only, so without this check they
    would be placed as point stores and found by their first reader."""
    _, dest, manifest = exported
    name, raw, members = point_member(dest, manifest)
    array = next(n for n in members if n != "sgdsweep_meta.npy")
    data = {"pickled object array": npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True),
            "not an npy file": b"this is not a .npy member",
            "zero-length member": b"",
            "shape beyond its data": npy_header("<f8", (1 << 28,))}[case]  # 2 GiB declared, 128 bytes held
    bad = _forged(dest, tmp_path / "bad.zip", replace={name: store_with(raw, replace={array: data})})
    _import_refused(bad, tmp_path, re.escape(f"member '{name}', the store of point ") + ".*is not a store sgdsweep "
                    + re.escape(f"wrote (member '{array}': "))


def test_an_array_header_declaring_gigabytes_is_refused_without_allocating_them(exported, tmp_path):
    """A 2 GiB shape declared over 128 bytes of data: verify refuses it from the header (NumPy
    would allocate the declared shape before reading), holding far less than the file's size."""
    _, dest, manifest = exported
    name, raw, members = point_member(dest, manifest)
    array = next(n for n in members if n != "sgdsweep_meta.npy")
    bad = _forged(dest, tmp_path / "bad.zip",
                  replace={name: store_with(raw, replace={array: npy_header("<f8", (1 << 28,))})})
    assert verify_peak(bad, refused="its header declares shape") < 64 * MiB


def test_metadata_header_declaring_gigabytes_is_refused_without_allocating_them(exported, tmp_path):
    """A store whose metadata member (100 bytes of data) declares float64 shape (2**28,) is
    refused from its header, before NumPy would allocate the 2 GiB it declares."""
    _, dest, manifest = exported
    name, _, members = point_member(dest, manifest)
    members["sgdsweep_meta.npy"] = npy_header("<f8", (1 << 28,)) + b"x" * 100
    bad = _forged(dest, tmp_path / "meta.zip", replace={name: npz(members)})
    peak = verify_peak(bad, refused=re.escape(f"member '{name}'"))
    assert peak < 64 * MiB, f"verify of a {bad.stat().st_size} byte file allocated {peak / MiB:.0f} MiB"


def test_refused_point_store_message_gives_an_export_readers_fix(exported, tmp_path):
    """A refused store of an export tells its reader what to do with a file received from someone
    else (not to use it), not what to do with a sweep's own store (rerun the workflow)."""
    _, dest, manifest = exported
    name, _, members = point_member(dest, manifest)
    bad = _forged(dest, tmp_path / "zero.zip", replace={name: npz({n: b"" for n in members})})
    proc = cli("verify", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rerun the workflow" not in proc.stderr and "do not use it" in proc.stderr, proc.stderr


def test_verify_holds_one_point_store_attributes_at_a_time(exported, tmp_path):
    """Verify holds one store's parsed attributes at a time (JSON such as ``[[], [], ...]`` parses
    to ~16 times its size, and a store's metadata may hold 16 MiB): 4 stores of 1 MB attributes
    each cost verify less than twice what one does."""
    _, dest, manifest = exported
    junk = [[] for _ in range(250_000)]  # ~1 MB of JSON, ~16 MB parsed

    def forged(which, name):
        return _forged(dest, tmp_path / name,
                       replace={f"points/{h}.npz": store_with(raw_store(dest, h), {"junk": junk}) for h in which})

    none, one, every = (forged(w, n) for w, n in [((), "none.zip"), (manifest["points"][:1], "one.zip"),
                                                 (manifest["points"], "all.zip")])
    verify(none)  # warm up (imports, caches)
    base, single, all_ = verify_peak(none), verify_peak(one), verify_peak(every)
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
    raw = raw_store(dest, h)
    meta = store_meta(raw)
    attrs = meta["attributes"]
    if case == "no summary":
        attrs.pop("summary")
    elif case == "summary not a dict":
        attrs["summary"] = "x"
    else:
        attrs["summary"]["weight_var"] = "x"
    bad = _forged(dest, tmp_path / "s.zip", replace={f"points/{h}.npz": with_meta_text(raw, json.dumps(meta))})
    with pytest.raises(ShareError):
        verify(bad)


def test_a_precision_store_whose_summary_misses_its_target_is_refused(precise, tmp_path):
    """A store's summary edited so that its target is unmet (the rounds read the attributes verify
    read) is refused as a point the import would simulate."""
    finished, dest, _ = precise
    h = next(h for h, p in finished.rounds["points"].items() if p["status"] == "met")
    summary = dict(store_meta(raw_store(dest, h))["attributes"]["summary"])
    summary["weight_var_se"] = abs(summary["weight_var"])  # 100 % relative SE
    bad = _forged(dest, tmp_path / "unmet.zip",
                  replace={f"points/{h}.npz": store_with(raw_store(dest, h), {"summary": summary})})
    with pytest.raises(ShareError, match="which a run of the import would simulate"):
        verify(bad)


def test_an_export_store_with_an_array_no_reader_reads_is_refused(exported, tmp_path):
    """An array of shape (-2, -3) over 48 bytes, which no reader reads, is refused by verify."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    raw = raw_store(dest, h)
    member = npy_header("<f8", (-2, -3)) + np.arange(6.0).tobytes()
    bad = _forged(dest, tmp_path / "neg.zip",
                  replace={f"points/{h}.npz": store_with(raw, replace={"weight_cov.npy": member})})
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
    return resigned(bytes(b))


@pytest.mark.parametrize("case", ["encrypted flag", "local name differs", "member CRC-32 fails"])
def test_a_store_member_zipfile_cannot_open_is_refused_not_a_crash(exported, tmp_path, case):
    """A member flagged encrypted, one whose local header names another file, or one failing its
    own CRC-32 is refused (ShareError, exit 2), never a traceback."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    bad = _forged(dest, tmp_path / "z.zip", replace={f"points/{h}.npz": _tampered(raw_store(dest, h), case)})
    with pytest.raises(ShareError):
        verify(bad)


def test_a_large_store_member_failing_its_crc_is_refused(exported, tmp_path):
    """A large member whose own CRC-32 fails, the store's whole-file CRC-32 re-signed as a forger
    would, is refused: every member is read to its end, where zipfile checks its CRC-32."""
    _, dest, manifest = exported
    h = manifest["points"][0]
    raw = raw_store(dest, h)
    meta = store_meta(raw)
    meta["arrays"]["big"] = {"dims": ["x"], "attrs": {}}
    members = {**store_members(raw), "sgdsweep_meta.npy": npy_bytes(np.array(json.dumps(meta).encode())),
               "big.npy": npy_bytes(np.zeros(1 << 17))}
    store = bytearray(npz(members))
    with zipfile.ZipFile(io.BytesIO(bytes(store))) as z:
        size = z.getinfo("big.npy").file_size
    store[_data_offset(bytes(store), "big.npy") + size - 1] ^= 1
    store = resigned(bytes(store))
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
    raw = raw_store(dest, h)
    meta = store_meta(raw)
    meta["attributes"]["deep"] = json.loads("[" * 40 + "0" + "]" * 40)
    bad = _forged(dest, tmp_path / "deep.zip", replace={f"points/{h}.npz": with_meta_text(raw, json.dumps(meta))})
    _import_refused(bad, tmp_path, "has attributes nested deeper than 32 levels")


def test_incomplete_point_store_is_refused(exported, tmp_path):
    """A point's store not marked complete, re-signed: verify reads every store as a run reads its
    own, so verify and import refuse it (exit 2) and nothing is written."""
    _, dest, manifest = exported
    name = f"points/{manifest['points'][0]}.npz"
    with zipfile.ZipFile(dest) as zf:
        raw = zf.read(name)
    bad = _forged(dest, tmp_path / "incomplete.zip", replace={name: store_with(raw, {"sgdsweep_complete": False})})
    _import_refused(bad, tmp_path, rf"member '{name}', the store of point \w+, is refused: point store .* is "
                                   "incomplete; the export was crafted")


def test_a_point_store_with_a_compressed_member_is_refused_before_it_is_inflated(exported, tmp_path):
    """sgdsweep stores a point's members uncompressed, so a deflated one is crafted: a 16 MiB
    array of zeros deflates to 16 kB. Verify and import refuse it (exit 2) without inflating it,
    and nothing is written."""

    _, dest, manifest = exported
    name = f"points/{manifest['points'][1]}.npz"
    with zipfile.ZipFile(dest) as zf:
        raw = zf.read(name)
    with zipfile.ZipFile(io.BytesIO(raw)) as zin:
        member = next(n for n in zin.namelist() if n != "sgdsweep_meta.npy")
    zeros = io.BytesIO()
    np.lib.format.write_array(zeros, np.zeros(2 << 20))
    bomb = store_with(raw, replace={member: zeros.getvalue()}, compressed=member)
    assert len(bomb) < 100_000
    bad = _forged(dest, tmp_path / "bomb.zip", replace={name: bomb})
    peak = verify_peak(bad, refused=rf"member '{member}' is compressed or its sizes differ")
    assert peak < 8 << 20, peak
    _import_refused(bad, tmp_path, "is compressed or its sizes differ; sgdsweep stores every member uncompressed")
