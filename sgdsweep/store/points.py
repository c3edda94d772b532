"""Per-point result stores: one NumPy ``.npz`` file per point, written atomically, checksummed.

A point store is ``<hash>.npz`` (:data:`POINT_SUFFIX`), NumPy's own archive format: a zip of
``.npy`` members (:mod:`numpy.lib.format`), which ``numpy.load(path, allow_pickle=False)``
opens. An array of two or more dimensions is one member; the 1-d numeric arrays along one
dimension with one length are the columns of one table, a structured array named
``table.<dimension>.<length>`` (:data:`TABLE_PREFIX`), so that reading a point reads a handful
of members rather than one per array. One more member, :data:`META_MEMBER`, holds the store's
metadata as one UTF-8 JSON string: the group attributes (the point's identity and parameters,
its scalar summary, the layout version :data:`STORE_VERSION` and :data:`COMPLETE_ATTR`) and
each array's dimension names, attributes and table. Members are written and read with
:func:`numpy.lib.format.write_array` / :func:`numpy.lib.format.read_array` through
:mod:`zipfile`, as :func:`numpy.savez` and :func:`numpy.load` do, never with pickle. The store
is written whole into a temporary file beside its final path and renamed into place, so a
killed run leaves either a complete store or nothing under the final name.

Integrity: the zip's comment (:attr:`zipfile.ZipFile.comment`, which the zip format places at
the very end of the file) is :data:`CHECKSUM_MARKER` and the CRC-32 of every byte before it, and
:mod:`zipfile` checks each member's own CRC-32 as it is read. A store cut short or with any byte
changed fails :func:`is_complete` and is recomputed by the next run; a crafted archive (members
that are not ``.npy`` or are compressed, declared sizes beyond :data:`MAX_POINT_BYTES`, a metadata member beyond
:data:`MAX_META_BYTES`, pickled objects) is
refused with a :class:`~sgdsweep.errors.StoreError` naming the file.

Identity: a point's store records the point it holds (attributes ``point_hash`` and
``params``), and a store counts as the store of point ``h`` only when both name ``h``: its
recorded hash is ``h`` and its parameters hash to ``h``
(:mod:`sgdsweep.store.point_identity`). A store copied or
renamed onto another point's name is therefore not that point's (:func:`complete_points`,
:meth:`PointStore.check_identity`); when the point is simulated, a good store of another point
found under its name is moved to its own name if that point has none, else replaced, with a
warning (:func:`place_members`).

Packs: once a shard's points are all stored, the shard job packs their stores into one file
(:mod:`sgdsweep.store.packs`, each store's bytes unchanged, its checksum checked alone); a packed
store's path is ``packs/<pack>.zip/<hash>.npz`` and it is read here like a single one.

Only this layout is read here. Stores of earlier layouts (a Zarr group per point in a zip file,
``<hash>.zarr.zip``, or in a directory, ``<hash>.zarr``) are rewritten into it, verified, by
:mod:`sgdsweep.store.migrate` before a run plans or a shard job looks for its points; until
then they are not found here.
"""

from __future__ import annotations

import errno
import io
import json
import os
import uuid
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.errors import StoreError, UsageError
from sgdsweep.store import packs
from sgdsweep.store.npy import MAX_HEADER_BYTES, PREFIX_BYTES, check_member, header_end, read_npy
from sgdsweep.store.point_identity import HASH_ATTR, identity_problem, misnamed, set_aside

