"""The whole pipeline on a 1,000-point sweep of small simulations, a no-op rerun, and the
dry run of a 10⁴-point config, against the simulation alone measured in the same run.

The sweep: linear regression N = 10, 1,000 steps (200 burn-in), 16 replicas; 10 lr × 5 momentum
× 4 batch_size × 5 samples_per_param = 1,000 points in 5 shards. Measured:

- ``pipeline``: ``sgdsweep run CONFIG --cores 2`` end to end (Snakemake, Dask cluster start,
  simulate, point stores, aggregate, fit, report), wall time, with the time of each rule from
  Snakemake's log;
- ``no-op``: the same command again (everything up to date);
- ``dry run 10⁴``: ``sgdsweep run CONFIG -n`` of a 10⁴-point sweep (also 20 lr);
- baseline: the same 1,000 points simulated in this process, batch by batch as the workers
  run them, without stores (``run_lanes`` only): the pipeline's overhead is the ratio.

    python benchmarks/pipeline.py [--cores 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

GRID = {"lr": [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5],
        "momentum": [0.0, 0.2, 0.4, 0.6, 0.8], "batch_size": [2, 4, 8, 16],
        "samples_per_param": [4, 6, 8, 10, 12], "noise": "minibatch"}


def config(name: str, results: Path, lr_values: int = 10) -> dict:
    grid = dict(GRID, lr=[round(float(v), 4) for v in np.linspace(0.05, 0.5, lr_values)])
    return {"sweep": name, "seed": 0, "results_dir": str(results),
            "model": {"kind": "linear", "n_inputs": 10, "label_noise": 0.5},
            "dynamics": {"steps": 1000, "replicas": 16, "burn_in": 200}, "grid": grid}


def timed(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return wall, out.stderr


def rule_times(log: str) -> dict[str, float]:
    """Seconds per rule (summed over its jobs) from Snakemake's log."""
    stamp = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
    started: dict[str, tuple[str, datetime]] = {}
    totals: dict[str, float] = {}
    now = None
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = stamp.match(line.strip())
        if m:
            now = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        rule = re.match(r"^\s*(?:local)?rule (\w+):", line)
        if rule and now is not None:
            jobid = next((re.search(r"jobid: (\d+)", lines[j]).group(1) for j in range(i, min(i + 12, len(lines)))
                          if re.search(r"jobid: (\d+)", lines[j])), None)
            if jobid is not None:
                started[jobid] = (rule.group(1), now)
        done = re.match(r"^Finished jobid: (\d+)", line.strip())
        if done and done.group(1) in started and now is not None:
            name, t = started.pop(done.group(1))
            totals[name] = totals.get(name, 0.0) + (now - t).total_seconds()
    return totals


def simulation_only(cfg: dict) -> float:
    """Seconds to run the sweep's lanes in this process, batch by batch (no stores, no theory)."""
    from sgdsweep.run.execute import make_batches
    from sgdsweep.sweep.config import build_sweep

    sweep = build_sweep(cfg)
    per_task = int(sweep.config["execution"]["points_per_task"])
    return sum(bare_batch(batch)[0] for points in sweep.shards.values()
               for batch in make_batches([p.spec() for p in points], per_task))


def bare_batch(batch: list[dict]) -> tuple[float, int]:
    """(seconds, replica-steps) of one batch of point specs (as a task gets them) through the
    engine alone: ``run_lanes`` on its replicas, no theory, results or stores."""
    from sgdsweep.models import get_model
    from sgdsweep.sim.engine import Dynamics, run_lanes
    from sgdsweep.sim.replicas import loss_stride, replica_streams
    from sgdsweep.sim.shapes import observe_spec

    first = batch[0]["params"]
    model = get_model(first["model"])
    problem = model.make_problem(model.data_params(first))
    lanes = [(s, g) for s in batch for g in replica_streams(0, s["hash"], int(s["params"]["replicas"]))]
    n = len(lanes)
    t0 = time.perf_counter()
    run_lanes(problem, noise=first["noise"], batch_size=int(first["batch_size"]), steps=int(first["steps"]),
              lr=np.array([s["params"]["lr"] for s, _ in lanes]),
              momentum=np.array([s["params"]["momentum"] for s, _ in lanes]),
              burn_in=np.array([s["burn_in"] for s, _ in lanes]), bound=np.full(n, 1e12),
              w0=np.zeros((n, problem.dim)), streams=[g[:2] for _, g in lanes],
              observe=observe_spec(first), dynamics=Dynamics(),
              loss_stride=np.array([loss_stride(problem, s["params"], s["burn_in"], 1) for s, _ in lanes]))
    return time.perf_counter() - t0, n * int(first["steps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sgdsweep-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = config("p1000", work / "results")
    (work / "p1000.yaml").write_text(yaml.safe_dump(cfg))
    big = config("p10000", work / "results", lr_values=100)
    (work / "p10000.yaml").write_text(yaml.safe_dump(big))
    run = [sys.executable, "-m", "sgdsweep", "run"]
    try:
        base = simulation_only(cfg)
        wall, log = timed(run + ["p1000.yaml", "--cores", str(args.cores)], work)
        rules = rule_times(log)
        noop, _ = timed(run + ["p1000.yaml", "--cores", str(args.cores)], work)
        dry, _ = timed(run + ["p10000.yaml", "-n"], work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("1,000 points (linear N = 10, 1,000 steps, 16 replicas), "
          f"{args.cores} cores:")
    print(f"  simulation alone, one process (baseline): {base:7.1f} s")
    print(f"  pipeline end to end:                      {wall:7.1f} s   ratio to baseline {wall / base:.1f}")
    print("    per rule (job seconds, summed over jobs): "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rules.items(), key=lambda kv: -kv[1])))
    print(f"  no-op rerun:                              {noop:7.1f} s")
    print(f"10,000 points: dry run (snakemake -n):      {dry:7.1f} s")


if __name__ == "__main__":
    main()
