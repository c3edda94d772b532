"""Bounds on what the arrays of an sgdsweep export declare, checked from their metadata alone,
before any of their data is read.

A Zarr array's metadata says its shape and data type; a reader allocates that shape whole
(Zarr reads a chunk missing from the store as the fill value, and a compressed chunk of a few
bytes can expand to its whole shape). A crafted export whose members all match its manifest
could therefore declare a 16000 × 16000 array in a file of a few hundred kB: an import or a
merge would allocate gigabytes. So, for every array of the export (the ensemble's, in both
views a reader may take, and, in an export of schema 1, those of every point store's Zarr
group), counted in bytes as NumPy holds it (its elements times their item size, 16 bytes for a
string element; a point store of schema 2 is bounded as sgdsweep bounds its own stores,
:class:`sgdsweep.store.points.PointStore`: its members uncompressed, so they declare no more
than the member holds):

- each array declares at most :data:`MAX_ARRAY_BYTES` (the largest member an export may hold,
  :data:`sgdsweep.share.verify.MAX_MEMBER_BYTES`: a point store's array is one member);
- each point store declares at most :data:`sgdsweep.store.points.MAX_POINT_BYTES` in all (the
  largest point store sgdsweep reads);
- all arrays together declare at most :data:`sgdsweep.share.verify.MAX_EXPANSION` times
  the file's size (the bound the zip's own declared sizes keep: sgdsweep writes an export's
  point stores uncompressed and its ensemble is a small part of it, so a real export declares
  about its own size);
- each array has at most as many chunks as the file has members (every chunk of an array an
  exporter wrote is a member, so a larger chunk grid is crafted, and walking it would take
  unbounded time);
- each array has the data type sgdsweep writes there: a number or a boolean, or, in the
  ensemble, a string for the coordinates (:data:`sgdsweep.store.variables.COORDS`) and
  ``missing_because``.

So an import or a merge of an export of ``n`` bytes never allocates for its arrays more than
``MAX_EXPANSION · n`` bytes, nor more than :data:`MAX_ARRAY_BYTES` for one array.
"""

from __future__ import annotations

import math
import warnings
import zipfile
from pathlib import Path
from typing import Any

from sgdsweep.share.point_members import metadata_names, metadata_store, zarr_groups
from sgdsweep.share.verify import MAX_EXPANSION, MAX_MEMBER_BYTES, ShareError, opened_zip
from sgdsweep.store.points import MAX_POINT_BYTES
from sgdsweep.store.variables import COORDS

#: Largest size one array of an export may declare, bytes: 1 GiB (the largest member).
MAX_ARRAY_BYTES = MAX_MEMBER_BYTES
#: Bytes counted for one string element (NumPy's ``StringDType`` item size).
STRING_ITEM_BYTES = 16
#: Arrays of the ensemble that hold strings: its coordinates (point hash, shard, noise type,
#: theory column, ...) and why a theory value is missing.
ENSEMBLE_STRINGS = frozenset(COORDS) | {"missing_because"}
#: NumPy dtype kinds of numbers and booleans.
_NUMERIC = "biufc"
#: NumPy dtype kinds of strings.
_STRING = "TUSO"


def _arrays(store: Any, consolidated: bool | None) -> list[tuple[str, Any]]:
    """The arrays of the group at the root of ``store``, as Zarr lists them: format 3 only (a
    reader of the export opens its groups so: a format 2 group would hide its ``.zarray`` arrays
    from a store of ``zarr.json`` members), its consolidated copy only where ``consolidated``."""
    import zarr

    with warnings.catch_warnings():  # an export's root also holds its other members (fits.json, …)
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        group = zarr.open_group(store, mode="r", zarr_format=3, use_consolidated=consolidated)
        if group.metadata.zarr_format != 3:  # Zarr takes a zarr.json that says 2 as it is
            raise ValueError(f"its zarr.json says zarr_format {group.metadata.zarr_format}, not 3")
        return list(group.arrays())


