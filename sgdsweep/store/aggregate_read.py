"""Reading the point stores an ensemble is built from: in order, in parallel processes for many points.

:func:`read_points` returns, for each point a sweep spec lists, its store's attributes and the
arrays the ensemble keeps (per replica, per mode, per layer, and ``lag``), read and checked
through :class:`sgdsweep.store.points.PointStore` (each store its point's own:
:meth:`~sgdsweep.store.points.PointStore.check_identity`). With at least
:data:`PARALLEL_MIN_POINTS` points and more than one core available to this process, the points
are read in contiguous slices by up to :data:`MAX_READERS` processes (this one, and ``python -m
sgdsweep.store.aggregate_read``, which imports only NumPy and the point store's reader; the
caller's main module is not imported again, so a script without a ``__main__`` guard may call
it), and put back in order; the result and the first error (in the spec's order) are those of
reading them one by one.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.errors import StoreError
from sgdsweep.store import points as point_store
from sgdsweep.store.variables import LAYER_VECTORS, REPLICA_ARRAYS, VECTOR_ARRAYS

#: Points from which the stores are read by several processes.
PARALLEL_MIN_POINTS = 2000
#: Most processes that read stores at once.
MAX_READERS = 8
#: Fewest points per reading process.
SLICE_POINTS = 500

Row = tuple[dict[str, Any], dict[str, np.ndarray]]


def readers(n_points: int) -> int:
    """How many processes read ``n_points`` stores: 1 below :data:`PARALLEL_MIN_POINTS`, else
    the cores this process may run on (its CPU affinity: a SLURM job's or a container's share),
    at most :data:`MAX_READERS` and one per :data:`SLICE_POINTS` points."""
    if n_points < PARALLEL_MIN_POINTS:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_READERS, n_points // SLICE_POINTS))


def read_slice(points_dir: str | Path, entries: list[dict[str, Any]]) -> list[Row]:
    """(attributes, arrays) of each of ``entries``' point stores, in order; ``lag`` only until a
    store has it.

    Raises: StoreError naming the first store that is missing, damaged or not its point's own."""
    rows: list[Row] = []
    lag = False
    for entry in entries:
        with point_store.PointStore(point_store.point_path(points_dir, entry["hash"])) as store:
            store.check_identity(entry["hash"])
            arrays = store.read_many([*REPLICA_ARRAYS, *VECTOR_ARRAYS, *([] if lag else ["lag"])],
                                     prefixes=("singular_values_", *LAYER_VECTORS))
            rows.append((store.attrs, arrays))
        lag = lag or "lag" in arrays
    return rows


def read_points(points_dir: str | Path, entries: list[dict[str, Any]], workers: int | None = None) -> list[Row]:
    """(attributes, arrays) of each of ``entries``' point stores, in order (module docstring);
    ``workers`` processes (default :func:`readers`): this one reads the first contiguous slice,
    each other one (``python -m sgdsweep.store.aggregate_read``) the next. ``lag`` is in the
    arrays of the first point that has it, and may be in later ones'.

    Raises: StoreError naming the first store, in ``entries``' order, that is missing, damaged
    or not its point's own (or saying how a reading process failed)."""
    workers = readers(len(entries)) if workers is None else workers
    if workers <= 1 or len(entries) < 2:
        return read_slice(points_dir, entries)
    size = -(-len(entries) // workers)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs: list[tuple[subprocess.Popen, threading.Thread]] = []
    try:
        for start in range(size, len(entries), size):  # the first slice is read here, meanwhile
            proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env)
            feeder = threading.Thread(target=_feed, args=(proc, (str(points_dir), entries[start: start + size])),
                                      daemon=True)
            feeder.start()
            procs.append((proc, feeder))
        rows = read_slice(points_dir, entries[:size])
        for proc, feeder in procs:
            feeder.join()
            proc.stdin = None  # closed by the feeder: communicate() only reads
            out, err = proc.communicate()
            try:
                kind, value = pickle.loads(out)
            except Exception:  # noqa: BLE001 - it died before answering: say how
                raise StoreError(f"a process reading point stores under {points_dir} failed (exit status "
                                 f"{proc.returncode}): {err.decode(errors='replace').strip()[-2000:]}") from None
            if kind == "error":
                raise StoreError(value)
            rows.extend(value)
        return rows
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _feed(proc: subprocess.Popen, task: tuple[str, list[dict[str, Any]]]) -> None:
    """Send ``task`` to the reading process ``proc`` (pickled on its stdin, then closed)."""
    try:
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(task))
        proc.stdin.close()
    except OSError:  # it died: read_points says how
        pass


def _serve() -> None:
    """``python -m sgdsweep.store.aggregate_read``: read ``(points_dir, entries)`` pickled on
    stdin (from :func:`read_points`, its parent), write ``("rows", rows)`` or ``("error", the
    StoreError's message)`` pickled on stdout."""
    points_dir, entries = pickle.load(sys.stdin.buffer)
    try:
        answer: tuple[str, Any] = ("rows", read_slice(points_dir, entries))
    except StoreError as exc:
        answer = ("error", str(exc))
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _serve()
