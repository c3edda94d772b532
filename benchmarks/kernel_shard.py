"""Small models, where per-step overhead dominates: 100 points × 16 replicas advanced together.

Linear regression N = 10, S = 10, P = 100, minibatch noise; 100 points of different lr
(0.05 … 0.5) and momentum (0, 0.3, 0.6, 0.9) in one call — 1,600 lanes — with the default
observables (10×10 second moment, losses). Measured in the same run:

- baseline: the numpy engine (one vectorised step of all lanes at a time; the compiled kernels
  switched off), one thread;
- ``sgdsweep``: the compiled kernel on 1 and 2 threads (``SGDSWEEP_THREADS``) in this process, and
  in two Dask worker processes of one thread each, half the points each, as a sweep's workers
  run a shard (the rate: all replica-steps over the span from the first start to the last end);
- the whole shard as a worker runs it: :func:`sgdsweep.run.simulate.simulate_points` (engine, exact
  theory per point, 100 point stores), one thread, and on two Dask workers, half the points each.

    python benchmarks/kernel_shard.py [--steps 10000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from sgdsweep.models import get_model
from sgdsweep.run.simulate import simulate_points
from sgdsweep.sim import kernels
from sgdsweep.sim.engine import run_lanes
from sgdsweep.sim.replicas import loss_stride, replica_streams
from sgdsweep.sim.shapes import observe_spec
from sgdsweep.sweep.config import build_sweep

REPLICAS = 16


def shard(steps: int) -> list:
    cfg = {"sweep": "shard", "model": {"kind": "linear", "n_inputs": 10},
           "dynamics": {"steps": steps, "replicas": REPLICAS, "burn_in": steps // 10},
           "grid": {"lr": [round(float(v), 4) for v in np.linspace(0.05, 0.5, 25)], "momentum": [0.0, 0.3, 0.6, 0.9],
                    "batch_size": 10, "samples_per_param": 10}}
    return build_sweep(cfg).points


def engine_rate(points, steps: int, threads: int, use_fused: bool) -> float:
    """Replica-steps/s of one :func:`sgdsweep.sim.engine.run_lanes` call on ``points`` (16 replicas each)."""
    start, end = engine_span(points, steps, threads, use_fused)
    return len(points) * REPLICAS * steps / (end - start)


def engine_span(points, steps: int, threads: int, use_fused: bool) -> tuple[float, float]:
    """Start and end (``time.monotonic``, the same clock in every process here) of one
    :func:`sgdsweep.sim.engine.run_lanes` call on ``points``; the replica streams are made before."""
    first = points[0].params
    model = get_model("linear")
    problem = model.make_problem(model.data_params(first))
    lanes = [(p, g) for p in points for g in replica_streams(0, p.hash, REPLICAS)]
    n = len(lanes)
    os.environ[kernels.THREADS_ENV] = str(threads)
    supports = kernels.supports
    if not use_fused:
        kernels.supports = lambda *a: False
    try:
        t0 = time.monotonic()
        run_lanes(problem, noise="minibatch", batch_size=10, steps=steps,
                  lr=np.array([p.params["lr"] for p, _ in lanes]),
                  momentum=np.array([p.params["momentum"] for p, _ in lanes]),
                  burn_in=np.array([p.burn_in for p, _ in lanes]), bound=np.full(n, 1e12),
                  w0=np.zeros((n, problem.dim)), streams=[g[:2] for _, g in lanes], observe=observe_spec(first),
                  loss_stride=np.array([loss_stride(problem, p.params, p.burn_in, 1) for p, _ in lanes]))
        return t0, time.monotonic()
    finally:
        kernels.supports = supports


def kernel_span(points, steps: int) -> tuple[float, float]:
    """:func:`engine_span` of the compiled kernel on one thread."""
    return engine_span(points, steps, 1, True)


def shard_span(points, steps: int) -> tuple[float, float]:
    """Start and end (``time.monotonic``) of :func:`sgdsweep.run.simulate.simulate_points` on
    ``points`` on one thread — engine, exact theory, results and a store per point — writing
    into a fresh temporary directory (removed after)."""
    os.environ[kernels.THREADS_ENV] = "1"
    with tempfile.TemporaryDirectory() as out:
        t0 = time.monotonic()
        simulate_points([p.spec() for p in points], out)
        return t0, time.monotonic()


def shard_rate(points, steps: int) -> float:
    """Replica-steps/s of :func:`shard_span`."""
    start, end = shard_span(points, steps)
    return len(points) * REPLICAS * steps / (end - start)


def workers_rates(points, steps: int, spans=(kernel_span, shard_span), workers: int = 2) -> list[float]:
    """Per function of ``spans``: replica-steps/s of ``points`` split into ``workers`` equal parts,
    one per worker process of a local Dask cluster started here (one thread each, started as a
    sweep's cluster starts them, with ``sgdsweep.sim.warmup``), submitted at once: all replica-steps
    over the span from the earliest start to the latest end of the parts."""
    import sys

    import cloudpickle
    from distributed import Client, LocalCluster

    if __name__ != "__main__":  # imported: the workers cannot import this file, so send it whole
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rates = []
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      preload=["sgdsweep.sim.warmup"]) as cluster, Client(cluster) as client:
        addresses = list(client.scheduler_info()["workers"])
        parts = [points[i::workers] for i in range(workers)]
        for span in spans:
            client.gather([client.submit(span, shard(200)[:4], 200, workers=[address], pure=False)
                           for address in addresses])  # load the kernel's cache, learn the store layout
            futures = [client.submit(span, part, steps, workers=[address], pure=False)
                       for part, address in zip(parts, addresses)]
            got = client.gather(futures)
            rates.append(len(points) * REPLICAS * steps / (max(e for _, e in got) - min(s for s, _ in got)))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    points = shard(args.steps)
    engine_rate(shard(200), 200, 1, True)  # compile
    base = engine_rate(points, max(200, args.steps // 10), 1, False)
    one = max(engine_rate(points, args.steps, 1, True) for _ in range(2))
    two = max(engine_rate(points, args.steps, 2, True) for _ in range(2))
    shard_rate(shard(200)[:4], 200)  # learn the store layout
    whole = shard_rate(points, args.steps)
    procs, whole_procs = (max(r) for r in zip(*(workers_rates(points, args.steps) for _ in range(2))))
    print(f"100 points × {REPLICAS} replicas (linear N = 10, S = 10), {args.steps} steps, float64; replica-steps/s")
    print(f"  numpy engine, 1 thread (baseline):      {base:10.3g}")
    print(f"  compiled kernel, 1 thread:              {one:10.3g}   × {one / base:.1f}")
    print(f"  compiled kernel, 2 threads:             {two:10.3g}   × {two / base:.1f}")
    print(f"  compiled kernel, 2 Dask workers × 1 thread: {procs:9.3g}   × {procs / base:.1f}")
    print(f"  whole shard (simulate_points), 1 thread: {whole:9.3g}   × {whole / base:.1f}")
    print(f"  whole shard, 2 Dask workers × 1 thread:  {whole_procs:9.3g}   × {whole_procs / base:.1f}")


if __name__ == "__main__":
    main()
