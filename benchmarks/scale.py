"""The pipeline at cluster scale: end-to-end cost against the bare simulation of the same points,
incremental reruns, and planning at 10⁵ and 10⁶ points, each with its peak RSS, in one run.

Cases (linear regression N = 10, 1,000 steps, 200 burn-in, 16 replicas, as ``pipeline.py``):

- ``1e3 / 5 data sets``: 10 lr × 5 momentum × 4 batch_size × 5 samples_per_param;
- ``1e3 / 200 data sets``: 5 lr × 200 samples_per_param;
- ``+1 data set``: the 200-data-set sweep with one samples_per_param value more (5 new points);
- ``+1 point``: then one lr value more (201 new points, one per data set);
- ``no-op``: the previous case's command again;
- ``1e4``: 100 lr × 10 momentum × 10 batch_size, one data set;
- ``plan 1e5`` / ``plan 1e6``: ``sgdsweep validate`` and ``sgdsweep plan`` of a 10⁵-point config and of a
  10⁶-point one (the limit of points per sweep): 100 lr × 10 momentum × 100 or 1,000
  samples_per_param.

Each end-to-end case is ``sgdsweep run CONFIG --cores N`` in a fresh results directory (but the
incremental ones, which reuse the previous case's); its ratio is to the same points simulated in
this process without stores (``pipeline.simulation_only``), measured in the same run. Peak RSS is
the largest resident set of any one process the command started (``getrusage(RUSAGE_CHILDREN)``).

    python benchmarks/scale.py [--cores 2] [--only NAME ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from pipeline import rule_times, simulation_only

BASE = {"seed": 0, "model": {"kind": "linear", "n_inputs": 10, "label_noise": 0.5},
        "dynamics": {"steps": 1000, "replicas": 16, "burn_in": 200}}


def config(name: str, results: Path, grid: dict) -> dict:
    return {"sweep": name, "results_dir": str(results), **BASE, "grid": {"noise": "minibatch", **grid}}


def lrs(n: int) -> list[float]:
    return [round(float(v), 5) for v in np.linspace(0.05, 0.5, n)]


def spps(n: int) -> list[float]:
    return [round(4.0 + 0.05 * i, 3) for i in range(n)]


def grids() -> dict[str, dict]:
    """Case name → grid (the sweep's size is the product of the list lengths)."""
    return {
        "1e3 / 5 data sets": {"lr": lrs(10), "momentum": [0.0, 0.2, 0.4, 0.6, 0.8], "batch_size": [2, 4, 8, 16],
                              "samples_per_param": spps(5)},
        "1e3 / 200 data sets": {"lr": lrs(5), "batch_size": 4, "samples_per_param": spps(200)},
        "+1 data set": {"lr": lrs(5), "batch_size": 4, "samples_per_param": [*spps(200), 20.0]},
        "+1 point": {"lr": [*lrs(5), 0.33], "batch_size": 4, "samples_per_param": [*spps(200), 20.0]},
        "no-op": {},  # the previous case's grid again
        "1e4": {"lr": lrs(100), "momentum": [round(0.08 * i, 2) for i in range(10)],
                "batch_size": [2, 3, 4, 5, 6, 8, 10, 12, 14, 16], "samples_per_param": [8.0]},
    }


#: Cases that rerun the previous case's sweep (same name and results) after an edit.
INCREMENTAL = {"+1 point", "+1 data set", "no-op"}


def measured(cmd: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, peak RSS in MiB of the largest child process, the completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, proc


def plan_case(work: Path, points: int) -> list[str]:
    """validate and plan of a config with ``points`` points, each its own subprocess."""
    # 100 lr × 10 momentum × points/1000 data sets (samples_per_param values)
    grid = {"lr": lrs(100), "momentum": [round(0.08 * i, 2) for i in range(10)], "batch_size": 4,
            "samples_per_param": spps(points // 1000)}
    cfg = config(f"plan{points}", work / "results", grid)
    path = work / f"plan{points}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rows = []
    for verb in ("validate", "plan"):
        # a fresh interpreter per measurement: RUSAGE_CHILDREN keeps the largest child ever seen
        code = ("import resource,subprocess,sys,time;t=time.perf_counter();"
                f"p=subprocess.run([sys.executable,'-m','sgdsweep','{verb}','{path}'],capture_output=True,text=True);"
                "print(time.perf_counter()-t,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024,p.returncode);"
                "print(p.stdout[-300:]+p.stderr[-300:],file=sys.stderr)")
        out = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, check=True)
        wall, rss, rc = out.stdout.split()
        note = "" if rc == "0" else " (refused: " + out.stderr.strip().splitlines()[-1][:100] + ")"
        rows.append(f"  plan {points:.0e} {verb:9s} {float(wall):7.1f} s  peak {float(rss):6.0f} MiB  rc {rc}{note}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="case names to run (default: all); 'plan' for the plan cases")
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sgdsweep-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only) if args.only else None
    rows: list[str] = []
    try:
        name, last = None, {}
        for case, grid in grids().items():
            if wanted is not None and case not in wanted:
                continue
            if case not in INCREMENTAL:
                name = "".join(c if c.isalnum() else "_" for c in case)
                shutil.rmtree(work / "results" / name, ignore_errors=True)
            grid = grid or last  # no-op: the previous case's grid
            last = grid
            cfg = config(name, work / "results", grid)
            path = work / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            base = simulation_only(cfg)
            wall, rss, proc = measured([sys.executable, "-m", "sgdsweep", "run", str(path), "-v", "--cores",
                                        str(args.cores)], work)
            if proc.returncode:
                sys.exit(f"{case}: sgdsweep run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            points = int(np.prod([len(v) for v in grid.values() if isinstance(v, list)]))
            times = sorted(rule_times(proc.stderr).items(), key=lambda kv: -kv[1])
            per_rule = ", ".join(f"{k} {v:.0f}" for k, v in times)
            ratio = "" if case in INCREMENTAL else f"  ratio {wall / base:5.1f}"
            rows.append(f"  {case:20s} {points:6d} points  {wall:7.1f} s  (simulation alone of all points "
                        f"{base:6.1f} s){ratio}  peak {rss:5.0f} MiB  [{per_rule}]")
            print(rows[-1], flush=True)
        if wanted is None or "plan" in wanted:
            for points in (10**5, 10**6):
                rows += plan_case(work, points)
                print("\n".join(rows[-2:]), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nsgdsweep at scale, {args.cores} cores:")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
