"""Precision targets: replica-steps spent by the rounds against the minimum and a fixed-size sweep.

A 16-point linear-regression sweep (4 lr × 4 batch_size) with the target ``weight_var:
{rel_se: 0.005}`` runs its rounds in this process (:func:`sgdsweep.sweep.precision.resolve_rounds`
decides each round from the stored results, :func:`sgdsweep.run.simulate.simulate_points`
simulates it, as the workflow's shard jobs do). From each point's final store:

- the *minimum*: the replicas that its measured per-replica variance of ``weight_var`` implies
  for the target, ``R_min = Var_r / (0.005 · mean)²`` (no round structure, no estimation error);
- the *fixed-size sweep*: one replica count for every point, the largest ``R_min``, which a user
  must choose to reach the same worst-case precision without rounds.

Prints the replica-steps of each and the ratios spent/minimum (the issue's target: ≤ 1.5) and
fixed/spent. Every sweep runs the same steps, so replica-steps are replicas × steps.

    python benchmarks/precision.py [--rel-se 0.005] [--replicas 32] [--steps 4000] [--seed 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from sgdsweep.run.execute import make_batches
from sgdsweep.run.simulate import simulate_points
from sgdsweep.store import points as point_store
from sgdsweep.sweep.config import build_sweep


def config(results: str, rel_se: float, replicas: int, steps: int, seed: int) -> dict:
    return {"sweep": "precision_bench", "results_dir": results, "seed": seed,
            "model": {"kind": "linear", "n_inputs": 8, "label_noise": 0.5},
            "dynamics": {"steps": steps, "replicas": replicas},
            "grid": {"lr": [0.1, 0.2, 0.3, 0.4], "batch_size": [1, 2, 4, 8], "samples_per_param": 8},
            "precision": {"observables": {"weight_var": {"rel_se": rel_se}}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rel-se", type=float, default=0.005)
    ap.add_argument("--replicas", type=int, default=32, help="the first round's replicas per point")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as results:
        cfg = config(results, args.rel_se, args.replicas, args.steps, args.seed)
        t0 = time.perf_counter()
        for _ in range(20):
            sweep = build_sweep(cfg)
            todo = [p for p in sweep.points if sweep.rounds["points"][p.hash]["status"] == "pending"]
            if not todo:
                break
            for batch in make_batches([p.spec() for p in todo], 8):  # as a shard job groups them
                simulate_points(batch, str(sweep.directory / "points"))
        seconds = time.perf_counter() - t0
        info = sweep.rounds
        spent = info["replica_steps"]
        minimum, worst, rounds, statuses = 0.0, 0.0, [], []
        for p in sweep.points:
            path = point_store.point_path(sweep.directory / "points", p.hash)
            per = point_store.read_array(path, "weight_var_replica")
            per = per[np.isfinite(per)]
            r_min = np.var(per, ddof=1) / (args.rel_se * per.mean()) ** 2
            minimum += r_min * args.steps
            worst = max(worst, r_min)
            rounds.append(info["points"][p.hash]["rounds"])
            statuses.append(info["points"][p.hash]["status"])
        fixed = len(sweep.points) * np.ceil(worst) * args.steps
    print(f"16-point sweep, weight_var rel SE target {args.rel_se:.3%}, first round {args.replicas} replicas, "
          f"{args.steps} steps: {seconds:.1f} s")
    print(f"  statuses: {sorted(set(statuses))}; rounds per point: min {min(rounds)}, max {max(rounds)}")
    print(f"  spent by the rounds:            {spent:.4g} replica-steps")
    print(f"  minimum implied by the data:    {minimum:.4g} replica-steps")
    print(f"  fixed-size sweep, same worst precision ({int(np.ceil(worst))} replicas per point): {fixed:.4g}")
    print(f"  ratio spent / minimum: {spent / minimum:.2f}   (target: at most 1.5)")
    print(f"  ratio fixed-size / spent: {fixed / spent:.2f}")


if __name__ == "__main__":
    main()
