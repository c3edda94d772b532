"""Variants of a kernel timed on one captured chunk, against the checkout's own kernel.

The shard benchmarks drift by 20–40 % within minutes here, more than most single kernel
changes gain or lose. This one takes a kernel change apart in one process: it runs the engine
briefly, keeps the arguments of one chunk of a kernel (32 lanes × one block of steps), and
then times that block loop (``KERNELS``) of the checkout's ``sgdsweep/sim/fused.py`` and of
each VARIANT — a copy of that file with a change — on copies of those arguments, round after
round, keeping each one's best. Three cases of the same chunk: as captured, with every step a
loss sample (stride 1), and in burn-in (nothing measured). Printed: ns per replica-step, the
ratio to the checkout's kernel, and the largest difference of any floating-point output from
it (0.0: the same numbers).

Chunks (float64, one thread): ``shard`` — two points of the small-model shard of
``kernel_shard.py`` (N = 10, S = 10, lr 0.3125 and 0.3375, momentum 0.3, loss stride 5), after
burn-in; ``linreg`` — linreg-ref (N = 100, S = 10), bare steps, so its three cases agree;
``double_well`` — 32 replicas of the double well (one parameter, gaussian noise, lr 0.05, loss
stride 2) after burn-in, in the additive kernel (``_advance_additive``); ``thesis`` — 32 replicas
of ``config/sweeps/vescovi_escape.yaml`` at lr 2.5e-3 (minibatch noise, S = 1, every step
measured, no loss series: its stride-1 case is the same), in ``_advance_thesis``.

    cp sgdsweep/sim/fused.py /tmp/v1.py   # edit /tmp/v1.py
    python benchmarks/kernel_variants.py /tmp/v1.py [/tmp/v2.py ...] [--chunk shard|linreg|double_well|thesis] [--rounds 40]
    git show 919e33d:sgdsweep/sim/fused.py > /tmp/old.py   # before the padded inputs: one problem argument fewer
    python benchmarks/kernel_variants.py /tmp/old.py --drop-shared 1

A variant is compiled without Numba's cache (its ``cache=True`` read as ``False``), so an
edited copy never meets a stale cache entry. Each file is compiled as its own module: give two
or three copies of each to see how much the same source varies between compilations (copies of
one file agreed within 2–4 % here; one variant once ran 30 % slower in burn-in, where its code
did not differ, than in an earlier process).
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
from sgdsweep.sim import fused
from sgdsweep.sim.simulate import simulate_points
from sgdsweep.sweep.config import build_sweep

#: The repository's root (its ``config/``).
ROOT = Path(__file__).resolve().parent.parent
#: Positions of the block loops' arguments that the cases change (see ``_advance_affine``).
BURN, STRIDE = 9, 11
#: The block loop each chunk runs.
KERNELS = {"shard": "_advance_affine", "linreg": "_advance_affine", "double_well": "_advance_additive",
           "thesis": "_advance_thesis"}


def capture(chunk: str) -> list:
    """The arguments of one call of the chunk's kernel while the engine runs ``chunk``."""
    calls: list[tuple[int, list]] = []
    advance = fused.advance

    def keep(kernel, shared, t0, *rest, **kw):
        def recorded(*args):
            calls.append((t0, [a.copy() if isinstance(a, np.ndarray) else a for a in args]))
            return kernel(*args)
        return advance(recorded, shared, t0, *rest, **kw)

    fused.advance = keep
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
            return next(args for t0, args in calls if t0 >= 512)  # after burn-in (100 steps, or none)
        if chunk == "shard":
            points = [p for p in kernel_shard.shard(3000)
                      if p.params["lr"] >= 0.3 and p.params["momentum"] == 0.3][:2]
            kernel_shard.engine_rate(points, 3000, 1, True)
            return next(args for t0, args in calls if t0 >= 512)  # after burn-in (300 steps)
        data = linear.make_problem({"n_inputs": kernel_linreg.N, "n_outputs": 1, "n_samples": kernel_linreg.P,
                                    "label_noise": 0.5, "inputs": "isotropic", "wishart_ratio": None,
                                    "labels": "teacher", "noiseless": False, "seed": 0})
        kernel_linreg.sgdsweep_kernel(data, 64, 1200, False, 1)
        return calls[1][1]
    finally:
        fused.advance = advance


