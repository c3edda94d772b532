"""Throughput of every model and noise type per flop, against linear regression in the same run.

Each case is one :func:`sgdsweep.sim.engine.run_lanes` call of 256 lanes (one thread, bare steps:
burn-in = all steps, escape off so that every lane runs every step), built from a config as a
sweep builds it. Its flops per replica-step are those of the gradient and update by the
cheapest algorithm (``CASES`` below; observables excluded): for noise matched to the per-sample
gradients, two passes over all P samples (4·P·d); the ratio is
(throughput × flops) against the same product of the reference, linear regression N = 100,
S = 10, minibatch (linreg-ref). Every case runs a compiled kernel (:mod:`sgdsweep.sim.kernels`).

The lanes' generators are timed (:class:`TimedGenerator`), so each case also says what share
of its time went to drawing random numbers outside the compiled loop (one thread; the normals —
the kernels draw the uniforms of sample selection themselves) and how the rest, the compiled
loop, compares per flop with the reference's compiled loop: noise matched to the
per-sample gradients draws P normals per step (3.3 ns each here) against a gradient of 4·P·d
flops, so drawing is a large share of those cases' time.

    python benchmarks/kernel_models.py [--seconds 1] [--repeat 1] [--numpy] [--match TEXT]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sgdsweep.models import get_model
from sgdsweep.sim import engine, kernels, noise
from sgdsweep.sim.engine import run_lanes
from sgdsweep.sim.kernels import loop
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.sim.shapes import observe_spec
from sgdsweep.sweep.config import build_sweep

LANES = 256

#: name → (config, flops per replica-step of (problem, S))
CASES: dict[str, tuple[dict[str, Any], Callable[[Any, int], float]]] = {
    "linear minibatch (reference)": (
        {"model": {"kind": "linear", "n_inputs": 100},
         "grid": {"lr": 0.1, "batch_size": 10, "samples_per_param": 10, "noise": "minibatch"}},
        lambda p, s: 4 * s * p.dim + 2 * p.dim),
    "linear label": (
        {"model": {"kind": "linear", "n_inputs": 100, "label_noise": 0.5},
         "grid": {"lr": 0.1, "batch_size": 10, "samples_per_param": 10, "noise": "label"}},
        lambda p, s: 4 * s * p.dim + 2 * p.dim),
    "linear gaussian": (
        {"model": {"kind": "linear", "n_inputs": 100},
         "grid": {"lr": 0.1, "batch_size": 10, "samples_per_param": 10, "noise": "gaussian"}},
        lambda p, s: 2 * p.n_inputs * p.dim + 3 * p.dim),
    "linear gaussian_matched": (
        {"model": {"kind": "linear", "n_inputs": 20},
         "grid": {"lr": 0.1, "batch_size": 10, "samples_per_param": 10, "noise": "gaussian_matched"}},
        lambda p, s: 4 * p.n_samples * p.dim + 4 * p.n_samples + 2 * p.dim),
    "linear student_t": (
        {"model": {"kind": "linear", "n_inputs": 20},
         "grid": {"lr": 0.1, "batch_size": 10, "samples_per_param": 10, "noise": "student_t"}},
        lambda p, s: 4 * p.n_samples * p.dim + 4 * p.n_samples + 2 * p.dim),
    "matrix minibatch": (
        {"model": {"kind": "matrix", "targets": [1.0, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.05]},
         "grid": {"lr": 0.05, "batch_size": 10, "samples_per_param": 10, "noise": "minibatch"}},
        # data sum 4·S·d, the metric once on the sum 2·n_out·d, the S offsets S·d (their weights
        # are all 1/S: add, then scale once), update 3·d
        lambda p, s: 4 * s * p.dim + 2 * p.n_outputs * p.dim + s * p.dim + 3 * p.dim),
    "two_layer minibatch": (
        {"model": {"kind": "two_layer", "n_inputs": 20, "labels": "teacher"},
         "grid": {"lr": 0.02, "batch_size": 10, "samples_per_param": 10, "hidden_width": 20,
                  "noise": "minibatch"}},
        lambda p, s: 6 * p.n_outputs * p.hidden * p.n_inputs + 4 * s * p.n_inputs * p.n_outputs + 2 * p.dim),
    "two_layer gaussian_matched": (
        {"model": {"kind": "two_layer", "n_inputs": 20, "labels": "teacher"},
         "grid": {"lr": 0.02, "batch_size": 10, "samples_per_param": 10, "hidden_width": 20,
                  "noise": "gaussian_matched"}},
        lambda p, s: 6 * p.n_outputs * p.hidden * p.n_inputs + 4 * p.n_samples * p.n_inputs * p.n_outputs
        + 4 * p.n_samples + 2 * p.dim),
    "quadratic gaussian (d = 2)": (
        {"model": {"kind": "quadratic", "curvatures": [1.0, 0.3], "noise_cov": [[1.0, 0.6], [0.6, 2.0]]},
         "grid": {"lr": 0.2, "batch_size": 1, "noise": "gaussian"}},
        lambda p, s: 2 * p.dim**2 + 3 * p.dim),
    "escape double well, gaussian": (
        {"model": {"kind": "landscape", "landscape": "double_well"},
         "grid": {"lr": 0.05, "batch_size": 1, "noise": "gaussian"}},
        lambda p, s: 12.0),
    "thesis landscape, minibatch S = 1": (
        {"model": {"kind": "landscape", "landscape": "thesis", "start": "spurious"},
         "grid": {"lr": 3e-3, "batch_size": 1, "noise": "minibatch"}},
        lambda p, s: 30.0 * s),
    "thesis landscape, gaussian_matched": (
        {"model": {"kind": "landscape", "landscape": "thesis", "start": "real"},
         "grid": {"lr": 1e-3, "batch_size": 10, "noise": "gaussian_matched"}},
        # per sample: its gradient (34, an exponential counted as one) and the three products of
        # the 2 × 2 covariance (6); the noise itself is 2 normals times its Cholesky factor
        lambda p, s: 40.0 * p.n_samples),
}


class TimedGenerator:
    """A lane's generator that adds the seconds spent drawing to ``clock[0]``: its uniforms
    where the numpy engine draws them (``random(out=)``, once per lane and block) and, through
    :meth:`normals`, which stands in for :func:`sgdsweep.sim.noise.draw_normals` during a run, its
    normals. The kernels draw uniforms themselves from the PCG64 state (``bit_generator``), so
    there their cost is part of the compiled loop's."""

    def __init__(self, gen: np.random.Generator, clock: list[float]):
        self.gen, self.clock = gen, clock

    @property
    def bit_generator(self) -> np.random.BitGenerator:
        return self.gen.bit_generator

    def random(self, out: np.ndarray) -> None:
        t = time.perf_counter()
        self.gen.random(out=out)
        self.clock[0] += time.perf_counter() - t

    @staticmethod
    def normals(timed: TimedGenerator, out: np.ndarray) -> None:
        t = time.perf_counter()
        noise.draw_normals(timed.gen, out)
        timed.clock[0] += time.perf_counter() - t


