"""The previous fits of groups of points, reused when a group's points have not changed.

A fit of one group (one combination of the swept axes a fit does not fit, e.g. one momentum) is
a function of that group's points and the fit settings alone (:func:`sgdsweep.analysis.fit.
fit_ensemble` seeds each group's bootstrap afresh), so a sweep grown by a value of such an axis,
or by points of other groups, refits only the groups whose points changed. A group's result is
found by its key (:func:`group_key`): the SHA-256 of the code (:func:`sgdsweep.analysis.digest.
code_digest`), the fit's name, the fit settings and the group's points — every variable and
coordinate of ``ds.isel(point=group)`` with the ensemble's attributes but those that describe
the whole sweep (:data:`WHOLE_SWEEP_ATTRS`: its config and grid, its size, when, where and by
which code it was built). The fits read from the attributes only ``swept_axes`` and the values
of axes not swept; both stay in the key.

Layout: ``<cache>/<key>.json`` holds ``{"result": …, "sha256": …}`` (the SHA-256 of the result's
JSON text): a file that does not match is refitted. Written atomically; after a fit job the cache
holds that job's groups only (:meth:`FitCache.keep_only`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from sgdsweep.analysis.digest import (
    ENTRY,
    Uncacheable,
    code_digest,
    digest_of,
    own_directory,
    prune,
    read_entry_file,
)
from sgdsweep.core.paths import atomic_write_text

#: Ensemble attributes that describe the whole sweep (its config with the grid, its size in the
#: title, digests of all its points) or when, where and by which code it was built, not what a
#: group's points are: left out of a group's key (the code is in it through its digest).
WHOLE_SWEEP_ATTRS = frozenset({"created_utc", "host", "python", "devices", "package_versions", "code_version",
                               "points_digest", "sweep_hash", "sweep", "config", "title", "source", "history",
                               "references", "model_units", "Conventions"})


def group_key(name: str, settings: Mapping[str, Any], ds: xr.Dataset, index: np.ndarray) -> str | None:
    """The key of fit ``name`` with ``settings`` (the config's ``fit`` section) on the points
    ``index`` of ``ds``; None when something in them has no digest."""
    part = ds.isel(point=index)
    part.attrs = {k: v for k, v in ds.attrs.items() if k not in WHOLE_SWEEP_ATTRS}
    try:
        text = f"{code_digest()}\0{name}\0{digest_of(dict(settings))}\0{digest_of(part)}"
    except (Uncacheable, RecursionError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _text(result: Any) -> str:
    """The JSON text of a result, its keys in their order (as fits.json writes them)."""
    return json.dumps(result, allow_nan=True)


class FitCache:
    """Fit results by key (:func:`group_key`) in ``directory``, created when needed; a symbolic
    link there is removed, never followed."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.used: set[str] = set()
        #: group results taken from the cache, and made (fitted and stored), since made
        self.reused = self.made = 0

    def get(self, key: str) -> dict[str, Any] | None:
        """The result stored under ``key`` (a new dict), or None when there is none, or the entry
        is anything but a regular file (:func:`~sgdsweep.analysis.digest.read_entry_file`: no
        link followed, no FIFO waited on, nothing larger than a bound) whose result matches its
        recorded SHA-256."""
        self.used.add(key)
        try:
            result = self._get(key)
        except Exception:  # noqa: BLE001 - whatever a damaged or planted entry raises: fitted again
            return None
        if result is not None:
            self.reused += 1
        return result

    def _get(self, key: str) -> dict[str, Any] | None:
        path = self.directory / f"{key}.json"
        if not ENTRY.fullmatch(path.name) or self.directory.is_symlink():
            return None
        raw = read_entry_file(path)
        if raw is None:
            return None
        stored = json.loads(raw)
        result = stored["result"]
        good = hashlib.sha256(_text(result).encode()).hexdigest() == stored["sha256"]
        return result if good and isinstance(result, dict) else None

    def put(self, key: str, result: Mapping[str, Any]) -> None:
        """Store ``result`` (JSON-serialisable, as fits.json holds it) under ``key``, written now:
        later changes to ``result`` are not stored. A cache that cannot be written is skipped."""
        self.used.add(key)
        self.made += 1
        try:
            text = _text(result)
            own_directory(self.directory)
            digest = hashlib.sha256(text.encode()).hexdigest()
            atomic_write_text(self.directory / f"{key}.json", f'{{"sha256": "{digest}", "result": {text}}}\n')
        except (OSError, TypeError, ValueError):
            return

    def keep_only(self, keys: Iterable[str] | None = None) -> None:
        """Remove every entry but those of ``keys`` (default: those asked for or stored since
        this object was made)."""
        prune(self.directory, self.used if keys is None else keys)
