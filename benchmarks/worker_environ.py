"""Simulation speed inside a Dask worker against in-process, with Dask's default worker
environment and with sgdsweep's (``sgdsweep.run.cluster.WORKER_ENVIRON``).

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which switches off glibc's
dynamic mmap threshold: every numpy temporary above 128 KiB is then mmap-ed and page-faulted on
each engine step. sgdsweep's local clusters start their workers with raised thresholds through
``distributed.nanny.pre-spawn-environ``. This benchmark runs the same batch of points (a) in this
process, (b) in a fresh one-worker ``LocalCluster`` with Dask's defaults (the baseline), and (c) in
a fresh worker of ``sgdsweep.run.cluster.local_cluster``, and prints the times and ratios. Two
workloads: the default sweep's 4 learning rates at S = 2 (linear regression, N = 20) and the
escape sweep's 5 learning rates (thesis landscape, 600 samples: large temporaries).

    python benchmarks/worker_environ.py [--steps-scale 0.25]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _batch(config: str, steps_scale: float, where: str) -> list[dict]:
    from sgdsweep.run.execute import make_batches
    from sgdsweep.sweep.config import build_sweep

    cfg = yaml.safe_load((ROOT / config).read_text())
    cfg["dynamics"]["steps"] = int(cfg["dynamics"]["steps"] * steps_scale)
    cfg["dynamics"]["burn_in"] = int(cfg["dynamics"]["steps"] // 4)
    cfg["results_dir"] = where
    return make_batches([p.spec() for p in build_sweep(cfg).points], 64)[0]


def _simulate(batch: list[dict], out: str) -> float:
    from sgdsweep.run.simulate import simulate_points

    shutil.rmtree(out, ignore_errors=True)
    simulate_points(batch[:1], out)  # compile numba, warm caches
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    simulate_points(batch, out)
    return time.perf_counter() - t0


def _in_worker(batch: list[dict], out: str, sgdsweep_environ: bool) -> float:
    from distributed import Client, LocalCluster

    from sgdsweep.run.cluster import local_cluster

    cluster = (local_cluster(1, dashboard_address=None) if sgdsweep_environ else
               LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None))
    with cluster, Client(cluster) as client:
        return client.submit(_simulate, batch, out, pure=False).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps-scale", type=float, default=0.25, help="fraction of each config's steps")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sgdsweep-bench-")
    print(f"{'workload':<34} {'in-process':>10} {'default':>8} {'sgdsweep':>8} {'default/in':>10} "
          f"{'default/sgdsweep':>16}")
    for name, config in (("default sweep, S = 2 (linear)", "config/config.yaml"),
                         ("escape sweep (thesis landscape)", "config/sweeps/vescovi_escape.yaml")):
        batch = _batch(config, args.steps_scale, tmp)
        if name.startswith("default"):
            batch = [p for p in batch if p["params"]["batch_size"] == 2] or batch
        inproc = _simulate(batch, f"{tmp}/a")
        base = _in_worker(batch, f"{tmp}/b", sgdsweep_environ=False)
        ours = _in_worker(batch, f"{tmp}/c", sgdsweep_environ=True)
        print(f"{name:<34} {inproc:>9.1f}s {base:>7.1f}s {ours:>7.1f}s {base / inproc:>10.2f} {base / ours:>16.2f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
