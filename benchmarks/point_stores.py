"""Point stores on this machine's disk: one zip file per point against a directory per point,
written and read in the same run.

The stores are those of the small-model shard (``kernel_shard.shard``: 100 points, 16
replicas, N = 10; their Zarr keys built once by ``simulate_points``). Measured, alternating the
two layouts ``--rounds`` times, each round into fresh directories under ``--dir``:

- write: ``point_store.place_point`` (one zip file, renamed into place) against the layout sgdsweep
  wrote before, a directory of the same keys (one directory per array, a file per key, renamed
  into place);
- read: ``aggregate.build_ensemble`` of the 100 stores in each layout (both are read).

Printed: ms per store, each round and the best, and the ratio directory/zip. The disk's speed
varies by 10× from minute to minute here, so compare within a round.

    python benchmarks/point_stores.py [--dir DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import kernel_shard

from sgdsweep.sim.simulate import simulate_points
from sgdsweep.store import aggregate
from sgdsweep.store import points as point_store


def store_files(points) -> list[tuple[str, dict[str, bytes]]]:
    """(hash, Zarr key → bytes) of the shard's point stores."""
    with tempfile.TemporaryDirectory() as out:
        simulate_points([p.spec() for p in points], out)
        result = []
        for p in points:
            with point_store.PointFiles(point_store.point_path(out, p.hash)) as files:
                result.append((p.hash, dict(files)))
    return result


def write_directory(path: Path, files: dict[str, bytes]) -> None:
    """The directory layout of a point store (sgdsweep's layout 1), written atomically."""
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for folder in sorted({os.path.dirname(k) for k in files} - {""}):
        (tmp / folder).mkdir(exist_ok=True)
    for key, data in files.items():
        (tmp / key).write_bytes(data)
    os.rename(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where the stores are written (default: the temporary directory)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    points = kernel_shard.shard(1000)
    stores = store_files(points)
    n = len(stores)
    times: dict[str, list[float]] = {"write directory": [], "write zip": [], "read directory": [], "read zip": []}
    for _ in range(args.rounds):
        root = Path(tempfile.mkdtemp(dir=args.dir))
        try:
            for layout in ("directory", "zip"):
                points_dir = root / layout
                points_dir.mkdir()
                t0 = time.perf_counter()
                for h, files in stores:
                    if layout == "zip":
                        point_store.place_point(points_dir / f"{h}{point_store.POINT_SUFFIX}", files)
                    else:
                        write_directory(points_dir / f"{h}{point_store.DIRECTORY_SUFFIX}", files)
                times[f"write {layout}"].append((time.perf_counter() - t0) / n)
                spec = {"points_dir": str(points_dir), "points": [{"hash": h, "shard": "s"} for h, _ in stores],
                        "coords": ["lr", "momentum"], "sweep": "bench", "sweep_hash": "-",
                        "simulation_config": {"model": {}}}
                t0 = time.perf_counter()
                aggregate.build_ensemble(spec)
                times[f"read {layout}"].append((time.perf_counter() - t0) / n)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{n} point stores of the small-model shard, {args.rounds} rounds under {args.dir or tempfile.gettempdir()}; "
          "ms per store")
    for name, values in times.items():
        print(f"  {name:16s} " + " ".join(f"{v * 1e3:7.2f}" for v in values) + f"   best {min(values) * 1e3:.2f}")
    for what in ("write", "read"):
        ratios = [d / z for d, z in zip(times[f"{what} directory"], times[f"{what} zip"])]
        print(f"  {what}: directory/zip per round " + " ".join(f"{r:.1f}" for r in ratios))


if __name__ == "__main__":
    main()
