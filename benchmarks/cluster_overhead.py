"""What Dask's own bookkeeping costs in sgdsweep's local cluster: Dask's defaults against
sgdsweep's settings (``sgdsweep.run.cluster.QUIET_DASK``), alternated in fresh processes.

Each round starts ``sgdsweep.run.cluster.local_cluster(2)`` (the scheduler in this process, two
one-thread worker processes) in a fresh process, once with Dask's defaults (the baseline:
``QUIET_DASK`` emptied) and once as sgdsweep starts it, in turn, and measures:

- **idle**: CPU seconds of the scheduler's process and the workers (with their nannies) over
  ``--idle`` seconds with nothing to do, per minute;
- **busy**: the small-model shard (``kernel_shard.shard``: 100 points × 16 replicas, linear
  N = 10, ``--steps`` steps) as a shard job runs it, batches of 8 points mapped over the two
  workers with :func:`sgdsweep.run.simulate.simulate_points` writing their stores: wall seconds
  and CPU seconds of all the cluster's processes.

Printed: every round's figures, the medians of each setting and their ratios (sgdsweep / Dask).

    python benchmarks/cluster_overhead.py [--rounds 3] [--idle 30] [--steps 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, sys, tempfile, time
import psutil
sys.path.insert(0, {here!r})
from distributed import Client
from sgdsweep.run import cluster as clu
from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
import kernel_shard as ks

if not {quiet}:
    clu.QUIET_DASK = {{}}  # the baseline: Dask's defaults
me = psutil.Process()

def cpu():
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])

batches = make_batches([p.spec() for p in ks.shard({steps})], 8)
with clu.local_cluster(2, dashboard_address=None) as cluster, Client(cluster) as client:
    client.wait_for_workers(2)
    with tempfile.TemporaryDirectory() as out:
        client.gather(client.map(simulate_points, batches[:2], [out] * 2, pure=False))  # kernels loaded
    time.sleep(2)
    c0 = cpu(); time.sleep({idle}); idle = (cpu() - c0) * 60 / {idle}
    with tempfile.TemporaryDirectory() as out:
        c0, t0 = cpu(), time.perf_counter()
        client.gather(client.map(simulate_points, batches, [out] * len(batches), pure=False))
        wall, busy = time.perf_counter() - t0, cpu() - c0
print(json.dumps({{"idle": idle, "wall": wall, "cpu": busy}}))
"""


def run_once(quiet: bool, idle: float, steps: int) -> dict:
    code = CHILD.format(here=str(HERE), quiet=quiet, idle=idle, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of the idle measurement")
    ap.add_argument("--steps", type=int, default=1000, help="steps of the shard's points")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"dask": [], "sgdsweep": []}
    for r in range(args.rounds):
        for name in (("dask", "sgdsweep") if r % 2 == 0 else ("sgdsweep", "dask")):
            fig = run_once(name == "sgdsweep", args.idle, args.steps)
            runs[name].append(fig)
            print(f"round {r + 1} {name:8s} idle {fig['idle']:5.2f} CPU-s/min   shard {fig['wall']:6.2f} s wall, "
                  f"{fig['cpu']:6.2f} CPU-s", flush=True)
    med = {n: {k: statistics.median(f[k] for f in v) for k in ("idle", "wall", "cpu")} for n, v in runs.items()}
    for n, m in med.items():
        print(f"median   {n:8s} idle {m['idle']:5.2f} CPU-s/min   shard {m['wall']:6.2f} s wall, {m['cpu']:6.2f} CPU-s")
    print("ratio sgdsweep/dask: " + ", ".join(f"{k} {med['sgdsweep'][k] / med['dask'][k]:.2f}"
                                             for k in ("idle", "wall", "cpu")))


if __name__ == "__main__":
    main()