#: Attribute that marks a store as complete (set in the metadata member written with the arrays).
COMPLETE_ATTR = "sgdsweep_complete"
#: Version of the point-store layout: 3, one ``.npz`` file (2, one Zarr zip file, and 1, a Zarr
#: directory, are migrated to it: :mod:`sgdsweep.store.migrate`).
STORE_VERSION = 3
#: File name suffix of a point store.
POINT_SUFFIX = ".npz"
#: Name of the metadata member (``<name>.npy`` in the archive): a 0-d bytes array, UTF-8 JSON.
META_MEMBER = "sgdsweep_meta"
#: Start of the name of a member that holds several 1-d arrays along one dimension as the fields
#: of one structured array (a table: ``table.<dimension>.<length>``, one column per array).
TABLE_PREFIX = "table."
#: Largest size of a point store's file, and largest total declared (uncompressed) size of its
#: members, bytes: more is a crafted archive (a "zip bomb"), refused before any member is read.
MAX_POINT_BYTES = 1 << 31
#: Largest size of a point store's metadata member (:data:`META_MEMBER`), bytes, both as declared
#: in the zip's directory and as inflated: the stores sgdsweep writes hold a few kB there, so more
#: is a crafted archive, refused before the member is parsed.
MAX_META_BYTES = 16 << 20
#: Age (seconds, by modification time) from which a point store's temporary file
#: (``.<hash>.npz.tmp-*``, or an earlier layout's: :data:`sgdsweep.store.migrate.LEGACY_SUFFIXES`)
#: is the leftover of a killed write: a live write fills and renames its file within a
#: second, so ten minutes leave a wide margin for a stalled file system.
STALE_TEMPORARY_SECONDS = 600.0
#: Start of a point store's zip comment; 8 hex digits follow, the CRC-32 of every byte of the
#: file before them (the comment ends the file, so a truncated store has none).
CHECKSUM_MARKER = b"sgdsweep-crc32:"
_CRC_DIGITS = 8
#: Modification time of every member (the earliest a zip can hold).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def point_path(points_dir: str | Path, point_hash: str) -> Path:
    """Path of a point's store: ``<hash>.npz``, where :func:`write_point` places it, if it is
    there; else its member of a pack (:class:`~sgdsweep.store.packs.MemberPath`), else
    ``<hash>.npz``."""
    single = Path(points_dir) / f"{point_hash}{POINT_SUFFIX}"
    if single.exists():
        return single
    pack = packs.index(points_dir).get(point_hash)
    if pack is not None:
        return packs.member_path(pack, point_hash)
    return single


def failed_marker(points_dir: str | Path, point_hash: str) -> Path:
    """File recording that simulating a point failed (removed when it succeeds)."""
    return Path(points_dir) / f"{point_hash}.failed.json"


def _stem(path: Path) -> str:
    """The point hash of a store path ``<hash>.npz``."""
    if path.name.endswith(POINT_SUFFIX):
        return path.name[: -len(POINT_SUFFIX)]
    raise ValueError(f"point store path {path}: must end in {POINT_SUFFIX} "
                     "(use sgdsweep.store.points.point_path)")


def write_point(path: str | Path, arrays: Mapping[str, tuple], attrs: Mapping[str, Any]) -> bool:
    """Write a point store atomically, as ``<hash>.npz`` beside ``path``.

    Args:
        path: the point's store path (:func:`point_path`). A complete store of the point is
            kept; an incomplete one, the leftover of a killed run, is replaced.
        arrays: name → (dimension names, array) or (dimension names, array, attributes); any
            name but :data:`META_MEMBER`, arrays of a numeric or boolean dtype (object arrays
            are refused: stores are read without pickle).
        attrs: JSON-serialisable group attributes (identity and summary).

    Returns:
        True if this call placed the store, False if a complete store was already there (it is
        kept: results are content-addressed, so an existing complete store is the same point).

    Raises:
        ValueError: a reserved array name, an object array, dimension names that do not match
            the array's or an unknown suffix (a caller's bug).
        UsageError: the directory cannot be written, naming it and the fix.
        StoreError: any other failure to write (a full disk...), naming the store.
    """
    path = Path(path)
    target = packs.points_dir_of(path) / (_stem(path) + POINT_SUFFIX)
    members: dict[str, np.ndarray] = {}
    described: dict[str, dict[str, Any]] = {}
    columns: dict[str, list[tuple[str, np.ndarray]]] = {}
    for name, (dims, data, *extra) in arrays.items():
        data = np.asarray(data)
        if name == META_MEMBER or name.startswith(TABLE_PREFIX) or data.dtype.hasobject:
            raise ValueError(f"point store array {name!r}: a reserved name or an object array "
                             f"(dtype {data.dtype}); give a numeric array under another name")
        if len(dims) != data.ndim:
            raise ValueError(f"point store array {name!r}: {len(dims)} dimension names {tuple(dims)} for "
                             f"an array of shape {data.shape}; give one name per dimension")
        described[name] = {"dims": list(dims), "attrs": dict(extra[0]) if extra else {}}
        if data.ndim == 1 and data.dtype.kind in "biufc":
            columns.setdefault(f"{TABLE_PREFIX}{dims[0]}.{data.size}", []).append((name, data))
        else:
            members[name] = data
    for table, cols in columns.items():
        if len(cols) == 1:
            members[cols[0][0]] = cols[0][1]
            continue
        rows = np.empty(cols[0][1].size, dtype=[(name, data.dtype) for name, data in cols])
        for name, data in cols:
            rows[name] = data
            described[name]["table"] = table
        members[table] = rows
    meta = {"attributes": {**dict(attrs), "store_version": STORE_VERSION, COMPLETE_ATTR: True},
            "arrays": described}
    return place_members(target, members, meta)


