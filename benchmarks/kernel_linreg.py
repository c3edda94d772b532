"""Kernel throughput on the reference problem "linreg-ref" against baselines and the roofline,
all measured in the same run.

linreg-ref: linear regression, N = 100 inputs, P = 1000 samples, S = 10, plain SGD, lr = 0.1,
float64, R replicas. Throughput is in replica-steps per second; one replica-step is 4·S·N flops
(the gradient: S dot products and S axpys of length N).

Measured here, in this process:

- ``numpy``: SGD vectorised over replicas with numpy (fancy-indexed minibatches, einsum);
- ``numba``: a plain numba kernel parallel over replicas (per-replica loop, per-sample dot and
  axpy, indices drawn inside numba) — the "numba, parallel over replicas" row of the issue;
- ``torch loop`` and ``torch bmm``: the issue's PyTorch CPU rows, a per-replica loop with
  ``nn.Linear`` + ``optim.SGD`` and the batched ``bmm`` (only where PyTorch is installed: run
  with ``--torch``; NaN otherwise);
- ``jax``: one replica's step vmapped over replicas inside a jitted ``lax.scan``, float64 — the
  issue's "JAX vmap + lax.scan" row (only where JAX is installed; NaN otherwise);
- ``sgdsweep``: :func:`sgdsweep.sim.engine.run_lanes` as a sweep runs it (the compiled kernel of
  :mod:`sgdsweep.sim.kernels`), bare (burn-in = all steps, nothing accumulated) and with the default
  observables (N×N second moment every step, train and test loss every eighth relaxation time),
  on 1 and on 2 threads (``SGDSWEEP_THREADS``; ``--threads`` for another second count);
- the roofline: float64 GEMM GFLOP/s (numpy matmul, all threads) → 4·S·N flops per replica-step;
  and the bandwidth of gathering S random rows of an N-column matrix of P rows (the minibatch
  reads; 800 kB of data: in L3 on a 512 KiB-L2 core, in L2 on a 1 MiB one) → 8·S·N bytes per
  replica-step. The roofline is the smaller of the two.

The last two columns are the roofline's own ratios to numba and JAX: no kernel can beat them,
so they say which speed-up targets this machine allows at all.

Each row is the best of ``--repeat`` rounds, and every round measures all columns and the
roofline one after the other: on these shared machines throughput drifts by 20–40 % over
minutes, and measuring the baselines in the same minutes as sgdsweep keeps that drift out of
the ratios.

    python benchmarks/kernel_linreg.py [--replicas 1 64 1024] [--seconds 2] [--repeat 3]
                                       [--threads 2] [--torch]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from sgdsweep.models import linear
from sgdsweep.sim.engine import run_lanes
from sgdsweep.sim.noise import lane_streams
from sgdsweep.sim.observables import ObserveSpec

N, P, S, LR = 100, 1000, 10, 0.1
FLOPS = 4 * S * N


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


@numba.njit(parallel=True, nogil=True)
def _numba_sgd(x, y, w, steps, lr, seed):  # pragma: no cover - compiled
    replicas, n = w.shape
    p = x.shape[0]
    for r in numba.prange(replicas):
        np.random.seed(seed + r)
        g = np.empty(n)
        for _ in range(steps):
            g[:] = 0.0
            for _k in range(S):
                row = np.random.randint(0, p)
                e = -y[row, 0]
                for i in range(n):
                    e += w[r, i] * x[row, i]
                for i in range(n):
                    g[i] += e * x[row, i]
            for i in range(n):
                w[r, i] -= lr / S * g[i]


def jax_runner(data, replicas: int, chunk: int = 100):
    """The issue's "JAX vmap + lax.scan (jit)" row: one replica's SGD step (S indices with
    replacement, float64) vmapped over the replicas, ``chunk`` steps per jitted ``lax.scan``, on
    JAX's default device. Returns (run(steps), chunk); raises ImportError without JAX."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    x, y = jnp.asarray(data.x), jnp.asarray(data.y[:, 0])

    def one(w, key):
        idx = jax.random.randint(key, (S,), 0, P)
        xb = x[idx]
        return w - LR * (xb.T @ (xb @ w - y[idx])) / S

    def step(w, key):
        return jax.vmap(one)(w, jax.random.split(key, replicas)), None

    block = jax.jit(lambda w, key: jax.lax.scan(step, w, jax.random.split(key, chunk))[0])
    state = {"w": jnp.zeros((replicas, N)), "key": jax.random.PRNGKey(0)}

    def run(steps: int) -> None:
        w = state["w"]
        for b in range(max(1, steps // chunk)):
            w = block(w, jax.random.fold_in(state["key"], b))
        w.block_until_ready()
    return run, chunk


def jax_baseline(data, replicas: int, steps: int) -> float:
    """Replica-steps/s of :func:`jax_runner` (compiled outside the timing); NaN without JAX."""
    try:
        run, chunk = jax_runner(data, replicas)
    except ImportError:
        return float("nan")
    run(chunk)
    steps = max(chunk, steps // chunk * chunk)
    t0 = time.perf_counter()
    run(steps)
    return replicas * steps / (time.perf_counter() - t0)


def torch_loop_baseline(data, replicas: int, steps: int) -> float:
    """The issue's "PyTorch CPU, per-replica loop with nn.Linear + optim.SGD" row: one model and
    optimiser per replica, stepped one after the other, float64; NaN without PyTorch."""
    try:
        import torch
    except ImportError:
        return float("nan")
    torch.manual_seed(0)
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y[:, 0])
    models = [torch.nn.Linear(N, 1, bias=False, dtype=torch.float64) for _ in range(replicas)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    t0 = time.perf_counter()
    for _ in range(steps):
        for model, opt in zip(models, opts):
            idx = torch.randint(0, P, (S,))
            opt.zero_grad()
            loss = 0.5 * ((model(x[idx])[:, 0] - y[idx]) ** 2).mean()
            loss.backward()
            opt.step()
    return replicas * steps / (time.perf_counter() - t0)


def torch_bmm_baseline(data, replicas: int, steps: int) -> float:
    """The issue's "PyTorch CPU, batched bmm" row: the replicas' minibatches gathered and
    multiplied with ``torch.bmm``, float64; NaN without PyTorch."""
    try:
        import torch
    except ImportError:
        return float("nan")
    x, y = torch.as_tensor(data.x), torch.as_tensor(data.y[:, 0])
    w = torch.zeros(replicas, N, 1, dtype=torch.float64)
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, P, (replicas, S))
        xb = x[idx]  # (R, S, N)
        e = torch.bmm(xb, w)[:, :, 0] - y[idx]
        w -= LR / S * torch.bmm(xb.transpose(1, 2), e[:, :, None])
    return replicas * steps / (time.perf_counter() - t0)


def numba_baseline(data, replicas: int, steps: int) -> float:
    """Replica-steps/s of a plain numba kernel parallel over replicas (all numba threads)."""
    w = np.zeros((replicas, N))
    t0 = time.perf_counter()
    _numba_sgd(data.x, data.y, w, steps, LR, 0)
    return replicas * steps / (time.perf_counter() - t0)


def sgdsweep_kernel(data, replicas: int, steps: int, accumulate: bool, threads: int = 1) -> float:
    """The engine as a sweep runs it; ``accumulate`` = the default observables (N×N second
    moment, losses every eighth relaxation time), otherwise bare steps (burn-in = all steps)."""
    streams = [lane_streams(q)[:2] for q in np.random.SeedSequence(0).spawn(replicas)]
    burn = np.zeros(replicas, np.int64) if accumulate else np.full(replicas, steps, np.int64)
    stride = max(1, int(data.relaxation_steps(LR, 0.0) / 8))
    os.environ["SGDSWEEP_THREADS"] = str(threads)
    t0 = time.perf_counter()
    run_lanes(data, noise="minibatch", batch_size=S, steps=steps, lr=np.full(replicas, LR),
              momentum=np.zeros(replicas), burn_in=burn, bound=np.full(replicas, 1e12),
              w0=np.zeros((replicas, N)), streams=streams,
              observe=ObserveSpec(cov_max_dim=N, autocorr_stride=stride))
    return replicas * steps / (time.perf_counter() - t0)


def gemm_gflops(size: int = 1500) -> float:
    """float64 GEMM GFLOP/s of numpy's BLAS on all its threads."""
    a, b = np.random.rand(size, size), np.random.rand(size, size)
    a @ b
    t0 = time.perf_counter()
    for _ in range(3):
        a @ b
    return 3 * 2 * size**3 / (time.perf_counter() - t0) / 1e9


@numba.njit(nogil=True, fastmath={"reassoc", "contract"})
def _gather_sum(x, rows):  # pragma: no cover - compiled
    acc = np.zeros(x.shape[1])
    for r in rows:
        for i in range(x.shape[1]):
            acc[i] += x[r, i]
    return acc


def gather_bandwidth(data, threads: int, rows: int = 2_000_000) -> float:
    """GB/s of reading random whole rows of the data matrix (the minibatch reads), summed over
    ``threads`` threads."""
    idx = [np.random.default_rng(t).integers(0, P, rows) for t in range(threads)]
    _gather_sum(data.x, idx[0][:10])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: _gather_sum(data.x, r), idx))
    return threads * rows * N * 8 / (time.perf_counter() - t0) / 1e9


