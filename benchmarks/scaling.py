"""How time scales with replicas, steps, N, points per batch and Dask workers.

Engine series (this process, one thread, :func:`sgdsweep.sim.engine.run_lanes` with the default
observables, linear regression, S = 4, P = 8N, λ = 0.1): time against replicas, steps, N (the
N×N second moment is accumulated) and points per batch (16 replicas each, lr varied: one call).
Each row is compared with the first of its series: the ideal time ratio is the ratio of
replica-steps (of flops per step, for N).

Workers series: ``sgdsweep run`` of a 40-point sweep (linear N = 20, 20,000 steps, 64 replicas:
simulation-bound) with ``execution.workers`` 1 and 2, end to end.

    python benchmarks/scaling.py [--skip-workers]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from sgdsweep.models import linear
from sgdsweep.sim.engine import run_lanes
from sgdsweep.sim.observables import ObserveSpec
from sgdsweep.sim.replicas import replica_streams


def problem(n_inputs: int):
    return linear.make_problem({"n_inputs": n_inputs, "n_outputs": 1, "n_samples": 8 * n_inputs,
                                "label_noise": 0.5, "inputs": "isotropic", "wishart_ratio": None,
                                "labels": "teacher", "noiseless": False, "seed": 0})


def engine_seconds(n_inputs: int, replicas: int, steps: int, points: int = 1) -> float:
    """Seconds of one run_lanes call: ``points`` points (lr 0.05 … 0.2) × ``replicas`` each."""
    data = problem(n_inputs)
    lanes = points * replicas
    lr = np.repeat(np.linspace(0.05, 0.2, points), replicas)
    streams = [g[:2] for g in replica_streams(0, "0123456789abcdef", lanes)]
    t0 = time.perf_counter()
    run_lanes(data, noise="minibatch", batch_size=4, steps=steps, lr=lr, momentum=np.zeros(lanes),
              burn_in=np.full(lanes, steps // 5), bound=np.full(lanes, 1e12), w0=np.zeros((lanes, n_inputs)),
              streams=streams, observe=ObserveSpec(cov_max_dim=128), loss_stride=np.full(lanes, 8))
    return time.perf_counter() - t0


def series(name: str, rows: list[tuple[str, dict, float]]) -> None:
    print(f"\n{name}")
    print(f"{'':>14} {'seconds':>9} {'replica-steps/s':>16} {'time ratio':>11} {'ideal':>7}")
    first = None
    for label, kw, ideal in rows:
        engine_seconds(**{**kw, "steps": 20})  # compile and cache the problem
        sec = engine_seconds(**kw)
        rs = kw["replicas"] * kw.get("points", 1) * kw["steps"]
        first = first or (sec, ideal)
        print(f"{label:>14} {sec:>9.3f} {rs / sec:>16.3g} {sec / first[0]:>11.2f} {ideal / first[1]:>7.2f}", flush=True)


def workers_series() -> None:
    print("\nworkers: sgdsweep run, 40 points (linear N = 20, 20,000 steps, 64 replicas), end to end")
    for workers in (1, 2):
        work = Path(tempfile.mkdtemp(prefix="sgdsweep-scaling-"))
        cfg = {"sweep": "scaling", "seed": 0, "results_dir": str(work / "results"),
               "model": {"kind": "linear", "n_inputs": 20},
               "dynamics": {"steps": 20_000, "replicas": 64, "burn_in": 2000},
               "grid": {"lr": [round(float(v), 4) for v in np.linspace(0.05, 0.2, 10)], "batch_size": [2, 4, 8, 16],
                        "samples_per_param": 8},
               "execution": {"workers": workers}}
        (work / "c.yaml").write_text(yaml.safe_dump(cfg))
        t0 = time.perf_counter()  # --cores 2 either way: the shard job and Dask's workers share them
        subprocess.run([sys.executable, "-m", "sgdsweep", "run", "c.yaml", "--cores", "2"], cwd=work, check=True,
                       capture_output=True)
        print(f"  workers = {workers}: {time.perf_counter() - t0:6.1f} s", flush=True)


def main() -> None:
    series("replicas (N = 20, 10,000 steps)", [(f"R = {r}", {"n_inputs": 20, "replicas": r, "steps": 10_000}, r)
                                               for r in (16, 64, 256, 1024)])
    series("steps (N = 20, 64 replicas)", [(f"{s:.0e} steps", {"n_inputs": 20, "replicas": 64, "steps": s}, s)
                                           for s in (1000, 10_000, 100_000)])
    series("N (64 replicas, 10,000 steps; ideal: flops per step 4SN + N² + 1.5N²/8, gradient, second "
           "moment, two losses every 8th step)",
           [(f"N = {n}", {"n_inputs": n, "replicas": 64, "steps": 10_000}, 16 * n + 1.1875 * n * n)
            for n in (10, 20, 50, 100)])
    series("points per batch (16 replicas each, N = 10, 10,000 steps)",
           [(f"{p} points", {"n_inputs": 10, "replicas": 16, "steps": 10_000, "points": p}, p) for p in (1, 10, 100)])
    if "--skip-workers" not in sys.argv:
        workers_series()


if __name__ == "__main__":
    main()
