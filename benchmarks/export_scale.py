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

    python benchmarks/export_scale.py [--points 10000] [--sample 100] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
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
    args = parser.parse_args()

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


if __name__ == "__main__":
    main()
