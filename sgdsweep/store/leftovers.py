"""Leftovers of killed writes in a points directory: temporaries and failure records.

A write killed mid-way (a lost worker, ``kill -9``) leaves its temporary file (or, for the
first layout, directory) beside the stores; a point that failed leaves its failure record
(:func:`sgdsweep.store.points.failed_marker`). The shard jobs remove both for the points they
handle: temporaries once they are older than
:data:`sgdsweep.store.points.STALE_TEMPORARY_SECONDS` (a younger one may belong to a write in
progress), failure records once the point is stored.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from sgdsweep.store.points import STALE_TEMPORARY_SECONDS, SUFFIXES, failed_marker


def remove_stale_temporaries(points_dir: str | Path, hashes: Iterable[str],
                             older_than: float = STALE_TEMPORARY_SECONDS) -> list[Path]:
    """Remove what killed writes of the points ``hashes`` left in ``points_dir``: their
    temporary files (and the temporary directories of layout 1) last modified ``older_than``
    seconds ago or earlier. Younger ones may belong to a write in progress and are kept. One
    directory listing. Returns the paths removed."""
    wanted = set(hashes)
    cutoff = time.time() - older_than
    removed = []
    try:
        entries = list(os.scandir(points_dir))
    except FileNotFoundError:
        return removed
    tags = tuple(f"{suffix}.tmp-" for suffix in SUFFIXES)
    for entry in entries:
        name = entry.name
        if not name.startswith(".") or ".tmp-" not in name:
            continue
        point, _, suffix = name[1:].partition(".")
        if point not in wanted or not f".{suffix}".startswith(tags):
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
