"""Peak memory of `sgdsweep run` on a tiny sweep against `sgdsweep plan`'s estimate, per worker count.

Runs the tiny sweep (linear N = 4, 4 points of 8 replicas, 3000 steps) with each number of local
workers, one run at a time, sampling the resident memory (RSS, and PSS every fifth sample)
summed over the whole process tree of ``sgdsweep run`` every 50 ms: Snakemake, the cluster
process, its workers and every job. Prints one JSON line per run: the peaks, the most processes
at once and the estimate of :func:`sgdsweep.sweep.cost.estimate_memory`. A local cluster takes
at most two workers per core, so 24 workers need a machine of 12 cores or more.

    python benchmarks/workers_memory.py 1 2 24
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import psutil
import yaml


def config(workers: int) -> dict:
    return {"sweep": "mem", "seed": 3, "model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
            "dynamics": {"steps": 3000, "replicas": 8},
            "grid": {"lr": [0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10},
            "execution": {"workers": workers, "points_per_task": 2}, "fit": {"bootstrap": 50}}


def estimate(workers: int) -> int:
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.cost import estimate_memory, tasks

    sweep = build_sweep(config(workers))
    return estimate_memory(sweep, tasks(sweep)).total


def measure(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(config(workers), fh)
        proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", path, "-q"], cwd=d,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        root = psutil.Process(proc.pid)
        peak_rss = peak_pss = most = i = 0
        while proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            rss = pss = 0
            for p in procs:
                try:
                    if i % 5 == 0:
                        full = p.memory_full_info()
                        rss, pss = rss + full.rss, pss + full.pss
                    else:
                        rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak_rss, most = max(peak_rss, rss), max(most, len(procs))
            peak_pss = max(peak_pss, pss) if i % 5 == 0 else peak_pss
            i += 1
            time.sleep(0.05)
        output = proc.stdout.read()
    return {"workers": workers, "rc": proc.returncode, "peak_rss_mib": round(peak_rss / 2**20),
            "peak_pss_mib": round(peak_pss / 2**20), "processes": most,
            "estimate_mib": round(estimate(workers) / 2**20), "output": output[-500:] if proc.returncode else ""}


if __name__ == "__main__":
    for n in (int(a) for a in sys.argv[1:] or ["1", "2"]):
        print(json.dumps(measure(n)), flush=True)
