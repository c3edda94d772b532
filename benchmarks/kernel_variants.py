"""Variants of a kernel family timed on one captured chunk, against the checkout's own kernel.

It runs the engine briefly, keeps the arguments of one chunk of a kernel (32 lanes × one block
of steps), and then times that kernel of the checkout (its family's ``KERNELS`` in
``sgdsweep/sim/kernels/``) and of each VARIANT — a copy of that family's module with a change —
on copies of those arguments, round after round, keeping each one's best. Three cases of the
same chunk: as captured, with every step a loss sample (stride 1), and in burn-in (nothing
measured). Printed: ns per replica-step, the ratio to the checkout's kernel, and the largest
difference of any floating-point output from it (0.0: the same numbers).

Chunks (float64, one thread): ``shard`` — two points of the small-model shard of
``kernel_shard.py`` (N = 10, S = 10, lr 0.3125 and 0.3375, momentum 0.3, loss stride 5), after
burn-in, family ``affine``; ``linreg`` — linreg-ref (N = 100, S = 10), bare steps, so its three
cases agree, ``affine``; ``double_well`` — 32 replicas of the double well (one parameter,
gaussian noise, lr 0.05, loss stride 2) after burn-in, ``additive``; ``thesis`` — 32 replicas of
``config/sweeps/vescovi_escape.yaml`` at lr 2.5e-3 (minibatch noise, S = 1, every step measured,
no loss series: its stride-1 case is the same), ``thesis``.

    cp sgdsweep/sim/kernels/affine.py /tmp/v1.py   # edit /tmp/v1.py
    python benchmarks/kernel_variants.py /tmp/v1.py [/tmp/v2.py ...] \
        [--chunk shard|linreg|double_well|thesis] [--rounds 40]

A variant is compiled without Numba's cache, so an edited copy never meets a cache entry. Each
file is compiled as its own module: give two or three copies of each to see how much the same
source varies between compilations.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import kernel_linreg
import kernel_shard
import numpy as np
import yaml

from sgdsweep.models import linear
from sgdsweep.run.simulate import simulate_points
from sgdsweep.sim import kernels as kernels_pkg
from sgdsweep.sim.kernels import FAMILIES
from sgdsweep.sweep.config import build_sweep

#: The repository's root (its ``config/``).
ROOT = Path(__file__).resolve().parent.parent
#: The kernel family each chunk runs.
FAMILY = {"shard": "affine", "linreg": "affine", "double_well": "additive", "thesis": "thesis"}


def _copied(args: tuple) -> tuple:
    """A kernel's arguments with their arrays copied (the lane state's too)."""
    return tuple(kernels_pkg.Lanes._make(a.copy() for a in x) if isinstance(x, kernels_pkg.Lanes)
                 else x.copy() if isinstance(x, np.ndarray) else x for x in args)


def capture(chunk: str) -> tuple[int, tuple]:
    """Which of its family's two kernels one call ran while the engine ran ``chunk`` (0: with
    Σδδᵀ), and the arguments of that call."""
    calls: list[tuple[int, int, tuple]] = []
    advance = kernels_pkg.advance

    def keep(pair, common, data, t0, *rest, **kw):
        def recorder(which):
            def recorded(*args):
                calls.append((t0, which, _copied(args)))
                return pair[which](*args)
            return recorded
        return advance((recorder(0), recorder(1)), common, data, t0, *rest, **kw)

    kernels_pkg.advance = keep
    try:
        if chunk in ("double_well", "thesis"):
            if chunk == "double_well":
                config = {"sweep": "dw", "model": {"kind": "landscape", "landscape": "double_well"},
                          "dynamics": {"steps": 2000, "replicas": 32, "burn_in": 100},
                          "grid": {"lr": 0.05, "batch_size": 1, "noise": "gaussian"}}
            else:
                config = yaml.safe_load((ROOT / "config" / "sweeps" / "vescovi_escape.yaml").read_text())
                config["grid"]["lr"] = [2.5e-3]
                config["dynamics"].update(steps=2000, replicas=32)
            point = build_sweep(config).points[0]
            with tempfile.TemporaryDirectory() as out:
                simulate_points([point.spec()], out)
            return next((which, args) for t0, which, args in calls if t0 >= 512)  # after burn-in
        if chunk == "shard":
            points = [p for p in kernel_shard.shard(3000)
                      if p.params["lr"] >= 0.3 and p.params["momentum"] == 0.3][:2]
            kernel_shard.engine_rate(points, 3000, 1, True)
            return next((which, args) for t0, which, args in calls if t0 >= 512)  # after burn-in (300 steps)
        data = linear.make_problem({"n_inputs": kernel_linreg.N, "n_outputs": 1, "n_samples": kernel_linreg.P,
                                    "label_noise": 0.5, "inputs": "isotropic", "wishart_ratio": None,
                                    "labels": "teacher", "noiseless": False, "seed": 0})
        kernel_linreg.sgdsweep_kernel(data, 64, 1200, False, 1)
        return calls[1][1:]
    finally:
        kernels_pkg.advance = advance


def load_variant(path: Path, number: int):
    """``path`` (a copy of a family's module) as module ``sgdsweep.sim.kernels._variant<number>``,
    compiled without Numba's cache."""
    source = path.read_text(encoding="utf-8").replace("cache=True", "cache=False").replace(
        "make_kernels(sys.modules[__name__]", "make_kernels(sys.modules[__name__], cache=False")
    name = f"sgdsweep.sim.kernels._variant{number}"
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / path.name
        copy.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, copy)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def timed(kernel, args: tuple) -> tuple[float, tuple]:
    """Seconds of one call of ``kernel`` on copies of ``args``, and those copies afterwards."""
    own = _copied(args)
    t0 = time.perf_counter()
    kernel(*own)
    return time.perf_counter() - t0, own


