"""Clear Snakemake state that a killed run leaves behind for *this* sweep.

After ``kill -9`` Snakemake leaves lock files (``.snakemake/locks/``) that refuse every later run
until ``--unlock``, "incomplete" markers (``.snakemake/incomplete/``) that refuse outputs a
still-running job finished after the kill, and the copy of an ``update()`` output
(``.snakemake/backups/<path>``, the ensemble's) that makes the next job updating it fail
("File exists"). None of them protects anything for sgdsweep: the sweep lock
(:mod:`sgdsweep.run.locking`) excludes concurrent runs and dies with its process, and every output
is written atomically, so an existing output is complete. This module removes exactly the
entries that refer to files under the sweep's directory, and only while the caller holds the
sweep lock (so no live run owns them). It reads Snakemake 9's file persistence backend; other
backends are left alone.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path


def _under(path: str, root: str) -> bool:
    p = os.path.normpath(path)
    return p == root or p.startswith(root + os.sep)


def clear_stale_state(workdir: Path, sweep_dir: Path) -> list[str]:
    """Remove stale locks and incomplete markers for files under ``sweep_dir``; return what was removed."""
    workdir = Path(workdir)
    roots = {os.path.normpath(str(sweep_dir)), os.path.normpath(str(Path(sweep_dir).resolve()))}
    removed: list[str] = []
    lockdir = workdir / ".snakemake" / "locks"
    for lock in sorted(lockdir.glob("*.lock")) if lockdir.is_dir() else []:
        try:
            entries = [line.strip() for line in lock.read_text().splitlines() if line.strip()]
        except OSError:
            continue
        if any(_under(e, r) for e in entries for r in roots):
            lock.unlink(missing_ok=True)
            removed.append(str(lock))
    incomplete = workdir / ".snakemake" / "incomplete"
    if incomplete.is_dir():
        for dirpath, _, files in os.walk(incomplete):
            for name in files:
                marker = Path(dirpath) / name
                parts = marker.relative_to(incomplete).parts
                encoded = "".join(p.removeprefix("@") for p in parts)
                try:
                    path = base64.urlsafe_b64decode(encoded.encode()).decode()
                except (ValueError, UnicodeDecodeError):
                    continue
                if any(_under(path, r) for r in roots):
                    marker.unlink(missing_ok=True)
                    removed.append(str(marker))
    for root in roots:  # Snakemake keeps the backup of output <path> at backups/<path> (made relative)
        backup = workdir / ".snakemake" / "backups" / root.lstrip(os.sep)
        if backup.is_dir() and not backup.is_symlink():
            shutil.rmtree(backup)
            removed.append(str(backup))
    return removed
