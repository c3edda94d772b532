"""Point stores of an export rewritten as a forger would, for the share tests: members read and
replaced, the metadata edited, the store's CRC-32 comment made to match."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from sgdsweep.share.archive import ShareError, verify
from sgdsweep.store.points import CHECKSUM_MARKER

MiB = 1 << 20


def point_member(dest: Path, manifest: dict, i: int = 0) -> tuple[str, bytes, dict[str, bytes]]:
    """(member name, store bytes, the store's members by name) of the ``i``-th point of the export ``dest``."""
    name = f"points/{manifest['points'][i]}.npz"
    with zipfile.ZipFile(dest) as zf:
        raw = zf.read(name)
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        members = {info.filename: z.read(info) for info in z.infolist()}
    return name, raw, members


def verify_peak(path: Path, refused: str | None = None) -> int:
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


def npy_bytes(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    """``array`` as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def npy_header(descr: str, shape: tuple) -> bytes:
    """A .npy (1.0) header declaring ``descr`` and ``shape``, with no data after it."""
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def npz(members: dict[str, bytes]) -> bytes:
    """A point store of ``members`` (stored), its CRC-32 comment made to match (as a forger would)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.comment = CHECKSUM_MARKER + b"0" * 8
    data = out.getvalue()
    return data[:-8] + b"%08x" % zlib.crc32(data[:-8])


def with_big_array(members: dict[str, bytes], nbytes: int) -> dict[str, bytes]:
    """``members`` plus a valid float64 array ``big`` of ``nbytes`` bytes, described in the metadata."""
    meta = json.loads(np.lib.format.read_array(io.BytesIO(members["sgdsweep_meta.npy"]))[()])
    meta["arrays"]["big"] = {"dims": ["x"], "attrs": {}}
    return {**members, "sgdsweep_meta.npy": npy_bytes(np.array(json.dumps(meta).encode())),
            "big.npy": npy_bytes(np.zeros(nbytes // 8))}


def raw_store(dest: Path, h: str) -> bytes:
    """The bytes of point ``h``'s store in the export ``dest``."""
    with zipfile.ZipFile(dest) as zf:
        return zf.read(f"points/{h}.npz")


def store_members(raw: bytes) -> dict[str, bytes]:
    """The members of the store ``raw`` by name."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def resigned(data: bytes) -> bytes:
    """``data`` (a point store whose comment ends in the CRC-32 digits) with its CRC-32 made to match."""
    return data[:-8] + b"%08x" % zlib.crc32(data[:-8])


def store_meta(raw: bytes) -> dict:
    """The metadata (attributes and arrays) of the store ``raw``."""
    return json.loads(np.lib.format.read_array(io.BytesIO(store_members(raw)["sgdsweep_meta.npy"]))[()])


def with_meta_text(raw: bytes, text: str, replace: dict[str, bytes] | None = None) -> bytes:
    """The store ``raw`` with its metadata member's JSON text ``text`` (and members ``replace``), re-signed."""
    members = store_members(raw)
    members["sgdsweep_meta.npy"] = npy_bytes(np.array(text.encode()))
    members.update(replace or {})
    return npz(members)


def store_with(raw: bytes, attributes=None, replace=None, compressed: str | None = None) -> bytes:
    """The ``.npz`` point store ``raw`` rebuilt as a forger would: its attributes updated with
    ``attributes``, members ``replace`` (name → bytes) rewritten, member ``compressed`` deflated,
    its CRC-32 comment made to match."""
    import zlib

    from sgdsweep.store.points import CHECKSUM_MARKER

    with zipfile.ZipFile(io.BytesIO(raw)) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    meta = json.loads(np.lib.format.read_array(io.BytesIO(members["sgdsweep_meta.npy"]))[()])
    meta["attributes"].update(attributes or {})
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array(json.dumps(meta).encode()))
    members.update({"sgdsweep_meta.npy": buf.getvalue(), **(replace or {})})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zout:
        for name, data in members.items():
            zout.writestr(name, data, zipfile.ZIP_DEFLATED if name == compressed else zipfile.ZIP_STORED)
        zout.comment = CHECKSUM_MARKER + b"0" * 8
    data = out.getvalue()
    return data[:-8] + b"%08x" % zlib.crc32(data[:-8])
