"""The simulation engine: many lanes (point × replica) of one problem advanced together.

A *lane* is one replica of one point. The lanes of a call share the problem, the batch size,
the noise type and the dynamics; learning rate, momentum and burn-in are per lane. Each step is
one vectorised update of every working lane:

- ``sgd``: heavy-ball SGD (docs/physics.md §0), ``m ← μ m + g; w ← w − λ m`` with g the noisy
  gradient of the noise type (:mod:`sgdsweep.sim.noise`);
- ``sde``: Euler–Maruyama for the SDE ``dw = −∇L dt + √(λ C) dW`` (time t = λ·steps, C the
  per-step noise covariance of SGD), with its own step ``dt = dt_over_lr · λ``:
  ``w ← w − dt ∇L − √(dt λ) ξ``, ξ ~ N(0, C). With dt = λ it is SGD with Gaussian noise.

A lane that diverges (|w − w*|² beyond its bound, or not finite) or escapes (``observe.escape``)
is flagged with the step and compacted out of the working set: it stops costing compute.
Randomness: :func:`sgdsweep.sim.noise.lane_streams`; results do not depend on the other lanes.

Where :mod:`sgdsweep.sim.kernels` has a compiled kernel for the model, noise type and dynamics —
every model and noise type a config can name: single and two layers with sampled or added
noise, the quadratic, double-well and thesis landscapes — each block of steps runs there
instead of the per-step numpy loop below, on the same random numbers. The numpy loop is the
reference implementation the kernels are tested against, and runs any combination without a
kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sgdsweep.models.base import ADDED_NOISE, Problem
from sgdsweep.sim import kernels, pcg64
from sgdsweep.sim import observables as obs
from sgdsweep.sim.noise import (
    MODE,
    added_noise,
    draw_normals,
    normals_per_step,
    sample_indices,
    uniforms_per_step,
)

# Defined there for the planner's memory estimate and for the shard job that groups points into
# calls (BATCH_VARYING: the parameters that may differ between the points of one call), which
# import neither Numba nor the kernels.
from sgdsweep.sim.shapes import BATCH_VARYING, BLOCK_RANDOM_NUMBERS

__all__ = ["BATCH_VARYING", "BLOCK_RANDOM_NUMBERS", "BLOCK_STEPS", "Dynamics", "LaneSet", "lane_state", "run_lanes",
           "update_obs"]

#: Longest block of steps.
BLOCK_STEPS = 512


@dataclass(frozen=True)
class Dynamics:
    """How lanes move: ``kind`` sgd or sde, and the SDE step as a fraction of lr."""

    kind: str = "sgd"
    dt_over_lr: float = 1.0

    @property
    def substeps(self) -> int:
        """Integrator steps per SGD-equivalent step (1 for sgd)."""
        return 1 if self.kind == "sgd" else int(round(1.0 / self.dt_over_lr))


def run_lanes(problem: Problem, *, noise: str, batch_size: int, steps: int, lr: np.ndarray,
              momentum: np.ndarray, burn_in: np.ndarray, bound: np.ndarray, w0: np.ndarray,
              streams: list[tuple[np.random.Generator, np.random.Generator]],
              observe: obs.ObserveSpec, dynamics: Dynamics = Dynamics(),
              loss_stride: np.ndarray | None = None,
              progress: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Advance L lanes for ``steps`` integrator steps and return their accumulators.

    Args:
        problem: the shared problem.
        noise: noise type (must be in ``problem.noise_types``).
        batch_size: S.
        steps: integrator steps (SGD steps, or SDE steps of size dt).
        lr, momentum, burn_in, bound: per-lane λ, μ, burn-in (integrator steps) and bound on
            |w − w*|² (|w|² when the model has no unique minimum), shapes (L,).
        w0: initial weights, shape (L, d).
        streams: per lane, its (uniforms, normals) generators.
        observe: what to accumulate.
        dynamics: sgd or sde.
        loss_stride: per lane, integrator steps between loss samples (default
            ``observe.autocorr_stride``); per lane, so that a lane's results do not depend on
            the other lanes of the call.
        progress: called after each block of steps (at most :data:`BLOCK_STEPS`) with the
            integrator steps done so far, out of ``steps``.

    Returns:
        name → full-size (L, …) arrays: the accumulators of :mod:`sgdsweep.sim.observables`,
        ``w_final`` (the weights when the lane stopped or at the end), ``diverged_step`` and
        ``escape_step`` (−1 when it did not happen).
    """
    n_lanes, d = w0.shape
    per_lane_ref = problem.w_min is None
    acc = obs.Accumulators.create(n_lanes, problem, observe, per_lane_ref)
    mu = np.asarray(momentum, dtype=np.float64)
    use_momentum = bool(np.any(mu != 0.0))
    w = np.array(w0, dtype=np.float64)
    ref = problem.w_min
    sde = dynamics.kind == "sde"
    dt_over_lr = dynamics.dt_over_lr if sde else 1.0  # the integrator's step is dt = λ·dt_over_lr
    noise_scale = np.sqrt(1.0 / dynamics.dt_over_lr) if sde else 1.0
    gaussian_var = problem.gaussian_noise_var(batch_size) if (
        noise == "gaussian" and problem.noise_cov is None) else 0.0

    n_u = uniforms_per_step(noise, batch_size)
    n_z = normals_per_step(noise, problem, batch_size)
    if noise in MODE:
        n_batches = max(1, problem.n_samples // batch_size)
    noise_lags = obs.noise_lag_list(observe) if "noise_lag" in acc.arrays else []
    lanes = LaneSet(
        n_lanes=n_lanes, n_u=n_u, acc=acc, ids=np.arange(n_lanes), w=w,
        mom=np.zeros_like(w) if use_momentum else None, lr=np.asarray(lr, dtype=np.float64), mu=mu,
        burn=np.asarray(burn_in, dtype=np.int64), bound=np.asarray(bound, dtype=np.float64),
        stride=np.maximum(1, np.asarray(loss_stride if loss_stride is not None
                                        else np.full(n_lanes, observe.autocorr_stride), dtype=np.int64)),
        perm=np.tile(np.arange(problem.n_samples, dtype=np.int64), (n_lanes, 1)) if noise in MODE else None,
        pos=np.zeros(n_lanes, np.int64) if noise in MODE else None,
        gu=[s[0] for s in streams], gz=[s[1] for s in streams])
    per_step = max(1, n_u + n_z)
    use_kernel = kernels.supports(problem, noise, dynamics.kind, noise_lags, observe.escape) and (
        n_u == 0 or all(pcg64.is_pcg64(g) for g in lanes.gu))  # the kernels draw uniforms from PCG64 states
    if use_kernel:
        omega = (obs.sketch_matrix(d, acc.arrays["sketch"].shape[2]) if "sketch" in acc.arrays
                 else np.zeros((0, 0)))
        kernel = kernels.prepare(problem, noise, batch_size, noise_scale, dt_over_lr, omega, observe.loss,
                                 observe.test_loss, observe.escape, noise_lags)
        n_threads = kernels.threads()
        lanes.ust = pcg64.states(lanes.gu) if n_u else np.zeros((n_lanes, 4), np.uint64)
    t0 = 0
    while use_kernel and t0 < steps and lanes.ids.size:  # compiled blocks; normals drawn per lane chunk
        nb = int(max(1, min(steps - t0, BLOCK_STEPS, BLOCK_RANDOM_NUMBERS // (kernels.CHUNK_LANES * max(1, n_z)))))
        state = lanes.kernel_state()
        kernels.advance(kernel.pair, kernel.common, kernel.data, t0, nb, state, lanes.gz, n_u, n_z, n_threads)
        if state.stopped.any():
            lanes.stop(state.stopped)
        t0 += nb
        if progress is not None:
            progress(t0)
    while t0 < steps and lanes.ids.size:
        n_work = lanes.ids.size
        nb = int(max(1, min(steps - t0, BLOCK_STEPS, BLOCK_RANDOM_NUMBERS // (n_work * per_step))))
        idx_block = z_block = None
        if n_u:
            u = np.empty((n_work, nb, n_u))
            for i, g in enumerate(lanes.gu):
                g.random(out=u[i])
            idx_block = sample_indices(u, lanes.perm, lanes.pos, MODE[noise], n_batches)
        if n_z:
            z_block = np.empty((n_work, nb, n_z))
            for i, g in enumerate(lanes.gz):
                draw_normals(g, z_block[i])
        for s in range(nb):
            t = t0 + s
            # the working lanes' arrays for this step (lanes.stop, at its end, replaces them)
            w, mom, lr_, mu_ = lanes.w, lanes.mom, lanes.lr, lanes.mu
            idx = idx_block[:, s] if idx_block is not None else None
            z = z_block[:, s] if z_block is not None else None
            eps = None
            if noise == "label":
                eps = problem.label_noise * z.reshape(lanes.ids.size, batch_size, problem.n_outputs)
                g = problem.grad(w, idx, eps)
            elif noise in ADDED_NOISE:
                g = problem.grad(w) + noise_scale * added_noise(noise, problem, w, z, batch_size, gaussian_var)
            else:
                g = problem.grad(w, idx)
            dt = lr_ * dt_over_lr
            if mom is not None:
                mom *= mu_[:, None]
                mom += g
                w -= dt[:, None] * mom
            else:
                w -= dt[:, None] * g
            delta = w - ref if ref is not None else w
            d2 = np.einsum("ld,ld->l", delta, delta)
            bad = ~(d2 <= lanes.bound)
            escaped = None
            if observe.escape:
                escaped = problem.escaped(w)
            measuring = t >= lanes.burn
            if measuring.any():
                sel = None if measuring.all() else measuring
                if per_lane_ref:
                    r = acc.arrays["reference"]
                    first = np.isnan(r[:, 0]) & measuring
                    if first.any():
                        r[first] = w[first]
                    delta = w - r
                if bad.any():  # never let a diverging step into the sums
                    sel = measuring & ~bad
                update_obs(acc, problem, observe, w, delta, sel, t, lanes.stride, idx, eps, noise_lags)
            stopping = bad.copy()
            if bad.any():
                acc.arrays["diverged_step"][bad] = t
            if escaped is not None and escaped.any():
                acc.arrays["escape_step"][escaped & ~bad] = t
                stopping |= escaped
            if stopping.any():
                lanes.stop(stopping)
                if idx_block is not None:
                    idx_block = idx_block[~stopping]
                if z_block is not None:
                    z_block = z_block[~stopping]
                if not lanes.ids.size:
                    break
        t0 += nb
        if progress is not None:
            progress(t0)
    return lanes.finish()


@dataclass(eq=False)
class LaneSet:
    """The working lanes of one :func:`run_lanes` call, and the full-size results of those that stopped.

    Every per-lane array holds one row per *working* lane, in the order of ``ids`` (their
    indices in the call, 0 … ``n_lanes`` − 1); ``acc`` holds their accumulators. :meth:`stop`
    moves the rows of the lanes that stop into ``out`` (the call's full-size results, made at the
    first stop) and drops them from every working array, so the engine never rebinds a lane's
    array itself: it reads them from here after each stop.

    Attributes:
        n_lanes: lanes of the call.
        n_u: uniforms per step (0: the lanes draw none, ``ust`` is not stored back).
        acc: the working lanes' accumulators (:class:`sgdsweep.sim.observables.Accumulators`).
        ids: the working lanes' indices in the call, shape (n,).
        w, mom: weights and momentum buffers, shape (n, d); ``mom`` None when no lane has momentum.
        lr, mu, burn, bound, stride: per lane λ, μ, burn-in (integrator steps), bound on
            |w − w*|², loss stride (integrator steps), shapes (n,).
        perm, pos: the sampling permutation (n, P) and position (n,) of an epoch-style noise
            type, None for the others.
        gu, gz: the working lanes' uniform and normal generators.
        ust: their PCG64 states (:func:`sgdsweep.sim.pcg64.states`) while compiled kernels draw
            their uniforms, shape (n, 4); None on the numpy loop.
        out: name → full-size (n_lanes, …) results of the lanes that stopped; None until one does.
    """

    n_lanes: int
    n_u: int
    acc: obs.Accumulators
    ids: np.ndarray
    w: np.ndarray
    mom: np.ndarray | None
    lr: np.ndarray
    mu: np.ndarray
    burn: np.ndarray
    bound: np.ndarray
    stride: np.ndarray
    perm: np.ndarray | None
    pos: np.ndarray | None
    gu: list[np.random.Generator]
    gz: list[np.random.Generator]
    ust: np.ndarray | None = None
    out: dict[str, np.ndarray] | None = None

    def kernel_state(self) -> kernels.Lanes:
        """The working lanes as the kernels take them (:func:`lane_state`; ``ust`` must be set)."""
        return lane_state(self.acc.arrays, self.ust, self.w, self.mom, self.lr, self.mu, self.burn,
                          self.bound, self.stride, self.perm, self.pos)

    def stop(self, mask: np.ndarray) -> None:
        """Stop the working lanes where ``mask`` (bool, shape (n,)) is true: write their
        accumulators and ``w_final`` into ``out`` and drop their rows. A stopping lane's uniform
        generator continues where its kernel stopped. When every lane of the call stops at once
        and none before, the working arrays themselves become ``out`` (no copy)."""
        if self.ust is not None:  # the stopping lanes' generators continue where their kernel stopped
            if self.n_u:
                pcg64.store([g for g, m in zip(self.gu, mask) if m], self.ust[mask])
            self.ust = self.ust[~mask]
        if self.out is None:
            if self.ids.size == self.n_lanes and mask.all():  # every lane stops here, none stopped before
                self.out = {**self.acc.arrays, "w_final": self.w}
                self.ids = self.ids[:0]
                return
            self.out = {k: np.empty_like(v) for k, v in self.acc.arrays.items()}  # every lane is written once
            self.out["w_final"] = np.empty_like(self.w)
        gone = self.ids[mask]
        for k, v in self.acc.arrays.items():
            self.out[k][gone] = v[mask]
        self.out["w_final"][gone] = self.w[mask]
        keep = ~mask
        self.acc.take(keep)
        self.ids, self.w = self.ids[keep], self.w[keep]
        if self.mom is not None:
            self.mom = self.mom[keep]
        if self.perm is not None:
            self.perm, self.pos = self.perm[keep], self.pos[keep]
        self.lr, self.mu, self.burn = self.lr[keep], self.mu[keep], self.burn[keep]
        self.bound, self.stride = self.bound[keep], self.stride[keep]
        self.gu = [g for g, k in zip(self.gu, keep) if k]
        self.gz = [g for g, k in zip(self.gz, keep) if k]

    def finish(self) -> dict[str, np.ndarray]:
        """Stop the lanes still working and return the full-size results (``run_lanes``' return
        value), the second moments symmetrised."""
        if self.ids.size or self.out is None:
            self.stop(np.ones(self.ids.size, dtype=bool))
        if "sum_dd" in self.out:
            obs.symmetrize(self.out["sum_dd"], self.out["n"])
        return self.out


def lane_state(acc: dict[str, np.ndarray], ust: np.ndarray, w: np.ndarray, mom: np.ndarray | None,
               lr: np.ndarray, mu: np.ndarray, burn: np.ndarray, bound: np.ndarray, stride: np.ndarray,
               perm: np.ndarray | None, pos: np.ndarray | None) -> kernels.Lanes:
    """The working lanes as :class:`sgdsweep.sim.kernels.Lanes`: the engine's arrays and the
    accumulators ``acc`` themselves (the kernels advance them in place); those not kept are
    empty."""
    e1, e2, e3, e4 = np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0, 0)), np.zeros((0, 0, 0, 0))
    i1, i2 = np.zeros(0, np.int64), np.zeros((0, 0), np.int64)
    lagged = "loss_buf" in acc
    return kernels.Lanes(
        ust=ust, w=w, mom=mom if mom is not None else e2, lr=lr, mu=mu, burn=burn, bound=bound,
        stride=stride, perm=perm if perm is not None else i2, pos=pos if pos is not None else i1,
        count=acc["n"], sum_d=acc["sum_d"], sum_dd=acc.get("sum_dd", e3), sum_d2=acc.get("sum_d2", e2),
        sketch=acc.get("sketch", e3), loss_count=acc.get("loss_count", i1), sum_loss=acc.get("sum_loss", e1),
        sum_test_loss=acc.get("sum_test_loss", e1), loss_buf=acc["loss_buf"] if lagged else e2,
        loss_lag=acc["loss_lag"] if lagged else e2, loss_head=acc["loss_head"] if lagged else e2,
        diverged_step=acc["diverged_step"], escape_step=acc["escape_step"], reference=acc.get("reference", e2),
        noise_buf=acc.get("noise_buf", e4), noise_lag=acc.get("noise_lag", e4), sum_gram=acc.get("sum_gram", e3),
        stopped=np.zeros(w.shape[0], dtype=np.bool_))


def update_obs(acc, problem, observe, w, delta, sel, t, stride, idx, eps, noise_lags) -> None:
    """One measured step's contributions to the accumulators (``stride``: per-lane loss stride)."""
    obs.update_moments(acc, delta, sel)
    if "loss_count" in acc.arrays:
        sample = (t % stride) == 0
        if sel is not None:
            sample &= sel
        if sample.any():
            obs.update_losses(acc, problem.loss(w) if observe.loss else None,
                              problem.test_loss(w) if observe.test_loss else None,
                              None if sample.all() else sample)
    if noise_lags and idx is not None:
        wm = np.broadcast_to(problem.w_min, w.shape)
        b = -problem.grad(wm, idx, eps).reshape(w.shape[0], problem.n_outputs, problem.n_inputs)
        obs.update_noise(acc, b, delta.reshape(b.shape), sel, noise_lags)
