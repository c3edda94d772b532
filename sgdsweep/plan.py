"""The plan: files that tell each workflow job what to do, written only when they change.

Snakemake decides what to rerun from file modification times and parameters. sgdsweep writes,
at workflow parse time, one JSON *spec* per shard listing that shard's points, and one spec
each for aggregation, fits and the report. A file is rewritten only when its content changes
(:func:`sgdsweep.paths.write_if_changed`), so:

- adding an ``lr`` value changes one shard's spec: that shard's job reruns and simulates only
  the new points (finished points are found in the content-addressed store);
- editing only ``fit`` or ``report`` changes only ``fit.json``/``report.json``;
- reordering keys or writing ``0.1`` as ``1e-1`` changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Sweep
from .paths import write_if_changed
from .store import is_complete, point_path


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class PlanFiles:
    """Paths of one sweep's plan and outputs (all under ``sweep.directory``)."""

    root: Path

    @property
    def points_dir(self) -> Path:
        return self.root / "points"

    def shard_spec(self, shard: str) -> Path:
        return self.root / "plan" / "shards" / f"{shard}.json"

    def shard_receipt(self, shard: str) -> Path:
        return self.root / "shards" / f"{shard}.json"

    @property
    def sweep_spec(self) -> Path:
        return self.root / "plan" / "sweep.json"

    @property
    def fit_spec(self) -> Path:
        return self.root / "plan" / "fit.json"

    @property
    def report_spec(self) -> Path:
        return self.root / "plan" / "report.json"

    @property
    def execution_spec(self) -> Path:
        return self.root / "plan" / "execution.json"

    @property
    def ensemble(self) -> Path:
        return self.root / "ensemble.zarr"

    @property
    def fits(self) -> Path:
        return self.root / "fits.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    @property
    def cluster_dir(self) -> Path:
        return self.root / ".cluster"


def write_plan(sweep: Sweep) -> PlanFiles:
    """Write (if changed) every spec file of ``sweep``; return the paths."""
    files = PlanFiles(sweep.directory)
    for shard, points in sweep.shards.items():
        write_if_changed(files.shard_spec(shard), _dump({
            "shard": shard, "points_dir": str(files.points_dir),
            "points": [p.spec() for p in points]}))
    write_if_changed(files.sweep_spec, _dump({
        "sweep": sweep.name, "sweep_hash": sweep.sweep_hash,
        "simulation_config": sweep.simulation_config(), "coords": list(sweep.coords),
        "points_dir": str(files.points_dir),
        "points": [{"hash": p.hash, "shard": p.shard} for p in sweep.points]}))
    write_if_changed(files.fit_spec, _dump(sweep.config["fit"]))
    shown = {k: v for k, v in sweep.config.items() if k != "execution"}  # execution never changes results
    write_if_changed(files.report_spec, _dump({"report": sweep.config["report"], "config": shown,
                                               "config_hash": sweep.config_hash}))
    for shard in pending_points(sweep):  # a store was deleted or corrupted: make the shard rerun
        files.shard_receipt(shard).unlink(missing_ok=True)
    write_if_changed(files.execution_spec, _dump(sweep.config["execution"]))
    return files


def pending_points(sweep: Sweep) -> dict[str, list[str]]:
    """Shard id → hashes of its points that have no complete store yet."""
    files = PlanFiles(sweep.directory)
    out: dict[str, list[str]] = {}
    for shard, points in sweep.shards.items():
        todo = [p.hash for p in points if not is_complete(point_path(files.points_dir, p.hash))]
        if todo:
            out[shard] = todo
    return out
