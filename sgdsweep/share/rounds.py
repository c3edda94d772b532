"""Checking the rounds of an export of a sweep with rounds (``precision:`` or ``search:``): that
running its imported config simulates nothing.

A sweep with rounds decides each round's points from the stored results of the one before
(:mod:`sgdsweep.sweep.precision`, :mod:`sgdsweep.sweep.search`), so its config alone does not
say which points an import needs; checksums do not either (a forger re-signs the manifest).
So :func:`check_rounds` replays the rounds from the export's own contents, as ``sgdsweep run``
of the imported config will: each point store's attributes (its summary), ``fits.json`` and the
fits of earlier rounds (``rounds/fits/<name>.json``, :func:`sgdsweep.sweep.precision.fit_archive_name`)
placed in a temporary sweep directory, and :func:`sgdsweep.sweep.config.build_sweep` at its
current round. The export is refused unless

- every point of the current round has its store in the file, and none is still to simulate
  (precision status ``pending``) or to fit (``pending fit``: a round's fits missing); and
- the file's points are exactly the points of every round the replay reached (no round's
  store left out, none added).

Cost: each point's store written to a temporary directory as an ``.npz`` store of its attributes
alone (as verify read them: the rounds read nothing else of a store; a store not marked complete
is not written, so its point counts as still to simulate), ``fits.json`` and the rounds' fits
copied there, and the rounds' decisions. No point's store is read again.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from sgdsweep.errors import ConfigError, StoreError
from sgdsweep.share.verify import ShareError, member_blocks
from sgdsweep.store.points import COMPLETE_ATTR, point_path, write_point

#: Name of a member holding the fits of one round of a precision sweep (``rounds/fits/<name>``).
FIT_ARCHIVE = re.compile(r"rounds/fits/[0-9a-f]{1,64}-[0-9a-f]{1,64}\.json")
#: Precision statuses of a point that a run would still simulate or fit.
_UNFINISHED = ("pending", "pending fit")


def check_archive_names(manifest: dict[str, Any], src: str | Path) -> None:
    """Raise :class:`ShareError` for a member under ``rounds/`` that is not a round's fits
    (``rounds/fits/<points digest>-<fit config hash>.json``) of a sweep with ``precision``."""
    for name in manifest["members"]:
        if name.startswith("rounds/") and not (FIT_ARCHIVE.fullmatch(name) and "precision" in manifest["config"]):
            raise ShareError(f"{src}: member {name!r} is not the fits of a round of a precision sweep "
                             "(rounds/fits/<points digest>-<fit config hash>.json); a crafted file, do not use it")


def check_rounds(zf: zipfile.ZipFile, manifest: dict[str, Any], attrs: dict[str, dict[str, Any]],
                 src: str | Path) -> None:
    """Replay the rounds of the export open as ``zf`` (its members verified) from its contents and
    check what the module docstring says; nothing to do for a sweep without rounds. ``attrs``:
    point hash → its store's attributes, as verify read them
    (:func:`sgdsweep.share.point_members.check_points`).

    Raises:
        ShareError: naming the point that a run of the import would simulate (or fit), or the
            points the rounds do not reach.
    """
    from sgdsweep.sweep.config import build_sweep

    config = manifest["config"]
    if "precision" not in config and "search" not in config:
        return
    members = manifest["members"]
    held = set(manifest["points"])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / manifest["sweep"]
        for name in ["fits.json", *sorted(n for n in members if n.startswith("rounds/"))]:
            out = root / name
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "xb") as fh:
                fh.writelines(member_blocks(zf, name, members[name], src))
        for h in manifest["points"]:  # each as a store of its attributes alone: all the rounds read of it
            if attrs[h].get(COMPLETE_ATTR) is True:  # a store not marked complete is a point still to simulate
                write_point(point_path(root / "points", h), {}, attrs[h])
        try:
            sweep = build_sweep({**{k: v for k, v in config.items() if k != "execution"}, "results_dir": tmp})
        except (ConfigError, StoreError, KeyError, TypeError, AttributeError, ValueError) as exc:
            # a store's summary not what sgdsweep writes: the rounds read it as they find it
            raise ShareError(f"{src}: its rounds cannot be replayed from its own contents ({type(exc).__name__}: "
                             f"{exc}); a damaged or crafted file, do not use it") from None
    info = sweep.rounds or {}
    current = [p.hash for p in sweep.points]
    reached = set(current)
    if info.get("kind") == "precision":
        for h, p in info["points"].items():
            reached.update(p.get("hashes", ()))
            if p["status"] in _UNFINISHED:
                what = "simulate" if p["status"] == "pending" else "fit (the fits of that round are not in the file)"
                raise ShareError(
                    f"{src}: replaying its precision rounds from its own stores and fits, round {p['rounds']} "
                    f"reaches point {h} ({p['replicas']} replicas × {p['steps']} steps), which a run of the "
                    f"import would {what}: the file's config, stores or fits were changed after export (a "
                    "target tightened, a budget raised, a round's store left out), do not use it")
    missing = sorted(set(current) - held)
    if missing:
        raise ShareError(f"{src}: replaying its rounds from its own stores, the current round holds point "
                         f"{missing[0]}, which the file has no store of: a run of the import would simulate it. "
                         "The file was changed after export, do not use it")
    if reached != held:
        odd = min(held - reached) if held - reached else min(reached - held)
        raise ShareError(f"{src}: its points are not those its rounds reach when replayed from its own stores "
                         f"(point {odd} is in one, not the other): "
                         "the file's config or stores were changed after export, do not use it")
