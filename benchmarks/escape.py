"""Escape runs: cost proportional to the sum of escape times, against masked stepping.

The engine compacts a lane out of the working set at the step it escapes, so an escape point
costs Σᵢ τᵢ replica-steps. The baseline, measured in the same run on the same lanes, is masked
stepping — every lane stepped until the last one escapes (R·max τ replica-steps): the same
engine with ``observe.escape`` off for max τ steps. Both use the escape sweep's landscape
(``config/sweeps/vescovi_escape.yaml``, the thesis landscape from its spurious minimum, S = 1).

    python benchmarks/escape.py [--lr 3.0e-3] [--replicas 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import yaml

from sgdsweep.models import get_model
from sgdsweep.sim.engine import run_lanes
from sgdsweep.sim.replicas import replica_streams
from sgdsweep.sim.shapes import observe_spec
from sgdsweep.sweep.config import build_sweep

CONFIG = Path(__file__).resolve().parents[1] / "config" / "sweeps" / "vescovi_escape.yaml"


def run(problem, params, steps: int, escape: bool) -> tuple[float, np.ndarray]:
    """(seconds, escape steps) of the point's lanes run for ``steps`` steps (the loss sampled
    every ``params["steps"] // 300`` steps in both runs: the same work per step)."""
    r = int(params["replicas"])
    gens = replica_streams(int(params["seed"]), "0123456789abcdef", r)
    observe = dataclasses.replace(observe_spec(params), escape=escape)
    t0 = time.perf_counter()
    with np.errstate(over="ignore"):  # masked lanes roam far past the barrier
        out = run_lanes(problem, noise=params["noise"], batch_size=int(params["batch_size"]), steps=steps,
                    lr=np.full(r, params["lr"]), momentum=np.zeros(r), burn_in=np.zeros(r, np.int64),
                        bound=np.full(r, 1e12), w0=np.array([problem.initial(params["init"], g[2]) for g in gens]),
                        streams=[g[:2] for g in gens], observe=observe,
                        loss_stride=np.full(r, max(1, int(params["steps"]) // 300)))
    return time.perf_counter() - t0, out["escape_step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lr", type=float, nargs="+", default=[3.0e-3, 3.5e-3])
    ap.add_argument("--replicas", type=int, default=256)
    args = ap.parse_args()
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["dynamics"]["replicas"] = args.replicas
    print(f"escape from the thesis landscape's spurious minimum, S = 1, {args.replicas} replicas")
    print(f"{'lr':>8} {'Σ τ':>10} {'R·max τ':>10} {'compacted s':>12} {'masked s':>9} {'speed-up':>9} "
          f"{'ideal':>7} {'µs per replica-step: compacted':>31} {'masked':>7}")
    for lr in args.lr:
        cfg["grid"]["lr"] = lr
        params = build_sweep(cfg).points[0].params
        model = get_model(params["model"])
        problem = model.make_problem(model.data_params(params))
        run(problem, params, 50, True)  # warm up
        t_c, tau = run(problem, params, int(params["steps"]), True)
        escaped = tau >= 0
        tau = np.where(escaped, tau + 1, int(params["steps"]))  # censored lanes ran every step
        total, longest = int(tau.sum()), int(tau.max())
        t_m, _ = run(problem, params, longest, False)
        print(f"{lr:>8.2e} {total:>10.3g} {args.replicas * longest:>10.3g} {t_c:>12.2f} {t_m:>9.2f} "
              f"{t_m / t_c:>9.2f} {args.replicas * longest / total:>7.2f} {t_c / total * 1e6:>31.2f} "
              f"{t_m / (args.replicas * longest) * 1e6:>7.2f}   ({escaped.sum()} of {args.replicas} escaped)",
              flush=True)


if __name__ == "__main__":
    main()
