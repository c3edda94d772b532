"""Point stores copied to and from Zarr groups: what an export holds and an import reads back.

An export (:mod:`sgdsweep.share.archive`) holds each point store as a Zarr (format 3) group,
written through Zarr's public API (:func:`write_zarr_group`, :func:`zarr_group_keys`); an import
writes such a group back as the point's ``.npz`` store (:func:`copy_point`). The ``.npz`` stores
are read single or packed (:class:`sgdsweep.store.points.PointStore`); a point held as a Zarr
group (an export's, or a store of an earlier layout that :mod:`sgdsweep.store.migrate` rewrites)
is read through Zarr's public API by :class:`ZarrPointGroup`, the one reader of such groups.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Iterator
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
    """Write the point store at ``path`` (``.npz``, single or packed) as a Zarr (format 3) group in the new
    directory ``directory``, through Zarr's public API: one array per array of the store, with
    its dimension names and attributes and every chunk written (also one holding only the fill
    value, so that a missing chunk file means a lost one), then the group's attributes (so an
    interrupted write is not marked complete). :class:`ZarrPointGroup` reads such a directory
    back.

    Raises: StoreError if the store is missing, damaged or incomplete; zarr's errors if
    ``directory`` exists.
    """
    with PointStore(path) as store:
        _write_group(store, str(directory))


#: (data type, number of dimensions) → the metadata Zarr writes for such an array (one written
#: through Zarr's API per kind, in memory), the template :func:`zarr_group_keys` fills in.
_TEMPLATES: dict[tuple[str, int], dict[str, Any]] = {}
_GROUP_TEMPLATE: dict[str, Any] = {}


def _template(dtype: np.dtype, ndim: int) -> dict[str, Any]:
    """Zarr's metadata (``zarr.json``, parsed) of an array of ``dtype`` with ``ndim`` dimensions,
    created through Zarr's public API as :func:`_write_group` creates one; and of a group."""
    key = (dtype.str, ndim)
    if key not in _TEMPLATES:
        import zarr
        from zarr.storage import MemoryStore

        memory: dict[str, Any] = {}
        group = zarr.open_group(MemoryStore(memory), mode="w-", zarr_format=3)
        group.create_array("a", shape=(1,) * ndim, dtype=dtype, chunks=(1,) * ndim or "auto",
                           dimension_names=["d"] * ndim, compressors=None, attributes={},
                           config={"write_empty_chunks": True})
        _TEMPLATES[key] = json.loads(memory["a/zarr.json"].to_bytes())
        _GROUP_TEMPLATE.update(json.loads(memory["zarr.json"].to_bytes()))
    return _TEMPLATES[key]


def _json(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, indent=2, allow_nan=True).encode()  # as Zarr writes its metadata


@functools.lru_cache(maxsize=4096)
def _array_metadata(dtype: str, shape: tuple[int, ...], dims: tuple[str, ...], attributes: str) -> bytes:
    """The ``zarr.json`` of an array of NumPy data type ``dtype`` (its ``str``), ``shape`` and
    dimension names ``dims``, one chunk, attributes ``attributes`` (JSON): :func:`_template` filled
    in. Cached: a sweep's point stores repeat the same few arrays, and encoding with Zarr's
    indentation is pure Python."""
    meta = copy.deepcopy(_template(np.dtype(dtype), len(shape)))
    meta["shape"] = list(shape)
    meta["chunk_grid"]["configuration"]["chunk_shape"] = [max(s, 1) for s in shape]
    meta["attributes"] = json.loads(attributes)
    meta["dimension_names"] = list(dims)
    return _json(meta)


def zarr_group_keys(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The keys and values of the point store at ``path`` (single or packed) written as a Zarr
    (format 3) group, byte for byte what :func:`write_zarr_group` writes into a directory, in
    key order, without writing a file: each array's metadata is the one Zarr's own API writes for
    an array of its data type and rank (:func:`_template`, made once per kind) with its shape,
    chunks (one, the whole array), dimension names and attributes filled in, and its one chunk
    ``c/0/…`` its bytes in C order, little-endian, uncompressed (Zarr's ``bytes`` codec); an
    array with a zero-length dimension has no chunk. A few milliseconds per point, where
    writing each array through Zarr took tens.

    Raises: StoreError if the store is missing, damaged or incomplete.
    """
    keys: dict[str, bytes] = {}
    with PointStore(path) as store:
        for name in sorted(store.arrays):
            dims, attributes = store.arrays[name]
            data = store.read(name)
            keys[f"{name}/zarr.json"] = _array_metadata(data.dtype.str, data.shape, tuple(dims),
                                                        json.dumps(attributes, allow_nan=True))
            if data.size:
                little = data.astype(data.dtype.newbyteorder("<"), copy=False)
                keys[f"{name}/" + "/".join(["c", *("0" * data.ndim)])] = np.ascontiguousarray(little).tobytes()
        group = dict(_GROUP_TEMPLATE) if _GROUP_TEMPLATE else json.loads(_json(
            {"attributes": {}, "zarr_format": 3, "node_type": "group"}))
        group["attributes"] = store.attrs
        keys["zarr.json"] = _json(group)
    yield from sorted(keys.items())


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
