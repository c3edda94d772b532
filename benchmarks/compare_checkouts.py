"""Two checkouts of sgdsweep on the same benchmark, alternated in separate processes.

This machine's speed drifts by up to 1.5× within an hour, so a before/after of a code change
runs both versions in turn — old, new, old, new, … — each in a fresh process with that
checkout first on ``sys.path``. In each process the benchmark compiles (or loads its cache),
then reports its best of ``--repeat`` runs. Printed: every process's figure per checkout,
the best of each, and the ratio new/old of the bests and of the medians.

    git worktree add /tmp/old <commit>      # or: git archive <commit> | tar -x -C /tmp/old
    python benchmarks/compare_checkouts.py /tmp/old . [--bench shard|linreg|points] [--threads 2] [--rounds 3]

Benchmarks (replica-steps/s, float64): ``shard`` — :func:`kernel_shard.engine_rate`, the
small-model shard of 100 points × 16 replicas (N = 10) with the default observables, 3,000
steps; ``linreg`` — :func:`kernel_linreg.sgdsweep_kernel`, linreg-ref at R = 1,024, bare steps,
1,500 steps; ``points`` — the small-model shard as a worker runs it, 1,000 steps:
:func:`sgdsweep.run.simulate.simulate_points` with its exact theory, results and 100 point stores,
written under a fresh temporary directory (``TMPDIR=/dev/shm`` keeps the disk's noise out).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

#: What a child process runs: the benchmark's module comes from the checkout's ``benchmarks/``.
CHILD = {
    "shard": """
import kernel_shard as ks
points = ks.shard({steps})
ks.engine_rate(ks.shard(200)[:4], 200, 1, True)  # compile or load the cache
print(max(ks.engine_rate(points, {steps}, {threads}, True) for _ in range({repeat})))
""",
    "linreg": """
import kernel_linreg as kl
from sgdsweep.models import linear
data = linear.make_problem({{"n_inputs": kl.N, "n_outputs": 1, "n_samples": kl.P, "label_noise": 0.5,
                             "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                             "noiseless": False, "seed": 0}})
kl.sgdsweep_kernel(data, 64, 50, False, {threads})  # compile or load the cache
print(max(kl.sgdsweep_kernel(data, 1024, {steps}, False, {threads}) for _ in range({repeat})))
""",
    "points": """
import os, tempfile, time
import kernel_shard as ks
try:
    from sgdsweep.run.simulate import simulate_points
except ImportError:  # a checkout from before the package was grouped by stage
    from sgdsweep.simulate import simulate_points
os.environ["SGDSWEEP_THREADS"] = "{threads}"
points = [p.spec() for p in ks.shard({steps})]
with tempfile.TemporaryDirectory() as out:
    simulate_points(points[:4], out)  # compile or load the cache; learn the store layout

def rate():
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        simulate_points(points, out)
        return len(points) * ks.REPLICAS * {steps} / (time.perf_counter() - t0)

print(max(rate() for _ in range({repeat})))
""",
}
STEPS = {"shard": 3000, "linreg": 1500, "points": 1000}


def run_once(checkout: Path, code: str) -> float:
    """The figure one fresh process prints for ``checkout`` (its package and benchmarks first)."""
    prelude = f"import sys; sys.path[:0] = [{str(checkout)!r}, {str(checkout / 'benchmarks')!r}]\n"
    out = subprocess.run([sys.executable, "-c", prelude + code], cwd=checkout, capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{checkout}: the benchmark failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="checkout measured first in each round (the baseline)")
    ap.add_argument("new", type=Path, help="checkout measured second in each round")
    ap.add_argument("--bench", choices=sorted(CHILD), default="shard")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="processes per checkout, alternated")
    ap.add_argument("--repeat", type=int, default=3, help="runs per process (its best is kept)")
    args = ap.parse_args()
    for path in (args.old, args.new):
        if not (path / "sgdsweep" / "__init__.py").is_file():
            raise SystemExit(f"{path}: not a checkout of sgdsweep (no sgdsweep/__init__.py); "
                             "give the top directory of a clone, worktree or archive")
    code = CHILD[args.bench].format(steps=STEPS[args.bench], threads=args.threads, repeat=args.repeat)
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        rates["old"].append(run_once(args.old.resolve(), code))
        rates["new"].append(run_once(args.new.resolve(), code))
    print(f"{args.bench}, {args.threads} thread(s), {args.rounds} alternated processes per checkout, "
          f"best of {args.repeat} in each; replica-steps/s")
    for name, path in (("old", args.old), ("new", args.new)):
        print(f"  {name} {path!s:30s} " + " ".join(f"{r:.3g}" for r in rates[name])
              + f"   best {max(rates[name]):.3g}")
    print(f"  new/old: best {max(rates['new']) / max(rates['old']):.2f}, "
          f"median {statistics.median(rates['new']) / statistics.median(rates['old']):.2f}")


if __name__ == "__main__":
    main()
