"""Packs: many point stores in one file, so that a large sweep leaves few files under ``points/``.

A parallel file system suffers from 10⁵ small files; a sweep's points are therefore packed. The
Dask tasks of a shard write one store per point (``points/<hash>.npz``,
:func:`sgdsweep.store.points.write_point`: concurrent writers, each atomic); once every point of
the shard is stored, the shard job packs them (:func:`pack_points`) into one file,
``points/packs/<label>.<digest>.zip`` (:data:`PACKS_DIR`; the label is the shard's id, the digest
12 hex digits of the members' names and CRC-32s). A pack is a zip of stored (uncompressed)
members ``<hash>.npz``, each the bytes of that point's store unchanged, so each member keeps its
own checksum (the CRC-32 comment that ends a store) and is checked alone when read: a damaged
member makes only its point incomplete, and only that point is recomputed. A pack is written
whole to a temporary file beside its final name and renamed into place; then the packs it
replaces and the single stores it holds are removed (a killed packing leaves at worst a store
both single and packed, or in two packs: read either way, merged by the next packing). Points
added later are single stores again until the shard packs them with its old pack's members
into a new pack (a repack, equally atomic).

A packed point's store path is ``points/packs/<pack>.zip/<hash>.npz`` (:class:`MemberPath`:
``exists()`` says whether the pack holds the member); :func:`sgdsweep.store.points.point_path`
returns it and :class:`sgdsweep.store.points.PointStore` reads it, so every reader goes through
the same functions whether a point is single or packed.

When to pack (once all the shard's points are stored): a shard with at least
:data:`PACK_MIN_POINTS` single stores, a shard that has a pack already (its new or recomputed
points join it), any shard once the points directory holds :data:`LOOSE_MAX` single stores or
more, and a shard with more than one pack (a killed repack's). So fewer than :data:`LOOSE_MAX`
single stores stay loose, and a sweep has about one file per shard under ``points/``; a small
sweep (shards of fewer than :data:`PACK_MIN_POINTS` points) keeps one file per point.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

from sgdsweep.errors import StoreError

log = logging.getLogger(__name__)

#: Subdirectory of the points directory that holds the packs.
PACKS_DIR = "packs"
#: A pack's file name: ``<label>.<12 hex digits>.zip``.
PACK_NAME = re.compile(r"^([0-9A-Za-z_-]{1,64})\.([0-9a-f]{12})\.zip$")
#: A member's name (and a single store's): ``<point hash>.npz``.
MEMBER_NAME = re.compile(r"^([0-9a-f]{8,64})\.npz$")
#: A shard packs its single stores once it has at least this many.
PACK_MIN_POINTS = 16
#: Every shard packs its single stores once the points directory holds at least this many.
LOOSE_MAX = 256
#: Largest member, bytes (as :data:`sgdsweep.store.points.MAX_POINT_BYTES`): more is a crafted pack.
MAX_MEMBER_BYTES = 1 << 31
#: Modification time of every member (the earliest a zip can hold): the same stores, the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
#: How many packs :func:`read_member` keeps open.
_OPEN_MAX = 8

_MEMBERS: dict[tuple[str, int], frozenset[str]] = {}  # (pack path, inode) → its member names
_OPEN: dict[tuple[str, int, int, int], zipfile.ZipFile] = {}  # (path, inode, size, mtime) → the pack, open
_INDEX: dict[tuple[str, tuple[tuple[str, int], ...]], dict[str, Path]] = {}  # listing → hash → pack


class MemberPath(type(Path())):  # type: ignore[misc]
    """The path of a packed point's store, ``<points>/packs/<pack>.zip/<hash>.npz``: not a file
    of its own, so :meth:`exists` says whether the pack holds the member."""

    def exists(self, *args: object, **kwargs: object) -> bool:
        return member_exists(self)


def packs_dir(points_dir: str | Path) -> Path:
    """The directory of a points directory's packs."""
    return Path(points_dir) / PACKS_DIR


