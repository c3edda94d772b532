"""Digests of values and of the code, for results reused while what they were made from is
unchanged: the previous report's figures (:mod:`sgdsweep.analysis.figure_cache`) and the
previous fits of groups of points (:mod:`sgdsweep.analysis.fit.cache`).

:func:`digest_of` hashes a value, not a Python object: equal values give equal digests in any
process (pickles do not: an xarray dataset pickles a set of names, in an order that changes with
the process's string hashing). :func:`code_digest` hashes what computes the results besides
their inputs. A cache directory is the sweep's own: :func:`own_directory` removes a symbolic
link in its place; :func:`prune` removes only entries named by a digest (64 hex digits) and its
writer's temporaries, never through a link; :func:`read_entry_file` reads an entry's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

#: Changes when what a digest covers changes (every older entry then misses).
DIGEST_FORMAT = "sgdsweep-digest-1"
#: The libraries whose versions are part of :func:`code_digest` (they compute or draw results).
LIBRARIES = ("matplotlib", "numpy", "pandas", "xarray", "scipy", "pillow", "kiwisolver", "pyparsing", "fonttools")
#: An entry's name in a cache directory: its key.
ENTRY = re.compile(r"([0-9a-f]{64})")
#: A temporary of a cache's writer: ``.<first 16 hex digits of a key>.<random>`` (an entry being
#: written, :mod:`tempfile`).
TEMPORARY = re.compile(r"\.[0-9a-f]{16}\.[A-Za-z0-9_]{8}")
_PACKAGE = Path(__file__).resolve().parents[1]


class Uncacheable(TypeError):
    """An argument of a type :func:`digest_of` does not know: the figure is drawn, not cached."""


def _feed(h: Any, obj: Any, memo: dict[int, str] | None = None) -> None:
    """Feed ``obj``'s value, tagged by its type, into the hash ``h``; the digest of each xarray
    object is kept in ``memo`` by its ``id`` (objects alive while ``memo`` is used)."""
    if memo is not None and isinstance(obj, (xr.Dataset, xr.DataArray)):
        if id(obj) not in memo:
            memo[id(obj)] = digest_of(obj)
        h.update(b"X" + memo[id(obj)].encode())
        return
    if isinstance(obj, xr.DataArray):
        h.update(b"A")
        _feed(h, None if obj.name is None else str(obj.name))
        obj = obj.to_dataset(name="__value__")
    if isinstance(obj, xr.Dataset):
        h.update(b"D")
        _feed(h, dict(obj.sizes))
        _feed(h, dict(obj.attrs))
        _feed(h, [str(n) for n in obj.coords])
        _feed(h, [str(n) for n in obj.data_vars])
        for name, var in obj.variables.items():
            _feed(h, (str(name), tuple(map(str, var.dims)), dict(var.attrs)))
            _feed(h, np.asarray(var.values))
    elif isinstance(obj, np.ma.MaskedArray):
        raise Uncacheable("no digest for a masked array (its mask is not in its bytes)")
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            h.update(b"O")
            _feed(h, obj.shape)
            items = obj.ravel().tolist()
            if all(type(x) is str or x is None for x in items):  # e.g. point names: one JSON text
                _update_text(h, b"J", json.dumps(items, ensure_ascii=False))
            else:
                _feed(h, items, memo)
        else:  # the dtype's full description: a structured dtype's fields, names and types
            _update_text(h, b"N", f"{obj.dtype.descr!r}{obj.shape}")
            h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):  # in its order: a figure's labels follow a dict's order
        h.update(b"M%d:" % len(obj))
        for key, value in obj.items():
            _feed(h, key, memo)
            _feed(h, value, memo)
    elif isinstance(obj, (list, tuple)):
        h.update(b"L%d:" % len(obj) if isinstance(obj, list) else b"T%d:" % len(obj))
        for item in obj:
            _feed(h, item, memo)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes, np.generic)):
        _update_text(h, b"S", f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!r}")
    else:
        raise Uncacheable(f"no digest for an argument of type {type(obj).__qualname__}")


def _update_text(h: Any, tag: bytes, text: str) -> None:
    """Feed ``text`` (any string, lone surrogates too) with its tag and length."""
    data = text.encode("utf-8", "surrogatepass")
    h.update(tag + b"%d:" % len(data) + data)


def digest_of(obj: Any, memo: dict[int, str] | None = None) -> str:
    """SHA-256 (hex) of ``obj``'s value: xarray datasets and arrays (sizes, attributes, names and
    order of coordinates and variables, each variable's dims, attributes and values), NumPy
    arrays (dtype, shape, bytes), dicts (in their order), lists, tuples and scalars. Equal values
    give equal digests in any process. ``memo`` keeps the digest of each xarray object met by its
    ``id``, for digests of many arguments that share one dataset (the objects must stay alive).

    Raises:
        Uncacheable: ``obj`` holds a value of another type.
    """
    h = hashlib.sha256()
    _feed(h, obj, memo)
    return h.hexdigest()


def _code_digest() -> str:
    h = hashlib.sha256(DIGEST_FORMAT.encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"python {sys.version}\0".encode())
    for name in LIBRARIES:
        try:
            h.update(f"{name}=={version(name)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{name} missing\0".encode())
    return h.hexdigest()


#: :func:`code_digest`'s value, computed as this module is imported (with the code that imports
#: it: a source file saved later, while a job runs, does not pass for the code that ran).
_CODE_DIGEST = _code_digest()


def code_digest() -> str:
    """SHA-256 (hex) of every ``.py`` file of the ``sgdsweep`` package (path and content), of
    Python's version and of the versions of :data:`LIBRARIES`, as they were when this module was
    imported: what computes a result, other than its inputs."""
    return _CODE_DIGEST


#: The most bytes a cache file may hold (a larger one is not read: a miss).
MAX_ENTRY_BYTES = 256 * 2**20


def read_entry_file(path: Path, max_bytes: int = MAX_ENTRY_BYTES) -> bytes | None:
    """The bytes of the regular file ``path`` of a cache entry, or None when it is anything else
    (a link, a FIFO, a device, a directory), larger than ``max_bytes`` (default
    :data:`MAX_ENTRY_BYTES`), or cannot be read: never blocks on a FIFO, never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def own_directory(directory: Path) -> None:
    """Make ``directory`` (a cache's) exist as a directory of its own: a symbolic link there is
    removed, never followed."""
    if directory.is_symlink():
        directory.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def prune(directory: Path, keep: Iterable[str]) -> None:
    """Remove every entry of the cache ``directory`` whose key is not in ``keep`` (names
    :data:`ENTRY`), and every temporary a killed writer left (names :data:`TEMPORARY`); nothing
    else, nothing through a link (a linked ``directory`` is left alone). What cannot be listed or
    removed is left."""
    keep = set(keep)
    try:
        if directory.is_symlink() or not directory.is_dir():
            return
        paths = list(directory.iterdir())
    except OSError:
        return
    for path in paths:
        entry = ENTRY.fullmatch(path.name)
        if not ((entry and entry[1] not in keep) or TEMPORARY.fullmatch(path.name)):
            continue
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)
        except OSError:
            continue
