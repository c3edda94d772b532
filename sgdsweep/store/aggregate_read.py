"""Reading the point stores an ensemble is built from: in order, in parallel processes for many points.

:func:`read_points` returns, for each point a sweep spec lists, its store's attributes and the
arrays the ensemble keeps (per replica, per mode, per layer, and ``lag``), read and checked
through :class:`sgdsweep.store.points.PointStore` (each store its point's own:
:meth:`~sgdsweep.store.points.PointStore.check_identity`). With at least
:data:`PARALLEL_MIN_POINTS` points and more than one core available to this process, the points
are read in contiguous slices by up to :data:`MAX_READERS` processes (started fresh: this module
imports only NumPy and the point store's reader), and put back in order; the result and the
first error (in the spec's order) are those of reading them one by one.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.store import points as point_store
from sgdsweep.store.variables import LAYER_VECTORS, REPLICA_ARRAYS, VECTOR_ARRAYS

#: Points from which the stores are read by several processes.
PARALLEL_MIN_POINTS = 2000
#: Most processes that read stores at once.
MAX_READERS = 8
#: Points per slice a reading process gets at a time (at least).
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
    ``workers`` processes (default :func:`readers`). ``lag`` is in the arrays of the first point
    that has it, and may be in later ones'.

    Raises: StoreError naming the first store, in ``entries``' order, that is missing, damaged
    or not its point's own."""
    workers = readers(len(entries)) if workers is None else workers
    if workers <= 1:
        return read_slice(points_dir, entries)
    size = max(SLICE_POINTS, -(-len(entries) // (workers * 4)))  # a few slices each: the faster read more
    slices = [entries[i: i + size] for i in range(0, len(entries), size)]
    rows: list[Row] = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(read_slice, str(points_dir), part) for part in slices]
        try:
            for future in futures:
                rows.extend(future.result())
        finally:
            for future in futures:
                future.cancel()
    return rows
