"""Digests of values and of the code, for results reused while what they were made from is
unchanged: the previous report's figures (:mod:`sgdsweep.analysis.figure_cache`) and the
previous fits of groups of points (:mod:`sgdsweep.analysis.fit.cache`).

:func:`digest_of` hashes a value, not a Python object: equal values give equal digests in any
process (pickles do not: an xarray dataset pickles a set of names, in an order that changes with
the process's string hashing). :func:`code_digest` hashes what computes the results besides
their inputs. A cache directory holds entries named by such a digest (64 hex digits), and is the
sweep's own: :func:`own_directory` removes a symbolic link in its place, :func:`prune` removes
only entries of that form and temporaries (names starting with a dot), never through a link.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

#: Changes when what a digest covers changes (every older entry then misses).
DIGEST_FORMAT = "sgdsweep-digest-1"
#: The libraries whose versions are part of :func:`code_digest` (they compute or draw results).
LIBRARIES = ("matplotlib", "numpy", "pandas", "xarray", "scipy")
#: An entry's name in a cache directory: its key, optionally with a suffix (``<key>.json``).
ENTRY = re.compile(r"([0-9a-f]{64})(\.[a-z]+)?")
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
    elif isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:  # e.g. point names: as JSON when it can be (one call, not one per item)
            h.update(b"O")
            _feed(h, obj.shape)
            items = obj.ravel().tolist()
            try:
                text = json.dumps(items, ensure_ascii=False, allow_nan=True)
            except TypeError:
                _feed(h, items, memo)
            else:
                h.update(b"J%d:" % len(text) + text.encode())
        else:
            h.update(f"N{obj.dtype.str}{obj.shape}".encode())
            h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        h.update(b"M%d:" % len(obj))
        for key in sorted(obj, key=repr):
            _feed(h, key, memo)
            _feed(h, obj[key], memo)
    elif isinstance(obj, (list, tuple)):
        h.update(b"L%d:" % len(obj) if isinstance(obj, list) else b"T%d:" % len(obj))
        for item in obj:
            _feed(h, item, memo)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes, np.generic)):
        text = f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!r}"
        h.update(b"S%d:" % len(text) + text.encode())
    else:
        raise Uncacheable(f"no digest for an argument of type {type(obj).__qualname__}")


def digest_of(obj: Any, memo: dict[int, str] | None = None) -> str:
    """SHA-256 (hex) of ``obj``'s value: xarray datasets and arrays (sizes, attributes, names and
    order of coordinates and variables, each variable's dims, attributes and values), NumPy
    arrays (dtype, shape, bytes), dicts (in key order), lists, tuples and scalars. Equal values
    give equal digests in any process. ``memo`` keeps the digest of each xarray object met by its
    ``id``, for digests of many arguments that share one dataset (the objects must stay alive).

    Raises:
        Uncacheable: ``obj`` holds a value of another type.
    """
    h = hashlib.sha256()
    _feed(h, obj, memo)
    return h.hexdigest()


@functools.cache
def code_digest() -> str:
    """SHA-256 (hex) of every ``.py`` file of the ``sgdsweep`` package (path and content) and the
    versions of :data:`LIBRARIES`: what draws a figure, other than its arguments."""
    h = hashlib.sha256(DIGEST_FORMAT.encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in LIBRARIES:
        try:
            h.update(f"{name}=={version(name)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{name} missing\0".encode())
    return h.hexdigest()


def own_directory(directory: Path) -> None:
    """Make ``directory`` (a cache's) exist as a directory of its own: a symbolic link there is
    removed, never followed."""
    if directory.is_symlink():
        directory.unlink()
    directory.mkdir(parents=True, exist_ok=True)


def prune(directory: Path, keep: Iterable[str]) -> None:
    """Remove every entry of the cache ``directory`` whose key is not in ``keep``, and every
    temporary (a name starting with a dot) a killed writer left; nothing else, nothing through a
    link (a linked ``directory`` is left alone). Entries that cannot be removed are left."""
    keep = set(keep)
    if directory.is_symlink() or not directory.is_dir():
        return
    for path in directory.iterdir():
        entry = ENTRY.fullmatch(path.name)
        if not (path.name.startswith(".") or (entry and entry[1] not in keep)):
            continue
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
            else:
                shutil.rmtree(path)
        except OSError:
            continue