def best(fn, repeat: int) -> float:
    """The best of ``repeat`` measurements (these machines are noisy; the best is the least
    disturbed)."""
    return max(fn() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--seconds", type=float, default=1.0, help="target duration of each measurement")
    ap.add_argument("--repeat", type=int, default=3, help="measurements per number (the best is kept)")
    ap.add_argument("--torch", action="store_true", help="also the PyTorch rows (needs torch)")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of the second sgdsweep column, the one the ratios use (default 2)")
    args = ap.parse_args()
    data = linear.make_problem({"n_inputs": N, "n_outputs": 1, "n_samples": P, "label_noise": 0.5,
                                "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                "noiseless": False, "seed": 0})
    threads = numba.config.NUMBA_NUM_THREADS
    sgdsweep_kernel(data, 2, 10, True)  # compile outside the timings
    numba_baseline(data, 2, 10)
    print(f"linreg-ref: N={N}, P={P}, S={S}, lr={LR}, float64, {threads} threads; replica-steps/s (best of "
          f"{args.repeat} rounds, each measuring every column and the roofline in turn)")
    print("roofline = min(GEMM GFLOP/s / (4·S·N flops), row-gather GB/s / (8·S·N bytes)),"
          " measured in each row's rounds")
    t = f"{args.threads}t"
    print(f"{'R':>5} {'numpy':>9} {'numba':>9} {'jax':>9} | {'bare 1t':>9} {'bare ' + t:>9} {'+obs 1t':>9} "
          f"{'+obs ' + t:>9} | {'GEMM':>6} {'gather':>7} {'roofline':>9} | {t + '/numpy':>8} {t + '/numba':>8} "
          f"{t + '/jax':>7} {t + '/roof':>7} | {'roof/numba':>10} {'roof/jax':>8}")
    for r in args.replicas:
        row = measure_row(data, r, args.seconds, args.repeat, args.threads)
        base, nb, jx, bare, obs = row["numpy"], row["numba"], row["jax"], row["bare"], row["observed"]
        roof = min(row["gemm"] * 1e9 / FLOPS, row["gather"] * 1e9 / (8 * S * N))
        if args.torch:
            loop = torch_loop_baseline(data, min(r, 64), max(2, int(2e3 * args.seconds / min(r, 64))))
            bmm = best(lambda r=r: torch_bmm_baseline(data, r, max(10, int(3e5 * args.seconds / r))), args.repeat)
            print(f"{r:>5} torch loop {loop:.3g} (over {min(r, 64)} replicas), torch bmm {bmm:.3g}; "
                  f"sgdsweep bare {t} / loop {bare[1] / loop:.0f}, / bmm {bare[1] / bmm:.1f}")
        print(f"{r:>5} {base:>9.3g} {nb:>9.3g} {jx:>9.3g} | {bare[0]:>9.3g} {bare[1]:>9.3g} {obs[0]:>9.3g} "
              f"{obs[1]:>9.3g} | {row['gemm']:>6.1f} {row['gather']:>7.1f} {roof:>9.3g} | {bare[1] / base:>8.1f} "
              f"{bare[1] / nb:>8.2f} {bare[1] / jx:>7.1f} {bare[1] / roof:>7.0%} | {roof / nb:>10.2f} "
              f"{roof / jx:>8.1f}", flush=True)


def measure_row(data, replicas: int, seconds: float, repeat: int, threads: int = 2) -> dict:
    """Every implementation at ``replicas`` replicas, and the roofline's GEMM and gather
    bandwidth, each the best of ``repeat`` rounds; a round measures every one of them in turn,
    so that each sees the same minutes of this noisy machine (a quiet or a busy minute then
    moves all numbers, not a ratio). sgdsweep on 1 and ``threads`` threads."""
    def steps(rate: float) -> int:
        return max(10, int(rate * seconds / replicas))

    fns = {"numpy": lambda: numpy_baseline(data, replicas, steps(3e5 if replicas > 1 else 3e4)),
           "numba": lambda: numba_baseline(data, replicas, steps(3e6)),
           "jax": lambda: jax_baseline(data, replicas, steps(8e5)),
           "gemm": gemm_gflops,
           "gather": lambda: gather_bandwidth(data, numba.config.NUMBA_NUM_THREADS)}
    for t in (1, threads):
        fns[f"bare {t}"] = lambda t=t: sgdsweep_kernel(data, replicas, steps(1.5e6 * t), False, t)
        fns[f"observed {t}"] = lambda t=t: sgdsweep_kernel(data, replicas, steps(3e5 * t), True, t)
    rounds = [{k: fn() for k, fn in fns.items()} for _ in range(repeat)]
    got = {k: max(r[k] for r in rounds) for k in fns}
    got["bare"] = [got[f"bare {t}"] for t in (1, threads)]
    got["observed"] = [got[f"observed {t}"] for t in (1, threads)]
    return got


if __name__ == "__main__":
    main()