def load_variant(path: Path, number: int):
    """``path`` (a copy of ``sgdsweep/sim/fused.py``) as module ``sgdsweep._variant<number>``, uncached."""
    source = path.read_text(encoding="utf-8").replace("cache=True", "cache=False")
    name = f"sgdsweep._variant{number}"
    with tempfile.TemporaryDirectory() as folder:  # compiled uncached: nothing is read back from it
        copy = Path(folder) / path.name
        copy.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, copy)
        module = importlib.util.module_from_spec(spec)
        module.__package__ = "sgdsweep"  # its relative imports resolve in the installed package
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def timed(kernel, args: list) -> tuple[float, list]:
    """Seconds of one call of ``kernel`` on copies of ``args``, and those copies afterwards."""
    own = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    t0 = time.perf_counter()
    kernel(*own)
    return time.perf_counter() - t0, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", type=Path, nargs="+", help="modified copies of sgdsweep/sim/fused.py")
    ap.add_argument("--chunk", choices=tuple(KERNELS), default="shard")
    ap.add_argument("--rounds", type=int, default=40, help="timed calls per kernel and case (the best is kept)")
    ap.add_argument("--drop-shared", type=int, default=0, metavar="K",
                    help="give the variants the captured arguments without their last K (the problem's): for a "
                         "copy of fused.py from before K problem arguments were added (1 for an affine kernel "
                         "without the padded-inputs argument)")
    args = ap.parse_args()
    for path in args.variants:
        if not path.is_file():
            raise SystemExit(f"{path}: no such file; give copies of sgdsweep/sim/fused.py with a change")
    captured = capture(args.chunk)
    stride_one, burn_in = list(captured), list(captured)
    stride_one[STRIDE] = np.ones_like(captured[STRIDE])
    burn_in[BURN] = np.full_like(captured[BURN], np.iinfo(np.int64).max)
    cases = {"as captured": captured, "stride 1": stride_one, "burn-in": burn_in}
    name = KERNELS[args.chunk]
    kernels = {"checkout": getattr(fused, name)}
    for i, path in enumerate(args.variants):
        variant = getattr(load_variant(path, i), name)
        kernels[f"{i + 1}: {path}"] = (lambda *a, v=variant: v(*a[:len(a) - args.drop_shared])) if args.drop_shared \
            else variant
    for kernel in kernels.values():  # compile
        for case in cases.values():
            timed(kernel, case)
    best = {(k, c): np.inf for k in kernels for c in cases}
    outputs: dict[tuple[str, str], list] = {}
    for _ in range(args.rounds):
        for k, kernel in kernels.items():
            for c, case in cases.items():
                seconds, outputs[k, c] = timed(kernel, case)
                best[k, c] = min(best[k, c], seconds)
    steps = captured[5].shape[0] * captured[1]  # lanes × steps
    print(f"{args.chunk} chunk: {captured[5].shape[0]} lanes × {captured[1]} steps, one thread, float64; "
          f"ns per replica-step, best of {args.rounds} (ratio: the checkout's time / the variant's)")
    for k in kernels:
        cells = []
        for c in cases:
            ns = best[k, c] / steps * 1e9
            ratio = best["checkout", c] / best[k, c]
            diff = max((float(np.max(np.abs(a - b))) for a, b in zip(outputs["checkout", c], outputs[k, c])
                        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size), default=0.0)
            cells.append(f"{c} {ns:6.1f} (×{ratio:.2f}, max diff {diff:.1e})")
        print(f"  {k:24s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
