"""Point stores of earlier layouts, rewritten into the current one: the one place that reads them.

sgdsweep stored a point first as a Zarr (format 3) group in a directory, ``<hash>.zarr``
(layout 1: no checksum, so every array must have all its chunk files, since Zarr reads a lost one
as the fill value), then in a zip file, ``<hash>.zarr.zip`` (layout 2: the zip's comment holds
the CRC-32 of the file before it, as a ``.npz`` store's does; the first such files carried no
comment, and then every member is checked against its own CRC-32). The readers
(:mod:`sgdsweep.store.points`) read only the current layout, ``<hash>.npz``. This module finds
stores of the earlier layouts (:func:`legacy_stores`: one listing, nothing opened) and rewrites
each into the current one (:func:`migrate_store`, :func:`migrate_points`):

1. the old store is opened through Zarr's public API (:class:`~sgdsweep.store.point_copies.ZarrPointGroup`)
   and checked whole, as it was when it was read in place: a damaged or incomplete one is not
   migrated (it is reported, the point is simulated anew, and its ``.npz`` then supersedes it);
2. its arrays (with their dimension names and attributes) and group attributes are written as the
   point's ``.npz`` store (:func:`~sgdsweep.store.points.write_point`: a temporary file renamed
   into place, checksummed), the layout version the current one;
3. the new store is read back and compared with the old one, every array bitwise (data type,
   shape and bytes) and every attribute;
4. only then is the old store removed (a directory is first renamed to a temporary name, which the
   cleaning of killed writes removes, so that no half-removed store is ever read under its name).

A migration killed at any step leaves the old store whole under its name, and the next one
starts again; a ``.npz`` store renamed into place before the kill is complete and the point's, so
the next migration finds the old store superseded and removes it. Migrating twice changes
nothing. An old store of a point that has a complete store of the current layout (single or
packed) is superseded: it is removed without being read.

When: ``sgdsweep run`` migrates every store of an earlier layout in the sweep's points directory
once it holds the sweep's lock, before it plans; each shard job migrates its own points' when it
starts (a plain ``snakemake`` run plans before any job runs: it counts such points as to
simulate, and the shard job then finds them stored). Nothing else reads the earlier layouts.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sgdsweep.errors import StoreError
from sgdsweep.store.point_copies import ZarrPointGroup, copy_point
from sgdsweep.store.points import (
    CHECKSUM_MARKER,
    POINT_SUFFIX,
    STORE_VERSION,
    PointStore,
    check_crc,
    is_complete,
    point_path,
)

log = logging.getLogger(__name__)

#: File name suffixes of the earlier layouts: 2, a Zarr group in a zip file; 1, in a directory
#: (the order in which a point's stores are migrated when it has both).
ZIP_SUFFIX, DIRECTORY_SUFFIX = ".zarr.zip", ".zarr"
LEGACY_SUFFIXES = (ZIP_SUFFIX, DIRECTORY_SUFFIX)
#: The group attribute holding a store's layout version (the only one migration changes).
VERSION_ATTR = "store_version"


@dataclass
class Migration:
    """What :func:`migrate_points` did: the points whose old store was rewritten as ``.npz``
    (``migrated``), whose old store was removed because a complete current store was there
    (``superseded``), and whose old store was left as it is (``damaged``: hash → why)."""

    migrated: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)


def legacy_stores(points_dir: str | Path, hashes: Iterable[str] | None = None) -> dict[str, list[Path]]:
    """Point hash → its stores of earlier layouts in ``points_dir`` (a zip store before a
    directory store), for the points ``hashes`` (None: every point); one listing of the
    directory, nothing opened. Temporaries (hidden names) are not stores."""
    wanted = None if hashes is None else set(hashes)
    try:
        names = sorted(os.listdir(points_dir))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found: dict[str, list[Path]] = {}
    for suffix in LEGACY_SUFFIXES:
        for name in names:
            stem = name[: -len(suffix)]
            if name.startswith(".") or not name.endswith(suffix) or not stem or "." in stem:
                continue
            if wanted is None or stem in wanted:
                found.setdefault(stem, []).append(Path(points_dir) / name)
    return found


def _stem(path: Path) -> str:
    for suffix in LEGACY_SUFFIXES:
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    raise ValueError(f"{path}: not a point store of an earlier layout (its name must end in "
                     f"{' or '.join(LEGACY_SUFFIXES)})")


def _check_zip(path: Path) -> None:
    """Check the layout-2 store ``path`` whole: against the CRC-32 in its comment
    (:func:`~sgdsweep.store.points.check_crc`), or, for a store written before stores carried
    that comment, every member against its own CRC-32 (:meth:`zipfile.ZipFile.testzip`).

    Raises: StoreError naming the store when it cannot be read, is not a zip, was cut short or
    has a byte changed since it was written.
    """
    try:
        raw = path.read_bytes()
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:  # BadZipFile when cut short: no directory at the end
            if zf.comment.startswith(CHECKSUM_MARKER):
                check_crc(raw, zf.comment)
                return
            bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"member {bad!r} fails its CRC-32: the file was changed or damaged")
    except (OSError, zipfile.BadZipFile) as exc:
        raise StoreError(f"point store {path} is damaged ({exc}); rerun the workflow: it recomputes that "
                         "point") from None


@contextlib.contextmanager
def open_legacy(path: str | Path) -> Iterator[ZarrPointGroup]:
    """The store ``path`` of an earlier layout opened for reading, checked as it was read in
    place: a zip store whole (:func:`_check_zip`), a directory store's every chunk file present.

    Raises: StoreError naming the store when it is missing, damaged or incomplete.
    """
    path = Path(path)
    if path.is_dir():
        yield ZarrPointGroup(path)
        return
    from zarr.storage import ZipStore

    _check_zip(path)
    store = ZipStore(path, mode="r")
    try:
        yield ZarrPointGroup(path, store, require_chunks=False)  # its bytes checked whole above
    finally:
        store.close()


def legacy_problem(path: str | Path) -> str | None:
    """Why the store ``path`` of an earlier layout cannot be migrated (damaged, incomplete:
    the error :func:`open_legacy` raises), or None when it can (for ``sgdsweep plan``)."""
    try:
        with open_legacy(path):
            return None
    except StoreError as exc:
        return str(exc)


def _differences(old: ZarrPointGroup, new: PointStore) -> list[str]:
    """What differs between the old store and its ``.npz`` rewrite: array names, each array's
    dimension names, attributes, data type, shape and bytes, and the group attributes but the
    layout version (empty: the rewrite reads bitwise equal)."""
    if set(old.arrays) != set(new.arrays):
        return [f"arrays {sorted(set(old.arrays) ^ set(new.arrays))}"]
    out = []
    for name in sorted(old.arrays):
        if tuple(old.arrays[name][0]) != tuple(new.arrays[name][0]) or old.arrays[name][1] != new.arrays[name][1]:
            out.append(f"array {name!r}'s dimension names or attributes")
            continue
        a, b = old.read(name), new.read(name)
        if a.dtype != b.dtype or a.shape != b.shape or np.ascontiguousarray(a).tobytes() != b.tobytes():
            out.append(f"array {name!r}'s values")
    strip = (lambda attrs: {k: v for k, v in attrs.items() if k != VERSION_ATTR})
    if strip(old.attrs) != strip(new.attrs):
        out.append("group attributes")
    if new.attrs.get(VERSION_ATTR) != STORE_VERSION:
        out.append(f"layout version {new.attrs.get(VERSION_ATTR)!r}")
    return out


def _remove(path: Path) -> None:
    """Remove the old store ``path``: a file at once, a directory renamed first to a temporary
    name (``.<name>.tmp-<8 hex>``, what a killed write of that layout leaves, removed later by
    :func:`sgdsweep.store.leftovers.remove_stale_temporaries` if this is killed midway)."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
        return
    aside = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def migrate_store(path: str | Path) -> tuple[Path, bool]:
    """Rewrite the store ``path`` of an earlier layout as its point's ``.npz`` store, verified,
    then remove it (the module's steps 1–4). Returns (the point's current store, whether this
    call rewrote it: False when a complete store of the point was there already and the old
    one, superseded, was only removed).

    Raises:
        StoreError: naming the store, when it is damaged or incomplete, or when the ``.npz``
            store found or written under its name does not read as it does (the old store is
            then kept).
        UsageError: when the points directory cannot be written (:func:`write_point`).
    """
    path = Path(path)
    point = _stem(path)
    current = point_path(path.parent, point)
    if is_complete(current, point_hash=point):
        _remove(path)
        return current, False
    target = path.parent / f"{point}{POINT_SUFFIX}"
    with open_legacy(path) as old:
        copy_point(old, target)
        with PointStore(point_path(path.parent, point)) as new:
            differ = _differences(old, new)
        if differ:
            raise StoreError(f"point store {path} is not migrated: the store {current} under its point's name "
                             f"differs in {', '.join(differ)}; it is kept as it is. Delete the one that is "
                             "wrong and rerun the workflow")
    _remove(path)
    return current, True


