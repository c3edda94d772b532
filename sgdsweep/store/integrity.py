"""Integrity of an ensemble (``ensemble.zarr``, or the root group of an export): what
:func:`sgdsweep.store.aggregate.write_ensemble` records and what every reader through sgdsweep
checks (:func:`check_ensemble`), through Zarr's public API only.

- **Chunks**: every chunk ends with its CRC-32C (Zarr's ``crc32c`` codec), which Zarr checks
  whenever it reads the chunk; every chunk is written, also one holding only the fill value, so
  a chunk file missing from the listing is a lost one (Zarr alone reads it as NaN, silently).
- **Metadata**: an edited metadata document that still parses (an array's ``bytes`` codec set
  to ``endian: big``, a ``scale_factor`` attribute, another fill value or data type) makes Zarr
  and xarray read other numbers without any error. So the root attribute :data:`METADATA_ATTR`
  records the SHA-256 of each array's metadata as Zarr parses it (``array.metadata.to_dict()``
  as canonical JSON: sorted keys, no whitespace) and of the root attributes (but the record
  itself and :data:`UNRECORDED_ATTRS`), with the Zarr version that wrote them; the check
  compares both views a reader may take: each array's own ``zarr.json``, and its copy in the
  consolidated metadata of the root ``zarr.json`` (which xarray reads by default).

What no check here covers: a dataset opened with plain xarray or Zarr reads whatever the
metadata says (only the chunks' CRC-32C is checked there), and a forger who rewrites the
record along with the metadata is not detected (it proves integrity, not origin). An ensemble
written before sgdsweep recorded the digests has no record; its metadata is not checked, and
arrays without the ``crc32c`` codec (written before chunks carried it, when chunks holding only
the fill value were skipped) are not listed for missing chunks. Rebuilding it (delete it and
rerun the workflow) adds both.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from sgdsweep.errors import StoreError

#: Root attribute of an ensemble that records the digests of its metadata:
#: ``{"zarr": version, "attributes": sha256, "arrays": {name: sha256}}``.
METADATA_ATTR = "sgdsweep_metadata_sha256"
#: Root attributes outside the digest: the fits, which an export adds to its ensemble's root
#: (they are also its member ``fits.json``, checked by its manifest).
UNRECORDED_ATTRS = ("fits",)


def _rebuild(where: str | Path) -> str:
    return (f"delete {where} and rerun the workflow (the aggregate step rebuilds it from the point stores)"
            if not str(where).endswith(".zip") else "export the sweep again from its results directory")


def _digest(document: Any) -> str:
    """SHA-256 of ``document`` as canonical JSON (sorted keys, no whitespace; a value JSON lacks,
    such as a NumPy scalar, as its Python value or its text)."""
    def plain(value: Any) -> Any:
        return value.item() if isinstance(value, np.generic) else str(value)

    text = json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=True, default=plain)
    return hashlib.sha256(text.encode()).hexdigest()


def _attributes_digest(attrs: Mapping[str, Any]) -> str:
    return _digest({k: v for k, v in attrs.items() if k != METADATA_ATTR and k not in UNRECORDED_ATTRS})


def metadata_record(store: Any) -> dict[str, Any]:
    """The record :data:`METADATA_ATTR` of the Zarr group at ``store`` (a path or a Zarr store):
    the digests of its root attributes and of each array's metadata, read from each array's own
    ``zarr.json`` (not from consolidated metadata)."""
    group = zarr.open_group(store, mode="r", use_consolidated=False)
    return {"zarr": zarr.__version__, "attributes": _attributes_digest(group.attrs.asdict()),
            "arrays": {name: _digest(arr.metadata.to_dict()) for name, arr in group.arrays()}}


def record_metadata(path: str | Path) -> None:
    """Add :data:`METADATA_ATTR` (:func:`metadata_record`) to the root attributes of the Zarr
    group at ``path``, keeping its consolidated metadata. Call it once the group is written."""
    record = metadata_record(str(path))
    zarr.open_group(str(path), mode="r+").attrs[METADATA_ATTR] = record


def _check_metadata(where: str | Path, store: Any, group: zarr.Group, arrays: list[tuple[str, Any]]) -> None:
    """Compare the group's metadata with its record (:data:`METADATA_ATTR`), in both views.

    Raises: StoreError naming the array (and the view) whose metadata differs.
    """
    record = group.attrs.get(METADATA_ATTR)
    if record is None:
        return  # written before ensembles carried the record (see the module docstring)
    if not (isinstance(record, dict) and isinstance(record.get("arrays"), dict)):
        raise StoreError(f"ensemble {where}: its root attribute '{METADATA_ATTR}' is not the record "
                         f"sgdsweep writes (the zarr.json was edited); {_rebuild(where)}")
    recorded: dict[str, Any] = record["arrays"]
    upgrade = ""
    if record.get("zarr") != zarr.__version__:
        upgrade = (f" (it was written with Zarr {record.get('zarr')} and is read with Zarr {zarr.__version__}:"
                   " if only Zarr changed, rebuilding records its metadata anew)")
    with warnings.catch_warnings():  # an export's root also holds its other members (fits.json, …)
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        plain = list(zarr.open_group(store, mode="r", use_consolidated=False).arrays())
    views = [(f"its own {Path(str(where)) / '<array>' / 'zarr.json'}", plain)]
    if group.metadata.consolidated_metadata is not None:
        views.append((f"its copy in the consolidated metadata of {Path(str(where)) / 'zarr.json'}", arrays))
    for view, members in views:
        got = {name: _digest(arr.metadata.to_dict()) for name, arr in members}
        for name in sorted(set(got) | set(recorded)):
            if name not in got or name not in recorded:
                change = "missing from" if name in recorded else "added to"
                raise StoreError(f"ensemble {where}: array '{name}' is {change} {view.replace('<array>', name)}, "
                                 f"unlike when sgdsweep wrote it; {_rebuild(where)}")
            if got[name] != recorded[name]:
                raise StoreError(
                    f"ensemble {where}: the metadata of array '{name}' ({view.replace('<array>', name)}) "
                    "differs from what sgdsweep wrote: an edited codec, data type, fill value or attribute "
                    f"changes the numbers read{upgrade}; {_rebuild(where)}")
    if record.get("attributes") != _attributes_digest(group.attrs.asdict()):
        raise StoreError(f"ensemble {where}: its attributes (the root zarr.json) differ from what sgdsweep "
                         f"wrote{upgrade}; {_rebuild(where)}")


def check_ensemble(path: str | Path, store: Any = None, keys: set[str] | None = None) -> None:
    """Check the ensemble at ``path`` (or held by the Zarr ``store``, ``path`` naming it in
    messages): its metadata against its record (:data:`METADATA_ATTR`, both views), then that
    every array with the ``crc32c`` codec has all its chunks in the store: counted by
    ``array.nchunks_initialized``, or, given ``keys`` (every key of ``store``: the names in an
    export's zip, whose ``ZipStore`` lists the chunks of an array ``diverged`` wrongly when
    another is ``diverged_step``), by looking up each chunk's key
    (``array.metadata.encode_chunk_key``) there.

    Cost: one listing of each array's chunks and one read of each array's ``zarr.json`` (the
    chunks' CRC-32C is checked by Zarr when they are read).

    Raises:
        StoreError: naming the array and what is wrong (its metadata, how many chunks are missing).
        zarr.errors.NodeNotFoundError: no Zarr group at ``path``.
    """
    target = str(path) if store is None else store
    try:
        group = zarr.open_group(target, mode="r")
        arrays = list(group.arrays())
        _check_metadata(path, target, group, arrays)
    except zarr.errors.NodeNotFoundError:  # not an ensemble at all: the caller says what is there
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"ensemble {path} is unreadable ({exc}); {_rebuild(path)}") from None
    for name, arr in arrays:
        if not any(isinstance(c, zarr.codecs.Crc32cCodec) for c in arr.compressors):
            continue  # written before ensembles carried checksums: all-fill chunks were not written
        if keys is None:
            present = arr.nchunks_initialized
        else:
            present = sum(f"{name}/{arr.metadata.encode_chunk_key(c)}" in keys for c in np.ndindex(*arr.cdata_shape))
        if present < arr.nchunks:
            raise StoreError(f"ensemble {path}: array '{name}' has {arr.nchunks - present} of its "
                             f"{arr.nchunks} chunk file(s) missing under {Path(str(path)) / name}; "
                             f"{_rebuild(path)}")


def damaged_chunk(path: str | Path, store: Any = None) -> str:
    """Where the ensemble at ``path`` (or in ``store``) fails to read: ``array 'x' chunk (i, ...)``
    and Zarr's error, for the first chunk that does (called after a read failed, so its cost is
    moot)."""
    group = zarr.open_group(str(path) if store is None else store, mode="r")
    for name, arr in group.arrays():
        for coords in np.ndindex(*arr.cdata_shape):
            try:
                arr.get_block_selection(coords)
            except Exception as exc:  # noqa: BLE001 - Zarr's codecs raise several types
                return f"array '{name}' chunk {coords} under {Path(str(path)) / name} ({exc})"
    return "no single chunk fails on its own"
