"""Peak memory of simulating one batch of points: flat in steps, linear in replicas × d².

Each measurement runs :func:`sgdsweep.run.simulate.simulate_points` (engine, theory, point stores) in
a fresh subprocess and reports its peak RSS above the RSS it had after importing everything and
building the problem (the baseline, measured in the same subprocess). Two series:

- steps: linear regression N = 10, 16 replicas, 10³ … 10⁶ steps: the accumulators stream, so
  the peak must not grow with the number of steps;
- replicas: N = 50, 64 … 1024 replicas, 200 steps: the growth per replica, against one N×N
  second moment (8·d² bytes; the engine holds a few copies of it per replica);
- parameters: N = 25 … 100 at 256 replicas (this growth also holds the exact theory of that d).

    python benchmarks/memory.py [--max-steps 1000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, tempfile
from sgdsweep.sweep.config import build_sweep
from sgdsweep.run.simulate import simulate_points
n_inputs, replicas, steps = (int(a) for a in sys.argv[1:4])
def point(n, r, t):
    c = {"sweep": "mem", "model": {"kind": "linear", "n_inputs": n},
         "dynamics": {"steps": t, "replicas": r, "burn_in": min(100, t // 2)},
         "grid": {"lr": 0.1, "batch_size": 4, "samples_per_param": 4}}
    return build_sweep(c).points[0]
with tempfile.TemporaryDirectory() as out:
    simulate_points([point(n_inputs, 2, 20).spec()], out)  # compile, import, build the problem
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    simulate_points([point(n_inputs, replicas, steps).spec()], out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_mib": base / 1024, "peak_mib": peak / 1024}))
"""


def measure(n_inputs: int, replicas: int, steps: int) -> dict:
    """Peak RSS (MiB) of simulating one point in a fresh process, and its baseline: the peak
    after a 2-replica, 20-step point of the same model (imports, compiled code, the problem)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(n_inputs), str(replicas), str(steps)],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-steps", type=int, default=1_000_000)
    args = ap.parse_args()
    print("steps series: linear N = 10, 16 replicas (peak RSS above the warmed-up baseline)")
    print(f"{'steps':>9} {'baseline MiB':>13} {'peak MiB':>9} {'growth MiB':>11}")
    first = None
    steps = 1000
    while steps <= args.max_steps:
        m = measure(10, 16, steps)
        growth = m["peak_mib"] - m["base_mib"]
        first = m["peak_mib"] if first is None else first
        print(f"{steps:>9} {m['base_mib']:>13.1f} {m['peak_mib']:>9.1f} {growth:>11.1f}"
              f"   peak / peak at 10³ steps = {m['peak_mib'] / first:.3f}", flush=True)
        steps *= 10
    print("\nreplicas series: N = 50, 200 steps (the exact theory of d = 50 is the same at every R;")
    print("the slope per replica is compared with one N×N second moment, 8·d² bytes)")
    print(f"{'R':>5} {'growth MiB':>11} {'slope / 8d²':>12}")
    prev = None
    d2 = 50**2
    for replicas in (64, 256, 1024, 4096, 16384):
        growth = (lambda m: m["peak_mib"] - m["base_mib"])(measure(50, replicas, 200))
        slope = "" if prev is None else f"{(growth - prev[1]) * 2**20 / (replicas - prev[0]) / (8 * d2):>12.2f}"
        print(f"{replicas:>5} {growth:>11.1f} {slope}", flush=True)
        prev = (replicas, growth)
    print("\nparameters series: R = 256, 200 steps (growth includes the exact theory of that d)")
    print(f"{'N':>4} {'8·R·d² MiB':>11} {'growth MiB':>11}")
    for n_inputs in (25, 50, 100):
        growth = (lambda m: m["peak_mib"] - m["base_mib"])(measure(n_inputs, 256, 200))
        print(f"{n_inputs:>4} {8 * 256 * n_inputs**2 / 2**20:>11.1f} {growth:>11.1f}", flush=True)

if __name__ == "__main__":
    main()