def _declared(name: str, arr: Any, where: str, strings: frozenset[str], members: int,
              src: str | Path) -> int:
    """Bytes the array ``name`` (at ``where``) declares, after its own checks (data type, size,
    chunk count).

    Raises: ShareError naming the array, what it declares and what is allowed.
    """
    shape = tuple(int(s) for s in arr.shape)
    dtype = arr.dtype
    kind = getattr(dtype, "kind", "?")
    allowed = "a number or a boolean" + (" or, for a coordinate or missing_because, a string" if strings else "")
    if not (kind in _NUMERIC or (kind in _STRING and name in strings)):
        raise ShareError(f"{src}: array '{name}' of {where} has data type {dtype} ({arr.metadata.data_type}); "
                         f"allowed there: {allowed}. sgdsweep never writes it: the file was crafted, do not use it")
    item = STRING_ITEM_BYTES if kind in _STRING else int(dtype.itemsize)
    size = math.prod(shape) * item
    if size > MAX_ARRAY_BYTES:
        raise ShareError(f"{src}: array '{name}' of {where} declares shape {shape} of {dtype}, {size} bytes; "
                         f"allowed: at most {MAX_ARRAY_BYTES} bytes for one array of an export. The file was "
                         "crafted, do not use it")
    chunks = math.prod(math.ceil(s / max(int(c), 1)) for s, c in zip(shape, arr.chunks))
    if chunks > members:
        raise ShareError(f"{src}: array '{name}' of {where} declares {chunks} chunks (shape {shape}, chunks "
                         f"{tuple(arr.chunks)}); allowed: at most the file's {members} members. The file was "
                         "crafted, do not use it")
    return size


def check_declared(source: Path | zipfile.ZipFile, manifest: dict[str, Any], size: int, src: str | Path) -> int:
    """Check the arrays of the export ``source`` (``src``'s local path or open zip, ``size`` bytes,
    its manifest checked) against the bounds of the module docstring, from their metadata only.

    Returns:
        The bytes all its arrays declare together.

    Raises:
        ShareError: naming the array, what it declares and the bound it exceeds.
    """
    from sgdsweep.share.remote import export_store

    members = max(len(manifest["members"]), 1)
    total = 0
    with export_store(source) as root, opened_zip(source) as zf:
        groups: list[tuple[str, str, frozenset[str], list[bool | None]]] = [
            ("", "the ensemble (the zip's root group)", ENSEMBLE_STRINGS, [False, None])]
        if zarr_groups(manifest):  # schema 2's point stores are bounded as sgdsweep reads its own (PointStore)
            groups += [(h, f"point {h}'s store (points/{h}.zarr)", frozenset(), [False]) for h in manifest["points"]]
        metadata = metadata_names(manifest) if zarr_groups(manifest) else {}
        for group, where, strings, views in groups:
            point_total = 0
            for consolidated in views:  # the ensemble's own zarr.json files and its consolidated copy
                try:  # a point's group from its metadata members alone (metadata_store: linear)
                    store = metadata_store(zf, metadata[group]) if group else root
                    arrays = _arrays(store, consolidated)
                except Exception as exc:  # noqa: BLE001 - Zarr raises many types for crafted metadata
                    raise ShareError(f"{src}: the metadata of {where} is not what sgdsweep writes ({exc}); "
                                     "a damaged or crafted file, do not use it") from None
                view = sum(_declared(name, arr, where, strings, members, src) for name, arr in arrays)
                point_total = max(point_total, view)
            if group and point_total > MAX_POINT_BYTES:
                raise ShareError(f"{src}: {where} declares {point_total} bytes of arrays; allowed: at most "
                                 f"{MAX_POINT_BYTES} bytes for one point store. The file was crafted, do not use it")
            total += point_total
            if total > MAX_EXPANSION * max(size, 1):
                raise ShareError(f"{src}: its arrays declare {total} bytes or more (up to {where}), more than "
                                 f"{MAX_EXPANSION} times the file's {size} bytes; allowed: at most "
                                 f"{MAX_EXPANSION * max(size, 1)} bytes. An array's metadata was crafted to "
                                 "allocate far more than the file holds, do not use it")
    return total
