"""The point stores ``sgdsweep run`` found complete, handed to its Snakemake.

Deciding which points are stored opens every store (:func:`sgdsweep.store.points.complete_points`:
about a millisecond each). ``sgdsweep run`` does it once, under the sweep's lock, and the
Snakefile, which plans the sweep again as it is parsed, would do it a second time. The run holds
the lock from before its check until Snakemake ends (Snakemake inherits it:
:mod:`sgdsweep.run.locking`), so no other run changes the stores in between; it writes what it
found to a file named in :data:`STORED_ENV`, and the Snakefile's main process takes the set
from there when the file is for the same sweep directory and the same points, less any store
that is no longer there (one listing: a store deleted meanwhile is simulated again in this run;
one damaged meanwhile is caught when it is next read). Anywhere else (plain ``snakemake``, a file
of another sweep or none, a job's process) the stores are opened. The hand-over only saves
time: where its file cannot be written, :func:`hand_over` withdraws it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, MutableMapping
from pathlib import Path

from sgdsweep.store import packs
from sgdsweep.store.points import POINT_SUFFIX

#: Environment variable naming the file of :func:`write_stored`.
STORED_ENV = "SGDSWEEP_STORED_POINTS"


def _points_digest(hashes: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def write_stored(path: str | Path, directory: str | Path, hashes: Iterable[str], stored: Iterable[str]) -> None:
    """Write to ``path`` the set ``stored`` of complete stores among the sweep's point ``hashes``
    (in the sweep's order), for the sweep in ``directory``."""
    Path(path).write_text(json.dumps({"directory": str(Path(directory).resolve()),
                                      "points": _points_digest(hashes), "stored": sorted(stored)}))


def hand_over(env: MutableMapping[str, str], path: Path | None, directory: str | Path, hashes: Iterable[str],
              stored: Iterable[str]) -> None:
    """Name ``path``, holding :func:`write_stored`'s set, to Snakemake in ``env``; where it cannot
    be written (no ``path``, a full or unwritable temporary directory), name none, so that the
    Snakefile opens the stores itself."""
    try:
        if path is None:
            raise OSError("no temporary file")
        write_stored(path, directory, hashes, stored)
        env[STORED_ENV] = str(path)
    except OSError:
        env.pop(STORED_ENV, None)


def read_stored(directory: str | Path, points_dir: str | Path, hashes: Iterable[str]) -> set[str] | None:
    """The stored points that ``sgdsweep run`` handed over (:data:`STORED_ENV`) for the sweep in
    ``directory`` with point ``hashes`` (in the sweep's order), less those with no store in
    ``points_dir`` now; None when there is no such file, it cannot be read, or it is for another
    sweep or other points."""
    path = os.environ.get(STORED_ENV)
    if not path:
        return None
    hashes = list(hashes)
    try:
        data = json.loads(Path(path).read_text())
        if data["directory"] != str(Path(directory).resolve()) or data["points"] != _points_digest(hashes):
            return None
        stored = set(data["stored"]) & set(hashes)
        present = {name[: -len(POINT_SUFFIX)] for name in os.listdir(points_dir) if name.endswith(POINT_SUFFIX)}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return stored & (present | set(packs.index(points_dir)))