def place_members(path: str | Path, members: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> bool:
    """Place the ``.npz`` point store ``path`` holding ``members`` (array name → array) and the
    metadata ``meta`` (``{"attributes": {...}, "arrays": {name: {"dims": [...], "attrs": {...}}}}``,
    with ``"table": <member>`` for an array that is a column of a table member; stored as the
    JSON member :data:`META_MEMBER`), checksummed, atomically: written to a temporary file beside
    ``path`` and renamed. Nothing is checked about the contents (:func:`write_point` builds
    them); returns False, placing nothing, if a complete store of the point is already there.
    When the attributes name the point (:data:`HASH_ATTR`), a complete store under its name that
    is not its own (:func:`identity_problem`) does not count: it is set aside first
    (:func:`~sgdsweep.store.point_identity.set_aside`: moved to its own name if it is a good
    store of a point that has none, else replaced), with a warning.

    Raises: UsageError or StoreError as :func:`write_point`.
    """
    path = Path(path)
    existing = point_path(path.parent, _stem(path))
    owner = meta.get("attributes", {}).get(HASH_ATTR)
    if is_complete(existing, point_hash=owner):
        return False
    packed = packs.split_member(existing) is not None  # a pack's damaged member: left to the next packing
    if owner is not None and existing.exists() and not packed:
        try:
            set_aside(existing, owner, read_attrs(existing), (POINT_SUFFIX,))
        except StoreError:  # incomplete: replaced as any incomplete store
            pass
    members = {**members, META_MEMBER: np.array(json.dumps(meta, allow_nan=True).encode())}
    return _place(path, _archive(members), owner)


def _archive(members: Mapping[str, np.ndarray]) -> memoryview:
    """The ``.npz`` archive of ``members`` as :func:`numpy.savez` writes it (a zip of stored
    members ``<name>.npy``, each written by :func:`numpy.lib.format.write_array`, without
    pickle, dated :data:`_ZIP_TIME`), its comment :data:`CHECKSUM_MARKER` and the CRC-32 of every
    byte before the digits.
    The comment is set before :mod:`zipfile` writes the archive's end, so the archive is written
    once."""
    buf = io.BytesIO()
    placeholder = CHECKSUM_MARKER + b"0" * _CRC_DIGITS
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, data in members.items():  # a fixed time stamp: the same point, the same bytes
            with zf.open(zipfile.ZipInfo(f"{name}.npy", _ZIP_TIME), "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(data), allow_pickle=False)
        zf.comment = placeholder  # zipfile writes it last, at the end of the file
    raw = buf.getbuffer()
    if bytes(raw[-len(placeholder):]) != placeholder:
        raise RuntimeError("zipfile did not end the archive with its comment: cannot checksum the store")
    raw[-_CRC_DIGITS:] = b"%08x" % zlib.crc32(raw[:-_CRC_DIGITS])
    return raw


def _place(path: Path, data: memoryview | bytes, owner: str | None = None) -> bool:
    """Write ``data`` to a temporary file beside ``path`` (``<hash>.npz``) and rename it into
    place. False, placing nothing, if a complete store (point ``owner``'s own, when given)
    appeared at ``path`` meanwhile."""
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_file(tmp, data)
        if is_complete(path, point_hash=owner):  # another task placed the same point meanwhile
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


def _write_file(path: Path, data: memoryview | bytes) -> None:
    """Create (or truncate) ``path`` holding ``data``."""
    with open(path, "wb") as f:
        f.write(data)


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


def check_crc(raw: bytes, comment: bytes) -> None:
    """Check the zip file ``raw``, whose comment :mod:`zipfile` read as ``comment``, against the
    CRC-32 there (as :func:`_archive` wrote it; :mod:`sgdsweep.store.migrate` checks the Zarr zip
    stores of an earlier layout that carry one the same way).

    Raises: zipfile.BadZipFile, saying what is wrong.
    """
    if not comment.startswith(CHECKSUM_MARKER):
        raise zipfile.BadZipFile("it has no sgdsweep checksum: the file was cut short, changed, "
                                 "or not written by sgdsweep")
    if (len(comment) != len(CHECKSUM_MARKER) + _CRC_DIGITS or not raw.endswith(comment)
            or comment[-_CRC_DIGITS:] != b"%08x" % zlib.crc32(memoryview(raw)[:-_CRC_DIGITS])):
        raise zipfile.BadZipFile("its CRC-32 does not match its contents: the file was changed "
                                 "or damaged after it was written")


def store_bytes(path: str | Path) -> bytes:
    """The bytes of the point store ``path``, single (at most :data:`MAX_POINT_BYTES`) or packed
    (:func:`sgdsweep.store.packs.read_member`), as written.

    Raises: OSError, KeyError, zipfile.BadZipFile as its file or pack does; StoreError for a
    file larger than a store sgdsweep writes."""
    member = packs.split_member(path)
    if member is not None:  # a packed store: its bytes as written, read from its pack
        return packs.read_member(*member)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_POINT_BYTES:
            raise StoreError(f"point store {path} is {size} bytes, more than {MAX_POINT_BYTES} "
                             "(not a store sgdsweep wrote); delete it and rerun the workflow")
        return f.read()


#: What a refusal of a sweep's own point store tells the reader to do.
RERUN = "delete it and rerun the workflow: it recomputes that point"


class PointStore:
    """One point store (``<hash>.npz``, single or packed) opened for reading; a context manager.

    Args:
        path: the store (single or packed), named in errors.
        raw: the store's bytes, when they are held already (an export's member); else they are
            read from ``path``.
        fix: what a refusal tells the reader to do (for a sweep's own store, :data:`RERUN`).

    Attributes:
        path: the store.
        raw: its bytes, as written (what an export holds of it).
        attrs: its group attributes (identity, parameters, summary, layout version).
        arrays: name → (dimension names, attributes) of each array it holds.

    The store is read whole and checked (:func:`check_crc`) when opened;
    its members are checked before any is read (every name ``<array>.npy``, stored uncompressed
    as sgdsweep writes them, the metadata member
    present, declared sizes at most :data:`MAX_POINT_BYTES` in all, the metadata member's at most
    :data:`MAX_META_BYTES` declared and inflated) and read as
    :func:`numpy.load` reads them, without pickle. (A point held as a Zarr group, an export's or
    a store of an earlier layout, is read by :class:`sgdsweep.store.point_copies.ZarrPointGroup`.)

    Raises (on opening): StoreError naming the store when it is missing, unreadable, damaged,
    crafted, or not marked complete.
    """

    def __init__(self, path: str | Path, raw: bytes | None = None, fix: str = RERUN) -> None:
        self.path = Path(path)
        self.fix = fix
        self._zip: zipfile.ZipFile | None = None
        self._tables: dict[str, str] = {}  # array name → the table member holding it
        self._rows: dict[str, np.ndarray] = {}  # table member → its structured array, once read
        try:
            meta = self._open_npz(raw)
        except StoreError:
            self.close()
            raise
        except zipfile.BadZipFile as exc:
            self.close()
            raise self._refused(f"is damaged ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - OSError, or what numpy raises for a bad file
            self.close()
            raise self._refused(f"is missing or unreadable ({exc})") from None
        attrs = meta.get("attributes") if isinstance(meta, dict) else None
        if not isinstance(attrs, dict) or attrs.get(COMPLETE_ATTR) is not True:
            self.close()
            raise self._refused("is incomplete")
        self.attrs: dict[str, Any] = attrs
        self.arrays: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = meta["arrays"]

    def _open_npz(self, raw: bytes | None) -> dict[str, Any]:
        if raw is None:
            raw = store_bytes(self.path)
        elif len(raw) > MAX_POINT_BYTES:
            raise self._refused(f"is {len(raw)} bytes, more than {MAX_POINT_BYTES} (not a store sgdsweep wrote)")
        self.raw = raw
        self._zip = zipfile.ZipFile(io.BytesIO(raw))  # reads the zip's directory only
        check_crc(raw, self._zip.comment)
        infos = self._zip.infolist()
        names = [info.filename for info in infos]
        declared = sum(info.file_size for info in infos)
        if (not all(n.endswith(".npy") for n in names) or len(set(names)) != len(names)
                or f"{META_MEMBER}.npy" not in names):
            raise self._refused(f"is not a store sgdsweep wrote (members {sorted(names)[:8]}: every member "
                                f"must be '<array>.npy' and '{META_MEMBER}.npy' must be one)")
        packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED or i.compress_size != i.file_size]
        if packed:  # a compressed member could inflate to far more than the file holds
            raise self._refused(f"is not a store sgdsweep wrote (member {packed[0]!r} is compressed or its "
                                "sizes differ; sgdsweep stores every member uncompressed)")
        if declared > MAX_POINT_BYTES:
            raise self._refused(f"declares {declared} bytes of members, more than {MAX_POINT_BYTES} (a crafted file)")
        text = self._meta_member()
        if text.dtype.kind != "S" or text.shape != ():
            raise self._refused(f"is not a store sgdsweep wrote (member '{META_MEMBER}.npy' is not a JSON string)")
        meta = json.loads(bytes(text[()]))
        if isinstance(meta, dict):
            described = meta.get("arrays")
            held = {n[:-4] for n in names} - {META_MEMBER}
            if not isinstance(described, dict) or {v.get("table", k) for k, v in described.items()} != held:
                raise self._refused("is not a store sgdsweep wrote (its arrays and their description differ)")
            self._tables = {k: v["table"] for k, v in described.items() if "table" in v}
            meta["arrays"] = {k: (tuple(v["dims"]), dict(v.get("attrs", {}))) for k, v in described.items()}
        return meta

    def check_identity(self, point_hash: str) -> None:
        """Check that this store is point ``point_hash``'s
        (:func:`~sgdsweep.store.point_identity.identity_problem`).

        Raises: StoreError naming the store, the point and what it holds instead.
        """
        why = identity_problem(point_hash, self.attrs)
        if why is not None:
            raise misnamed(self.path, point_hash, why)

    def _refused(self, problem: str) -> StoreError:
        """The error refusing this store: ``point store <path> <problem>; <fix>``."""
        return StoreError(f"point store {self.path} {problem}; {self.fix}")

    def check_arrays(self) -> None:
        """Check every array member from its ``.npy`` header and size, before its data is parsed
        (:func:`sgdsweep.store.npy.check_member`): a data type of numbers or booleans (a table's
        columns too: no object array, so nothing pickled), a shape an array can have and exactly
        the bytes it declares; then its CRC-32, read to its end in blocks. Opening a store checks
        its metadata only; a reader of its arrays would find such a member when it reads it,
        after NumPy allocated what the header declares.

        Raises: StoreError naming the store and the member."""
        assert self._zip is not None
        for info in self._zip.infolist():
            if info.filename == f"{META_MEMBER}.npy":
                continue
            try:
                with self._zip.open(info) as member:
                    head = member.read(PREFIX_BYTES)
                    end = header_end(head)
                    if end > MAX_HEADER_BYTES:
                        raise ValueError(f"its header declares {end} bytes")
                    check_member(head + member.read(end - len(head)), info.file_size)
                    while member.read(1 << 20):  # to its end, where zipfile checks its CRC-32
                        pass
            except (ValueError, RuntimeError, NotImplementedError, EOFError, OSError, zipfile.BadZipFile) as exc:
                raise self._refused(f"is not a store sgdsweep wrote (member {info.filename!r}: {exc})") from None

    def _member(self, name: str) -> np.ndarray:
        """The array of member ``<name>.npy``, read as :func:`numpy.load` reads a member of an
        ``.npz`` archive (:func:`numpy.lib.format.read_array`, without pickle), its CRC-32
        checked by :mod:`zipfile`."""
        assert self._zip is not None
        return read_npy(self._zip.read(f"{name}.npy"))  # read_array's result, repeated headers parsed once

    def _meta_member(self) -> np.ndarray:
        """The metadata member's array, as :meth:`_member` reads it, after checking that its
        declared size is at most :data:`MAX_META_BYTES` and inflating at most one byte more.

        Raises: StoreError naming the store when either size is larger."""
        assert self._zip is not None
        name = f"{META_MEMBER}.npy"
        declared = self._zip.getinfo(name).file_size
        raw = b""
        if declared <= MAX_META_BYTES:  # the declaration can lie: inflate one byte more at most
            with self._zip.open(name) as member:
                raw = member.read(MAX_META_BYTES + 1)
        if declared > MAX_META_BYTES or len(raw) > MAX_META_BYTES:
            raise self._refused(f"is not a store sgdsweep wrote (its member '{name}' holds more than "
                                f"{MAX_META_BYTES} bytes, declared {declared}; sgdsweep writes a few kB there)")
        try:  # a bytes scalar of exactly its size: NumPy allocates what a header declares before reading
            _, shape = check_member(raw, len(raw), kinds="S")
        except ValueError as exc:
            raise self._refused(f"is not a store sgdsweep wrote (member '{name}': {exc})") from None
        if shape != ():
            raise self._refused(f"is not a store sgdsweep wrote (member '{name}' has shape {shape}, not a string)")
        return np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)

    def read(self, name: str) -> np.ndarray:
        """The array ``name`` (a new, writeable NumPy array).

        Raises: KeyError if the store holds no such array; StoreError if it cannot be read (a
        damaged member, an object array), naming the store and the array.
        """
        if name not in self.arrays:
            raise KeyError(name)
        try:
            if name in self._tables:
                table = self._tables[name]
                if table not in self._rows:
                    self._rows[table] = self._member(table)
                return self._rows[table][name].copy()
            return self._member(name)
        except Exception as exc:  # noqa: BLE001 - numpy and zipfile raise several types
            raise StoreError(f"array {name!r} of point store {self.path} is unreadable ({exc}); {self.fix}") from None

    def read_many(self, names: Iterable[str], prefixes: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """The arrays ``names`` that the store holds (absent ones left out), in that order, then
        every other array whose name starts with one of ``prefixes``, in name order."""
        wanted = [*names, *sorted(a for a in self.arrays if a.startswith(prefixes))] if prefixes else list(names)
        return {name: self.read(name) for name in dict.fromkeys(wanted) if name in self.arrays}

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> PointStore:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_attrs(path: str | Path) -> dict[str, Any]:
    """The group attributes of a complete point store.

    Raises:
        StoreError: if the store is missing, unreadable, damaged or incomplete.
    """
    with PointStore(path) as store:
        return store.attrs


def read_array(path: str | Path, name: str) -> np.ndarray:
    """One array of a point store.

    Raises: StoreError if the store or the array is missing or unreadable.
    """
    with PointStore(path) as store:
        try:
            return store.read(name)
        except KeyError:
            raise StoreError(f"point store {path} holds no array {name!r}; delete the store and rerun "
                             "the workflow") from None


def read_arrays(path: str | Path, names: Iterable[str], prefixes: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the point store at ``path`` that it holds, then those whose name
    starts with one of ``prefixes`` (:meth:`PointStore.read_many`); empty if there is no store.

    Raises: StoreError if the store is damaged, incomplete or an array is unreadable.
    """
    if not packs.member_exists(path):
        return {}
    with PointStore(path) as store:
        return store.read_many(names, prefixes)


def is_complete(path: str | Path, point_hash: str | None = None) -> bool:
    """Whether ``path`` holds a complete point store: readable, marked complete, and every byte
    as written (a store cut short or with a byte changed is not complete). With ``point_hash``,
    the store must also be that point's
    (:func:`~sgdsweep.store.point_identity.identity_problem`)."""
    try:
        with PointStore(path) as store:
            if point_hash is not None:
                store.check_identity(point_hash)
    except StoreError:
        return False
    return True


def complete_points(points_dir: str | Path, hashes: Iterable[str]) -> set[str]:
    """The hashes among ``hashes`` whose point store in ``points_dir`` (single or packed) is
    complete and is that point's own (:func:`is_complete` with the hash; one listing of the
    directory and one of its packs, then only the stores that exist are opened: planning 10⁴
    points stays fast). Stores of earlier layouts are not found: :mod:`sgdsweep.store.migrate`
    rewrites them first."""
    try:
        present = set(os.listdir(points_dir))
    except FileNotFoundError:
        return set()
    packed = packs.index(points_dir)
    done = set()
    for h in hashes:
        if f"{h}{POINT_SUFFIX}" in present:  # as point_path prefers them
            found: Path | None = Path(points_dir) / f"{h}{POINT_SUFFIX}"
        else:
            found = packs.member_path(packed[h], h) if h in packed else None
        if found is not None and is_complete(found, point_hash=h):
            done.add(h)
    return done


def has_array(path: str | Path, name: str) -> bool:
    """Whether the complete point store at ``path`` holds an array called ``name``."""
    try:
        with PointStore(path) as store:
            return name in store.arrays
    except StoreError:
        return False

