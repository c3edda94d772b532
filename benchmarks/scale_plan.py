"""Planning at scale: wall time and peak memory of ``sgdsweep validate`` and ``sgdsweep plan`` on
sweeps of 10³, 10⁴, 10⁵ and 10⁶ points (the cap of ``sgdsweep.sweep.limits``).

Each config is a grid of lr × batch_size × samples_per_param on the linear model (N = 4, burn-in
set, so that every lr is valid); each command runs in its own subprocess, its wall time taken
around it and its peak resident memory from ``resource.getrusage(RUSAGE_CHILDREN)`` (the largest
child so far: the sizes run in increasing order, so each row's figure is its own). ``plan`` runs
with ``-s`` (the counts) and in full (one line per point and the cost), into ``/dev/null``.

    python benchmarks/scale_plan.py [--sizes 1000 10000 100000 1000000] [--profile N]

``--profile N`` runs the N-point validate under cProfile and prints its top functions instead.
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

#: Grid shapes (lr, batch_size, samples_per_param) of each size.
SHAPES = {1000: (10, 10, 10), 10000: (100, 10, 10), 100000: (100, 10, 100), 1000000: (100, 10, 1000)}


def config(points: int, root: Path) -> Path:
    """A linear-model config of ``points`` points under ``root``."""
    n_lr, n_batch, n_spp = SHAPES[points]
    raw = {"sweep": f"scale{points}", "results_dir": str(root / "results"), "seed": 3,
           "model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
           "dynamics": {"steps": 3000, "replicas": 8, "burn_in": 500},
           "grid": {"lr": [round(0.001 * (i + 1), 4) for i in range(n_lr)],
                    "batch_size": list(range(1, n_batch + 1)),
                    "samples_per_param": [10 + i for i in range(n_spp)]},
           "execution": {"workers": 2, "points_per_task": 16}}
    path = root / f"scale{points}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def timed(args: list[str]) -> tuple[float, float]:
    """Wall seconds and the peak resident MiB of the children so far, for one subprocess."""
    t0 = time.perf_counter()
    with open(os.devnull, "w") as sink:
        proc = subprocess.run([sys.executable, "-m", "sgdsweep", *args], stdout=sink, stderr=subprocess.PIPE,
                              text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"sgdsweep {' '.join(args)} failed:\n{proc.stderr}")
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=sorted(SHAPES), choices=sorted(SHAPES))
    parser.add_argument("--profile", type=int, choices=sorted(SHAPES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.profile:
            import cProfile
            import pstats

            from sgdsweep.sweep.config import load_sweep

            path = config(args.profile, root)
            cProfile.runctx("load_sweep(path)", globals(), {"load_sweep": load_sweep, "path": path},
                            str(root / "prof"))
            pstats.Stats(str(root / "prof")).sort_stats("cumulative").print_stats(30)
            return
        rows = []
        for n in sorted(args.sizes):
            path = config(n, root)
            rows.append((n, timed(["validate", str(path)]), timed(["plan", "-s", str(path)]),
                         timed(["plan", str(path)])))
    print("| points | validate s | validate MiB | plan -s s | plan -s MiB | plan s | plan MiB |")
    print("|---|---|---|---|---|---|---|")
    for n, v, s, p in rows:
        print(f"| {n} | {v[0]:.2f} | {v[1]:.0f} | {s[0]:.2f} | {s[1]:.0f} | {p[0]:.2f} | {p[1]:.0f} |")
    for (n0, v0, _, p0), (n1, v1, _, p1) in itertools.pairwise(rows):
        print(f"{n1}/{n0} points: validate time ×{v1[0] / v0[0]:.2f}, memory ×{v1[1] / v0[1]:.2f}; "
              f"plan time ×{p1[0] / p0[0]:.2f}, memory ×{p1[1] / p0[1]:.2f}")


if __name__ == "__main__":
    main()
