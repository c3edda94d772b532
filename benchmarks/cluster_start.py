"""Time from the start of ``sgdsweep run`` to its local Dask cluster being ready, on a tiny sweep.

Each repetition starts ``sgdsweep run`` on a sweep of 4 slow points (2 workers, numba's cache
warm), watches ``<sweep>/.cluster/scheduler.json`` and, once it names a scheduler, connects to it
and records when the first and when all workers run; then stops the run (SIGINT to its process
group, as Ctrl-C) and removes the sweep. With several ``--tree`` arguments (checkouts of
sgdsweep, e.g. one made with ``git archive``) the trees take turns within each repetition, so
they share the machine's load; each is run once first, unmeasured, to fill numba's cache for
its source files.

    python benchmarks/cluster_start.py [--tree PATH ...] [--repeats 3] [--workers 2]

Prints, per tree, seconds to the scheduler file, to the first worker and to all workers (each
repetition, then the median).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEP = {"sweep": "start", "seed": 3, "model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
         "dynamics": {"steps": 200000, "replicas": 8},
         "grid": {"lr": [0.2, 0.3], "batch_size": [2, 4], "samples_per_param": 10}}


def _once(tree: Path, workers: int, timeout_s: float = 600.0) -> tuple[float, float, float]:
    """Seconds from the start of ``sgdsweep run`` (package from ``tree``) to the scheduler file,
    the first worker and ``workers`` workers."""
    from distributed import Client

    with tempfile.TemporaryDirectory(prefix="cluster-start-") as tmp:
        cfg = {**SWEEP, "results_dir": str(Path(tmp) / "results"),
               "execution": {"workers": workers, "points_per_task": 1}}
        (Path(tmp) / "start.yaml").write_text(yaml.safe_dump(cfg))
        scheduler_file = Path(tmp) / "results" / "start" / ".cluster" / "scheduler.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("SGDSWEEP_SCHEDULER_FILE", None)
        env.pop("SGDSWEEP_SCHEDULER", None)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", "start.yaml", "--cores", str(workers)],
                                cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            while True:
                try:
                    if json.loads(scheduler_file.read_text()).get("address"):
                        break
                except (OSError, ValueError):
                    pass
                if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"sgdsweep run ({tree}) ended or overran before its scheduler file")
                time.sleep(0.02)
            t_file, t_first = time.monotonic() - t0, None
            with Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
                while True:
                    up = sum(w["status"] == "running"
                             for w in client.scheduler_info(n_workers=-1)["workers"].values())
                    if up and t_first is None:
                        t_first = time.monotonic() - t0
                    if up >= workers:
                        return t_file, t_first, time.monotonic() - t0
                    if time.monotonic() - t0 > timeout_s:
                        raise RuntimeError(f"sgdsweep run ({tree}): {up} of {workers} workers after {timeout_s} s")
                    time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout of sgdsweep (default: this one)")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions per tree (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="Dask workers of the run's cluster (default 2)")
    args = parser.parse_args()
    trees = args.tree or [ROOT]
    times: dict[Path, list[tuple[float, float, float]]] = {t: [] for t in trees}
    for tree in trees:  # warm-up: numba's cache (keyed by each tree's source paths), the file system cache
        _once(tree, args.workers)
    for _ in range(args.repeats):
        for tree in trees:
            times[tree].append(_once(tree, args.workers))
            print(f"{tree}: scheduler file {times[tree][-1][0]:.1f} s, first worker {times[tree][-1][1]:.1f} s, "
                  f"{args.workers} workers {times[tree][-1][2]:.1f} s", flush=True)
    for tree, runs in times.items():
        med = [statistics.median(r[i] for r in runs) for i in range(3)]
        print(f"median of {len(runs)}, {tree}: scheduler file {med[0]:.1f} s, first worker {med[1]:.1f} s, "
              f"{args.workers} workers {med[2]:.1f} s")


if __name__ == "__main__":
    main()
