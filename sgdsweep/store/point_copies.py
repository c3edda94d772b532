"""Point stores copied to and from Zarr groups: what an export holds and an import reads back.

An export (:mod:`sgdsweep.store.share`) holds each point store as a Zarr (format 3) group,
written through Zarr's public API (:func:`write_zarr_group`, :func:`zarr_group_keys`); an import
writes such a group back as the point's ``.npz`` store (:func:`copy_point`). Any store layout is
read, single or packed (:class:`sgdsweep.store.points.PointStore`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sgdsweep.store.points import PointStore, write_point


def _write_group(store: PointStore, target: Any) -> None:
    """Write the open point store ``store`` as a Zarr (format 3) group into ``target`` (a
    directory path or a Zarr store): one array per array of the store, with its dimension names
    and attributes and every chunk written (also one holding only the fill value, so that a
    missing chunk file means a lost one), then the group's attributes (so an interrupted write
    is not marked complete)."""
    import zarr

    group = zarr.open_group(target, mode="w-", zarr_format=3)
    for name in sorted(store.arrays):
        dims, attributes = store.arrays[name]
        data = store.read(name)
        arr = group.create_array(name, shape=data.shape, dtype=data.dtype,
                                 chunks=tuple(max(s, 1) for s in data.shape) or "auto",
                                 dimension_names=list(dims), compressors=None, attributes=attributes,
                                 config={"write_empty_chunks": True})
        arr[...] = data
    group.attrs.update(store.attrs)


def write_zarr_group(path: str | Path, directory: str | Path) -> None:
    """Write the point store at ``path`` (any layout) as a Zarr (format 3) group in the new
    directory ``directory``, through Zarr's public API: one array per array of the store, with
    its dimension names and attributes and every chunk written (also one holding only the fill
    value, so that a missing chunk file means a lost one), then the group's attributes (so an
    interrupted write is not marked complete). :class:`PointStore` reads such a directory back
    (layout 1).

    Raises: StoreError if the store is missing, damaged or incomplete; zarr's errors if
    ``directory`` exists.
    """
    with PointStore(path) as store:
        _write_group(store, str(directory))


def zarr_group_keys(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The keys and values of the point store at ``path`` (any layout) written as a Zarr
    (format 3) group, as :func:`write_zarr_group` would write them into a directory (the same
    key names and bytes), in key order; written in memory (:class:`zarr.storage.MemoryStore`),
    no file touched.

    Raises: StoreError if the store is missing, damaged or incomplete.
    """
    from zarr.storage import MemoryStore

    memory: dict[str, Any] = {}
    with PointStore(path) as store:
        _write_group(store, MemoryStore(memory))
    for key in sorted(memory):
        yield key, memory[key].to_bytes()


def copy_point(source: str | Path, path: str | Path, require_chunks: bool = True) -> bool:
    """Write the point store at ``source`` (any layout; ``require_chunks`` as
    :class:`PointStore`) as the ``.npz`` store ``path`` (:func:`write_point`: atomic, a complete
    store there is kept). Returns what it returns.

    Raises: StoreError if ``source`` is missing, damaged or incomplete.
    """
    with PointStore(source, require_chunks=require_chunks) as store:
        arrays = {name: (dims, store.read(name), attributes) for name, (dims, attributes) in store.arrays.items()}
        return write_point(path, arrays, store.attrs)
