"""Aggregation at scale: the full aggregation of N point stores against adding one point.

The stores are those of the small-model shard (linear regression, N = 10, 16 replicas), as in
``benchmarks/point_stores.py``: the arrays and attributes of a few simulated points captured
once, then written through the public writer (``write_point``) as ``--points`` distinct points
(a parameter ``benchmark_index`` added, each store named by its parameters' hash) of one data set.

Measured, each as the workflow's aggregate job runs it (``python -m sgdsweep aggregate
SWEEP_SPEC --out ensemble.zarr``, a fresh process, imports included), ``--rounds`` times:

- ``full``: the ensemble of N points built from nothing (no ensemble yet);
- ``+1 point``: the same sweep spec with one point more, on the N-point ensemble (an append);
- ``+1 point, served``: the same job handed to a job server (:mod:`sgdsweep.run.jobserver`), as
  ``sgdsweep run``'s jobs are: a process that starts in milliseconds, run by a fork of a process
  that has the job's code imported;
- ``+1 point, in-process``: the same, timed around :func:`sgdsweep.store.aggregate_incremental.update_ensemble`.

Printed: seconds per round, the medians, and the ratios (+1 point)/(full), for the job by itself
and served. The old hand-written reader aggregated 10⁴ of these points in 5.4 s on the reference
machine (benchmarks/README.md).

    python benchmarks/aggregate_scale.py [--points 10000] [--rounds 3] [--dir DIR [--keep]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_POINTS = 4


def captured_points() -> list[tuple[dict, dict]]:
    """(arrays, attributes) of the first points of the small-model shard, as ``simulate_points``
    writes them (50 steps: the stores' shapes do not depend on the number of steps)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import kernel_shard

    from sgdsweep.run import simulate
    from sgdsweep.store import points as point_store

    captured: list[tuple[dict, dict]] = []
    write = point_store.write_point

    def grab(where, arrays, attrs):
        captured.append((arrays, attrs))
        return write(where, arrays, attrs)

    point_store.write_point = grab
    try:
        with tempfile.TemporaryDirectory() as out:
            simulate.simulate_points([p.spec() for p in kernel_shard.shard(50)[:SAMPLE_POINTS]], out)
    finally:
        point_store.write_point = write
    return captured


def write_stores(root: Path, n: int) -> dict:
    """``n`` point stores under ``root/points`` and the sweep spec listing them; return the spec."""
    from sgdsweep.core.identity import content_hash
    from sgdsweep.store import points as point_store

    captured = captured_points()
    points_dir = root / "points"
    entries = []
    for i in range(n):
        arrays, attrs = captured[i % len(captured)]
        params = {**attrs["params"], "benchmark_index": i}
        h = content_hash(params)
        point_store.write_point(point_store.point_path(points_dir, h), arrays,
                                {**attrs, "params": params, "point_hash": h})
        entries.append({"hash": h, "shard": f"s{i // 50}"})
    return {"points_dir": str(points_dir), "points": entries, "coords": ["lr", "momentum"],
            "sweep": "bench", "sweep_hash": "-", "repair": 0, "simulation_config": {"model": {}}}


ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def job(spec_path: Path, out: Path, served: Path | None = None) -> float:
    """Seconds of ``python -m sgdsweep aggregate spec_path --out out`` (a fresh process; handed
    to the job server listening at ``served`` when given)."""
    from sgdsweep.run.jobclient import JOB_SERVER_ENV

    env = dict(ENV, **({JOB_SERVER_ENV: str(served)} if served else {}))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sgdsweep", "aggregate", str(spec_path), "--out", str(out)],
                          env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"the aggregate job failed:\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the stores are written (default: the temporary directory)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the stores in DIR/aggregate_scale-<points> and reuse them in later runs")
    args = ap.parse_args()
    from sgdsweep.run.jobserver import start_job_server, stop_job_server
    from sgdsweep.store import provenance
    from sgdsweep.store.aggregate_incremental import update_ensemble

    results: dict[str, list[float]] = {"full": [], "+1 point": [], "+1 point, served": [], "+1 point, in-process": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        server, served = start_job_server(ENV, Path(tmp) / "job-server.log")
        root = Path(args.dir or tmp) / f"aggregate_scale-{args.points}" if args.keep else Path(tmp)
        if not (root / "n1.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            spec = write_stores(root, args.points + 1)
            print(f"{args.points + 1} point stores written in {time.perf_counter() - t0:.1f} s", flush=True)
            (root / "n.json").write_text(json.dumps({**spec, "points": spec["points"][:-1]}))
            (root / "n1.json").write_text(json.dumps(spec))
        spec = json.loads((root / "n1.json").read_text())
        ensemble, kept = root / "ensemble.zarr", root / "kept.zarr"
        for _ in range(args.rounds):
            shutil.rmtree(ensemble, ignore_errors=True)
            results["full"].append(job(root / "n.json", ensemble))
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(ensemble, kept)
            results["+1 point"].append(job(root / "n1.json", ensemble))
            shutil.rmtree(ensemble)
            shutil.copytree(kept, ensemble)
            while not served.exists():
                if server.poll() is not None:
                    sys.exit("the job server stopped:\n" + (Path(tmp) / "job-server.log").read_text())
                time.sleep(0.1)
            results["+1 point, served"].append(job(root / "n1.json", ensemble, served))
            shutil.rmtree(ensemble)
            shutil.copytree(kept, ensemble)
            provenance.code_version.cache_clear()  # as the job sees it now
            t1 = time.perf_counter()
            _, how = update_ensemble(spec, ensemble)
            results["+1 point, in-process"].append(time.perf_counter() - t1)
            print("  round: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in results.items()) + f" ({how})", flush=True)
        shutil.rmtree(ensemble, ignore_errors=True)
        shutil.rmtree(kept, ignore_errors=True)
        stop_job_server(server, served)
        if (Path(tmp) / "job-server.log").read_text().count(": aggregate") != args.rounds:
            sys.exit("the job server did not run every served job:\n" + (Path(tmp) / "job-server.log").read_text())
    print(f"aggregation of {args.points} points of the small-model shard under {args.dir or tempfile.gettempdir()}, "
          f"{args.rounds} rounds, seconds")
    for name, values in results.items():
        print(f"  {name:24s} " + " ".join(f"{v:6.2f}" for v in values) + f"   median {statistics.median(values):6.2f}")
    full, plus = statistics.median(results["full"]), statistics.median(results["+1 point"])
    print(f"  ratio (+1 point job) / (full job): {plus / full:.3f}; "
          f"served: {statistics.median(results['+1 point, served']) / full:.3f}")


if __name__ == "__main__":
    main()
