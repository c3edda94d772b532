"""Leftovers of killed writes: temporaries, failure records, lane parts cut short, imports.

A write killed mid-way (a lost worker, ``kill -9``) leaves its temporary file (or, for the
first layout, directory) beside the stores, in the points directory or, for the lanes of a
precision sweep, in its ``lanes/`` subdirectory; a point that failed leaves its failure record
(:func:`sgdsweep.store.points.failed_marker`); a machine that went down before a renamed lane
part reached the disk leaves the part cut short under its own name (a store's checksum is the
comment that ends its file, so such a part has none); a killed ``sgdsweep import`` leaves its
staging directory ``<results>/.import-<8 hex>``. None of these is ever read as a result.

They are removed only where no write in progress can own them. The shard jobs run under the
sweep's lock (:mod:`sgdsweep.run.locking`: one workflow per sweep), and a write in progress
fills and renames its temporary within seconds, so a temporary or a cut-short part last
modified :data:`sgdsweep.store.points.STALE_TEMPORARY_SECONDS` ago or earlier is a leftover,
whichever point, round or config it belongs to; a younger one is kept. Once every point of a
shard is stored, its own points' and lanes' temporaries go whatever their age (a writer still
running finds the store or part complete and places nothing). Failure records go once the point
is stored. An import's staging directory goes when nothing in it changed for that long (an
import in progress writes into it continuously).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from sgdsweep.store.migrate import LEGACY_SUFFIXES
from sgdsweep.store.packs import PACK_NAME, packs_dir
from sgdsweep.store.points import CHECKSUM_MARKER, POINT_SUFFIX, STALE_TEMPORARY_SECONDS, failed_marker

#: A lane part's name (:func:`sgdsweep.store.lanes.part_path`) and its temporary's.
_LANE_PART = re.compile(r"^([0-9a-f]{16})\.([0-9]+)-([0-9]+)\.npz$")
_LANE_TEMPORARY = re.compile(r"^\.([0-9a-f]{16})\.[0-9]+-[0-9]+\.npz\.tmp-[0-9a-zA-Z]+$")
#: Suffixes of a point store's temporaries: of the current layout and, left by killed writes or
#: migrations, of the earlier ones (:mod:`sgdsweep.store.migrate`).
SUFFIXES = (POINT_SUFFIX, *LEGACY_SUFFIXES)
#: A point store's temporary when any point's may be removed: ``.<hex hash><suffix>.tmp-*``.
_POINT_TEMPORARY = re.compile(r"^\.[0-9a-f]+(?:" + "|".join(re.escape(s) for s in SUFFIXES) + r")\.tmp-")
#: The staging directory of ``sgdsweep import`` (:func:`sgdsweep.share.archive.import_sweep`).
_IMPORT_STAGING = re.compile(r"^\.import-[0-9a-f]{8}$")
#: Length of the checksum comment that ends a complete store: the marker and 8 hex digits.
_TAIL = len(CHECKSUM_MARKER) + 8


def _remove(entry: os.DirEntry, cutoff: float) -> bool:
    """Remove ``entry`` (a file, or a directory with its contents) if it was last modified at
    ``cutoff`` or earlier; False if it is younger, gone meanwhile or cannot be removed (an
    unwritable directory: a write there fails with the reason)."""
    try:
        if entry.stat(follow_symlinks=False).st_mtime > cutoff:
            return False
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    except OSError:  # removed meanwhile (its write finished, or another cleaner), or unwritable
        return False
    return True


def _entries(directory: str | Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_stale_temporaries(points_dir: str | Path, hashes: Iterable[str] | None,
                             older_than: float = STALE_TEMPORARY_SECONDS) -> list[Path]:
    """Remove what killed writes of the points ``hashes`` (None: of any point, e.g. an earlier
    round's) left in ``points_dir``: their temporary files (and the temporary directories of
    layout 1) last modified ``older_than`` seconds ago or earlier. Younger ones may belong to a
    write in progress and are kept. One directory listing. Returns the paths removed."""
    wanted = None if hashes is None else set(hashes)
    cutoff = time.time() - older_than
    removed = []
    tags = tuple(f"{suffix}.tmp-" for suffix in SUFFIXES)
    for entry in _entries(points_dir):
        name = entry.name
        if not name.startswith(".") or ".tmp-" not in name:
            continue
        point, _, suffix = name[1:].partition(".")
        if wanted is None:
            if not _POINT_TEMPORARY.match(name):
                continue
        elif point not in wanted or not f".{suffix}".startswith(tags):
            continue
        if _remove(entry, cutoff):
            removed.append(Path(entry.path))
    return removed


def remove_pack_leftovers(points_dir: str | Path, older_than: float = STALE_TEMPORARY_SECONDS) -> list[Path]:
    """Remove, in ``points_dir/packs`` (:mod:`sgdsweep.store.packs`), the temporaries of packs
    whose write was killed (``.<pack>.tmp-*``), last modified ``older_than`` seconds ago or
    earlier. A pack itself is never removed here (a packing removes the packs it replaces).
    Returns the paths removed."""
    cutoff = time.time() - older_than
    removed = []
    for entry in _entries(packs_dir(points_dir)):
        name, _, tag = entry.name.partition(".tmp-")
        if not (tag and name.startswith(".") and PACK_NAME.match(name[1:])):
            continue
        if _remove(entry, cutoff):
            removed.append(Path(entry.path))
    return removed


def cut_short(path: str | Path) -> bool:
    """Whether the store file ``path`` was cut short: it does not end with the checksum comment
    (:data:`sgdsweep.store.points.CHECKSUM_MARKER` and 8 hex digits) that a complete store's
    file ends with. Reads only its last bytes; a file that cannot be read counts as not cut
    short (nothing is removed on a guess)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < _TAIL:
                return True
            fh.seek(size - _TAIL)
            tail = fh.read(_TAIL)
    except OSError:
        return False
    return not (tail.startswith(CHECKSUM_MARKER)
                and re.fullmatch(rb"[0-9a-f]{8}", tail[len(CHECKSUM_MARKER):]) is not None)