def split_member(path: str | Path) -> tuple[Path, str] | None:
    """(pack file, member name) when ``path`` names a packed store
    (``<points>/packs/<pack>.zip/<hash>.npz``); None for any other path."""
    path = Path(path)
    parent = path.parent
    if parent.parent.name == PACKS_DIR and PACK_NAME.match(parent.name) and MEMBER_NAME.match(path.name):
        return Path(parent), path.name
    return None


def points_dir_of(path: str | Path) -> Path:
    """The points directory a store path (single or packed) belongs to."""
    member = split_member(path)
    return member[0].parent.parent if member else Path(path).parent


def member_exists(path: str | Path) -> bool:
    """Whether the packed store ``path`` is a member of its pack (a single store: whether the file is there)."""
    member = split_member(path)
    if member is None:
        return os.path.exists(path)
    try:
        inode = os.stat(member[0]).st_ino
    except OSError:
        return False
    return member[1] in _members(str(member[0]), inode)


def _members(pack: str, inode: int) -> frozenset[str]:
    """The member names of ``pack`` (cached by path and inode: a pack is never changed in place)
    that name a store; empty if the pack cannot be read (cut short: its points count as missing)."""
    key = (pack, inode)
    if key not in _MEMBERS:
        try:
            names = _open(pack).namelist()
        except (OSError, zipfile.BadZipFile, StoreError):
            names = []
        _MEMBERS[key] = frozenset(n for n in names if MEMBER_NAME.match(n))
    return _MEMBERS[key]


def _open(pack: str) -> zipfile.ZipFile:
    """The pack, open for reading (at most :data:`_OPEN_MAX` kept open, each as long as the
    file's inode, size and modification time stay the same).

    Raises: OSError, zipfile.BadZipFile."""
    st = os.stat(pack)
    key = (pack, st.st_ino, st.st_size, st.st_mtime_ns)
    zf = _OPEN.pop(key, None)
    if zf is None:
        zf = zipfile.ZipFile(pack)
        st = os.fstat(zf.fp.fileno())  # replaced meanwhile: keyed as what was opened
        key = (pack, st.st_ino, st.st_size, st.st_mtime_ns)
        while len(_OPEN) >= _OPEN_MAX:
            _OPEN.pop(next(iter(_OPEN))).close()
    _OPEN[key] = zf  # most recently used last
    return zf


