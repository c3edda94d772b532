"""The point stores an export holds, by the schema version of its manifest.

- ``sgdsweep-export/2`` (what :func:`sgdsweep.share.archive.export_sweep` writes): one member
  per point, ``points/<hash>.npz``, the point's store as sgdsweep keeps it
  (:mod:`sgdsweep.store.points`: a NumPy ``.npz`` archive of uncompressed ``.npy`` members,
  checksummed), its bytes unchanged. It is checked as sgdsweep checks its own stores
  (:class:`~sgdsweep.store.points.PointStore`: its CRC-32, its members' names, kinds and
  declared sizes, no pickle) and read the same way; ``numpy.load(f, allow_pickle=False)`` opens
  it too.
- ``sgdsweep-export/1`` (read, no longer written): ``points/<hash>.zarr/<key>``, each point's
  store as a Zarr (format 3) group, about 37 members a point; its arrays' metadata is bounded
  by :mod:`sgdsweep.share.bounds` and an import rewrites it as the point's ``.npz`` store
  (:class:`~sgdsweep.store.point_copies.ZarrPointGroup`, :func:`~sgdsweep.store.point_copies.copy_point`).

Either way a point's store must record that point (:func:`~sgdsweep.store.point_identity.identity_problem`),
so stores swapped or renamed between points are refused naming the member.
"""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path
from typing import Any

from sgdsweep.errors import StoreError
from sgdsweep.share.verify import READ_ERRORS, ShareError, member_blocks
from sgdsweep.store.point_identity import identity_problem
from sgdsweep.store.points import POINT_SUFFIX, PointStore

#: The schema version whose point stores are Zarr groups (``points/<hash>.zarr/<key>``).
ZARR_GROUPS_SCHEMA = "sgdsweep-export/1"
#: Deepest nesting of lists and mappings in a point store's attributes (sgdsweep writes about 5
#: levels). JSON parses deeper ones only as far as the stack allows, so a run, parsing at another
#: depth, could find a store that verify read unreadable, and simulate its point again.
MAX_ATTRS_DEPTH = 32


def zarr_groups(manifest: dict[str, Any]) -> bool:
    """Whether the export's point stores are Zarr groups (schema ``sgdsweep-export/1``) rather
    than one ``.npz`` member each."""
    return manifest.get("schema_version") == ZARR_GROUPS_SCHEMA


def member_name(point_hash: str) -> str:
    """The member holding point ``point_hash``'s store in an export of schema 2: ``points/<hash>.npz``."""
    return f"points/{point_hash}{POINT_SUFFIX}"


def _too_deep(value: Any, limit: int = MAX_ATTRS_DEPTH) -> bool:
    """Whether lists and mappings nest in ``value`` deeper than ``limit`` levels."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _swapped(src: str | Path, name: str, point_hash: str, why: str) -> ShareError:
    return ShareError(f"{src}: member {name!r}: the point store under point {point_hash}'s name is not that "
                      f"point's ({why}); the file's stores were swapped, renamed or edited after export, "
                      "do not use it")


def check_layout(manifest: dict[str, Any], src: str | Path) -> None:
    """Raise :class:`ShareError` unless the members under ``points/`` are the stores of exactly
    the manifest's points: ``points/<hash>.npz`` (``points/<hash>.zarr/<key>``, with its
    ``zarr.json``, in schema 1)."""
    points = set(manifest["points"])
    groups = zarr_groups(manifest)
    form = "points/<hash>.zarr/<key>" if groups else f"points/<hash>{POINT_SUFFIX}"
    stored = set()
    for name in manifest["members"]:
        parts = name.split("/")
        if parts[0] != "points":
            continue
        if groups:
            h = parts[1][: -len(".zarr")] if len(parts) >= 3 and parts[1].endswith(".zarr") else None
        else:
            h = parts[1][: -len(POINT_SUFFIX)] if len(parts) == 2 and parts[1].endswith(POINT_SUFFIX) else None
        if h not in points:
            raise ShareError(f"{src}: member {name!r} is not a file of the point store of one of the "
                             f"manifest's points ({form}); a crafted file")
        if not groups or parts[2:] == ["zarr.json"]:
            stored.add(h)
    if stored != points:
        needed = "points/<hash>.zarr/zarr.json" if groups else form
        raise ShareError(f"{src}: point {min(points - stored)} of the manifest has no point store ({needed}) "
                         "in the file")


def metadata_names(manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Schema 1: for each point of the manifest, its group's metadata members: key in the group
    (``zarr.json``, ``<array>/zarr.json``: the group's and its children's, all that Zarr reads to
    list a group's arrays; nothing deeper) → member name (``points/<hash>.zarr/<key>``), from one
    pass over the manifest's members (:func:`check_layout` checked their layout)."""
    found: dict[str, dict[str, str]] = {h: {} for h in manifest["points"]}
    for name in manifest["members"]:
        parts = name.split("/")
        if (parts[0] == "points" and len(parts) <= 4 and parts[-1] == "zarr.json"
                and parts[1][: -len(".zarr")] in found):
            found[parts[1][: -len(".zarr")]]["/".join(parts[2:])] = name
    return found


