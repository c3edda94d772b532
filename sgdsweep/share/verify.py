"""Checking an sgdsweep export before anything is taken from it: the zip's entries and the
sizes they declare, the manifest and what it says, and every member's SHA-256 (streamed).

A forger can rewrite the manifest and recompute the checksum in the zip comment (it proves
integrity, not origin), so nothing the file says is trusted:

- every entry is a regular file with a plain relative name (letters, digits, ``_ . -`` between
  ``/``; no ``..``, ``.``, empty, absolute or backslashed part, no directory or link entry, no two
  names equal but for case, no name that is also another's directory), neither encrypted nor
  compressed otherwise than stored or deflated;
- the sizes the zip declares are bounded before any member is read: each at most
  :data:`MAX_MEMBER_BYTES` (the manifest :data:`MAX_MANIFEST_BYTES`, a point's store
  :data:`sgdsweep.store.points.MAX_POINT_BYTES`, the largest a run reads), all together at most
  :data:`MAX_EXPANSION` times the file's size (an export is stored, not compressed), and each
  equal to the size the manifest lists;
- the manifest names a sweep as the config schema allows one, lists exactly the members present,
  and its config is a valid sweep whose ``sweep`` is the manifest's and whose points hash to the
  manifest's points, each of which has its point store in the file (and no other store is);
- every member is read in blocks of :data:`BLOCK_BYTES`, counted and hashed as it streams: no
  member is held whole in memory but a point's store, one at a time, when it is checked;
- then, from the arrays' metadata alone, what they declare is bounded (their sizes, chunk
  counts and data types: :mod:`sgdsweep.share.bounds`), before any of their data is read;
- then (:func:`check_contents`) the ensemble, read through Zarr's public API, passes the check
  :func:`sgdsweep.open_ensemble` runs (:func:`sgdsweep.store.integrity.check_ensemble`: its
  metadata against its recorded digests, every chunk present), and each point's store is one
  sgdsweep would read as its own and records that point (its hash, and parameters that hash to
  it), so stores swapped or renamed between points are refused
  (:mod:`sgdsweep.share.point_members`);
- last, for a sweep with rounds, the rounds replayed from the file's own stores and fits reach
  exactly its points and simulate nothing (:mod:`sgdsweep.share.rounds`).
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sgdsweep.errors import ConfigError, SgdsweepError, StoreError
from sgdsweep.store.points import MAX_POINT_BYTES

#: The schema version an export is written with (its point stores one ``.npz`` member each).
SCHEMA_VERSION = "sgdsweep-export/2"
#: The schema versions read (1: point stores as Zarr groups, :mod:`sgdsweep.share.point_members`).
SCHEMA_VERSIONS = ("sgdsweep-export/1", SCHEMA_VERSION)
MANIFEST = "sgdsweep-manifest.json"
COMMENT_PREFIX = b"sgdsweep-manifest-sha256="

#: Largest member an export may hold, in bytes (uncompressed): 1 GiB. A point store's array or
#: an ensemble chunk is far smaller.
MAX_MEMBER_BYTES = 1 << 30
#: Largest manifest, in bytes: 256 MiB (about 5 kB a point: ~50,000 points).
MAX_MANIFEST_BYTES = 256 << 20
#: Largest ratio of the members' declared sizes, all together, to the size of the file. An
#: export's members are stored uncompressed (ratio about 1); a higher one is a zip bomb.
MAX_EXPANSION = 100
#: Longest member name, in characters, and most parts between ``/`` (an export's deepest names,
#: a Zarr chunk's, have about seven).
MAX_NAME_CHARS = 1024
MAX_NAME_PARTS = 32
#: Bytes read from a member at a time when it is hashed or copied.
BLOCK_BYTES = 1 << 20

#: One part of a member's name: letters, digits and ``_ . -`` (``.`` and ``..`` are refused apart).
_NAME_PART = re.compile(r"[A-Za-z0-9_.-]{1,255}")
_POINT_HASH = re.compile(r"[0-9a-f]{16}")
#: A point's store in an export of schema 2, which may be as large as a store a run reads.
_POINT_MEMBER = re.compile(r"points/[0-9a-f]{16}\.npz")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The compression methods an export's members may use (sgdsweep writes them stored).
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
#: Errors reading a damaged or crafted member raises.
READ_ERRORS = (
    zipfile.BadZipFile,
    OSError,
    EOFError,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    ValueError,
)


class ShareError(SgdsweepError):
    """An export file is missing, truncated, tampered with, crafted or incompatible."""

    exit_code = 2


def open_export(path: Path, src: str | Path) -> zipfile.ZipFile:
    """``path`` (the local copy of ``src``) opened as a zip file, or :class:`ShareError`."""
    try:
        return zipfile.ZipFile(path)
    except UnicodeDecodeError as exc:  # a name flagged UTF-8 that is not
        raise ShareError(
            f"{src}: a member's name is not valid UTF-8 ({exc}); the file was crafted or "
            "damaged, do not use it"
        ) from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ShareError(
            f"{src} is not a complete zip file (truncated or corrupted: {exc})"
        ) from None


def verified(zf: zipfile.ZipFile, size: int, src: str | Path) -> dict[str, Any]:
    """Every check of the module docstring on an open export of ``size`` bytes, every member's
    SHA-256 included.

    Returns:
        The manifest.

    Raises:
        ShareError: naming the file, the member and what is wrong.
    """
    infos = checked_entries(zf, size, src)
    manifest = read_manifest(zf, infos, src)
    check_listed_members(manifest, infos, src)
    check_config(manifest, src)
    from sgdsweep.share.rounds import check_archive_names

    check_archive_names(manifest, src)
    for name, entry in manifest["members"].items():
        for _ in member_blocks(zf, name, entry, src):
            pass
    from sgdsweep.share.bounds import check_declared

    check_declared(zf, manifest, size, src)  # before any array is read
    attrs = check_contents(zf, manifest, src)
    from sgdsweep.share.rounds import check_rounds

    check_rounds(zf, manifest, attrs, src)
    return manifest


@contextmanager
def opened_zip(source: Path | zipfile.ZipFile) -> Iterator[zipfile.ZipFile]:
    """``source`` as an open zip file: itself, or the local file ``source`` opened (and closed after)."""
    if isinstance(source, zipfile.ZipFile):
        yield source
        return
    with zipfile.ZipFile(source) as zf:
        yield zf


def check_contents(source: Path | zipfile.ZipFile, manifest: dict[str, Any],
                   src: str | Path) -> dict[str, dict[str, Any]]:
    """Check what the export ``source`` (``src``'s local path or open zip, its members verified)
    holds: its ensemble, through Zarr's public API, as :func:`sgdsweep.store.integrity.check_ensemble`
    checks one, and that the store under each point's name is that point's
    (:func:`sgdsweep.share.point_members.check_points`).

    Returns: for a sweep with rounds, point hash → its store's attributes; else empty.

    Raises:
        ShareError: naming the file, the member and what is wrong.
    """
    import zarr

    from sgdsweep.share.point_members import check_points
    from sgdsweep.share.remote import export_store
    from sgdsweep.store.integrity import check_ensemble

    with export_store(source) as store:
        try:
            check_ensemble(src, store=store, keys=set(manifest["members"]))
        except (StoreError, zarr.errors.NodeNotFoundError) as exc:
            raise ShareError(f"{src}: its ensemble (the zip's root group) is refused: {exc}. The file was "
                             "changed after export, or exported from a damaged sweep: do not use it") from None
    with opened_zip(source) as zf:  # the attributes only where the rounds are replayed from them
        return check_points(zf, manifest, src, keep="precision" in manifest["config"] or "search" in manifest["config"])


def _name_problem(name: str) -> str | None:
    """Why ``name`` is not a member name an export uses, or None."""
    if len(name) > MAX_NAME_CHARS or name.count("/") >= MAX_NAME_PARTS:
        return f"it is longer than {MAX_NAME_CHARS} characters or {MAX_NAME_PARTS} parts"
    if (
        "\\" in name
        or name.startswith("/")
        or ".." in name.split("/")
        or re.match(r"[A-Za-z]:", name)
    ):
        return "it would escape the results directory"
    if name.endswith("/"):
        return "it is a directory entry"
    parts = name.split("/")
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' part"
    if not all(_NAME_PART.fullmatch(p) for p in parts):
        return "it has characters other than letters, digits, '_', '.', '-' and '/'"
    return None


def checked_entries(zf: zipfile.ZipFile, size: int, src: str | Path) -> dict[str, zipfile.ZipInfo]:
    """The zip's entries by name, after the checks of names, kinds and declared sizes (before
    any member is read).

    Raises:
        ShareError: for the first entry that fails, naming it.
    """
    infos = zf.infolist()
    repeated = sorted(n for n, count in Counter(i.filename for i in infos).items() if count > 1)
    if repeated:  # zipfile reads the last entry of a name; other tools the first
        raise ShareError(f"{src}: member {repeated[0]!r} is in the file twice (added after export)")
    for info in infos:
        name = info.filename
        why = _name_problem(name)
        mode = info.external_attr >> 16
        if why is None and (
            stat.S_IFMT(mode) not in (0, stat.S_IFREG) or info.external_attr & 0x10
        ):
            why = "it is not a regular file (a link, directory or device entry)"
        if why is None and info.flag_bits & 0x1:
            why = "it is encrypted"
        if why is None and info.compress_type not in _METHODS:
            why = (
                f"it uses compression method {info.compress_type} (an export's members are "
                "stored or deflated)"
            )
        if why is not None:
            raise ShareError(
                f"{src}: member {name!r} is refused: {why}. An sgdsweep export holds regular "
                "files with relative names of letters, digits and _ . - between '/'; this file "
                "was crafted or damaged, do not use it"
            )
        limit = (MAX_MANIFEST_BYTES if name == MANIFEST
                 else MAX_POINT_BYTES if _POINT_MEMBER.fullmatch(name) else MAX_MEMBER_BYTES)
        if info.file_size > limit:
            raise ShareError(
                f"{src}: member {name!r} declares {info.file_size} bytes, more than the limit of "
                f"{limit} bytes a member of an export may have; refusing to read it"
            )
    total = sum(i.file_size for i in infos)
    if total > MAX_EXPANSION * max(size, 1):
        raise ShareError(
            f"{src}: its members declare {total} bytes in all, more than {MAX_EXPANSION} times "
            f"the file's {size} bytes (a zip bomb, or a damaged file); refusing to extract it"
        )
    folded = Counter(i.filename.lower() for i in infos)
    clash = sorted(i.filename for i in infos if folded[i.filename.lower()] > 1)
    if clash:
        raise ShareError(
            f"{src}: members {clash[0]!r} and {clash[1]!r} differ only in case (one would "
            "overwrite the other on some file systems); the file was crafted, do not use it"
        )
    directories = {
        "/".join(i.filename.split("/")[:k])
        for i in infos
        for k in range(1, i.filename.count("/") + 1)
    }
    both = sorted(directories & {i.filename for i in infos})
    if both:
        raise ShareError(
            f"{src}: member {both[0]!r} is a file and also the directory of other members; "
            "the file was crafted, do not use it"
        )
    return {i.filename: i for i in infos}


def member_blocks(
    zf: zipfile.ZipFile,
    name: str,
    entry: dict[str, Any],
    src: str | Path,
    mismatch: str | None = None,
) -> Iterator[bytes]:
    """The bytes of member ``name`` in blocks of at most :data:`BLOCK_BYTES`, counted and hashed
    as they stream; after the last block, checks the count and SHA-256 against the manifest's
    ``entry`` (``size``, ``sha256``); a consumer that writes the blocks out must discard them
    when this raises. ``mismatch``: the message for a wrong count or SHA-256, if not the default.

    Raises:
        ShareError: the member is unreadable, longer than listed, or its SHA-256 differs.
    """
    digest, count, size = hashlib.sha256(), 0, entry["size"]
    try:
        fh = zf.open(name)
    except READ_ERRORS as exc:
        raise ShareError(
            f"{src}: member {name!r} is unreadable ({exc}); the file is truncated or corrupted"
        ) from None
    with fh:
        while True:
            try:
                block = fh.read(min(BLOCK_BYTES, size + 1 - count))
            except READ_ERRORS as exc:
                raise ShareError(
                    f"{src}: member {name!r} is unreadable ({exc}); the file is truncated or "
                    "corrupted"
                ) from None
            if not block:
                break
            count += len(block)
            if count > size:
                break
            digest.update(block)
            yield block
    if count != size or digest.hexdigest() != entry["sha256"]:
        raise ShareError(
            mismatch
            or f"{src}: member {name!r} does not match its SHA-256 in the manifest "
            "(the file was modified or corrupted)"
        )


def read_manifest(
    zf: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], src: str | Path
) -> dict[str, Any]:
    """The manifest, checked against the zip comment's checksum, its schema version and its form
    (:func:`check_manifest`).

    Raises:
        ShareError: naming what is wrong.
    """
    if MANIFEST not in infos:
        raise ShareError(f"{src} has no {MANIFEST}: it is not an sgdsweep export")
    changed = (
        f"{src}: {MANIFEST} does not match the checksum in the zip comment (the manifest was "
        "changed)"
    )
    if not zf.comment.startswith(COMMENT_PREFIX):
        raise ShareError(changed)
    expected = {
        "size": infos[MANIFEST].file_size,  # bounded by checked_entries
        "sha256": zf.comment[len(COMMENT_PREFIX) :].decode("ascii", "replace"),
    }
    text = b"".join(
        member_blocks(zf, MANIFEST, expected, src, mismatch=changed)
    )  # checked, then parsed
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ShareError(f"{src}: the manifest is not valid JSON ({exc})") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if version not in SCHEMA_VERSIONS:
        raise ShareError(
            f"{src}: schema version {version!r}; this sgdsweep reads "
            f"{' and '.join(map(repr, SCHEMA_VERSIONS))}"
        )
    check_manifest(manifest, src)
    return manifest


def sweep_name_problem(name: object) -> str | None:
    """Why ``name`` is not a sweep name as the config schema allows one (the whole string, a
    final newline included, must match its pattern), or None."""
    from sgdsweep.sweep.schema import load_schema

    pattern = load_schema()["properties"]["sweep"]["pattern"]
    if isinstance(name, str) and re.fullmatch(pattern, name):
        return None
    return f"allowed: {pattern}, letters, digits and _ . - only"


def check_manifest(manifest: dict[str, Any], src: str | Path) -> None:
    """Raise :class:`ShareError` unless the manifest lists its members (name → SHA-256 and size),
    config and points (distinct point hashes), and names a sweep as the config schema allows one
    (a name that stays inside a results directory)."""
    members, points = manifest.get("members"), manifest.get("points")
    if not (
        isinstance(members, dict)
        and isinstance(manifest.get("config"), dict)
        and isinstance(points, list)
        and all(
            isinstance(e, dict)
            and isinstance(e.get("sha256"), str)
            and _SHA256.fullmatch(e["sha256"])
            and type(e.get("size")) is int
            and e["size"] >= 0
            for e in members.values()
        )
    ):
        raise ShareError(
            f"{src}: the manifest lacks its members, config or points (a damaged or crafted file)"
        )
    if not all(isinstance(h, str) and _POINT_HASH.fullmatch(h) for h in points) or len(
        set(points)
    ) != len(points):
        raise ShareError(
            f"{src}: the manifest's points are not distinct point hashes (16 hex digits); "
            "a damaged or crafted file"
        )
    why = sweep_name_problem(manifest.get("sweep"))
    if why:
        raise ShareError(
            f"{src}: the manifest's sweep name {manifest.get('sweep')!r} is not a sweep name "
            f"({why}); an import would place it outside the results directory"
        )


def check_listed_members(
    manifest: dict[str, Any], infos: dict[str, zipfile.ZipInfo], src: str | Path
) -> None:
    """Raise :class:`ShareError` unless the members present are those the manifest lists, with
    the sizes it lists, laid out as an export: the ensemble's keys, ``fits.json``, ``README.txt``
    and the stores of exactly the manifest's points
    (:func:`sgdsweep.share.point_members.check_layout`)."""
    listed = manifest["members"]
    extra = sorted(set(infos) - set(listed) - {MANIFEST})
    if extra:
        raise ShareError(
            f"{src}: member {extra[0]!r} is not listed in the manifest (added after export)"
        )
    for name, entry in listed.items():
        if name not in infos:
            raise ShareError(f"{src}: member {name!r} listed in the manifest is missing")
        if infos[name].file_size != entry["size"]:
            raise ShareError(
                f"{src}: member {name!r} declares {infos[name].file_size} bytes in the zip but "
                f"{entry['size']} in the manifest (the file was modified or crafted)"
            )
    for needed in ("zarr.json", "fits.json"):
        if needed not in listed:
            raise ShareError(f"{src}: member {needed!r} listed in the manifest is missing")
    from sgdsweep.share.point_members import check_layout

    check_layout(manifest, src)


def check_config(manifest: dict[str, Any], src: str | Path) -> None:
    """Raise :class:`ShareError` unless the manifest's config is a valid sweep config of the
    manifest's sweep whose points hash to the manifest's points (so that running an import of it
    reads its own results, simulates nothing and writes nowhere else)."""
    from sgdsweep.sweep.config import build_sweep

    config = manifest["config"]
    if config.get("sweep") != manifest["sweep"]:
        raise ShareError(
            f"{src}: the config's sweep {config.get('sweep')!r} is not the manifest's sweep "
            f"{manifest['sweep']!r}; running it would write another sweep's results. A crafted "
            "file: do not use it"
        )
    try:
        sweep = build_sweep({k: v for k, v in config.items() if k != "execution"}, rounds=False)
    except ConfigError as exc:
        raise ShareError(
            f"{src}: the manifest's config is not a valid sweep config ({exc})"
        ) from None
    hashes = [p.hash for p in sweep.points]
    if "precision" in config:  # the first round's points; later rounds' follow from their stores
        from sgdsweep.sweep.precision import round_zero

        hashes = [p.hash for p in round_zero(sweep)]
    rounds = "precision" in config or "search" in config  # the file holds the rounds' points too
    if (not set(hashes) <= set(manifest["points"])) if rounds else sorted(hashes) != sorted(manifest["points"]):
        missing = sorted(set(hashes) - set(manifest["points"])) or sorted(
            set(manifest["points"]) - set(hashes)
        )
        raise ShareError(
            f"{src}: the config's points are not the manifest's points (point {missing[0]} is in "
            "one, not the other): running it would simulate points the file does not hold. The "
            "file was crafted, or made by an sgdsweep whose simulation version differs"
        )