def remove_lane_leftovers(points_dir: str | Path, keys: Iterable[str] | None,
                          older_than: float = STALE_TEMPORARY_SECONDS, parts: bool = True) -> list[Path]:
    """Remove, in ``points_dir/lanes``, the leftovers of the lanes ``keys`` (None: of any
    lanes, e.g. an earlier round's or config's): temporaries of parts whose write was killed
    and (with ``parts``) parts cut short (:func:`cut_short`), last modified ``older_than``
    seconds ago or earlier. Complete parts, damaged or not, are never touched here (a part that
    is not what its name says is refused by name when read). One directory listing. Returns the
    paths removed."""
    wanted = None if keys is None else set(keys)
    cutoff = time.time() - older_than
    removed = []
    for entry in _entries(Path(points_dir) / "lanes"):
        temporary, part = _LANE_TEMPORARY.match(entry.name), _LANE_PART.match(entry.name) if parts else None
        match = temporary or part
        if match is None or (wanted is not None and match.group(1) not in wanted):
            continue
        if part is not None and not (entry.is_file(follow_symlinks=False) and cut_short(entry.path)):
            continue
        if _remove(entry, cutoff):
            removed.append(Path(entry.path))
    return removed


def _newest_change(path: str) -> float:
    """The latest modification time of ``path`` and everything under it (symbolic links not
    followed); 0 when it vanished."""
    newest = 0.0
    try:
        newest = os.lstat(path).st_mtime
    except OSError:
        return newest
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except OSError:
                continue
    return newest


def remove_stale_imports(results_dir: str | Path, older_than: float = STALE_TEMPORARY_SECONDS) -> list[Path]:
    """Remove the staging directories (``<results_dir>/.import-<8 hex>``) that killed
    ``sgdsweep import`` runs left, when nothing in one changed for ``older_than`` seconds; one
    that changed since may be an import in progress and is kept. Returns the paths removed."""
    cutoff = time.time() - older_than
    removed = []
    for entry in _entries(results_dir):
        if not _IMPORT_STAGING.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        if _newest_change(entry.path) > cutoff:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
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
