"""Coverage of the fits' intervals and the report's false alarms, measured over many seeds.

Each design is a small sweep whose exact theory is known. It is simulated in this process (the
engine the workers run, no stores kept) once per seed — the seed changes the replicas' streams
and the data sets — and fitted as ``sgdsweep run`` fits it. For every comparison with the exact
theory the table gives how often the interval holds the theory's value (target 95 % ± 3 %), how
often its own p-value falls below 5 % and 0.5 % (a family-wise decision reads the far tail), and
per design how many reports would show any "disagrees": with each comparison read at its own
5 % level (no control), and with the report's Holm control (:mod:`sgdsweep.analysis.fit.family`).

    python benchmarks/calibration.py [--seeds 200] [--designs linear,escape]

Designs:

- ``linear``: the README's momentum example, smaller: linear regression N = 10, P/N = 8,
  λ ∈ {0.05, 0.1, 0.2} × S ∈ {4, 8} × μ ∈ {0, 0.5}, minibatch noise, 8,000 steps, 32 replicas:
  the power law's a and b and its point-by-point agreement per μ, both collapses.
- ``escape``: the 1-D double well (ΔL = 0.25, k = 2 and 1), gaussian noise σ² = 1.25, S = 1,
  λ ∈ {0.1, 0.125, 0.15, 0.2} (ΔL/T from 4 to 2), 256 replicas: the escape slope against the
  exact discrete chain's.
- ``flatness``: the two-layer network of ``config/models/two_layer.yaml`` (N = 4, teacher labels,
  λ = 0.02, S = 4), hidden widths 3 and 6, 20,000 steps, 16 replicas: ψ of W2 per point against
  the same fit of the exact spectrum, and the headline's check of the joint eigenvalue.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import numpy as np

DESIGNS: dict[str, dict[str, Any]] = {
    "linear": {"sweep": "calibration_linear", "model": {"kind": "linear", "n_inputs": 10, "label_noise": 0.5},
               "dynamics": {"steps": 8000, "replicas": 32},
               "grid": {"lr": [0.05, 0.1, 0.2], "batch_size": [4, 8], "momentum": [0.0, 0.5],
                        "samples_per_param": 8, "noise": "minibatch"}},
    "escape": {"sweep": "calibration_escape",
               "model": {"kind": "landscape", "landscape": "double_well", "barrier": 0.25, "curvature_min": 2.0,
                         "curvature_saddle": 1.0, "noise_std": math.sqrt(1.25)},
               "dynamics": {"steps": 20000, "replicas": 256, "burn_in": 0, "observe": {"loss": False}},
               "grid": {"lr": [0.1, 0.125, 0.15, 0.2], "batch_size": 1, "noise": "gaussian"},
               "fit": {"power_law": {"enabled": False}}},
    "flatness": {"sweep": "calibration_flatness",
                 "model": {"kind": "two_layer", "n_inputs": 4, "labels": "teacher", "label_noise": 1.0,
                           "init_scale": "glorot"},
                 "dynamics": {"steps": 20000, "replicas": 16},
                 "grid": {"lr": 0.02, "batch_size": 4, "samples_per_param": 1000, "hidden_width": [3, 6]},
                 "fit": {"power_law": {"enabled": False}, "linear_scaling": {"enabled": False}}},
}


def simulate_and_fit(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """The fits of ``config`` at ``seed``, simulated in this process as the workers would."""
    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.run.execute import make_batches
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store.aggregate import build_ensemble
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    with tempfile.TemporaryDirectory() as root:
        sweep = build_sweep(dict(config, seed=seed, results_dir=root))
        files = write_plan(sweep)
        for batch in make_batches([p.spec() for p in sweep.points], 16):
            simulate_points(batch, str(files.points_dir))
        ds = build_ensemble(json.loads(files.sweep_spec.read_text())).load()
        return fit_ensemble(ds, sweep.config["fit"])


def comparisons(fits: dict[str, Any]) -> list[tuple[str, bool | None, float, bool]]:
    """(name, theory inside the interval (None: a whole-fit test), p-value, Holm's "disagrees")
    of every comparison in ``fits``, as the report's family counts them."""
    from sgdsweep.analysis.fit.family import COMPARED, WHOLE_FIT

    out = []
    for kind, names in COMPARED.items():
        for res in fits.get(kind) or []:
            where = res.get("variable") or ",".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in res["group"].items())
            for name in names:
                label = f"{kind}[{where}] {name.lstrip('@')}"
                if name in WHOLE_FIT:
                    key, decision = WHOLE_FIT[name]
                    if res.get(key) is not None:
                        out.append((label, None, res[key], res[decision]))
                    continue
                q = (res.get("params") or {}).get(name)
                if q and q.get("pvalue") is not None:
                    out.append((label, q["theory_inside"], q["pvalue"], q["disagrees"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--designs", default=",".join(DESIGNS))
    args = parser.parse_args()
    print(f"{'design':8} {'comparison':44} {'seeds':>5} {'coverage':>8} {'[binomial 95 %]':>15} "
          f"{'p<5%':>6} {'p<0.5%':>6}")
    for design in args.designs.split(","):
        t0 = time.perf_counter()
        rows: dict[str, list[tuple[bool | None, float]]] = defaultdict(list)
        any_out = any_holm = 0
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            found = comparisons(simulate_and_fit(DESIGNS[design], seed))
            for name, inside, p, _ in found:
                rows[name].append((inside, p))
            any_out += any(p < 0.05 for _, _, p, _ in found)
            any_holm += any(d for *_, d in found)
        n = args.seeds
        band = 1.96 * math.sqrt(0.95 * 0.05 / n)
        for name, values in rows.items():
            inside = [v for v, _ in values if v is not None]
            p = np.array([p for _, p in values])
            cover = f"{np.mean(inside):8.3f}" if inside else f"{'—':>8}"
            print(f"{design:8} {name:44} {len(values):5d} {cover} {f'[{0.95 - band:.3f}, {0.95 + band:.3f}]':>15} "
                  f"{np.mean(p < 0.05):6.3f} {np.mean(p < 0.005):6.3f}")
        print(f"{design:8} {'reports with any p < 5 % (no control)':44} {n:5d} {any_out / n:8.3f}")
        print(f"{design:8} {'reports with any “disagrees” (Holm)':44} {n:5d} {any_holm / n:8.3f} "
              f"{'(target ≤ 0.05)':>15}   {time.perf_counter() - t0:.0f} s")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
