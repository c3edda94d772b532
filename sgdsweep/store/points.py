"""Per-point result stores: one Zarr (format 3) group per point, in one zip file, written atomically.

A point store is ``<hash>.zarr.zip``: a zip of the group's Zarr keys (uncompressed members,
each array one ``zarr.json`` and one chunk), written to a temporary file next to its final path
and renamed into place when complete, so a killed run leaves either a complete store or nothing
under the final name. The zip's archive comment, the last bytes of the file, holds the CRC-32 of
every byte before it (:data:`CHECKSUM_MARKER`): a store cut short or with any byte changed after
it was written fails :func:`is_complete` and is recomputed by the next run. A store is one file
rather than a directory of ~40 files in ~20 directories because file-system metadata dominates
the cost of writing many small files, and on a cluster's parallel file system each file is a
metadata operation and an inode of the user's quota. Directory stores (``<hash>.zarr``, store
layout 1) are still read.

The group's attributes hold the point's identity (hash, parameters) and its scalar summary;
arrays hold per-replica values and matrices, with ``dimension_names``, so that xarray opens a
point store too: ``xarray.open_zarr(zarr.storage.ZipStore(path, mode="r"))``.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import shutil
import struct
import time
import uuid
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.api.asynchronous
from zarr.storage import MemoryStore, ZipStore

from sgdsweep.errors import StoreError, UsageError

#: Attribute that marks a store as complete (set last, before the rename).
COMPLETE_ATTR = "sgdsweep_complete"
#: Version of the point-store layout: 2, one zip file per point; 1, a directory.
STORE_VERSION = 2
#: File name suffix of a point store, and of the directory stores of layout 1 (still read).
POINT_SUFFIX, DIRECTORY_SUFFIX = ".zarr.zip", ".zarr"
#: Age (seconds, by modification time) from which a point store's temporary file or directory
#: (``.<hash>.zarr.zip.tmp-*``, or ``.<hash>.zarr.tmp-*`` of layout 1) is the leftover of a killed
#: write: a live write fills and renames its file within a second, so ten minutes leave a wide
#: margin for a stalled file system.
STALE_TEMPORARY_SECONDS = 600.0
#: Chunk keys ``c.0.0`` beside the array's ``zarr.json``: one directory per array, where the
#: default ``c/0/0`` makes three (a point store is ~18 arrays of one chunk each, and a sweep
#: writes thousands of stores: directories are most of their file-system cost).
CHUNK_KEY_ENCODING = {"name": "default", "separator": "."}
#: Start of a point store's zip comment; 8 hex digits follow, the CRC-32 of every byte of the
#: file before them (so the comment is the end of the file: a truncated store has none).
CHECKSUM_MARKER = b"sgdsweep-crc32:"
_CRC_DIGITS = 8


def point_path(points_dir: str | Path, point_hash: str) -> Path:
    """Path of a point's store: ``<hash>.zarr.zip``, where :func:`write_point` places it, or the
    directory store ``<hash>.zarr`` of an earlier sgdsweep where only that exists."""
    zipped = Path(points_dir) / f"{point_hash}{POINT_SUFFIX}"
    directory = Path(points_dir) / f"{point_hash}{DIRECTORY_SUFFIX}"
    return directory if not zipped.exists() and directory.is_dir() else zipped


def failed_marker(points_dir: str | Path, point_hash: str) -> Path:
    """File recording that simulating a point failed (removed when it succeeds)."""
    return Path(points_dir) / f"{point_hash}.failed.json"


def write_point(path: str | Path, arrays: Mapping[str, tuple[tuple[str, ...], np.ndarray]],
                attrs: Mapping[str, Any]) -> bool:
    """Write a point store atomically, as one zip file.

    Args:
        path: final path (``<hash>.zarr.zip``, :func:`point_path`). A directory store there
            (layout 1) that is complete is kept; an incomplete one, the leftover of a killed
            run, is replaced.
        arrays: name → (dimension names, array) or (dimension names, array, attributes).
        attrs: JSON-serialisable group attributes (identity and summary).

    Returns:
        True if this call placed the store, False if a complete store was already there (it is
        kept: results are content-addressed, so an existing complete store is the same point).
    """
    if _placed(Path(path)):
        return False
    group_attrs = {**json.loads(json.dumps(dict(attrs))), "store_version": STORE_VERSION, COMPLETE_ATTR: True}
    return place_point(path, _point_files(arrays, group_attrs))


def _directory_store(path: Path) -> Path:
    """The layout-1 directory store ``<hash>.zarr`` of the point whose zip store is ``path``."""
    if not path.name.endswith(POINT_SUFFIX):
        raise ValueError(f"point store path {path}: must end in {POINT_SUFFIX!r} (use sgdsweep.store.points.point_path)")
    return path.with_name(path.name[:-len(POINT_SUFFIX)] + DIRECTORY_SUFFIX)


def _placed(path: Path) -> bool:
    """Whether a complete store of the point whose zip store is ``path`` exists (zip or directory)."""
    directory = _directory_store(path)
    return is_complete(path) or (directory.is_dir() and is_complete(directory))


def place_point(path: str | Path, files: Mapping[str, bytes]) -> bool:
    """Place the point store of ``files`` (Zarr key → bytes, as :class:`PointFiles` reads them)
    at ``path`` (``<hash>.zarr.zip``) atomically: zipped into a temporary file beside it, then
    renamed. Returns False, placing nothing, if a complete store of the point is already there.

    Raises:
        UsageError: the directory cannot be written (read-only file system, permissions, an
            immutable attribute), naming it and the fix.
        StoreError: any other failure to write (a full disk...), naming the store.
    """
    path = Path(path)
    if _placed(path):
        return False
    directory = _directory_store(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_zip(tmp, files)
        for leftover in {path, directory}:  # an incomplete store of a killed run
            if leftover.is_dir():
                shutil.rmtree(leftover)
        if is_complete(path):  # another task placed the same point meanwhile
            return False
        os.replace(tmp, path)
        return True
    except OSError as exc:
        raise _write_error(path, exc) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the directory became unwritable: the next run's shard job removes it
            pass


def _write_error(path: Path, exc: OSError) -> UsageError | StoreError:
    """The error to report when writing the point store ``path`` failed with ``exc``."""
    where = path.parent
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UsageError(
            f"cannot write point store {path} ({exc.strerror}): the directory {where} is not writable "
            f"(a read-only file system, its permissions, or the immutable attribute: 'lsattr -d {where}' "
            f"shows an 'i', 'chattr -i {where}' removes it). Make it writable and rerun; the points "
            "already stored are kept")
    return StoreError(f"cannot write point store {path} ({exc.strerror or exc}); fix the cause (a full disk?) "
                      "and rerun; the points already stored are kept")


def remove_stale_temporaries(points_dir: str | Path, hashes: Iterable[str],
                             older_than: float = STALE_TEMPORARY_SECONDS) -> list[Path]:
    """Remove what killed writes of the points ``hashes`` left in ``points_dir``: their
    temporary files (and layout-1 temporary directories) last modified ``older_than`` seconds
    ago or earlier. Younger ones may belong to a write in progress and are kept. One directory
    listing. Returns the paths removed."""
    wanted = set(hashes)
    cutoff = time.time() - older_than
    removed = []
    try:
        entries = list(os.scandir(points_dir))
    except FileNotFoundError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or ".tmp-" not in name:
            continue
        point, _, suffix = name[1:].partition(".")
        if point not in wanted or not f".{suffix}".startswith((f"{POINT_SUFFIX}.tmp-", f"{DIRECTORY_SUFFIX}.tmp-")):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_mtime > cutoff:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:  # removed meanwhile (its write finished, or another cleaner)
            continue
        except OSError:  # an unwritable directory: kept (a write there fails with the reason)
            continue
        removed.append(Path(entry.path))
    return removed


def remove_failed_markers(points_dir: str | Path, hashes: Iterable[str]) -> list[Path]:
    """Remove the failure records (:func:`failed_marker`) of the points ``hashes``: call it once
    they are stored (a record a killed run left, or one of a failure retried since, is past).
    Records that cannot be removed (an unwritable directory) stay. Returns the paths removed."""
    removed = []
    for h in hashes:
        marker = failed_marker(points_dir, h)
        try:
            marker.unlink()
        except OSError:  # none there (the usual case), or an unwritable directory
            continue
        removed.append(marker)
    return removed


def _write_zip(path: Path, files: Mapping[str, bytes]) -> None:
    """A zip of ``files`` (key → bytes, stored uncompressed: the chunks are float64 noise) at
    ``path``, the group's ``zarr.json`` first, built in memory and written with one call. Its
    comment is :data:`CHECKSUM_MARKER` and the CRC-32 of the bytes before the digits."""
    buf = io.BytesIO()
    placeholder = CHECKSUM_MARKER + b"0" * _CRC_DIGITS
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.comment = placeholder  # zipfile writes it last, after the end-of-directory record
        for key in sorted(files, key=lambda k: (k != "zarr.json", k)):
            zf.writestr(key, files[key])
    raw = buf.getbuffer()
    if bytes(raw[-len(placeholder):]) != placeholder:
        raise RuntimeError("zipfile did not end the archive with its comment: cannot checksum the store")
    raw[-_CRC_DIGITS:] = b"%08x" % zlib.crc32(raw[:-_CRC_DIGITS])
    _write_file(path, raw)


def _checked_bytes(path: Path) -> bytes:
    """The bytes of the zip point store at ``path``, checked whole: against the CRC-32 in its
    comment (:func:`_write_zip`), or, for a store written without one, every member against its
    own CRC-32 through :meth:`zipfile.ZipFile.testzip` (and the archive's directory read whole).
    A file cut exactly before its comment, all its members intact, reads as such a store.

    Raises: OSError if the file cannot be read; zipfile.BadZipFile (the message says what is
    wrong) if it is not a zip, was cut short or has a byte changed since it was written.
    """
    raw = path.read_bytes()
    tail = raw[-len(CHECKSUM_MARKER) - _CRC_DIGITS:]
    if tail.startswith(CHECKSUM_MARKER):
        if raw[-_CRC_DIGITS:] != b"%08x" % zlib.crc32(memoryview(raw)[:-_CRC_DIGITS]):
            raise zipfile.BadZipFile("its CRC-32 does not match its contents: the file was changed "
                                     "or damaged after it was written")
        return raw
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:  # truncated: no end-of-directory record here
        if zf.comment.startswith(CHECKSUM_MARKER):
            raise zipfile.BadZipFile("its CRC-32 is cut short: the file was truncated")
        bad = zf.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"member {bad!r} fails its CRC-32: the file was changed or damaged")
    return raw


def _write_file(path: Path, data: bytes) -> None:
    """Create (or truncate) ``path`` holding ``data``, with ``os`` calls."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


#: Array signature (name, dims, dtype, shape, attributes) → (its ``zarr.json`` bytes, chunk key,
#: or None for an empty array, which has no chunk), learnt from what Zarr wrote for the first
#: array of that signature in this process.
_TEMPLATES: dict[tuple, tuple[bytes, str | None]] = {}
#: Whether :func:`_group_json` rendered a group's ``zarr.json`` exactly as Zarr wrote it in this
#: process (checked on the first store Zarr builds).
_GROUP_JSON_CHECKED = [False]


def _group_json(group_attrs: Mapping[str, Any]) -> bytes:
    """A Zarr 3 group's ``zarr.json`` with ``group_attrs`` (JSON types only), as Zarr renders it."""
    return json.dumps({"attributes": group_attrs, "zarr_format": 3, "node_type": "group"}, indent=2,
                      allow_nan=True).encode()


def _point_files(arrays: Mapping[str, tuple], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files (Zarr key → bytes) of a point store.

    Once Zarr has written every array's signature in this process and its group metadata matched
    :func:`_group_json`, the store is assembled from those templates without Zarr: a sweep's
    point stores repeat the same arrays, and Zarr's event loop and metadata objects cost ~1 ms
    per store. Otherwise Zarr builds it (:func:`_encode`).
    """
    files: dict[str, bytes] = {}
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)
        template = _TEMPLATES.get(_signature(name, dims, data, dict(extra[0]) if extra else None))
        if template is None or not _GROUP_JSON_CHECKED[0] or data.dtype.byteorder not in "=<|":
            return asyncio.run(_encode(arrays, group_attrs))
        meta, chunk = template
        files[f"{name}/zarr.json"] = meta
        if chunk is not None:
            files[f"{name}/{chunk}"] = data.tobytes()  # C order whatever the layout
    files["zarr.json"] = _group_json(group_attrs)
    return files


def _signature(name: str, dims: tuple[str, ...], data: np.ndarray, attributes: Mapping[str, Any] | None) -> tuple:
    return (name, tuple(dims), data.dtype.str, data.shape, json.dumps(attributes, sort_keys=True, default=str))


async def _encode(arrays: Mapping[str, tuple], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files (Zarr key → bytes) of a point store, built by Zarr in memory.

    Zarr 3 spends milliseconds of Python per array and per synchronous call, and a sweep writes
    thousands of stores whose arrays repeat a few metadata documents. So the group is built by
    Zarr in a :class:`zarr.storage.MemoryStore` in one event loop, and an array whose signature
    (name, dimensions, dtype, shape, attributes) Zarr has already written in this process reuses
    that array's ``zarr.json`` with its one uncompressed chunk, ``data.tobytes()`` — a template
    is only kept after checking that Zarr's chunk for it was exactly those bytes. The keys are
    then written as files (what :class:`zarr.storage.LocalStore` does key by key).
    """
    contents: dict = {}
    group = await zarr.api.asynchronous.open_group(store=MemoryStore(contents), mode="w", zarr_format=3)
    files: dict[str, bytes] = {}
    built: list[tuple[str, tuple, np.ndarray]] = []
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)  # tobytes() is C order whatever the layout
        attributes = dict(extra[0]) if extra else None
        key = _signature(name, dims, data, attributes)
        if key in _TEMPLATES and data.dtype.byteorder in "=<|":
            meta, chunk = _TEMPLATES[key]
            files[f"{name}/zarr.json"] = meta
            if chunk is not None:
                files[f"{name}/{chunk}"] = data.tobytes()
            continue
        arr = await group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=data.shape or "auto",
                                       dimension_names=list(dims), compressors=None, attributes=attributes,
                                       chunk_key_encoding=CHUNK_KEY_ENCODING)
        await arr.setitem(Ellipsis, data)
        built.append((name, key, data))
    await group.update_attributes(group_attrs)
    files.update({k: buf.to_bytes() for k, buf in contents.items()})
    for name, key, data in built:  # learn templates from what Zarr wrote
        own = [k for k in contents if k.startswith(name + "/")]
        chunks = [k for k in own if k != f"{name}/zarr.json"]
        if len(own) == 2 and len(chunks) == 1 and files[chunks[0]] == data.tobytes():
            _TEMPLATES[key] = (files[f"{name}/zarr.json"], chunks[0][len(name) + 1:])
        elif own == [f"{name}/zarr.json"] and data.size == 0:
            _TEMPLATES[key] = (files[own[0]], None)
    _GROUP_JSON_CHECKED[0] = _GROUP_JSON_CHECKED[0] or files["zarr.json"] == _group_json(group_attrs)
    return files


