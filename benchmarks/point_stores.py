"""Point stores and aggregation: this checkout against a baseline checkout, in the same run.

The stores are those of the small-model shard (``kernel_shard.shard``: linear regression,
N = 10, 16 replicas; their arrays and attributes captured from ``simulate_points`` on the
first points of the shard, then repeated as new points: a parameter ``benchmark_index`` added,
each store named by its parameters' hash). Each measurement runs in a fresh
subprocess, alternating baseline and this checkout ``--rounds`` times, into fresh directories
under ``--dir``:

- pipeline, 1,000 points: the stores written one by one as a shard's worker writes them
  (``write_point``), then aggregated as the aggregate step does (``build_ensemble`` and
  ``write_ensemble``);
- aggregation of 1,000 and of 10⁴ points: ``build_ensemble`` and ``write_ensemble`` alone.

The baseline is another checkout of sgdsweep (``--baseline DIR``, imported with
``PYTHONPATH=DIR``; e.g. ``git worktree add /tmp/base pre-relayout``), whose modules may have
either layout (``sgdsweep.store.points`` or the flat ``sgdsweep.store``). Printed: seconds per
round and the ratio this/baseline of each round and of the medians.

    python benchmarks/point_stores.py --baseline /tmp/base [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE_POINTS = 8


def capture(path: Path) -> None:
    """Simulate the first points of the small-model shard with this checkout and save, with
    pickle (a benchmark's own scratch file), the (arrays, attributes) each store was written with."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import kernel_shard

    from sgdsweep.run import simulate
    from sgdsweep.store import points as point_store

    captured = []
    write = point_store.write_point

    def grab(where, arrays, attrs):
        captured.append((arrays, attrs))
        return write(where, arrays, attrs)

    point_store.write_point = grab
    try:
        with tempfile.TemporaryDirectory() as out:
            simulate.simulate_points([p.spec() for p in kernel_shard.shard(1000)[:SAMPLE_POINTS]], out)
    finally:
        point_store.write_point = write
    path.write_bytes(pickle.dumps(captured))


def worker(inputs: Path, n: int, root: Path, write: bool) -> dict[str, float]:
    """In this process (its sgdsweep as found on ``sys.path``): write ``n`` stores under ``root``
    (timed only when ``write``), then build and write the ensemble. Seconds per phase."""
    try:
        from sgdsweep.core.identity import content_hash
        from sgdsweep.store import aggregate
        from sgdsweep.store import points as point_store
    except ImportError:  # a checkout with the flat layout
        from sgdsweep.identity import content_hash  # type: ignore[no-redef]

        from sgdsweep import aggregate  # type: ignore[no-redef]
        from sgdsweep import store as point_store  # type: ignore[no-redef]
    captured = pickle.loads(inputs.read_bytes())
    points_dir = root / "points"
    # n distinct points: each store named by the hash of its own parameters, as it records them
    params = [{**captured[i % len(captured)][1]["params"], "benchmark_index": i} for i in range(n)]
    hashes = [content_hash(p) for p in params]
    t0 = time.perf_counter()
    for i, h in enumerate(hashes):
        arrays, attrs = captured[i % len(captured)]
        point_store.write_point(point_store.point_path(points_dir, h), arrays,
                                {**attrs, "params": params[i], "point_hash": h})
    t1 = time.perf_counter()
    spec = {"points_dir": str(points_dir), "points": [{"hash": h, "shard": "s"} for h in hashes],
            "coords": ["lr", "momentum"], "sweep": "bench", "sweep_hash": "-", "simulation_config": {"model": {}}}
    ds = aggregate.build_ensemble(spec)
    aggregate.write_ensemble(ds, root / "ensemble.zarr")
    t2 = time.perf_counter()
    assert ds.sizes["point"] == n
    return {"write": t1 - t0, "aggregate": t2 - t1, "pipeline": t2 - t0, "module": point_store.__file__}


def run(code: Path, inputs: Path, n: int, parent: str | None) -> dict[str, float]:
    """:func:`worker` in a fresh interpreter importing sgdsweep from ``code``."""
    with tempfile.TemporaryDirectory(dir=parent) as root:
        env = {**os.environ, "PYTHONPATH": str(code)}
        proc = subprocess.run([sys.executable, __file__, "--worker", str(inputs), str(n), root], env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            sys.exit(f"worker for {code} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, inputs, n, root = sys.argv
        print(json.dumps(worker(Path(inputs), int(n), Path(root), True)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, type=Path, help="a checkout of sgdsweep to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the stores are written (default: the temporary directory)")
    ap.add_argument("--sizes", default="1000,10000", help="numbers of points (default: 1000,10000)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "points.pkl"
        capture(inputs)
        checkouts = {"baseline": args.baseline.resolve(), "this": REPO}
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for n in (int(s) for s in args.sizes.split(",")):
                for name, code in checkouts.items():
                    results.setdefault((name, n), []).append(run(code, inputs, n, args.dir))
    print(f"point stores of the small-model shard, {args.rounds} rounds under {args.dir or tempfile.gettempdir()}; "
          f"baseline {args.baseline}; seconds")
    for n in sorted({n for _, n in results}):
        for phase in (("pipeline", "write", "aggregate") if n == 1000 else ("aggregate",)):
            base = [r[phase] for r in results[("baseline", n)]]
            this = [r[phase] for r in results[("this", n)]]
            label = "pipeline (write + aggregate)" if phase == "pipeline" else phase
            print(f"  {n:>6} points {label:29s} baseline " + " ".join(f"{v:6.2f}" for v in base)
                  + "  this " + " ".join(f"{v:6.2f}" for v in this)
                  + "  ratio this/baseline per round " + " ".join(f"{t / b:.2f}" for t, b in zip(this, base))
                  + f", of medians {statistics.median(this) / statistics.median(base):.2f}")


if __name__ == "__main__":
    main()
