"""Kernel throughput on the reference problem "linreg-ref" against a numpy baseline, same run.

linreg-ref: linear regression, N = 100 inputs, P = 1000 samples, S = 10, plain SGD, lr = 0.1,
float64. Throughput is in replica-steps per second (one replica-step = 4·S·N flops for the
gradient). Two sgdsweep numbers are printed: the bare SGD step (burn-in = all steps, so nothing is
accumulated) and the step with the streaming N×N second-moment accumulator (what a sweep runs).
The baseline is numpy vectorised over replicas (fancy-indexed minibatches, einsum gradients),
measured here, in the same process; the ratio is what to compare across machines.

    python benchmarks/kernel_linreg.py [--replicas 1 64 1024] [--seconds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sgdsweep.engine import run_lanes
from sgdsweep.models import linear
from sgdsweep.observables import ObserveSpec
from sgdsweep.simulate import replica_streams

N, P, S, LR = 100, 1000, 10, 0.1


def numpy_baseline(data, replicas: int, steps: int, seed: int = 0) -> float:
    """Replica-steps/s of plain numpy SGD vectorised over replicas (minibatch without replacement)."""
    rng = np.random.default_rng(seed)
    w = np.zeros((replicas, N))
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = np.argpartition(rng.random((replicas, P)), S, axis=1)[:, :S]
        xb = data.x[idx]  # (R, S, N)
        resid = np.einsum("rsn,rn->rs", xb, w) - data.y[idx, 0]
        w -= LR * np.einsum("rsn,rs->rn", xb, resid) / S
    return replicas * steps / (time.perf_counter() - t0)


def sgdsweep_kernel(data, replicas: int, steps: int, accumulate: bool) -> float:
    """The engine as a sweep runs it; ``accumulate`` = the default observables (N×N second
    moment, losses every eighth relaxation time), otherwise bare steps (burn-in = all steps)."""
    streams = [g[:2] for g in replica_streams(0, "0123456789abcdef", replicas)]
    burn = np.zeros(replicas, np.int64) if accumulate else np.full(replicas, steps, np.int64)
    stride = max(1, int(data.relaxation_steps(LR, 0.0) / 8))
    t0 = time.perf_counter()
    run_lanes(data, noise="minibatch", batch_size=S, steps=steps, lr=np.full(replicas, LR),
              momentum=np.zeros(replicas), burn_in=burn, bound=np.full(replicas, 1e12),
              w0=np.zeros((replicas, N)), streams=streams, observe=ObserveSpec(cov_max_dim=N, autocorr_stride=stride))
    return replicas * steps / (time.perf_counter() - t0)


def _steps_for(rate_guess: float, replicas: int, seconds: float) -> int:
    return max(10, int(rate_guess * seconds / replicas))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--seconds", type=float, default=2.0, help="target duration of each measurement")
    args = ap.parse_args()
    data = linear.make_problem({"n_inputs": N, "n_outputs": 1, "n_samples": P, "label_noise": 0.5, "inputs": "isotropic",
                                "wishart_ratio": None, "labels": "teacher", "noiseless": False, "seed": 0})
    sgdsweep_kernel(data, 2, 10, True)  # compile (numba) outside the timings
    print(f"linreg-ref: N={N}, P={P}, S={S}, lr={LR}, float64, one core; replica-steps/s")
    print(f"{'R':>6} {'numpy':>10} {'sgdsweep bare':>14} {'ratio':>7} {'sgdsweep +acc':>14} {'ratio':>7}")
    for r in args.replicas:
        base = numpy_baseline(data, r, _steps_for(3e5 if r > 1 else 3e4, r, args.seconds))
        bare = sgdsweep_kernel(data, r, _steps_for(1.5e6, r, args.seconds), accumulate=False)
        acc = sgdsweep_kernel(data, r, _steps_for(2e5, r, args.seconds), accumulate=True)
        print(f"{r:>6} {base:>10.3g} {bare:>14.3g} {bare / base:>7.1f} {acc:>14.3g} {acc / base:>7.1f}")


if __name__ == "__main__":
    main()
