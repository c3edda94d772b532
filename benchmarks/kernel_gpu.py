"""The GPU path (:mod:`sgdsweep.sim.gpu`, a CuPy kernel) on linreg-ref against JAX on the same GPU
and the CPU kernels of the same machine, all measured in one run. Needs CuPy and a CUDA device;
JAX is optional.

linreg-ref: linear regression, N = 100, P = 1000, S = 10, lr = 0.1, float64; one replica-step is
4·S·N flops. The GPU path draws S indices with replacement (``minibatch_replace``); the CPU
rows draw them as their own code does — the cost per step is the same.

Measured here, in this process:

- ``check``: the CuPy kernel against the numpy reference on a small case (same indices; the
  largest relative difference is printed and must be below 1e-9, or the run stops);
- ``cupy``: :class:`sgdsweep.sim.gpu.CupyEnsemble` at each R (one warp per replica, all steps of a
  launch on the chip; the timing covers the launches, not the copies to and from the host);
- ``jax``: ``kernel_linreg.jax_runner`` (the issue's "JAX vmap + lax.scan" row) on the same
  GPU, float64;
- the CPU of the same machine, all its threads: the issue's plain numba kernel and the
  sgdsweep compiled kernel (bare steps), from ``kernel_linreg.py``;
- the GPU's float64 GEMM TFLOP/s (CuPy matmul): the flop roofline, GEMM/(4·S·N); and the
  bandwidth at which the kernel reads the minibatch rows (8·S·N bytes per replica-step, from
  the L2 cache: the data, 800 kB, exceed an SM's L1), which is what bounds it.

    python benchmarks/kernel_gpu.py [--replicas 1024 16384 131072] [--seconds 1]
"""

from __future__ import annotations

import argparse
import time

import kernel_linreg as kl
import numba
import numpy as np

from sgdsweep.sim import gpu

LR, S = kl.LR, kl.S


def check() -> float:
    """Largest relative difference of the kernel against the reference (N = 100, 300 steps)."""
    data = _linreg()
    w0 = np.random.default_rng(0).standard_normal((67, data.n_inputs))
    kw = {"lr": LR, "momentum": 0.5, "batch_size": S, "steps": 300, "burn_in": 100, "w0": w0, "seed": 3}
    ref = gpu.run_reference(data, **kw)
    dev = gpu.run_cupy(data, **kw)
    return float(max(np.max(np.abs(dev.w_final - ref.w_final) / np.abs(ref.w_final).max()),
                     np.max(np.abs(dev.sq_dev / ref.sq_dev - 1))))


def _linreg():
    from sgdsweep.models import linear
    return linear.make_problem({"n_inputs": kl.N, "n_outputs": 1, "n_samples": kl.P, "label_noise": 0.5,
                                "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                "noiseless": False, "seed": 0})


def timed(fn, steps: int) -> float:
    t0 = time.perf_counter()
    fn(steps)
    return time.perf_counter() - t0


def rate(fn, replicas: int, seconds: float, probe: int = 20) -> float:
    """Replica-steps/s of ``fn(steps)``: probes of doubling length (until one lasts 0.1 s) size a
    run of about ``seconds``; best of 2."""
    fn(probe)
    while (elapsed := timed(fn, probe)) < 0.1 and probe < 10**7:
        probe *= 2
    steps = max(probe, int(seconds * probe / elapsed))
    return replicas * steps / min(timed(fn, steps) for _ in range(2))


def cupy_fn(data, replicas: int):
    ens = gpu.CupyEnsemble(data, lr=LR, momentum=0.0, batch_size=S, burn_in=0,
                           w0=np.zeros((replicas, data.n_inputs)), seed=0)

    def run(steps: int) -> None:
        ens.advance(steps)
        ens.synchronize()
    return run


def gemm_tflops(size: int = 8192) -> float:
    import cupy as cp
    a, b = cp.random.rand(size, size), cp.random.rand(size, size)
    a @ b
    cp.cuda.Stream.null.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        a @ b
    cp.cuda.Stream.null.synchronize()
    return 3 * 2 * size**3 / (time.perf_counter() - t0) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1024, 16384, 131072])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--no-jax", action="store_true")
    args = ap.parse_args()
    if not gpu.cupy_available():
        raise SystemExit("needs CuPy and a CUDA device")
    import cupy as cp
    data = _linreg()
    diff = check()
    print(f"check: CuPy kernel against the numpy reference, largest relative difference {diff:.2e}")
    if not diff < 1e-9:
        raise SystemExit("the kernel does not reproduce the reference")
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    tflops = gemm_tflops()
    roof = tflops * 1e12 / kl.FLOPS
    threads = numba.config.NUMBA_NUM_THREADS
    kern = gpu._kernel(kl.N)
    print(f"kernel: {kern.num_regs} registers per thread, {kern.local_size_bytes} bytes of local memory")
    print(f"linreg-ref on {name}, float64; GPU GEMM {tflops:.1f} TFLOP/s → roofline {roof:.3g} replica-steps/s; "
          f"CPU: {threads} threads")
    cpu = {}
    r_cpu = args.replicas[0]
    kl.numba_baseline(data, 2, 10)
    kl.sgdsweep_kernel(data, 2, 10, False, threads)
    cpu["numba"] = max(kl.numba_baseline(data, r_cpu, max(10, int(4e6 * args.seconds / r_cpu))) for _ in range(2))
    cpu["sgdsweep"] = max(kl.sgdsweep_kernel(data, r_cpu, max(10, int(4e6 * args.seconds / r_cpu)), False, threads)
                          for _ in range(2))
    print(f"CPU at R={r_cpu}: numba {cpu['numba']:.3g}, sgdsweep kernel (bare) {cpu['sgdsweep']:.3g} replica-steps/s")
    print(f"{'R':>7} {'cupy':>9} {'jax':>9} | {'cupy/jax':>8} {'cupy/numba':>10} {'cupy/sgdsweep':>13} "
          f"{'cupy/roof':>9} {'rows read':>9}")
    for r in args.replicas:
        g = rate(cupy_fn(data, r), r, args.seconds)
        j = float("nan")
        if not args.no_jax:
            try:
                fn, chunk = kl.jax_runner(data, r)
                j = rate(fn, r, args.seconds, probe=chunk)
            except Exception as exc:  # noqa: BLE001 - JAX missing or failing: the row keeps its CuPy number
                print(f"jax at R={r}: {type(exc).__name__}: {exc}")
        print(f"{r:>7} {g:>9.3g} {j:>9.3g} | {g / j:>8.1f} {g / cpu['numba']:>10.1f} {g / cpu['sgdsweep']:>13.1f} "
              f"{g / roof:>9.1%} {g * 8 * S * kl.N / 1e12:>6.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