def _outputs(args: tuple) -> list[np.ndarray]:
    """The floating-point arrays among a kernel's arguments (the lane state's too)."""
    out: list[np.ndarray] = []
    for x in args:
        for a in (x if isinstance(x, kernels_pkg.Lanes) else (x,)):
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size:
                out.append(a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", type=Path, nargs="+", help="modified copies of a module of sgdsweep/sim/kernels/")
    ap.add_argument("--chunk", choices=tuple(FAMILY), default="shard")
    ap.add_argument("--rounds", type=int, default=40, help="timed calls per kernel and case (the best is kept)")
    args = ap.parse_args()
    for path in args.variants:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file; give copies of sgdsweep/sim/kernels/{FAMILY[args.chunk]}.py "
                             "with a change")
    which, captured = capture(args.chunk)
    lanes = captured[4]
    cases = {"as captured": captured,
             "stride 1": captured[:4] + (lanes._replace(stride=np.ones_like(lanes.stride)),) + captured[5:],
             "burn-in": captured[:4] + (lanes._replace(burn=np.full_like(lanes.burn, np.iinfo(np.int64).max)),)
             + captured[5:]}
    kernels = {"checkout": FAMILIES[FAMILY[args.chunk]].KERNELS[which]}
    for i, path in enumerate(args.variants):
        kernels[f"{i + 1}: {path}"] = load_variant(path, i).KERNELS[which]
    for kernel in kernels.values():  # compile
        for case in cases.values():
            timed(kernel, case)
    best = {(k, c): np.inf for k in kernels for c in cases}
    outputs: dict[tuple[str, str], tuple] = {}
    for _ in range(args.rounds):
        for k, kernel in kernels.items():
            for c, case in cases.items():
                seconds, outputs[k, c] = timed(kernel, case)
                best[k, c] = min(best[k, c], seconds)
    steps = lanes.w.shape[0] * captured[1]  # lanes × steps
    print(f"{args.chunk} chunk: {lanes.w.shape[0]} lanes × {captured[1]} steps, one thread, float64; "
          f"ns per replica-step, best of {args.rounds} (ratio: the checkout's time / the variant's)")
    for k in kernels:
        cells = []
        for c in cases:
            ns = best[k, c] / steps * 1e9
            ratio = best["checkout", c] / best[k, c]
            diff = max((float(np.max(np.abs(a - b))) for a, b in zip(_outputs(outputs["checkout", c]),
                                                                   _outputs(outputs[k, c]))), default=0.0)
            cells.append(f"{c} {ns:6.1f} (×{ratio:.2f}, max diff {diff:.1e})")
        print(f"  {k:24s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
