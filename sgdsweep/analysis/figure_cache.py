"""The figures of the previous report, reused when their inputs have not changed.

A report rebuilt after a change that leaves a figure's inputs as they were — a new title or
lead, new fit settings (the figures of the ensemble stay) — draws only the figures whose inputs
changed (drawing is the report's cost: matplotlib spends ~0.5–1 s of CPU per figure). Points
added to a sweep change the ensemble and with it nearly every figure (each also carries the
ensemble's attributes, which count its points). A figure is found by its key
(:func:`figure_key`): the SHA-256 of the code that draws it (every source file of the
``sgdsweep`` package, Python's version and the versions of the libraries that compute and draw:
:func:`~sgdsweep.analysis.digest.code_digest`), matplotlib's settings (:func:`drawing_settings`),
the function's name and a digest of the values of its arguments
(:func:`~sgdsweep.analysis.digest.digest_of`). Arguments of a type the digest does not know are
never cached. The fonts installed on the machine are not in the key (matplotlib draws with its
own unless its settings name others).

Layout: ``<cache>/<key>/`` holds ``figure.png``, ``figure.svg`` (when drawn; a report that asks
for SVGs draws a figure stored without one again), ``legends.json`` and ``sha256.json`` (the
SHA-256 of each of the others). An entry that is anything else, or whose files do not match, is
drawn again; an entry is written in a temporary directory and renamed into place, so a killed
report leaves none half written. After a report the cache holds that report's figures only
(:meth:`FigureCache.keep_only`); nothing else in the directory is removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sgdsweep.analysis.digest import ENTRY, Uncacheable, code_digest, digest_of, own_directory, prune, read_entry_file

#: The files an entry may hold (but its ``sha256.json``).
FILES = ("figure.png", "figure.svg", "legends.json")

#: A drawn figure: (PNG, SVG or None, legends) as :mod:`sgdsweep.analysis.report` draws it.
Drawn = tuple[bytes, bytes | None, dict[str, list[str]]]


def drawing_settings() -> str:
    """SHA-256 (hex) of matplotlib's settings in this process (``matplotlib.rcParams``: what a
    ``matplotlibrc``, ``MATPLOTLIBRC`` or ``MPLCONFIGDIR`` sets, and what
    :mod:`sgdsweep.analysis.plotting` sets), every figure's style."""
    import matplotlib

    return hashlib.sha256(repr(sorted((k, repr(v)) for k, v in matplotlib.rcParams.items())).encode()).hexdigest()


def figure_key(make: Any, args: tuple[Any, ...], memo: dict[int, str] | None = None) -> str | None:
    """The cache key of the figure ``make(*args)``, or None when an argument has no digest
    (:class:`Uncacheable`); ``memo`` as for :func:`digest_of`."""
    try:
        args_digest = digest_of(list(args), memo)
    except (Uncacheable, RecursionError, ValueError):
        return None
    text = f"{code_digest()}\0{drawing_settings()}\0{make.__module__}.{make.__qualname__}\0{args_digest}"
    return hashlib.sha256(text.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FigureCache:
    """Drawn figures by key (:func:`figure_key`) in ``directory``, created when needed. A
    symbolic link at ``directory`` is removed, never followed (the cache is the sweep's own)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def get(self, key: str, svg: bool) -> Drawn | None:
        """The figure stored under ``key`` (its SVG when ``svg``, else None), or None — it is
        then drawn again and stored anew — when there is none, when ``svg`` and it was stored
        without one, or when the entry is anything but its own regular files (:data:`FILES`,
        read by :func:`~sgdsweep.analysis.digest.read_entry_file`: no link followed, no FIFO
        waited on, nothing larger than a bound) matching their recorded SHA-256."""
        try:
            return self._get(key, svg)
        except Exception:  # noqa: BLE001 - whatever a damaged or planted entry raises: drawn again
            return None

    def _get(self, key: str, svg: bool) -> Drawn | None:
        entry = self.directory / key
        if not ENTRY.fullmatch(key) or self.directory.is_symlink() or entry.is_symlink():
            return None
        raw = read_entry_file(entry / "sha256.json")
        sums = json.loads(raw) if raw is not None else None
        if not (isinstance(sums, dict) and {"figure.png", "legends.json"} <= set(sums) <= set(FILES)
                and all(isinstance(v, str) for v in sums.values())) or (svg and "figure.svg" not in sums):
            return None
        data = {name: read_entry_file(entry / name) for name in sums}
        if any(d is None or _sha256(d) != sums[name] for name, d in data.items()):
            return None
        legends = json.loads(data["legends.json"])
        if not (isinstance(legends, dict) and all(isinstance(v, list) for v in legends.values())):
            return None
        return data["figure.png"], data["figure.svg"] if svg else None, legends

    def put(self, key: str, drawn: Drawn) -> None:
        """Store ``drawn`` under ``key`` (written aside, then renamed into place; an entry already
        there is replaced). A cache that cannot be written is skipped: the figure was drawn."""
        png, svg, legends = drawn
        files = {"figure.png": png, "legends.json": json.dumps(legends).encode()}
        if svg is not None:
            files["figure.svg"] = svg
        try:
            own_directory(self.directory)
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
        prune(self.directory, keys)