def metadata_store(zf: zipfile.ZipFile, keys: dict[str, str]) -> Any:
    """Schema 1: a read-only Zarr ``MemoryStore`` holding the metadata members ``keys`` (key in
    the group → member name) of one point's group in the open export ``zf``, for Zarr to read
    that group's metadata as a reader of the export would. Zarr's ``ZipStore`` lists every name
    of the zip to list one group, so opening each point's group there would cost the number of
    points times the number of members.

    Raises: the errors zipfile raises for an unreadable member (:data:`~sgdsweep.share.verify.READ_ERRORS`).
    """
    from zarr.buffer.cpu import Buffer
    from zarr.storage import MemoryStore

    return MemoryStore({key: Buffer.from_bytes(zf.read(name)) for key, name in keys.items()}, read_only=True)


def _group_attrs(zf: zipfile.ZipFile, point_hash: str, src: str | Path) -> dict[str, Any]:
    """Schema 1: the attributes of point ``point_hash``'s group, read through Zarr (format 3)."""
    import zarr

    name = f"points/{point_hash}.zarr/zarr.json"
    try:
        group = zarr.open_group(metadata_store(zf, {"zarr.json": name}), mode="r", zarr_format=3,
                                use_consolidated=False)
        if group.metadata.zarr_format != 3:  # as bounds checks it, before this
            raise ValueError(f"zarr_format {group.metadata.zarr_format}, not 3")
        attrs = group.attrs.asdict()
        if _too_deep(attrs):
            raise ValueError(f"its attributes nest deeper than {MAX_ATTRS_DEPTH} levels")
        return attrs
    except (zarr.errors.NodeNotFoundError, KeyError, TypeError, *READ_ERRORS) as exc:
        raise ShareError(f"{src}: member {name!r} is not a Zarr group's metadata ({exc}); a damaged "
                         "or crafted file, do not use it") from None


#: What a refusal of an export's point store tells the reader.
_CRAFTED = "the export was crafted, damaged or made from an unfinished sweep, do not use it"


def point_store(zf: zipfile.ZipFile, manifest: dict[str, Any], point_hash: str, src: str | Path) -> PointStore:
    """Schema 2: point ``point_hash``'s store, read from its member (hashed again as it streams:
    :func:`~sgdsweep.share.verify.member_blocks`; held once in memory), opened as sgdsweep opens
    its own stores, its arrays checked from their headers
    (:meth:`~sgdsweep.store.points.PointStore.check_arrays`), and checked to be that point's; the
    caller closes it.

    Raises:
        ShareError: the member differs from its manifest entry, is not a complete store
            sgdsweep wrote, or is another point's store.
    """
    name = member_name(point_hash)
    held = io.BytesIO()
    for block in member_blocks(zf, name, manifest["members"][name], src):
        held.write(block)
    raw = held.getvalue()  # the buffer itself, not a copy (none of it is exported)
    del held
    try:
        store = PointStore(name, raw=raw, fix=_CRAFTED)
        try:
            store.check_arrays()
            if _too_deep([store.attrs, *(attrs for _, attrs in store.arrays.values())]):
                raise StoreError(f"point store {name} has attributes nested deeper than {MAX_ATTRS_DEPTH} levels "
                                 f"(sgdsweep writes about 5); {_CRAFTED}")
        except StoreError:
            store.close()
            raise
    except StoreError as exc:
        raise ShareError(f"{src}: member {name!r}, the store of point {point_hash}, is refused: {exc}") from None
    why = identity_problem(point_hash, store.attrs)
    if why is not None:
        store.close()
        raise _swapped(src, name, point_hash, why)
    return store