def _scan(points_dir: str | Path) -> list[tuple[str, int]]:
    """(path, inode) of each pack of ``points_dir``, in name order: one directory listing."""
    try:
        with os.scandir(packs_dir(points_dir)) as it:
            return sorted((e.path, e.inode()) for e in it
                          if PACK_NAME.match(e.name) and e.is_file(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def listing(points_dir: str | Path) -> list[tuple[Path, frozenset[str]]]:
    """The packs of ``points_dir`` in name order, each with its member names (one directory
    listing; each pack's directory read once per process)."""
    return [(Path(path), _members(path, inode)) for path, inode in _scan(points_dir)]


def index(points_dir: str | Path) -> dict[str, Path]:
    """Point hash → the pack that holds its store (the first in name order where several do);
    one directory listing, the mapping cached until the packs change."""
    scanned = _scan(points_dir)
    key = (str(points_dir), tuple(scanned))
    if key not in _INDEX:
        if len(_INDEX) > 64:
            _INDEX.clear()
        found: dict[str, Path] = {}
        for path, inode in scanned:
            for name in _members(path, inode):
                found.setdefault(name[: -len(".npz")], Path(path))
        _INDEX[key] = found
    return _INDEX[key]


def member_path(pack: Path, point_hash: str) -> MemberPath:
    """The store path of point ``point_hash`` in ``pack``."""
    return MemberPath(pack / f"{point_hash}.npz")


def read_member(pack: str | Path, name: str) -> bytes:
    """The bytes of member ``name`` of ``pack``, checked against the member's CRC-32 by
    :mod:`zipfile` (the store's own checksum is checked by its reader).

    Raises: OSError (no such pack), KeyError (no such member), zipfile.BadZipFile (damaged),
    StoreError (a member sgdsweep does not write: compressed, or larger than
    :data:`MAX_MEMBER_BYTES`), naming the pack.
    """
    zf = _open(str(pack))
    info = zf.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > MAX_MEMBER_BYTES:
        raise StoreError(f"pack {pack}: member {name!r} is compressed or declares {info.file_size} bytes "
                         f"(sgdsweep stores members uncompressed, at most {MAX_MEMBER_BYTES} bytes): a crafted "
                         "file; delete it and rerun the workflow: it recomputes its points")
    return zf.read(info)


def _write_pack(directory: Path, label: str, members: dict[str, bytes]) -> Path:
    """Write ``members`` (name → bytes) as the pack ``<label>.<digest>.zip`` in ``directory``,
    atomically (a temporary file renamed into place). Returns its path."""
    names = sorted(members)
    digest = hashlib.sha256("".join(f"{n}:{zlib.crc32(members[n]):08x};" for n in names).encode()).hexdigest()
    path = directory / f"{label}.{digest[:12]}.zip"
    tmp = directory / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(tmp, "x", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in names:
                zf.writestr(zipfile.ZipInfo(name, _ZIP_TIME), members[name])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def label_for(shard: str) -> str:
    """The pack label of shard ``shard``: its id where that can name a file (a content hash),
    else 16 hex digits of the id's SHA-256."""
    if PACK_NAME.match(f"{shard}.{'0' * 12}.zip"):
        return shard
    return hashlib.sha256(shard.encode()).hexdigest()[:16]


def _single_names(points_dir: Path) -> set[str]:
    try:
        return {n for n in os.listdir(points_dir) if MEMBER_NAME.match(n)}
    except FileNotFoundError:
        return set()


def pack_points(points_dir: str | Path, label: str, hashes: Iterable[str], force: bool = False) -> Path | None:
    """Pack the single stores of the points ``hashes`` in ``points_dir`` with the members of the
    packs labelled ``label`` into one new pack ``packs/<label>.<digest>.zip``, when the rule
    above says so (or ``force``); then remove the packs it replaces and the single stores it
    holds. Only complete stores that are their point's own
    (:func:`sgdsweep.store.points.is_complete`) are packed: a damaged or misnamed member of an
    old pack is left out (with a warning), a damaged single store is left where it is, to be
    recomputed. Call it once every point of ``hashes`` is stored, under the sweep's lock.

    Returns: the new pack, or None when nothing was packed.

    Raises: ValueError if ``label`` cannot name a pack (a caller's bug); OSError if the pack
    cannot be written (the stores are left as they were).
    """
    from sgdsweep.store.points import is_complete

    if not PACK_NAME.match(f"{label}.{'0' * 12}.zip"):
        raise ValueError(f"pack label {label!r}: give 1 to 64 letters, digits, '_' or '-'")
    points_dir = Path(points_dir)
    loose = _single_names(points_dir)
    singles = [h for h in dict.fromkeys(hashes) if f"{h}.npz" in loose]
    own = [p for p, _ in listing(points_dir) if PACK_NAME.match(p.name).group(1) == label]
    due = len(singles) >= PACK_MIN_POINTS or len(loose) >= LOOSE_MAX or bool(own) or force
    if not (singles and due) and len(own) <= 1:
        return None
    members: dict[str, bytes] = {}
    for pack in own:
        for name in sorted(_members(str(pack), os.stat(pack).st_ino)):
            h = name[: -len(".npz")]
            if name in members or f"{h}.npz" in singles:
                continue
            if is_complete(member_path(pack, h), point_hash=h):
                members[name] = read_member(pack, name)
            else:
                log.warning("pack %s: member %s is damaged or not point %s's store: left out of the new pack "
                            "(the point is recomputed by the next run)", pack, name, h)
    packed = []
    for h in singles:
        single = points_dir / f"{h}.npz"
        if is_complete(single, point_hash=h):
            members[single.name] = single.read_bytes()
            packed.append(single)
    if not members:
        return None
    new = _write_pack(packs_dir(points_dir), label, members)
    for pack in own:
        if pack != new:
            pack.unlink(missing_ok=True)
    for single in packed:
        single.unlink(missing_ok=True)
    return new
