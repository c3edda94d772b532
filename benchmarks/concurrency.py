"""What two processes get out of this machine: the bare simulation and a task's whole work per
point, in one process alone and in two processes at once, measured in one run.

The end-to-end targets of ``scale.py`` compare a sweep run on ``--cores`` Dask workers with the
bare simulation on one thread. Whether the workers can beat that depends on how much a second
process adds on the machine (two hardware threads of one core add far less than a second core)
and on what a point costs beyond the kernel. Measured, on the points of ``scale.py``'s ``1e4``
case (linear regression N = 10, 1,000 steps, 16 replicas, batches of ``points_per_task``):

- ``bare``: the kernel alone (``run_lanes``, as ``pipeline.simulation_only``), replica-steps/s;
- ``task``: :func:`sgdsweep.run.simulate.simulate_points` (replica streams, kernel, exact
  theory, results, point stores), milliseconds of wall per point;

each first in one process, then in ``--procs`` processes started together on disjoint points, every
process with the environment of the run's Dask workers (Dask's ``pre-spawn-environ``: one BLAS
thread, and :data:`sgdsweep.run.cluster.WORKER_ENVIRON`).
``speed-up`` is the throughput of all processes together over one process alone: the most any
number of workers can add on this machine.

    python benchmarks/concurrency.py [--points 320] [--procs 2] [--repeat 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from pipeline import bare_batch
from scale import config, grids


def _batches(points: int) -> list[list[dict]]:
    from sgdsweep.run.execute import make_batches
    from sgdsweep.sweep.config import build_sweep

    sweep = build_sweep(config("concurrency", Path(tempfile.gettempdir()) / "unused", grids()["1e4"]))
    specs = [p.spec() for p in next(iter(sweep.shards.values()))]
    return make_batches(specs, int(sweep.config["execution"]["points_per_task"]))[: max(1, points // 8)]


def _bare(batches: list[list[dict]]) -> tuple[float, int]:
    """(seconds, replica-steps) of the kernel alone over ``batches`` (``pipeline.bare_batch``)."""
    done = [bare_batch(batch) for batch in batches]
    return sum(d[0] for d in done), sum(d[1] for d in done)


def _task(batches: list[list[dict]]) -> tuple[float, int]:
    """(seconds, points) of the whole task body over ``batches``, stores in a temporary folder."""
    from sgdsweep.run.simulate import simulate_points

    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        for batch in batches:
            simulate_points(batch, folder)
        return time.perf_counter() - t0, sum(len(b) for b in batches)


def _worker(kind: str, batches: list[list[dict]], start, out) -> None:
    run = _bare if kind == "bare" else _task
    run(batches[:1])  # kernels loaded and compiled code warm before the clock starts
    start.wait()
    out.put(run(batches))


def worker_environ() -> dict[str, str]:
    """The environment variables the run's local Dask workers start with."""
    import dask
    import distributed  # noqa: F401  (its configuration defaults)

    from sgdsweep.run.cluster import WORKER_ENVIRON

    return {**{k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()},
            **WORKER_ENVIRON}


def measure(kind: str, parts: list[list[list[dict]]]) -> tuple[float, int]:
    """(wall seconds until every process finished, total work) of ``kind`` on ``parts`` at once."""
    os.environ.update(worker_environ())  # inherited by the processes spawned below
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(len(parts) + 1), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, part, start, out)) for part in parts]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return wall, sum(r[1] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=320, help="points per process")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="rounds (each measures every row once)")
    args = ap.parse_args()
    batches = _batches(args.points * args.procs)
    per = len(batches) // args.procs
    parts = [batches[i * per:(i + 1) * per] for i in range(args.procs)]
    print(f"{per * 8} points per process, batches of 8; {multiprocessing.cpu_count()} CPUs")
    for kind, unit in (("bare", "replica-steps/s"), ("task", "ms per point")) * args.repeat:
        one_wall, one_work = measure(kind, parts[:1])
        all_wall, all_work = measure(kind, parts)
        one, both = one_work / one_wall, all_work / all_wall
        shown = (f"{one:.3g} alone, {both:.3g} with {args.procs} processes together" if kind == "bare" else
                 f"{1000 / one:.2f} alone, {1000 / both:.2f} with {args.procs} processes together")
        print(f"  {kind:5s} {unit:16s} {shown}  speed-up {both / one:.2f}", flush=True)


if __name__ == "__main__":
    main()
