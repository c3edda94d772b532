"""Small models, where per-step overhead dominates: 100 points × 16 replicas advanced together.

Linear regression N = 10, S = 10, P = 100, minibatch noise; 100 points of different lr
(0.05 … 0.5) and momentum (0, 0.3, 0.6, 0.9) in one call — 1,600 lanes — with the default
observables (10×10 second moment, losses). Measured in the same run:

- baseline: the numpy engine (one vectorised step of all lanes at a time; the fused kernels
  switched off), one thread;
- ``sgdsweep``: the fused kernel on 1 and 2 threads (``SGDSWEEP_THREADS``);
- the whole shard as a worker runs it: :func:`sgdsweep.simulate.simulate_points` (engine, exact
  theory per point, 100 point stores), one thread.

    python benchmarks/kernel_shard.py [--steps 10000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from sgdsweep import fused
from sgdsweep.config import build_sweep
from sgdsweep.engine import run_lanes
from sgdsweep.models import get_model
from sgdsweep.simulate import loss_stride, observe_spec, replica_streams, simulate_points

REPLICAS = 16


def shard(steps: int) -> list:
    cfg = {"sweep": "shard", "model": {"kind": "linear", "n_inputs": 10},
           "dynamics": {"steps": steps, "replicas": REPLICAS, "burn_in": steps // 10},
           "grid": {"lr": [round(float(v), 4) for v in np.linspace(0.05, 0.5, 25)], "momentum": [0.0, 0.3, 0.6, 0.9],
                    "batch_size": 10, "samples_per_param": 10}}
    return build_sweep(cfg).points


def engine_rate(points, steps: int, threads: int, use_fused: bool) -> float:
    first = points[0].params
    model = get_model("linear")
    problem = model.make_problem(model.data_params(first))
    lanes = [(p, g) for p in points for g in replica_streams(0, p.hash, REPLICAS)]
    n = len(lanes)
    os.environ[fused.THREADS_ENV] = str(threads)
    supports = fused.supports
    if not use_fused:
        fused.supports = lambda *a: False
    try:
        t0 = time.perf_counter()
        run_lanes(problem, noise="minibatch", batch_size=10, steps=steps,
                  lr=np.array([p.params["lr"] for p, _ in lanes]),
                  momentum=np.array([p.params["momentum"] for p, _ in lanes]),
                  burn_in=np.array([p.burn_in for p, _ in lanes]), bound=np.full(n, 1e12),
                  w0=np.zeros((n, problem.dim)), streams=[g[:2] for _, g in lanes], observe=observe_spec(first),
                  loss_stride=np.array([loss_stride(problem, p.params, p.burn_in, 1) for p, _ in lanes]))
        return n * steps / (time.perf_counter() - t0)
    finally:
        fused.supports = supports


def shard_rate(points, steps: int) -> float:
    os.environ[fused.THREADS_ENV] = "1"
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        simulate_points([p.spec() for p in points], out)
        return len(points) * REPLICAS * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    points = shard(args.steps)
    engine_rate(shard(200), 200, 1, True)  # compile
    base = engine_rate(points, max(200, args.steps // 10), 1, False)
    one = max(engine_rate(points, args.steps, 1, True) for _ in range(2))
    two = max(engine_rate(points, args.steps, 2, True) for _ in range(2))
    whole = shard_rate(points, args.steps)
    print(f"100 points × {REPLICAS} replicas (linear N = 10, S = 10), {args.steps} steps, float64; replica-steps/s")
    print(f"  numpy engine, 1 thread (baseline):      {base:10.3g}")
    print(f"  fused kernel, 1 thread:                 {one:10.3g}   × {one / base:.1f}")
    print(f"  fused kernel, 2 threads:                {two:10.3g}   × {two / base:.1f}")
    print(f"  whole shard (simulate_points), 1 thread: {whole:9.3g}   × {whole / base:.1f}")


if __name__ == "__main__":
    main()
