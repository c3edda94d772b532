"""The figures of the previous report, reused when their inputs have not changed.

A report rebuilt after a change that leaves a figure's inputs as they were — a new title or
lead, new fit settings (the figures of the ensemble stay), a group of points that did not change
— draws only the figures whose inputs did (drawing is the report's cost: matplotlib spends
~0.5–1 s of CPU per figure). A figure is found by its key (:func:`figure_key`): the SHA-256 of
the code that draws it (every source file of the ``sgdsweep`` package and the versions of the
libraries that draw), the function's name and a canonical digest of its arguments
(:func:`digest_of`: values, not Python object identity or pickles, which differ from process to
process). Arguments of a type the digest does not know are never cached.

Layout: ``<cache>/<key>/`` holds ``figure.png``, ``figure.svg`` (when drawn; a report that asks
for SVGs draws a figure stored without one again), ``legends.json``
and ``sha256.json`` (the SHA-256 of each of the others). An entry whose files do not match is
drawn again; an entry is written in a temporary directory and renamed into place, so a killed
report leaves none half written. After a report the cache holds that report's figures only
(:meth:`FigureCache.keep_only`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

#: Changes when the layout of an entry changes (every older entry then misses).
CACHE_FORMAT = "sgdsweep-figure-cache-1"
#: The libraries whose versions are part of every key (they draw the figures or shape their data).
DRAWING_LIBRARIES = ("matplotlib", "numpy", "pandas", "xarray", "scipy")
_KEY = re.compile(r"[0-9a-f]{64}")
_PACKAGE = Path(__file__).resolve().parents[1]

#: A drawn figure: (PNG, SVG or None, legends) as :mod:`sgdsweep.analysis.report` draws it.
Drawn = tuple[bytes, bytes | None, dict[str, list[str]]]


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
    versions of :data:`DRAWING_LIBRARIES`: what draws a figure, other than its arguments."""
    h = hashlib.sha256(CACHE_FORMAT.encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in DRAWING_LIBRARIES:
        try:
            h.update(f"{name}=={version(name)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{name} missing\0".encode())
    return h.hexdigest()


def figure_key(make: Any, args: tuple[Any, ...], memo: dict[int, str] | None = None) -> str | None:
    """The cache key of the figure ``make(*args)``, or None when an argument has no digest
    (:class:`Uncacheable`); ``memo`` as for :func:`digest_of`."""
    try:
        args_digest = digest_of(list(args), memo)
    except Uncacheable:
        return None
    text = f"{code_digest()}\0{make.__module__}.{make.__qualname__}\0{args_digest}"
    return hashlib.sha256(text.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FigureCache:
    """Drawn figures by key (:func:`figure_key`) in ``directory``, created when needed. A
    symbolic link at ``directory`` is removed, never followed (the cache is the sweep's own)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def get(self, key: str, svg: bool) -> Drawn | None:
        """The figure stored under ``key`` (its SVG when ``svg``, else None), or None when there
        is none, when ``svg`` and it was stored without one, or when its files do not match their
        recorded SHA-256 (it is then drawn again and stored anew)."""
        entry = self.directory / key
        if not _KEY.fullmatch(key) or self.directory.is_symlink() or entry.is_symlink():
            return None
        try:
            sums = json.loads((entry / "sha256.json").read_text())
            data = {name: (entry / name).read_bytes() for name in sums}
        except (OSError, ValueError, TypeError):
            return None
        if "figure.png" not in data or "legends.json" not in data or set(data) - {
                "figure.png", "figure.svg", "legends.json"}:
            return None
        if any(_sha256(data[name]) != sums[name] for name in data):
            return None
        try:
            legends = json.loads(data["legends.json"])
        except ValueError:
            return None
        if not (isinstance(legends, dict) and all(isinstance(v, list) for v in legends.values())):
            return None
        if svg and "figure.svg" not in data:
            return None
        return data["figure.png"], data["figure.svg"] if svg else None, legends

    def put(self, key: str, drawn: Drawn) -> None:
        """Store ``drawn`` under ``key`` (written aside, then renamed into place; an entry already
        there is replaced). A cache that cannot be written is skipped: the figure was drawn."""
        png, svg, legends = drawn
        files = {"figure.png": png, "legends.json": json.dumps(legends, sort_keys=True).encode()}
        if svg is not None:
            files["figure.svg"] = svg
        try:
            self._own_directory()
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=self.directory))
            for name, data in files.items():
                (tmp / name).write_bytes(data)
            (tmp / "sha256.json").write_text(json.dumps({n: _sha256(d) for n, d in files.items()}, sort_keys=True))
            entry = self.directory / key
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
            elif entry.exists():
                shutil.rmtree(entry)
            os.rename(tmp, entry)
        except OSError:
            return

    def keep_only(self, keys: Iterable[str]) -> None:
        """Remove every entry (and temporary left by a killed report) but those of ``keys``."""
        keep = set(keys)
        if self.directory.is_symlink() or not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            if path.name in keep or not (_KEY.fullmatch(path.name) or path.name.startswith(".")):
                continue
            try:
                if path.is_symlink() or path.is_file():
                    path.unlink()
                else:
                    shutil.rmtree(path)
            except OSError:
                continue

    def _own_directory(self) -> None:
        if self.directory.is_symlink():
            self.directory.unlink()
        self.directory.mkdir(parents=True, exist_ok=True)
