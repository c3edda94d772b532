"""Replicas of minibatch SGD on one-output linear regression on a CUDA GPU (CuPy), and its
numpy reference.

An opt-in GPU path: the CPU engine (:mod:`sgdsweep.sim.engine`, :mod:`sgdsweep.sim.kernels`)
stays the default and the one every sweep and CI run; this module runs the ensemble a GPU is
good at — many replicas of one linear-regression problem — and is measured in
``benchmarks/kernel_gpu.py``. Sweeps route points to it through ``execution.device``
(:mod:`sgdsweep.sweep.device`, docs/gpu.md) once it measures what a point store needs.

Dynamics (docs/physics.md §0, §2), per replica r, for steps t = 0 … steps − 1::

    g = (1/S) Σ_k (w·x_{i_k} − y_{i_k}) x_{i_k}      (i_k: S indices drawn with replacement)
    m ← μ m + g;   w ← w − λ m

with the loss L(w) = (1/2P) Σ_μ (w·x_μ − y_μ)², i.e. ``minibatch_replace`` noise, float64.

Randomness is counter-based, so that the GPU kernel and the numpy reference draw the same
indices and a replica's trajectory does not depend on the other replicas or on how the steps
are split into launches: i_k of replica r at step t is the high 32 bits of
``splitmix64(key_r + t·S + k)`` mapped to [0, P) by a multiply-shift, with
``key_r = splitmix64(seed ^ splitmix64(r))``. The streams differ from the CPU engine's
(:func:`sgdsweep.sim.noise.lane_streams`): the two paths agree in distribution, not bitwise.

Measured per replica (after each update; a step t counts when t ≥ ``burn_in``):

- ``sq_dev``: time mean of |w − ŵ|²/N — the weight variance Tr(M)/N of
  :func:`sgdsweep.theory.linear.weight_var` (ŵ the least-squares minimiser);
- ``w_final``, ``m_final``: weights and momentum buffer at the end, shape (R, N).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sgdsweep.models.affine import AffineProblem

#: Steps per kernel launch (a launch of 10⁴ steps of 10⁵ replicas lasts well under a second).
LAUNCH_STEPS = 10_000
#: Replicas (one warp each) per thread block of the kernel.
WARPS_PER_BLOCK = 4

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``z + golden`` on uint64 arrays (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def replica_keys(seed: int, replicas: int) -> np.ndarray:
    """Per-replica stream keys, shape (R,) uint64."""
    return splitmix64(np.uint64(seed) ^ splitmix64(np.arange(replicas, dtype=np.uint64)))


def batch_indices(keys: np.ndarray, step: int, batch_size: int, n_samples: int) -> np.ndarray:
    """The S sample indices of every replica at ``step``, shape (R, S) int64 in [0, P)."""
    counter = np.uint64(step * batch_size) + np.arange(batch_size, dtype=np.uint64)
    h = splitmix64(keys[:, None] + counter[None, :])
    return ((h >> np.uint64(32)) * np.uint64(n_samples) >> np.uint64(32)).astype(np.int64)


@dataclass(frozen=True)
class Run:
    """What one call measures; see the module docstring. Arrays are numpy, on the host."""

    sq_dev: np.ndarray
    w_final: np.ndarray
    m_final: np.ndarray


def _check(data: AffineProblem, lr: float, momentum: float, batch_size: int, steps: int,
           burn_in: int, w0: np.ndarray, seed: int) -> None:
    if data.n_outputs != 1 or data.metric is not None or data.offsets is not None:
        raise ValueError(f"the GPU path runs one-output linear regression without metric or offsets; "
                         f"got n_outputs={data.n_outputs}, metric={'set' if data.metric is not None else None}, "
                         f"offsets={'set' if data.offsets is not None else None}. Run it on the CPU engine.")
    if not lr > 0:
        raise ValueError(f"lr={lr!r}: must be > 0")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum={momentum!r}: must be in [0, 1)")
    if not 1 <= batch_size <= data.n_samples:
        raise ValueError(f"batch_size={batch_size!r}: must be in [1, {data.n_samples}] (P)")
    if not 0 <= burn_in < steps:
        raise ValueError(f"burn_in={burn_in!r}: must be in [0, steps={steps})")
    if w0.ndim != 2 or w0.shape[1] != data.n_inputs:
        raise ValueError(f"w0 has shape {w0.shape}: must be (replicas, {data.n_inputs})")
    if not (isinstance(seed, (int, np.integer)) and 0 <= seed < 2**64):
        raise ValueError(f"seed={seed!r}: must be an integer in [0, 2**64)")


def run_reference(data: AffineProblem, *, lr: float, momentum: float, batch_size: int, steps: int,
                  burn_in: int, w0: np.ndarray, seed: int) -> Run:
    """The dynamics in numpy, vectorised over the replicas (rows of ``w0``, shape (R, N))."""
    w0 = np.asarray(w0, dtype=np.float64)
    _check(data, lr, momentum, batch_size, steps, burn_in, w0, seed)
    x, y, w_star = data.x, data.y[:, 0], data.w_min
    w, m = w0.copy(), np.zeros_like(w0)
    keys = replica_keys(seed, len(w))
    acc = np.zeros(len(w))
    for t in range(steps):
        idx = batch_indices(keys, t, batch_size, data.n_samples)
        xb = x[idx]  # (R, S, N)
        e = np.einsum("rsn,rn->rs", xb, w) - y[idx]
        m = momentum * m + np.einsum("rs,rsn->rn", e, xb) / batch_size
        w = w - lr * m
        if t >= burn_in:
            acc += np.sum((w - w_star) ** 2, axis=1)
    return Run(acc / ((steps - burn_in) * data.n_inputs), w, m)


_COMMON = r"""
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double warp_sum(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ int sample_row(unsigned long long key, long long counter, int p) {
    const unsigned long long h = splitmix64(key + (unsigned long long)counter);
    return (int)(((h >> 32) * (unsigned long long)p) >> 32);
}
"""

# One warp per replica; lane l owns the components i = l + 32 j (j < NPL) of w, m and g, in
# registers; every lane draws the same indices, and the samples are taken one at a time.
_KERNEL = _COMMON + r"""
extern "C" __global__ void linreg_sgd(
        const double* __restrict__ x, const double* __restrict__ y,
        const double* __restrict__ w_star, const unsigned long long* __restrict__ keys,
        double* __restrict__ w, double* __restrict__ m, double* __restrict__ acc,
        int replicas, int n, int p, int s, double lr, double mu,
        long long t0, int n_steps, long long burn_in) {
    const int lane = threadIdx.x & 31;
    const int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (r >= replicas) return;
    double wr[NPL], mr[NPL], wsr[NPL];
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const int i = lane + 32 * j;
        const bool in = i < n;
        wr[j] = in ? w[(size_t)r * n + i] : 0.0;
        mr[j] = in ? m[(size_t)r * n + i] : 0.0;
        wsr[j] = in ? w_star[i] : 0.0;
    }
    const unsigned long long key = keys[r];
    const double inv_s = 1.0 / s;
    double total = 0.0;
    for (int t = 0; t < n_steps; ++t) {
        const long long step = t0 + t;
        double g[NPL];
#pragma unroll
        for (int j = 0; j < NPL; ++j) g[j] = 0.0;
        for (int k = 0; k < s; ++k) {
            const int row = sample_row(key, step * s + k, p);
            const double* xr = x + (size_t)row * n;
            double xv[NPL];
            double e = 0.0;
#pragma unroll
            for (int j = 0; j < NPL; ++j) {
                const int i = lane + 32 * j;
                xv[j] = i < n ? __ldg(xr + i) : 0.0;
                e += wr[j] * xv[j];
            }
            e = warp_sum(e) - __ldg(y + row);
#pragma unroll
            for (int j = 0; j < NPL; ++j) g[j] += e * xv[j];
        }
        double d2 = 0.0;
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
            mr[j] = mu * mr[j] + g[j] * inv_s;
            wr[j] -= lr * mr[j];
            const double dv = wr[j] - wsr[j];  // 0 on padding components
            d2 += dv * dv;
        }
        if (step >= burn_in) total += warp_sum(d2);
    }
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const int i = lane + 32 * j;
        if (i < n) { w[(size_t)r * n + i] = wr[j]; m[(size_t)r * n + i] = mr[j]; }
    }
    if (lane == 0) acc[r] += total;
}
"""

#: Largest N of the kernel (16 components of w, m and g per lane, in registers).
MAX_INPUTS = 512


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - ImportError, or CUDA without a device or driver (CuPy raises several types)
        return False


@functools.lru_cache(maxsize=32)
def _kernel(n_inputs: int):
    """The kernel compiled for N (its components per lane, ⌈N/32⌉, are a compile-time constant)."""
    import cupy as cp

    return cp.RawKernel(f"#define NPL {-(-n_inputs // 32)}\n" + _KERNEL, "linreg_sgd")


class CupyEnsemble:
    """R replicas resident on the GPU (the dynamics of :func:`run_reference`): ``advance`` runs
    steps without copying anything back, ``result`` copies the measurement to the host.

    Raises:
        RuntimeError: CuPy is not installed or sees no CUDA device.
        ValueError: a bad argument (named), or N beyond :data:`MAX_INPUTS`.
    """

    def __init__(self, data: AffineProblem, *, lr: float, momentum: float, batch_size: int, burn_in: int,
                 w0: np.ndarray, seed: int) -> None:
        if not cupy_available():
            raise RuntimeError("the GPU path needs CuPy and a CUDA device (pip install cupy-cuda12x or "
                               "cupy-cuda13x); without one, run the CPU engine")
        import cupy as cp

        w0 = np.asarray(w0, dtype=np.float64)
        _check(data, lr, momentum, batch_size, burn_in + 1, burn_in, w0, seed)
        if data.n_inputs > MAX_INPUTS:
            raise ValueError(f"n_inputs={data.n_inputs}: the GPU kernel runs N <= {MAX_INPUTS}; "
                             "run it on the CPU engine")
        self.replicas, self.n = w0.shape
        self._kernel = _kernel(self.n)
        self._scalars = (np.int32(self.replicas), np.int32(self.n), np.int32(data.n_samples),
                         np.int32(batch_size), np.float64(lr), np.float64(momentum))
        self.burn_in = burn_in
        self.step = 0
        self._x = cp.asarray(data.x)
        self._y = cp.asarray(np.ascontiguousarray(data.y[:, 0]))
        self._w_star = cp.asarray(data.w_min)
        self._keys = cp.asarray(replica_keys(seed, self.replicas))
        self._w = cp.asarray(w0)
        self._m = cp.zeros_like(self._w)
        self._acc = cp.zeros(self.replicas)

    def advance(self, steps: int) -> None:
        """Launch ``steps`` more steps (asynchronous: returns before the GPU is done)."""
        grid = (-(-self.replicas // WARPS_PER_BLOCK),)
        for t0 in range(self.step, self.step + steps, LAUNCH_STEPS):
            n_steps = min(LAUNCH_STEPS, self.step + steps - t0)
            self._kernel(grid, (32 * WARPS_PER_BLOCK,),
                         (self._x, self._y, self._w_star, self._keys, self._w, self._m, self._acc,
                          *self._scalars, np.int64(t0), np.int32(n_steps), np.int64(self.burn_in)))
        self.step += steps

    def synchronize(self) -> None:
        import cupy as cp

        cp.cuda.Stream.null.synchronize()

    def result(self) -> Run:
        """The measurement so far (needs steps beyond the burn-in)."""
        import cupy as cp

        if self.step <= self.burn_in:
            raise ValueError(f"{self.step} steps run: the measurement starts after burn_in={self.burn_in}")
        counted = (self.step - self.burn_in) * self.n
        return Run(cp.asnumpy(self._acc) / counted, cp.asnumpy(self._w), cp.asnumpy(self._m))


def run_cupy(data: AffineProblem, *, lr: float, momentum: float, batch_size: int, steps: int,
             burn_in: int, w0: np.ndarray, seed: int) -> Run:
    """The dynamics of :func:`run_reference` on the GPU (:class:`CupyEnsemble`), same arguments
    and the same result to rounding."""
    w0 = np.asarray(w0, dtype=np.float64)
    _check(data, lr, momentum, batch_size, steps, burn_in, w0, seed)
    ens = CupyEnsemble(data, lr=lr, momentum=momentum, batch_size=batch_size, burn_in=burn_in, w0=w0,
                       seed=seed)
    ens.advance(steps)
    return ens.result()
