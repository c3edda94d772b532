"""Export of many points: the per-point part of ``sgdsweep export``, packed stores.

The stores are those of the small-model shard (``kernel_shard.shard``: linear regression,
N = 10, 16 replicas; ``point_stores.capture`` simulates its first points and their arrays and
attributes are repeated as new points, each named by its parameters' hash), written one by one
(``write_point``) and packed as a shard job packs them (``pack_points``). Measured:

- ``members``: every point's export members (``sgdsweep.share.archive._point_members``: each store
  written as a Zarr group's keys, :func:`sgdsweep.store.point_copies.zarr_group_keys`) written
  into a zip file as ``sgdsweep export`` writes them (stored, the SHA-256 of each taken);
- ``zarr_api``: the same keys written for ``--sample`` points through Zarr's API into a
  temporary directory (:func:`sgdsweep.store.point_copies.write_zarr_group`, how export wrote
  them before), per point, for the ratio.

Printed: seconds in all and per point, and the time of 10⁴ points at that rate. The ensemble's
and fits' members of an export do not grow with the number of points by more than the ensemble
itself.

With ``--sweep RESULTS_DIR`` (a finished sweep, e.g. one kept by ``scale.py --keep``), the
commands themselves instead, each a fresh process: ``sgdsweep export`` (which ends by verifying
what it wrote), ``sgdsweep verify`` and ``sgdsweep import`` of that file; against the baseline of
the sweep directory's files written into a stored zip file, the SHA-256 of each taken, with no
check (what sharing it by hand costs).

    python benchmarks/export_scale.py [--points 10000] [--sample 100] [--dir DIR]
    python benchmarks/export_scale.py --sweep RESULTS_DIR [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where to write the stores (a temporary directory)")
    parser.add_argument("--sweep", default=None, help="time the export, verify and import commands of this "
                        "finished sweep directory instead")
    args = parser.parse_args()
    if args.sweep:
        commands(Path(args.sweep), args.dir)
        return

    import point_stores

    from sgdsweep.core.identity import content_hash
    from sgdsweep.share.archive import _point_members
    from sgdsweep.store import points as point_store
    from sgdsweep.store.packs import pack_points
    from sgdsweep.store.point_copies import write_zarr_group

    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        root = Path(root)
        point_stores.capture(root / "captured.pkl")
        captured = pickle.loads((root / "captured.pkl").read_bytes())
        points_dir = root / "points"
        params = [{**captured[i % len(captured)][1]["params"], "benchmark_index": i} for i in range(args.points)]
        hashes = [content_hash(p) for p in params]
        t0 = time.perf_counter()
        for i, h in enumerate(hashes):
            arrays, attrs = captured[i % len(captured)]
            point_store.write_point(point_store.point_path(points_dir, h), arrays,
                                    {**attrs, "params": params[i], "point_hash": h})
        t1 = time.perf_counter()
        pack = pack_points(points_dir, "bench", hashes, force=True)
        t2 = time.perf_counter()
        files = sum(1 for p in points_dir.rglob("*") if p.is_file())
        print(f"{args.points} stores written in {t1 - t0:.1f} s, packed in {t2 - t1:.1f} s "
              f"({pack.stat().st_size / 2**20:.0f} MiB in {pack.name}); files under points/: {files}")

        t0 = time.perf_counter()
        with zipfile.ZipFile(root / "export.zip", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name, data in _point_members(points_dir, hashes):
                hashlib.sha256(data).hexdigest()
                zf.writestr(name, data)
        members = time.perf_counter() - t0
        t0 = time.perf_counter()
        for h in hashes[: args.sample]:
            with tempfile.TemporaryDirectory(dir=root) as tmp:
                group = Path(tmp) / "point.zarr"
                write_zarr_group(point_store.point_path(points_dir, h), group)
                for file in sorted(f for f in group.rglob("*") if f.is_file()):
                    file.read_bytes()
        zarr_api = (time.perf_counter() - t0) / min(args.sample, args.points)
        per = members / args.points
        print(f"members: {members:.1f} s, {1e3 * per:.1f} ms per point, 10^4 points: {1e4 * per:.0f} s")
        print(f"zarr_api: {1e3 * zarr_api:.1f} ms per point (10^4 points: {1e4 * zarr_api:.0f} s); "
              f"ratio {zarr_api / per:.1f}x")


def commands(sweep: Path, where: str | None) -> None:
    """Time ``sgdsweep export``, ``verify`` and ``import`` of the finished sweep ``sweep`` against
    a plain stored zip of its directory (see the module docstring)."""
    import json

    points = len(json.loads((sweep / "plan" / "sweep.json").read_text())["points"])
    with tempfile.TemporaryDirectory(dir=where) as root:
        root = Path(root)
        t0 = time.perf_counter()
        with zipfile.ZipFile(root / "plain.zip", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for dirpath, _, names in os.walk(sweep):
                for name in sorted(names):
                    path = Path(dirpath) / name
                    data = path.read_bytes()
                    hashlib.sha256(data).hexdigest()
                    zf.writestr(path.relative_to(sweep).as_posix(), data)
        plain = time.perf_counter() - t0
        print(f"{sweep}: {points} points; plain stored zip of the directory with SHA-256s: {plain:.1f} s")
        export = root / "export.zip"
        runs = [("export", ["export", str(sweep), str(export)]), ("verify", ["verify", str(export)]),
                ("import", ["import", str(export), "--results-dir", str(root / "imported")])]
        for name, argv in runs:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sgdsweep", *argv], check=True, cwd=root,
                           stdout=subprocess.DEVNULL)
            took = time.perf_counter() - t0
            print(f"  sgdsweep {name:<7} {took:7.1f} s  {1e3 * took / points:6.2f} ms per point  "
                  f"ratio to the plain zip {took / plain:5.1f}")
        print(f"  export size {export.stat().st_size / 2**20:.0f} MiB, plain zip "
              f"{(root / 'plain.zip').stat().st_size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
