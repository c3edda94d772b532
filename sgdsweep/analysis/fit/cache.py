"""The previous fits of groups of points, reused when a group's points have not changed.

A fit of one group (one combination of the swept axes a fit does not fit, e.g. one momentum) is
a function of that group's points and the fit settings alone (:func:`sgdsweep.analysis.fit.
fit_ensemble` seeds each group's bootstrap afresh), so a sweep grown by a value of such an axis,
or by points of other groups, refits only the groups whose points changed. A group's result is
found by its key (:class:`GroupKeys`): the SHA-256 of the code (:func:`sgdsweep.analysis.digest.
code_digest`), the fit's name, the fit settings and the group's points — every variable and
coordinate of ``ds.isel(point=group)`` with the ensemble's attributes but those that describe
the whole sweep (:data:`WHOLE_SWEEP_ATTRS`: its config and grid, its size, when, where and by
which code it was built). The fits read from the attributes only ``swept_axes`` and the values
of axes not swept; both stay in the key.

The cache is trusted as fits.json is (both in the sweep's directory): its SHA-256s catch damage,
not a result written there on purpose with its digest. A variable along ``point`` whose first
dimension is not ``point`` turns the cache off for the job (the fits read rows).

Layout: one file, ``<cache>/groups.json``: key → ``{"sha256": …, "result": …}`` (the SHA-256 of
the result's JSON text): an entry that does not match is refitted. Read once, written once and
atomically after the fits (:meth:`FitCache.save`), holding that job's groups only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.digest import Uncacheable, code_digest, digest_of, own_directory, read_entry_file
from sgdsweep.core.paths import atomic_write_text

#: Ensemble attributes that describe the whole sweep (its config with the grid, its size in the
#: title, digests of all its points) or when, where and by which code it was built, not what a
#: group's points are: left out of a group's key (the code is in it through its digest).
WHOLE_SWEEP_ATTRS = frozenset({"created_utc", "host", "python", "devices", "package_versions", "code_version",
                               "points_digest", "sweep_hash", "sweep", "config", "title", "source", "history",
                               "references", "model_units", "Conventions"})


class GroupKeys:
    """The keys of groups of the points of ``ds`` fitted with ``settings`` (the config's ``fit``
    section): what does not depend on the group (the code, the settings, the attributes but
    :data:`WHOLE_SWEEP_ATTRS`, each variable's name, dims, dtype and attributes, the variables
    without a ``point`` dimension) digested once; per group only its rows of the variables along
    ``point`` — what :func:`~sgdsweep.analysis.digest.digest_of` of ``ds.isel(point=group)``
    covers, at the cost of one slice per variable."""

    def __init__(self, ds: xr.Dataset, settings: Mapping[str, Any]) -> None:
        self._along: list[tuple[int, np.ndarray]] = []
        self._base: str | None = None
        try:
            fixed: dict[str, Any] = {}
            schema = []
            for name, var in ds.variables.items():
                values = np.asarray(var.values)
                schema.append((str(name), tuple(map(str, var.dims)), repr(values.dtype.descr), dict(var.attrs)))
                if "point" in var.dims:
                    if var.dims[0] != "point":  # the fits index rows (point first): keyed as they read
                        raise Uncacheable(f"{name}: its first dimension is not point")
                    self._along.append((0, values))
                else:
                    fixed[str(name)] = values
            attrs = {k: v for k, v in ds.attrs.items() if k not in WHOLE_SWEEP_ATTRS}
            sizes = {str(k): v for k, v in ds.sizes.items() if k != "point"}  # the group's size: per key
            self._base = digest_of([code_digest(), dict(settings), attrs, schema, fixed, sizes])
        except (Uncacheable, RecursionError, ValueError):
            self._base = None

    def key(self, name: str, index: np.ndarray) -> str | None:
        """The key of fit ``name`` on the points ``index``; None when something has no digest."""
        if self._base is None:
            return None
        h = hashlib.sha256(f"{self._base}\0{name}\0{len(index)}\0".encode())
        try:
            for axis, values in self._along:
                part = np.take(values, index, axis=axis)
                h.update(repr(part.shape).encode())
                if part.dtype.hasobject:
                    h.update(digest_of(part).encode())
                else:
                    h.update(np.ascontiguousarray(part).tobytes())
        except (Uncacheable, RecursionError, ValueError):
            return None
        return h.hexdigest()


def _shaped(result: Any) -> bool:
    """Whether ``result`` has the shape of a group's fit: a dict whose ``params``, if any, map
    names to dicts (or None), as the report and the family of comparisons read them."""
    if not isinstance(result, dict):
        return False
    params = result.get("params", {})
    return isinstance(params, dict) and all(q is None or isinstance(q, dict) for q in params.values())


def _text(result: Any) -> str:
    """The JSON text of a result, its keys in their order (as fits.json writes them)."""
    return json.dumps(result, allow_nan=True)


#: The cache's one file, in its directory, and the most bytes it is read at (a larger one counts
#: as empty: parsing JSON takes ~25 times its size in memory).
GROUPS_FILE, MAX_GROUPS_BYTES = "groups.json", 32 * 2**20


class FitCache:
    """Fit results by key (:class:`GroupKeys`) in ``directory``'s :data:`GROUPS_FILE`, read once
    when made (as a regular file only: :func:`~sgdsweep.analysis.digest.read_entry_file`; a file
    that cannot be read or parsed counts as empty) and written once by :meth:`save`."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._stored: dict[str, Any] = {}
        self._kept: dict[str, Any] = {}
        #: group results taken from the cache, and made (fitted and stored), since made
        self.reused = self.made = 0
        try:
            file = self.directory / GROUPS_FILE
            raw = None if self.directory.is_symlink() else read_entry_file(file, MAX_GROUPS_BYTES)
            stored = json.loads(raw) if raw is not None else {}
            self._stored = stored if isinstance(stored, dict) else {}
        except Exception:  # noqa: BLE001 - whatever a damaged or planted file raises: an empty cache
            self._stored = {}

    def get(self, key: str) -> dict[str, Any] | None:
        """A copy of the result stored under ``key``, or None when there is none or it does not
        match its recorded SHA-256 (the group is then fitted again)."""
        try:
            entry = self._stored.get(key)
            text = _text(entry["result"])
            if hashlib.sha256(text.encode()).hexdigest() != entry["sha256"] or not _shaped(entry["result"]):
                return None
        except Exception:  # noqa: BLE001 - a damaged or planted entry: fitted again
            return None
        self._kept[key] = entry
        self.reused += 1
        return json.loads(text)

    def put(self, key: str, result: Mapping[str, Any]) -> None:
        """Keep ``result`` (JSON-serialisable, as fits.json holds it) under ``key`` as it is now
        (later changes to it are not kept), for :meth:`save`."""
        self.made += 1
        try:
            text = _text(result)
        except (TypeError, ValueError):
            return
        self._kept[key] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "result": json.loads(text)}

    def save(self) -> None:
        """Write the cache: the results taken or kept since it was made, and no others (one file,
        atomically; a link at the directory removed, never followed). A cache that cannot be
        written is skipped: the fits were made."""
        try:
            own_directory(self.directory)
            atomic_write_text(self.directory / GROUPS_FILE, json.dumps(self._kept, allow_nan=True) + "\n")
        except (OSError, TypeError, ValueError):
            return
