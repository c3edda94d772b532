"""Whose results a point store holds: the check that a store read under a point's name is that
point's.

A point store is found by its name, ``<hash>.<suffix>`` (:func:`sgdsweep.store.points.point_path`),
and records the point it was written for: the attribute :data:`HASH_ATTR` and the point's
parameters ``params``. A store copied or renamed onto another point's name, or whose parameters
were edited, would be read as that point's results; so every reader that picks a store by name
checks that the recorded hash is the name and that the recorded parameters hash to it
(:func:`identity_problem`; :func:`sgdsweep.core.identity.content_hash`, which includes the
simulation version). The check costs one hash of the parameters (microseconds) per store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgdsweep.core.identity import content_hash
from sgdsweep.errors import StoreError

log = logging.getLogger(__name__)

#: Attribute holding the hash of the point a store holds (its name must be that hash); the point's
#: parameters are the attribute ``params``.
HASH_ATTR = "point_hash"


def identity_problem(point_hash: str, attrs: Mapping[str, Any]) -> str | None:
    """Why a store whose group attributes are ``attrs`` is not the store of point ``point_hash``,
    or None when it is: it must record that hash (:data:`HASH_ATTR`) and parameters (``params``)
    that hash to it (:func:`sgdsweep.core.identity.content_hash`, which includes this
    simulation version)."""
    recorded, params = attrs.get(HASH_ATTR), attrs.get("params")
    if not isinstance(recorded, str) or not isinstance(params, Mapping):
        return f"it records no point identity (attributes '{HASH_ATTR}' and 'params')"
    if recorded != point_hash:
        return f"it holds the results of point {recorded}"
    try:
        computed = content_hash(params)
    except (TypeError, ValueError) as exc:
        return f"its parameters cannot be hashed ({exc})"
    if computed != point_hash:
        return (f"its parameters hash to {computed}, not {point_hash}: they were edited, or it was "
                "written by another simulation version")
    return None


def misnamed(path: str | Path, point_hash: str, why: str) -> StoreError:
    """The error for the store ``path`` read as point ``point_hash``'s when it is not
    (:func:`identity_problem` said ``why``), naming the store and the fix."""
    return StoreError(f"point store {path} is not the store of point {point_hash}: {why} (a store copied "
                      "or renamed onto this name, or edited). Delete it, or move it to its own point's name "
                      "if that point has no store, and rerun the workflow: it recomputes the point")


def set_aside(existing: Path, owner: str, attrs: Mapping[str, Any], suffixes: tuple[str, ...]) -> None:
    """Make way for point ``owner``'s store when the complete store ``existing`` under its name
    (group attributes ``attrs``; its name ends in one of ``suffixes``, the store layouts) holds
    another point's results (:func:`identity_problem`): move it to its own name when it is a good
    store of a point that has no store of any layout yet; otherwise leave it to be replaced (a
    duplicate of a point stored already, or a store whose parameters do not hash to its
    recorded point). Either way a warning names it. Nothing is done to ``owner``'s own store."""
    why = identity_problem(owner, attrs)
    if why is None:
        return
    other = attrs.get(HASH_ATTR)
    suffix = next(s for s in suffixes if existing.name.endswith(s))
    if isinstance(other, str) and identity_problem(other, attrs) is None and not any(
            (existing.parent / f"{other}{s}").exists() for s in suffixes):
        target = existing.with_name(f"{other}{suffix}")  # `other` is a content hash: 16 hex digits
        try:
            if existing.is_dir():
                os.rename(existing, target)
            else:  # a hard link fails rather than replace a store that appeared meanwhile
                os.link(existing, target)
                existing.unlink()
        except OSError as exc:
            log.warning("point store %s holds point %s's results, not point %s's; moving it to %s "
                        "failed (%s): it is replaced by point %s's own results", existing, other, owner,
                        target, exc.strerror or exc, owner)
            return
        log.warning("point store %s held point %s's results, not point %s's: moved to %s, its own "
                    "name; point %s is simulated", existing, other, owner, target, owner)
        return
    log.warning("point store %s is not point %s's store (%s): it is replaced by point %s's own results",
                existing, owner, why, owner)
