"""The point stores ``sgdsweep run`` found complete, handed to its Snakemake.

Deciding which points are stored opens every store (:func:`sgdsweep.store.points.complete_points`:
about a millisecond each). ``sgdsweep run`` does it once, under the sweep's lock, and the
Snakefile, which plans the sweep again as it is parsed, would do it a second time. The run holds
the lock from before its check until Snakemake ends (Snakemake inherits it:
:mod:`sgdsweep.run.locking`), so no other run changes the stores in between; it writes what it
found to a file without a name (nothing is left behind, however the run ends) whose descriptor
Snakemake inherits, named in :data:`STORED_FD_ENV`. The Snakefile's main process takes the set
from there when it is for the same sweep directory and the same points, less any store that is
no longer there (one listing: a store deleted meanwhile is simulated again in this run; one
damaged meanwhile is caught when it is next read). Anywhere else (plain ``snakemake``, a hand-over
of another sweep or none, a descriptor that is not a file, a job's process) the stores are
opened. The hand-over only saves time: where its file cannot be made or written,
:func:`hand_over` withdraws it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import IO

from sgdsweep.core.identity import HASH_LENGTH
from sgdsweep.store import packs
from sgdsweep.store.points import POINT_SUFFIX

#: Environment variable holding the descriptor of :func:`hand_over`'s file (inherited by Snakemake).
STORED_FD_ENV = "SGDSWEEP_STORED_POINTS_FD"


def _points_digest(hashes: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def _largest_hand_over(points: int) -> int:
    """Bytes of :func:`stored_text` at most for a sweep of ``points`` points: each stored hash is
    written as ``"…", ``, and the rest is under 64 KiB (the resolved directory, at most 4 KiB of
    UTF-8, is at most 6 bytes of JSON per byte)."""
    return 65536 + (HASH_LENGTH + 4) * points


def stored_text(directory: str | Path, hashes: Iterable[str], stored: Iterable[str]) -> bytes:
    """What the hand-over holds: the set ``stored`` of complete stores among the sweep's point
    ``hashes`` (in the sweep's order), for the sweep in ``directory`` (JSON, UTF-8)."""
    return json.dumps({"directory": str(Path(directory).resolve()), "points": _points_digest(hashes),
                       "stored": sorted(stored)}).encode()


def hand_over(env: MutableMapping[str, str], file: IO[bytes] | None, directory: str | Path, hashes: Iterable[str],
              stored: Iterable[str]) -> None:
    """Write :func:`stored_text` into ``file`` (replacing what it held: a round's set replaces the
    previous one) and name its descriptor in ``env``; the caller passes the descriptor on to
    Snakemake. Where it cannot be written (no ``file``, a full temporary directory), name none,
    so that the Snakefile opens the stores itself."""
    try:
        if file is None:
            raise OSError("no temporary file")
        file.seek(0)
        file.truncate()
        file.write(stored_text(directory, hashes, stored))
        file.flush()
        env[STORED_FD_ENV] = str(file.fileno())
    except OSError:
        env.pop(STORED_FD_ENV, None)


def read_stored(directory: str | Path, points_dir: str | Path, hashes: Iterable[str]) -> set[str] | None:
    """The stored points that ``sgdsweep run`` handed over (:data:`STORED_FD_ENV`) for the sweep in
    ``directory`` with point ``hashes`` (in the sweep's order), less those with no store in
    ``points_dir`` now; None when there is no hand-over, its descriptor is not an open regular
    file, it cannot be read, or it is for another sweep or other points."""
    fd = os.environ.get(STORED_FD_ENV, "")
    if not fd.isdigit():
        return None
    hashes = list(hashes)
    try:
        info = os.fstat(int(fd))
        # a pipe, a terminal or another program's file that happens to have the number (the
        # variable reaches every job's environment): not read, nor a file larger than the set
        if not stat.S_ISREG(info.st_mode) or info.st_size > _largest_hand_over(len(hashes)):
            return None
        data = json.loads(os.pread(int(fd), info.st_size, 0))
        if data["directory"] != str(Path(directory).resolve()) or data["points"] != _points_digest(hashes):
            return None
        stored = set(data["stored"]) & set(hashes)
        present = {name[: -len(POINT_SUFFIX)] for name in os.listdir(points_dir) if name.endswith(POINT_SUFFIX)}
    except (OSError, ValueError, KeyError, TypeError, OverflowError, MemoryError):
        return None
    return stored & (present | set(packs.index(points_dir)))