def rate(cfg: dict[str, Any], steps: int, use_fused: bool = True) -> tuple[float, float, Any, int]:
    """(replica-steps/s, fraction of the time spent drawing random numbers, problem, S) of one
    bare run_lanes call of LANES lanes (``use_fused`` False: the numpy engine)."""
    point = build_sweep({"sweep": "bench", "dynamics": {"burn_in": 0, "steps": 10_000}, **cfg}).points[0]
    p = point.params
    model = get_model(p["model"])
    problem = model.make_problem(model.data_params(p))
    gens = replica_streams(0, point.hash, LANES)
    clock = [0.0]
    supports = kernels.supports
    if not use_fused:
        kernels.supports = lambda *a: False
    loop.draw_normals = engine.draw_normals = TimedGenerator.normals
    try:
        t0 = time.perf_counter()
        run_lanes(problem, noise=p["noise"], batch_size=int(p["batch_size"]), steps=steps,
                  lr=np.full(LANES, p["lr"]), momentum=np.zeros(LANES), burn_in=np.full(LANES, steps),
                  bound=np.full(LANES, 1e30), w0=np.array([problem.initial(p["init"], g[2]) for g in gens]),
                  streams=[[TimedGenerator(q, clock) for q in g[:2]] for g in gens],
                  observe=dataclasses.replace(observe_spec(p), escape=False))
        seconds = time.perf_counter() - t0
    finally:
        kernels.supports = supports
        loop.draw_normals = engine.draw_normals = noise.draw_normals
    return LANES * steps / seconds, clock[0] / seconds, problem, int(p["batch_size"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds, each measuring every case in turn; the best of each case is kept")
    ap.add_argument("--numpy", action="store_true", help="also run each case on the numpy engine")
    ap.add_argument("--match", default="", help="only the cases whose name contains this text (and the reference)")
    args = ap.parse_args()
    cases = {name: case for i, (name, case) in enumerate(CASES.items()) if i == 0 or args.match in name}
    steps = {}
    for name, (cfg, _) in cases.items():
        rate(cfg, 20)  # compile and build the problem
        steps[name] = max(500, int(rate(cfg, 500)[0] * args.seconds / LANES))
    best: dict[str, tuple] = {}
    for _ in range(args.repeat):  # rounds: every case sees the same minutes of this noisy machine
        for name, (cfg, _) in cases.items():
            got = rate(cfg, steps[name])
            if name not in best or got[0] > best[name][0]:
                best[name] = got
    print(f"{LANES} lanes, one thread, float64, bare steps, best of {args.repeat} round(s); replica-steps/s and"
          " per-flop ratio to linreg-ref; 'drawing': the share of the time spent drawing random numbers,"
          " 'without drawing': the per-flop ratio of the rest (the compiled loop) to the reference's")
    print(f"{'case':>36} {'replica-steps/s':>16} {'flops/step':>11} {'GFLOP/s':>8} {'per flop / ref':>15}"
          f" {'drawing':>8} {'without drawing':>16}"
          + (f" {'numpy engine':>13} {'fused/numpy':>12}" if args.numpy else ""))
    ref = ref_loop = None
    for name, (cfg, flops) in cases.items():
        r, drawing, problem, s = best[name]
        gflops = r * flops(problem, s) / 1e9
        loop = gflops / (1.0 - drawing)  # GFLOP/s of the compiled loop alone
        ref, ref_loop = ref or gflops, ref_loop or loop
        line = (f"{name:>36} {r:>16.3g} {flops(problem, s):>11.3g} {gflops:>8.2f} {gflops / ref:>15.3f}"
                f" {drawing:>8.0%} {loop / ref_loop:>16.3f}")
        if args.numpy:
            base = rate(cfg, max(20, int(r * args.seconds / LANES / 10)), use_fused=False)[0]
            line += f" {base:>13.3g} {r / base:>12.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