def migrate_points(points_dir: str | Path, hashes: Iterable[str] | None = None) -> Migration:
    """Migrate every store of an earlier layout of the points ``hashes`` (None: of every point)
    in ``points_dir`` (:func:`migrate_store`); a damaged one is left as it is and logged, and its
    point is simulated anew. One listing of the directory when there is nothing to migrate.

    Raises: UsageError when the points directory cannot be written.
    """
    result = Migration()
    for point, paths in legacy_stores(points_dir, hashes).items():
        for path in paths:
            try:
                _, rewrote = migrate_store(path)
            except StoreError as exc:
                result.damaged[point] = str(exc)
                log.warning("a point store of an earlier layout is not migrated (its point is simulated anew): %s",
                            exc)
                continue
            if rewrote:
                result.migrated.append(point)
            else:
                result.superseded.append(point)
    if result.migrated or result.superseded:
        log.info("migrated %d point store(s) of an earlier layout to %s (and removed %d superseded by one), "
                 "e.g. %s", len(result.migrated), POINT_SUFFIX, len(result.superseded),
                 (result.migrated or result.superseded)[0])
    return result



def remove_superseded(points_dir: str | Path, hashes: Iterable[str]) -> list[Path]:
    """Remove the stores of an earlier layout of the points ``hashes`` that have a complete
    store of the current layout (single or packed) of their own: a damaged old store once its
    point was simulated anew. One listing of ``points_dir``. Returns the paths removed."""
    removed = []
    for point, paths in legacy_stores(points_dir, hashes).items():
        if is_complete(point_path(points_dir, point), point_hash=point):
            for path in paths:
                _remove(path)
                removed.append(path)
    return removed