class PointFiles(Mapping[str, bytes]):
    """The files of one point store as a read-only mapping, Zarr key (``zarr.json``,
    ``<array>/zarr.json``, ``<array>/c.0``) → bytes, from a zip store or a directory store
    alike; keys iterate sorted. A context manager.

    A zip store is read whole, once (point stores are written whole, and their readers take most
    of their members); an uncompressed member is then sliced out of those bytes at its local
    header (:func:`_stored_member`; name, sizes and CRC-32 checked) instead of through
    :meth:`zipfile.ZipFile.read`, whose Python costs ~35 µs a member (an aggregation reads 37
    members a point). Any other member, or one that fails a check, is read by :mod:`zipfile`.

    A zip store is checked whole when it is opened (:func:`_checked_bytes`).

    Raises: OSError on opening a missing store, zipfile.BadZipFile a damaged one; KeyError for
    a key the store lacks; OSError or zipfile.BadZipFile when a file cannot be read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._raw, self._zip = b"", None
        if not self.path.is_dir():
            self._raw = _checked_bytes(self.path)
            self._zip = zipfile.ZipFile(io.BytesIO(self._raw))

    def __getitem__(self, key: str) -> bytes:
        if self._zip is not None:
            info = self._zip.getinfo(key)
            member = _stored_member(self._raw, info.header_offset)
            if member is not None and member[0] == info.filename.encode():
                return member[1]
            return self._zip.read(info)
        try:
            return (self.path / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if self._zip is not None:
            try:
                self._zip.getinfo(key)
            except KeyError:
                return False
            return True
        return (self.path / key).is_file()

    def __iter__(self) -> Iterator[str]:
        if self._zip is not None:
            return iter(sorted(self._zip.namelist()))
        return iter(sorted(f.relative_to(self.path).as_posix() for f in self.path.rglob("*") if f.is_file()))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> PointFiles:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _group_meta(path: Path) -> bytes:
    """The group's ``zarr.json`` of a point store, the zip store checked whole first
    (:func:`_checked_bytes`). In a store written by :func:`write_point` it is the first member,
    sliced from the file at its local header (name, stored, CRC-32 checked) without parsing the
    archive's directory, which costs ~0.1 ms a store (planning checks every store of a sweep);
    any other zip is read by :mod:`zipfile`."""
    if path.is_dir():
        return (path / "zarr.json").read_bytes()
    raw = _checked_bytes(path)
    member = _stored_member(raw, 0)
    if member is not None and member[0] == b"zarr.json":
        return member[1]
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return zf.read("zarr.json")


def _stored_header(raw: bytes, offset: int) -> tuple[bytes, int, int, int] | None:
    """(name, start of the data, size, CRC-32) from the zip local header at ``offset`` of
    ``raw``, for a member stored uncompressed with its sizes in the header (as :func:`_write_zip`
    writes them); None for anything else."""
    if len(raw) < offset + 30 or raw[offset:offset + 4] != b"PK\x03\x04":
        return None
    flags, method, _, _, crc, size, raw_size, name_len, extra_len = struct.unpack_from("<HHHHIIIHH", raw, offset + 6)
    if method != zipfile.ZIP_STORED or flags & 0x08 or size != raw_size:
        return None
    return raw[offset + 30:offset + 30 + name_len], offset + 30 + name_len + extra_len, size, crc


def _stored_member(raw: bytes, offset: int) -> tuple[bytes, bytes] | None:
    """(name, data) of the member whose local header is at ``offset`` of ``raw``
    (:func:`_stored_header`), its data whole in ``raw`` and matching its CRC-32; None otherwise."""
    header = _stored_header(raw, offset)
    if header is None:
        return None
    name, start, size, crc = header
    data = raw[start:start + size]
    return (name, data) if len(data) == size and zlib.crc32(data) == crc else None


def read_attrs(path: str | Path) -> dict[str, Any]:
    """The group attributes of a complete point store (zip or directory).

    Raises:
        StoreError: if the store is missing, unreadable or incomplete.
    """
    try:
        meta = json.loads(_group_meta(Path(path)))
    except zipfile.BadZipFile as exc:
        raise StoreError(f"point store {path} is damaged ({exc}); rerun the workflow: it recomputes "
                         "that point") from None
    except (OSError, KeyError, ValueError) as exc:
        raise StoreError(f"point store {path} is missing or unreadable ({exc}); "
                         "rerun the workflow to recompute it") from None
    attrs = meta.get("attributes", {}) if isinstance(meta, dict) else {}
    if attrs.get(COMPLETE_ATTR) is not True:
        raise StoreError(f"point store {path} is incomplete; rerun the workflow to recompute it")
    return attrs


def read_array(path: str | Path, name: str) -> np.ndarray:
    """One array of a point store (zip or directory), read by Zarr."""
    path = Path(path)
    try:
        if path.is_dir():
            return zarr.open_array(str(path / name), mode="r")[...]
        zipped = ZipStore(path, mode="r")
        try:
            return zarr.open_array(store=zipped, path=name, mode="r")[...]
        finally:
            zipped.close()
    except Exception as exc:  # noqa: BLE001 - zarr raises several types for missing/corrupt data
        raise StoreError(f"array {name!r} of point store {path} is unreadable ({exc}); "
                         "delete the store and rerun the workflow") from None


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` holds a complete point store: metadata readable and marked complete, and
    for a zip store every byte as written (:func:`_checked_bytes`: a store cut short or with a
    byte changed is not complete). A directory store (layout 1) has no checksum: only its
    metadata is read. Cost: the file read once and its CRC-32 (~25 µs for a 25 kB store)."""
    try:
        read_attrs(path)
    except StoreError:
        return False
    return True


def complete_points(points_dir: str | Path, hashes: Iterable[str]) -> set[str]:
    """The hashes among ``hashes`` whose point store in ``points_dir`` is complete (one directory
    listing, then only the stores that exist are opened: planning 10⁴ points stays fast)."""
    try:
        present = set(os.listdir(points_dir))
    except FileNotFoundError:
        return set()
    done = set()
    for h in hashes:
        for name in (f"{h}{POINT_SUFFIX}", f"{h}{DIRECTORY_SUFFIX}"):  # as point_path prefers them
            if name in present:
                if is_complete(Path(points_dir) / name):
                    done.add(h)
                break
    return done


def has_array(path: str | Path, name: str) -> bool:
    """Whether the point store at ``path`` holds an array called ``name``."""
    try:
        with PointFiles(path) as files:
            return f"{name}/zarr.json" in files
    except (OSError, zipfile.BadZipFile):
        return False
