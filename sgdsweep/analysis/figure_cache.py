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

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sgdsweep.analysis.digest import Uncacheable, code_digest, digest_of, own_directory, prune

_KEY = re.compile(r"[0-9a-f]{64}")

#: A drawn figure: (PNG, SVG or None, legends) as :mod:`sgdsweep.analysis.report` draws it.
Drawn = tuple[bytes, bytes | None, dict[str, list[str]]]


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