def check_points(zf: zipfile.ZipFile, manifest: dict[str, Any], src: str | Path,
                 keep: bool = False) -> dict[str, dict[str, Any]]:
    """Check that the store under each point's name is that point's: in schema 2, read whole as
    sgdsweep reads its own (:func:`point_store`); in schema 1, from its group's attributes.

    Returns:
        With ``keep``, point hash → its store's attributes (identity, parameters, summary), all
        that a replay of the sweep's rounds reads of it (:mod:`sgdsweep.share.rounds`); else
        empty (each store's attributes are dropped after its check).

    Raises:
        ShareError: naming the member and what is wrong.
    """
    found: dict[str, dict[str, Any]] = {}
    for h in manifest["points"]:
        if zarr_groups(manifest):
            attrs = _group_attrs(zf, h, src)
            why = identity_problem(h, attrs)
            if why is not None:
                raise _swapped(src, f"points/{h}.zarr/zarr.json", h, why)
        else:
            with point_store(zf, manifest, h, src) as store:
                attrs = store.attrs
        if keep:
            found[h] = attrs
    return found


def extract_points(zf: zipfile.ZipFile, manifest: dict[str, Any], out: Path, src: str | Path) -> None:
    """Write each point's store of the verified export ``zf`` as ``out/<hash>.npz`` (a new file),
    checked as :func:`check_points` checks it: in schema 2 the member's bytes; in schema 1 its
    group, streamed to disk under ``out/.groups`` (removed after), read back through Zarr (format
    3, each array's own metadata: what :mod:`sgdsweep.share.bounds` bounded; chunk files are the
    manifest's, so a chunk left out by an exporter that wrote only those holding more than the
    fill value reads as the fill value) and written as an ``.npz`` store.

    Raises:
        ShareError: naming the member and what is wrong.
    """
    from sgdsweep.store.point_copies import ZarrPointGroup, copy_point

    out.mkdir(parents=True, exist_ok=True)
    if not zarr_groups(manifest):
        for h in manifest["points"]:
            with point_store(zf, manifest, h, src) as store, open(out / f"{h}{POINT_SUFFIX}", "xb") as fh:
                fh.write(store.raw)
        return
    names: dict[str, list[str]] = {}
    for name in manifest["members"]:
        if name.startswith("points/"):
            names.setdefault(name.split("/")[1][: -len(".zarr")], []).append(name)
    groups = out / ".groups"
    for h in manifest["points"]:
        group, prefix = groups / f"{h}.zarr", f"points/{h}.zarr/"
        for name in names[h]:  # the keys of a Zarr group, as verify checked their names
            target = group / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as fh:
                fh.writelines(member_blocks(zf, name, manifest["members"][name], src))
        try:
            with ZarrPointGroup(group, require_chunks=False) as store:
                why = identity_problem(h, store.attrs)
                if why is not None:
                    raise _swapped(src, f"{prefix}zarr.json", h, why)
                copy_point(store, out / f"{h}{POINT_SUFFIX}")
        except StoreError as exc:
            raise ShareError(f"{src}: the point store of point {h} is not marked complete or not readable ({exc}); "
                             "the file was crafted or exported from an unfinished sweep, do not use it") from None
        shutil.rmtree(group)
    shutil.rmtree(groups, ignore_errors=True)
