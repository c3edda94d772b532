"""Point stores held as Zarr (format 3) groups, read back through Zarr's public API: an export
of schema 1 held each point so (:mod:`sgdsweep.share.point_members`), as did the point stores of
earlier layouts that :mod:`sgdsweep.store.migrate` rewrites. :class:`ZarrPointGroup` is the one
reader of such groups; :func:`copy_point` writes a point it reads (or a ``.npz`` store) as the
point's ``.npz`` store (:class:`sgdsweep.store.points.PointStore` reads those, single or packed).
sgdsweep no longer writes Zarr point groups.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from sgdsweep.errors import StoreError
from sgdsweep.store.point_identity import identity_problem, misnamed
from sgdsweep.store.points import COMPLETE_ATTR, PointStore, write_point


class ZarrPointGroup:
    """A point held as a Zarr (format 3) group, opened for reading through Zarr's public API
    (:func:`zarr.open_group`); a context manager with :class:`~sgdsweep.store.points.PointStore`'s
    interface (``path``, ``attrs``, ``arrays``, :meth:`read`, :meth:`read_many`,
    :meth:`check_identity`).

    Args:
        path: the group's directory, or the file of ``store`` (named in errors).
        store: a Zarr store holding the group at its root (a ``ZipStore``), or None to open the
            directory ``path``.
        require_chunks: whether every array must have all its chunk files (Zarr reads a missing
            one as the fill value, so a lost file would read as zeros); False for a group whose
            files were checked otherwise (an export's, against its manifest; a zip's, against
            its CRC-32).

    Raises (on opening): StoreError naming the group when it is unreadable, damaged (a chunk
    file missing) or not marked complete.
    """

    def __init__(self, path: str | Path, store: Any = None, require_chunks: bool = True) -> None:
        import zarr

        self.path = Path(path)
        try:
            self._group = zarr.open_group(store if store is not None else str(self.path), mode="r", zarr_format=3,
                                          use_consolidated=False)  # each array's own metadata, as verify bounds it
            if self._group.metadata.zarr_format != 3:  # Zarr takes a zarr.json that says 2 as it is
                raise ValueError(f"its zarr.json says zarr_format {self._group.metadata.zarr_format}, not 3")
            for name, arr in self._group.arrays() if require_chunks else ():
                present = arr.nchunks_initialized  # one listing of the array's chunk files
                if present < arr.nchunks:
                    raise StoreError(f"point store {self.path} is damaged: array '{name}' has "
                                     f"{arr.nchunks - present} of its {arr.nchunks} chunk file(s) missing "
                                     f"under {self.path / name}; rerun the workflow: it recomputes that point")
            self._arrays = dict(self._group.arrays())  # opened once: read() uses them
            arrays = {name: (tuple(arr.metadata.dimension_names or ()), dict(arr.attrs))
                      for name, arr in self._arrays.items()}
            attrs = dict(self._group.attrs)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - OSError, or what zarr raises for a bad group
            raise StoreError(f"point store {self.path} is missing or unreadable ({exc}); rerun the "
                             "workflow to recompute it") from None
        if attrs.get(COMPLETE_ATTR) is not True:
            raise StoreError(f"point store {self.path} is incomplete; rerun the workflow to recompute it")
        self.attrs: dict[str, Any] = attrs
        self.arrays: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = arrays

    def check_identity(self, point_hash: str) -> None:
        """As :meth:`sgdsweep.store.points.PointStore.check_identity`."""
        why = identity_problem(point_hash, self.attrs)
        if why is not None:
            raise misnamed(self.path, point_hash, why)

    def read(self, name: str) -> np.ndarray:
        """The array ``name`` (a new NumPy array). Raises: KeyError if there is none;
        StoreError naming the group and the array if it cannot be read."""
        if name not in self.arrays:
            raise KeyError(name)
        try:
            return np.asarray(self._arrays[name][...])
        except Exception as exc:  # noqa: BLE001 - zarr and its codecs raise several types
            raise StoreError(f"array {name!r} of point store {self.path} is unreadable ({exc}); "
                             "delete the store and rerun the workflow") from None

    def read_many(self, names: Iterable[str], prefixes: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """As :meth:`sgdsweep.store.points.PointStore.read_many`."""
        wanted = [*names, *sorted(a for a in self.arrays if a.startswith(prefixes))] if prefixes else list(names)
        return {name: self.read(name) for name in dict.fromkeys(wanted) if name in self.arrays}

    def close(self) -> None:
        """Nothing to release: the caller closes the store it gave."""

    def __enter__(self) -> ZarrPointGroup:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_point(source: PointStore | ZarrPointGroup, path: str | Path) -> bool:
    """Write the open point store ``source`` (a ``.npz`` store or a Zarr group) as the ``.npz``
    store ``path`` (:func:`write_point`: atomic, a complete store there is kept), every array
    with its dimension names and attributes and the group's attributes as they are (the layout
    version :data:`~sgdsweep.store.points.STORE_VERSION` the current one). Returns what
    :func:`write_point` returns.

    Raises: StoreError if an array of ``source`` cannot be read; as :func:`write_point`.
    """
    arrays = {name: (dims, source.read(name), attributes) for name, (dims, attributes) in source.arrays.items()}
    return write_point(path, arrays, source.attrs)
