"""Fused kernels: a block of steps of many lanes in one compiled loop.

:func:`sgdsweep.sim.engine.run_lanes` advances lanes with numpy, one vectorised step at a time,
which costs about 100 µs of interpreter overhead per step whatever the number of lanes. Where a
kernel exists this module runs the whole block instead — noise, gradient, heavy-ball update,
divergence and escape checks and the streaming accumulators of :mod:`sgdsweep.sim.observables` —
lane by lane (a lane's weights, momentum and second moment stay in cache for the block),
optionally in threads over lanes (the compiled loops release the GIL):

- ``_advance_affine``: single linear layers (:class:`sgdsweep.models.affine.AffineProblem`:
  ``linear``, ``digits``, ``matrix``) with sampled noise (``minibatch``, ``minibatch_replace``,
  ``epoch``, ``label``; SGD) or added noise (``gaussian``, ``gaussian_matched``, ``student_t``;
  SGD or the SDE);
- ``_advance_additive``: additive-noise problems whose gradient is a per-coordinate polynomial
  (``quadratic``, the ``double_well`` landscape) with ``gaussian`` or ``student_t`` noise, SGD or
  the SDE, with escape;
- ``_advance_two_layer``: the two-layer linear network (``two_layer``) with sampled noise (SGD)
  or added noise (SGD or the SDE);
- ``_advance_thesis``: the thesis landscape (``landscape: thesis``, Vescovi's escape problem)
  with sampled noise (SGD) or added noise (SGD or the SDE), with escape.

Added noise on a data set is a weighted sum over all P samples: the full gradient plus
``gaussian_matched`` noise is Σ_μ c_μ g_μ with c_μ = 1/P + a (z_μ − z̄), a = √(f/P) (times the
Student-t factor and the SDE's noise scale), because √(f/P) Σ_μ z_μ (g_μ − ḡ) = √(f/P) Σ_μ
(z_μ − z̄) g_μ. The kernels therefore run the minibatch loop over every sample with weights
c_μ (:func:`_matched_weights`) instead of S drawn samples with weight 1/S. Where d is at most
:data:`sgdsweep.sim.noise.MATCHED_COV_MAX_DIM` (the thesis landscape) the noise is drawn from the
d × d covariance of the per-sample gradients instead (:func:`_thesis_matched`).

Both consume exactly the random numbers the numpy path consumes (the same per-lane uniform and
normal streams, the same partial Fisher–Yates shuffle), so both paths give the same trajectories
up to floating-point rounding; ``tests/test_fused.py`` checks that for every kernel. The kernels
draw the uniforms themselves, from the lanes' PCG64 states (:mod:`sgdsweep.sim.pcg64`); helpers
that are called once per step are inlined, and index arrays rather than take row views (a view
costs an atomic reference-count update): together 1.05–1.35× on the small-model shard of
``benchmarks/kernel_shard.py``, 1.7× on the thesis landscape at S = 1."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np

from sgdsweep.models.affine import AffineProblem
from sgdsweep.models.landscape import Thesis
from sgdsweep.models.two_layer import TwoLayerProblem
from sgdsweep.sim.noise import MODE, STUDENT_NU, cholesky_psd, draw_normals, matched_by_covariance
from sgdsweep.sim.observables import feed_noise_lane
from sgdsweep.sim.pcg64 import next_double
from sgdsweep.sim.vecmath import exp

#: The modules whose compiled functions and constants are built into this module's cached
#: kernels, and the SHA-256 (16 hex digits, :func:`dependency_digest`) of their sources. Numba's
#: cache checks only the stamp of this file, so a change there alone would leave stale machine
#: code in every checkout that pulls it; ``tests/test_fused.py`` fails until the digest is
#: updated here, and that edit makes Numba compile the kernels again.
COMPILED_DEPENDENCIES = ("noise.py", "observables.py", "pcg64.py", "vecmath.py")
DEPENDENCY_DIGEST = "25901871946947ac"
#: Environment variable: threads the fused kernel may use in one process (default 1: a
#: sweep's parallelism is its Dask workers, one per core; set it for in-process runs).
THREADS_ENV = "SGDSWEEP_THREADS"
#: Added-noise types of the additive kernel.
ADDITIVE = ("gaussian", "student_t")
#: Lanes whose random numbers are drawn and used together (a chunk's block stays in cache).
CHUNK_LANES = 32
#: ``added`` code of the data-set kernels: 0 sampled noise, then each added-noise type.
ADDED_CODE = {"gaussian": 1, "gaussian_matched": 2, "student_t": 3}
#: Accumulate-and-flush buffer of δ per lane (steps): the N×N second moment is updated from
#: this many steps at once (a blocked rank-k update) instead of once per step.
DELTA_BUFFER = 16
#: Inputs from which :func:`_plain_grad` takes rows eight at a time (below, four: on short rows
#: eight accumulators cost more than they save; measured 1.06–1.18× at N = 100).
EIGHT_ROWS_MIN = 32
#: Below :data:`EIGHT_ROWS_MIN` inputs, linear regression's gradient (one output, sampled noise,
#: no metric or offsets) runs on the inputs padded with zero columns to a multiple of this, and
#: on weights padded with zeros likewise (:func:`padded_inputs`): the compiled row loops then
#: have no scalar remainder. At N = 10 a step is 1.05–1.13× faster in burn-in and 1.03–1.07×
#: with the default observables (a captured chunk of the small-model shard).
PAD_INPUTS = 4


def dependency_digest() -> str:
    """SHA-256 (16 hex digits) of the sources of :data:`COMPILED_DEPENDENCIES`, in that order."""
    digest = hashlib.sha256()
    for name in COMPILED_DEPENDENCIES:
        digest.update((Path(__file__).parent / name).read_text(encoding="utf-8").replace("\r\n", "\n").encode())
    return digest.hexdigest()[:16]


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Whether a fused kernel can run this call (otherwise the numpy engine does)."""
    if noise_lags and not isinstance(problem, AffineProblem):  # D(m) of single layers only
        return False
    sampled_sgd = noise in MODE and dynamics_kind == "sgd"
    if noise in ("gaussian_matched", "student_t") and matched_by_covariance(problem) and not isinstance(problem, Thesis):
        return False  # matched noise from the d × d covariance: only the thesis kernel has it
    if isinstance(problem, TwoLayerProblem):
        return (sampled_sgd or noise in ADDED_CODE) and not escape
    if problem.w_min is None:
        return False
    if isinstance(problem, AffineProblem):
        return (sampled_sgd or noise in ADDED_CODE) and not escape
    if isinstance(problem, Thesis):
        return (sampled_sgd and noise != "label") or noise in ADDED_CODE
    return getattr(problem, "polynomial", None) is not None and noise in ADDITIVE


def threads() -> int:
    """Threads the fused kernel uses: ``$SGDSWEEP_THREADS`` (default 1)."""
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads") from None
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer number of threads")
    return n


def model_arrays(problem, noise: str, batch_size: int, noise_scale: float, mode: int, n_batches: int,
                 omega: np.ndarray, want_loss: bool, want_test: bool, escape: bool,
                 noise_lags: list[int] = ()) -> tuple:
    """The kernel and its shared (not per-lane) arguments for ``problem`` (``noise_lags``: the
    lags m of D(m), 0 first, when the gradient noise is observed — affine problems only)."""
    empty2 = np.zeros((0, 0))
    if isinstance(problem, (AffineProblem, Thesis, TwoLayerProblem)):
        added, noise_amp = added_noise_weights(problem, noise, batch_size, noise_scale)
    if isinstance(problem, AffineProblem):
        metric = problem.metric if problem.metric is not None else empty2
        offsets = problem.offsets.reshape(problem.n_samples, -1) if problem.offsets is not None else empty2
        if problem.test_quadratic is not None:
            test_a, test_b, test_c = problem.test_quadratic
            if np.count_nonzero(test_a - np.diag(np.diag(test_a))) == 0:  # isotropic inputs: A = I/N
                test_a = np.ascontiguousarray(np.diag(test_a)).reshape(1, -1)  # its diagonal, a row
        else:
            test_a, test_b, test_c = empty2, np.zeros((0, 0)), 0.0
        plain = added == 0 and problem.y.shape[1] == 1 and metric.size == 0 and offsets.size == 0
        return _advance_affine, (problem.x, problem.y, metric, offsets, float(problem.label_noise), mode, n_batches, added, noise_amp, np.ascontiguousarray(problem.syx),
                                 np.ascontiguousarray(problem.a_mean), np.array(problem.w_min), omega, want_loss,
                                 want_test and test_a.size > 0, np.ascontiguousarray(problem.sxx),
                                 float(problem.loss_min), test_a, test_b.ravel(), float(test_c),
                                 np.asarray(noise_lags, dtype=np.int64), padded_inputs(problem.x) if plain else empty2)
    if isinstance(problem, TwoLayerProblem):
        return _advance_two_layer, (problem.x, problem.y, problem.hidden, float(problem.label_noise), mode, n_batches,
                                    added, noise_amp, np.ascontiguousarray(problem.map_min), np.ascontiguousarray(problem.sxx),
                                    float(problem.loss_min), np.ascontiguousarray(problem.teacher),
                                    problem.n_outputs * problem.label_noise**2 / 2, omega, want_loss, want_test)
    if isinstance(problem, Thesis):
        return _advance_thesis, (problem.x, problem.y, mode, n_batches, added, noise_amp, problem.w_min,
                                 problem.saddle_point, problem.normal, escape, omega, want_loss)
    a1, a2, a3 = (np.asarray(c, dtype=np.float64) for c in problem.polynomial)
    threshold = float(getattr(problem, "escape_threshold", np.inf))
    return _advance_additive, (a1, a2, a3, np.ascontiguousarray(problem.noise_chol) / np.sqrt(batch_size),
                               noise == "student_t", noise_scale, threshold, problem.w_min, omega, want_loss)


def padded_inputs(x: np.ndarray) -> np.ndarray:
    """The rows of ``x`` (P × N) with zero columns appended up to a multiple of
    :data:`PAD_INPUTS`, for :func:`_plain_grad`'s loops; an empty (0, 0) array where that
    does not pay (N already a multiple, or N ≥ :data:`EIGHT_ROWS_MIN`, where rows go eight at
    a time and padding measured 0.89–0.91× at N = 50)."""
    p, n_in = x.shape
    width = -(-n_in // PAD_INPUTS) * PAD_INPUTS
    if width == n_in or n_in >= EIGHT_ROWS_MIN:
        return np.zeros((0, 0))
    out = np.zeros((p, width))
    out[:, :n_in] = x
    return out


def added_noise_weights(problem, noise: str, batch_size: int, noise_scale: float) -> tuple[int, float]:
    """``(added, a)`` for a data-set problem: the :data:`ADDED_CODE` of ``noise`` (0 for sampled
    noise) and the noise amplitude — √(f/P) with f = (P−S)/(S(P−1)) for ``gaussian_matched``
    and ``student_t`` (see the module docstring), the standard deviation √(gaussian_noise_var)
    per coordinate for ``gaussian`` — times the SDE's ``noise_scale``."""
    added = ADDED_CODE.get(noise, 0)
    if added == 1:
        return added, noise_scale * float(np.sqrt(problem.gaussian_noise_var(batch_size)))
    if added:
        p = problem.n_samples
        f = (p - batch_size) / (batch_size * (p - 1))
        return added, noise_scale * float(np.sqrt(f / p))
    return 0, 0.0


def advance(kernel, shared: tuple, t0: int, n_steps: int, states: np.ndarray, normals: list, n_u: int, n_z: int,
            w: np.ndarray, mom: np.ndarray | None, step: np.ndarray, mu: np.ndarray, burn: np.ndarray,
            bound: np.ndarray, stride: np.ndarray, perm: np.ndarray | None, pos: np.ndarray | None,
            acc: dict[str, np.ndarray], n_threads: int) -> np.ndarray:
    """Advance the working lanes by ``n_steps`` steps starting at step ``t0``, in place.

    ``kernel, shared`` come from :func:`model_arrays`. Each step of a lane takes ``n_u``
    uniforms (sample selection) and ``n_z`` normals (label or added noise), in the same order
    as the numpy engine draws them, so both see the same numbers. The uniforms are drawn inside
    the kernel from row i of ``states``, lane i's PCG64 state (:mod:`sgdsweep.sim.pcg64`), which it
    leaves advanced; the normals from ``normals[i]``, its generator, here for up to
    :data:`CHUNK_LANES` lanes at a time (fewer where that gives each of ``n_threads`` threads a
    chunk), used while they are still in cache. With ``n_threads`` > 1 chunks are drawn and
    advanced in parallel (NumPy's generators and the kernels release the GIL). ``step`` is the
    per-lane step size (λ, or dt for the SDE); ``acc`` the working accumulators of
    :class:`sgdsweep.sim.observables.Accumulators`. A lane that diverges gets ``diverged_step``, one
    that escapes ``escape_step``; both stop advancing. Returns the mask of lanes that stopped.
    """
    n_lanes = w.shape[0]
    stopped = np.zeros(n_lanes, dtype=np.bool_)
    e1, e2, e3 = np.zeros(0), np.zeros((0, 0)), np.zeros((0, 0, 0))
    k_lags = acc["loss_buf"].shape[1] if "loss_buf" in acc else 0
    # per-lane arrays (sliced per chunk); empty ones stay as they are
    lanes = [w, mom if mom is not None else e2, step, mu, burn, bound, stride,
             perm if perm is not None else np.zeros((0, 0), np.int64),
             pos if pos is not None else np.zeros(0, np.int64),
             acc["n"], acc["sum_d"], acc.get("sum_dd", e3), acc.get("sum_d2", e2), acc.get("sketch", e3),
             acc.get("loss_count", np.zeros(0, np.int64)), acc.get("sum_loss", e1), acc.get("sum_test_loss", e1),
             acc["loss_buf"] if k_lags else e2, acc["loss_lag"] if k_lags else e2,
             acc["loss_head"] if k_lags else e2, acc["diverged_step"], acc["escape_step"],
             acc.get("reference", e2), acc.get("noise_buf", np.zeros((0, 0, 0, 0))),
             acc.get("noise_lag", np.zeros((0, 0, 0, 0))), acc.get("sum_gram", e3), stopped]

    # at most CHUNK_LANES lanes a chunk, fewer when that gives every thread a chunk
    chunk = max(1, min(CHUNK_LANES, -(-n_lanes // max(1, n_threads))))

    def run(lo: int) -> None:
        hi = min(lo + chunk, n_lanes)
        z = np.empty((hi - lo, n_steps, n_z))
        if n_z:
            for i in range(lo, hi):
                draw_normals(normals[i], z[i - lo])
        kernel(t0, n_steps, n_u, states[lo:hi], z, *[a[lo:hi] if a.shape[0] else a for a in lanes], *shared)

    starts = range(0, n_lanes, chunk)
    if n_threads <= 1 or len(starts) == 1:
        for lo in starts:
            run(lo)
    else:
        with ThreadPoolExecutor(min(n_threads, len(starts))) as pool:
            list(pool.map(run, starts))
    return stopped


#: Leading arguments of the block loops that are per lane or per block (t0 … stopped),
#: and the position among them of ``sum_dd``, the full second moment (empty when not kept).
LANE_ARGS, SUM_DD_ARG = 32, 16


def _advance_affine(*args) -> None:
    """The block loop of :func:`advance` for affine problems (:func:`_affine_lanes`; the
    arguments as for the other kernels), compiled twice: :func:`_affine_full` keeps the full
    second moment Σδδᵀ, :func:`_affine_diagonal` Σδ² and the sketch. In each the other's
    accumulators are dead, which frees registers in the step loop: on the small-model shard
    (N = 10, full Σδδᵀ) 1.15–1.20× against one loop for both. The arguments travel as two
    tuples, the lanes' and the problem's: CPython passes a call of more than 30 arguments as
    ``*args``, which Numba does not inline."""
    _run_by_moment(args, _affine_full, _affine_diagonal)


def _run_by_moment(args: tuple, full, diagonal) -> None:
    """Run a block loop compiled twice: ``full(lanes, shared)`` where the lanes keep Σδδᵀ
    (``sum_dd`` not empty), else ``diagonal(lanes, shared)``, ``args`` split into the lanes' and
    the problem's arguments."""
    lanes, shared = args[:LANE_ARGS], args[LANE_ARGS:]
    (full if lanes[SUM_DD_ARG].shape[0] > 0 else diagonal)(lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _affine_full(lanes, shared):  # pragma: no cover - compiled
    """:func:`_affine_lanes` with Σδδᵀ."""
    _affine_lanes(True, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _affine_diagonal(lanes, shared):  # pragma: no cover - compiled
    """:func:`_affine_lanes` with Σδ² and the sketch."""
    _affine_lanes(False, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _affine_lanes(full, lanes, shared):  # pragma: no cover - compiled
    """Affine problems: sampled noise (``added`` = 0: S drawn samples, weight 1/S each),
    isotropic ``gaussian`` (``added`` = 1: the full gradient M (W Σxx − Σyx) − ā plus
    ``noise_amp``·z) or ``gaussian_matched``/``student_t`` (2, 3: every sample, weighted by
    :func:`_matched_weights`). With sampled noise and ``lags``, the gradient noise at the
    minimum b = −g_B(W*) of the step's batch feeds D(m) (Han et al.). ``full``: whether
    ``sum_dd`` is kept (a constant in each of :func:`_advance_affine`'s two kernels)."""
    (t0, n_steps, n_u, ust, z, w, mom, lr, mu, burn, bound, stride, perm, pos,
     count, sum_d, sum_dd, sum_d2, sketch, loss_count, sum_loss, sum_test_loss,
     loss_buf, loss_lag, loss_head, diverged_step, _escape_step, _reference, noise_buf, noise_lag,
     sum_gram, stopped) = lanes
    (x, y, metric, offsets, label_noise, mode, n_batches, added, noise_amp, syx, a_mean, ref,
     omega, want_loss, want_test, sxx, loss_min, test_a, test_b, test_c, lags, x_pad) = shared
    n_lanes = w.shape[0]
    p, n_in = x.shape
    n_out = y.shape[1]
    d = n_in * n_out
    s = n_u if added == 0 else p  # rows of the gradient sum
    has_label = added == 0 and z.shape[2] > 0
    observe_noise = added == 0 and noise_buf.shape[0] > 0
    sample_losses = loss_count.shape[0] > 0
    padded = x_pad.shape[0] > 0  # the gradient on padded inputs and weights (then n_out = 1)
    rows = x_pad if padded else x
    d_grad = x_pad.shape[1] if padded else d
    for lane in range(n_lanes):
        g = np.empty(d_grad)
        tmp = np.empty(d)
        delta = np.empty(d)
        noise_b = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        if padded:
            wl = np.zeros(d_grad)  # the lane's weights for the block (padded with zeros: they stay 0)
            for i in range(d):
                wl[i] = w[lane, i]
        else:
            wl = w[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        for step in range(n_steps):
            t = t0 + step
            if added == 0:
                st_hi, st_lo = _draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            elif added >= 2:
                _matched_weights(z, lane, step, p, noise_amp, added == 3, weight)
            if added == 1:
                _affine_full_grad(wl, sxx, syx, metric, a_mean, n_out, n_in, tmp, g)
                for i in range(d):
                    g[i] += noise_amp * z[lane, step, i]
            else:
                _affine_grad(wl, rows, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp, g)
            # -- heavy-ball update --
            _heavy_ball(wl, g, mom, lane, mu[lane], lr[lane])
            d2 = _deviation(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            if t < burn[lane]:
                continue
            nbuf = _moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
            if observe_noise:
                _observe_noise(lane, ref, x, y, idx, weight, metric, offsets, label_noise, z, step, has_label,
                               tmp, noise_b, delta, lags, count, noise_buf, noise_lag, sum_gram)
            if sample_losses and t % stride[lane] == 0:
                if want_loss:
                    _feed_loss(lane, loss_min + 0.5 * _metric_form(delta, sxx, metric, n_out, n_in),
                               loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                if want_test:  # c + Σ_o w_oᵀ (½ A w_o − b_o); A given by its diagonal when a row
                    val = test_c
                    for o in range(n_out):
                        lo = o * n_in
                        if test_a.shape[0] == 1:
                            for i in range(n_in):
                                wi = wl[lo + i]
                                val += wi * (0.5 * test_a[0, i] * wi - test_b[lo + i])
                        else:
                            _sym_times(test_a, wl, lo, tmp)
                            for i in range(n_in):
                                val += wl[lo + i] * (0.5 * tmp[i] - test_b[lo + i])
                    sum_test_loss[lane] += val
                loss_count[lane] += 1
        if padded:
            for i in range(d):
                w[lane, i] = wl[i]
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if full and nbuf > 0:
            _flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _affine_grad(wl, x, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp, g):  # pragma: no cover
    """g = Σ_k weight_k g_{idx_k}(W) of the affine per-sample gradients g_μ = M (W x_μ − y_μ − ε_μ) x_μᵀ
    − a_μ (ε: label noise from z[lane, step] when ``has_label``; ``tmp``: scratch of d): output by
    output the data sum G_o = Σ_k weight_k (W_o·x_k − y_ko − ε_ko) x_k (:func:`_plain_grad`),
    then M applied once to G (it is linear, so M Σ = Σ M), then the offsets. Inlined into the
    block loop by Numba: as a call, with a dozen array arguments, it cost as much as a small
    model's gradient."""
    n_in = x.shape[1]
    n_out = y.shape[1]
    for o in range(n_out):
        _plain_grad(wl, x, y, o, idx, weight, label_noise, z, lane, step, has_label, g)
    if metric.shape[0] > 0:
        for i in range(g.shape[0]):
            tmp[i] = g[i]
            g[i] = 0.0
        for o in range(n_out):
            lo = o * n_in
            for q in range(n_out):
                m = metric[o, q]
                lq = q * n_in
                for i in range(n_in):
                    g[lo + i] += m * tmp[lq + i]
    if offsets.shape[0] > 0:
        for k in range(idx.shape[0]):
            row = idx[k]
            c = weight[k]
            for i in range(g.shape[0]):
                g[i] -= c * offsets[row, i]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _observe_noise(lane, ref, x, y, idx, weight, metric, offsets, label_noise, z, step, has_label, tmp, noise_b, delta,
                   lags, count, noise_buf, noise_lag, sum_gram):  # pragma: no cover - compiled
    """Han's D(m) for one measured step of one lane: the gradient noise at the minimum of the
    step's batch, b = −g_B(W*), and δ into :func:`sgdsweep.sim.observables.feed_noise_lane`."""
    _affine_grad(ref, x, y, idx, weight, metric, offsets, label_noise, z, lane, step, has_label, tmp, noise_b)
    for i in range(noise_b.shape[0]):
        noise_b[i] = -noise_b[i]
    feed_noise_lane(lane, noise_b, delta, lags, count, noise_buf, noise_lag, sum_gram)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _plain_grad(wl, x, y, o, idx, weight, label_noise, z, lane, step, has_label, g):  # pragma: no cover - compiled
    """g_o = Σ_k weight_k (x_k·w_o − y_ko − ε_k) x_k: one output's data sum (the whole gradient
    of linear regression) into entries o·n_in … (o + 1)·n_in − 1 of g, w_o the same entries of
    wl (ε_k = label_noise · z[lane, step, k·n_out + o] when ``has_label``, n_out = y's columns; offsets,
    not per-output slices, which cost time on every step): rows eight (from
    :data:`EIGHT_ROWS_MIN` inputs), four, then two, then one at a time, each group's residuals
    and its share of g in one visit (a weight or gradient element loaded once per group; eight
    row streams in flight hide the latency of gathering them from L2). Inlined by Numba."""
    n_in = x.shape[1]
    n_out = y.shape[1]
    s = idx.shape[0]
    lo = o * n_in  # output o's entries of wl and g
    for i in range(n_in):
        g[lo + i] = 0.0
    k = 0
    while n_in >= EIGHT_ROWS_MIN and k + 8 <= s:
        r0, r1, r2, r3 = idx[k], idx[k + 1], idx[k + 2], idx[k + 3]
        r4, r5, r6, r7 = idx[k + 4], idx[k + 5], idx[k + 6], idx[k + 7]
        a0, a1, a2, a3 = -y[r0, o], -y[r1, o], -y[r2, o], -y[r3, o]
        a4, a5, a6, a7 = -y[r4, o], -y[r5, o], -y[r6, o], -y[r7, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
            a2 += wi * x[r2, i]
            a3 += wi * x[r3, i]
            a4 += wi * x[r4, i]
            a5 += wi * x[r5, i]
            a6 += wi * x[r6, i]
            a7 += wi * x[r7, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o]
            a2 -= label_noise * z[lane, step, (k + 2) * n_out + o]
            a3 -= label_noise * z[lane, step, (k + 3) * n_out + o]
            a4 -= label_noise * z[lane, step, (k + 4) * n_out + o]
            a5 -= label_noise * z[lane, step, (k + 5) * n_out + o]
            a6 -= label_noise * z[lane, step, (k + 6) * n_out + o]
            a7 -= label_noise * z[lane, step, (k + 7) * n_out + o]
        a0 *= weight[k]
        a1 *= weight[k + 1]
        a2 *= weight[k + 2]
        a3 *= weight[k + 3]
        a4 *= weight[k + 4]
        a5 *= weight[k + 5]
        a6 *= weight[k + 6]
        a7 *= weight[k + 7]
        for i in range(n_in):
            g[lo + i] += (a0 * x[r0, i] + a1 * x[r1, i] + a2 * x[r2, i] + a3 * x[r3, i]
                     + a4 * x[r4, i] + a5 * x[r5, i] + a6 * x[r6, i] + a7 * x[r7, i])
        k += 8
    while k + 4 <= s:
        r0, r1, r2, r3 = idx[k], idx[k + 1], idx[k + 2], idx[k + 3]
        a0, a1, a2, a3 = -y[r0, o], -y[r1, o], -y[r2, o], -y[r3, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
            a2 += wi * x[r2, i]
            a3 += wi * x[r3, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o]
            a2 -= label_noise * z[lane, step, (k + 2) * n_out + o]
            a3 -= label_noise * z[lane, step, (k + 3) * n_out + o]
        a0 *= weight[k]
        a1 *= weight[k + 1]
        a2 *= weight[k + 2]
        a3 *= weight[k + 3]
        for i in range(n_in):
            g[lo + i] += a0 * x[r0, i] + a1 * x[r1, i] + a2 * x[r2, i] + a3 * x[r3, i]
        k += 4
    while k < s:  # the last one to three rows, two at a time while two are left
        r0, r1 = idx[k], idx[min(k + 1, s - 1)]
        two = k + 1 < s
        a0, a1 = -y[r0, o], -y[r1, o]
        for i in range(n_in):
            wi = wl[lo + i]
            a0 += wi * x[r0, i]
            a1 += wi * x[r1, i]
        if has_label:
            a0 -= label_noise * z[lane, step, k * n_out + o]
            a1 -= label_noise * z[lane, step, (k + 1) * n_out + o] if two else 0.0
        a0 *= weight[k]
        a1 = a1 * weight[k + 1] if two else 0.0
        for i in range(n_in):
            g[lo + i] += a0 * x[r0, i] + a1 * x[r1, i]
        k += 2


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _affine_full_grad(wl, sxx, syx, metric, a_mean, n_out, n_in, r, g):  # pragma: no cover - compiled
    """The full gradient M (W Σxx − Σyx) − ā of an affine problem into ``g`` (``r``: scratch of
    n_out; Σxx is symmetric, so its rows are read)."""
    for i in range(n_in):
        for o in range(n_out):
            acc = -syx[o, i]
            for j in range(n_in):
                acc += wl[o * n_in + j] * sxx[i, j]
            r[o] = acc
        for o in range(n_out):
            if metric.shape[0] > 0:
                acc = 0.0
                for q in range(n_out):
                    acc += metric[o, q] * r[q]
            else:
                acc = r[o]
            g[o * n_in + i] = acc - a_mean[o, i]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _matched_weights(z, lane, step, p, noise_amp, student, weight):  # pragma: no cover - compiled
    """Per-sample weights c_μ = 1/P + a (z_μ − z̄) of the full gradient plus ``gaussian_matched``
    noise (module docstring) from the step's normals z[lane, step]: z_μ = its first P; with ``student`` the
    amplitude a = ``noise_amp`` is scaled by √((ν−2)/V), V = the sum of squares of the last ν."""
    zbar = 0.0
    for q in range(p):
        zbar += z[lane, step, q]
    zbar /= p
    amp = noise_amp * _student_factor(z, lane, step, p) if student else noise_amp
    inv_p = 1.0 / p
    for q in range(p):
        weight[q] = inv_p + amp * (z[lane, step, q] - zbar)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _student_factor(z, lane, step, first):  # pragma: no cover - compiled
    """√((ν−2)/V), V = the sum of squares of the ν = STUDENT_NU normals z[lane, step, first:first + ν]: the
    factor that makes Gaussian noise multivariate Student-t of the same covariance."""
    v = 0.0
    for j in range(first, first + STUDENT_NU):
        v += z[lane, step, j] * z[lane, step, j]
    return np.sqrt((STUDENT_NU - 2) / v)


def _advance_additive(*args) -> None:
    """The block loop of :func:`advance` for additive-noise problems (:func:`_additive_lanes`),
    compiled twice as :func:`_advance_affine` is: with Σδδᵀ (:func:`_additive_full`) and with Σδ²
    and the sketch (:func:`_additive_diagonal`). On the double well's measured steps 1.11–1.20×
    against one loop for both, where the choice was made on every step."""
    _run_by_moment(args, _additive_full, _additive_diagonal)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _additive_full(lanes, shared):  # pragma: no cover - compiled
    """:func:`_additive_lanes` with Σδδᵀ."""
    _additive_lanes(True, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _additive_diagonal(lanes, shared):  # pragma: no cover - compiled
    """:func:`_additive_lanes` with Σδ² and the sketch."""
    _additive_lanes(False, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _additive_lanes(full, lanes, shared):  # pragma: no cover - compiled
    """Additive-noise problems with a per-coordinate polynomial gradient ``g_i = a1_i w_i +
    a2_i w_i² + a3_i w_i³`` (``quadratic``, the double well) and noise ``chol·z`` (``chol`` = the
    Cholesky factor of C/S), Student-t when ``student`` (the last STUDENT_NU normals make the
    χ²); escape when ``w_0 ≥ threshold``. ``full``: whether ``sum_dd`` is kept (a constant in
    each of the two kernels)."""
    (t0, n_steps, _n_u, _ust, z, w, mom, step, mu, burn, bound, stride, _perm, _pos,
     count, sum_d, sum_dd, sum_d2, sketch, loss_count, sum_loss, _sum_test_loss,
     loss_buf, loss_lag, loss_head, diverged_step, escape_step, _reference, _noise_buf, _noise_lag,
     _sum_gram, stopped) = lanes
    (a1, a2, a3, chol, student, noise_scale, threshold, ref, omega, want_loss) = shared
    n_lanes = w.shape[0]
    d = a1.shape[0]
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(d)
        delta = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        wl = w[lane]
        for s in range(n_steps):
            t = t0 + s
            scale = noise_scale * _student_factor(z, lane, s, d) if student else noise_scale
            for i in range(d):
                xi = 0.0
                for j in range(i + 1):  # chol is lower triangular
                    xi += chol[i, j] * z[lane, s, j]
                wi = wl[i]
                g[i] = wi * (a1[i] + wi * (a2[i] + wi * a3[i])) + scale * xi
            _heavy_ball(wl, g, mom, lane, mu[lane], step[lane])
            d2 = _deviation(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            escaped = wl[0] >= threshold
            if t >= burn[lane]:
                nbuf = _moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
                if sample_losses and t % stride[lane] == 0:
                    if want_loss:
                        val = 0.0
                        for i in range(d):
                            wi = wl[i]
                            val += wi * wi * (0.5 * a1[i] + wi * (a2[i] / 3.0 + wi * a3[i] / 4.0))
                        _feed_loss(lane, val, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                    loss_count[lane] += 1
            if escaped:
                escape_step[lane] = t
                stopped[lane] = True
                break
        if nbuf > 0:
            _flush(dbuf, nbuf, sum_dd, lane)


def _advance_thesis(*args) -> None:
    """The block loop of :func:`advance` for the thesis landscape (:func:`_thesis_lanes`),
    compiled twice as :func:`_advance_affine` is: with Σδδᵀ (:func:`_thesis_full`, its usual
    case: d = 2) and with Σδ² and the sketch (:func:`_thesis_diagonal`). On measured steps
    without a loss sample (an escape run that observes no loss) 1.29–1.30× against one loop for both."""
    _run_by_moment(args, _thesis_full, _thesis_diagonal)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _thesis_full(lanes, shared):  # pragma: no cover - compiled
    """:func:`_thesis_lanes` with Σδδᵀ."""
    _thesis_lanes(True, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _thesis_diagonal(lanes, shared):  # pragma: no cover - compiled
    """:func:`_thesis_lanes` with Σδ² and the sketch."""
    _thesis_lanes(False, lanes, shared)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy", inline="always")
def _thesis_lanes(full, lanes, shared):  # pragma: no cover - compiled
    """The thesis landscape (``landscape: thesis``: f(a, b; x) = a² + x(1 + b σ(a x)), loss =
    mean (f − y)²) with sampled noise (``added`` = 0) or added noise (``added`` as in
    :func:`_affine_lanes`); escape when (w − saddle)·normal > 0. The sample loop vectorises: σ
    through :func:`sgdsweep.sim.vecmath.exp`, and NumPy's error model (no division-by-zero branch).
    ``full``: whether ``sum_dd`` is kept (a constant in each of the two kernels)."""
    (t0, n_steps, n_u, ust, z, w, mom, step, mu, burn, bound, stride, perm, pos,
     count, sum_d, sum_dd, sum_d2, sketch, loss_count, sum_loss, _sum_test_loss,
     loss_buf, loss_lag, loss_head, diverged_step, escape_step, _reference, _noise_buf, _noise_lag,
     _sum_gram, stopped) = lanes
    (x, y, mode, n_batches, added, noise_amp, ref, saddle, normal, check_escape, omega, want_loss) = shared
    n_lanes = w.shape[0]
    p = x.shape[0]
    s = n_u if added == 0 else p
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(2)
        delta = np.empty(2)
        dbuf = np.empty((DELTA_BUFFER, 2))
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        per_sample = np.empty((2, s)) if added >= 2 else np.empty((2, 0))  # g_μ, a row per component
        cov = np.empty((2, 2))
        chol = np.empty((2, 2))
        wl = w[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        for step_i in range(n_steps):
            t = t0 + step_i
            if added == 0:
                st_hi, st_lo = _draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            a, b = wl[0], wl[1]
            if added >= 2:  # matched noise from the 2 × 2 covariance (noise.matched_by_covariance)
                _thesis_matched(a, b, x, y, noise_amp, added == 3, z, lane, step_i, per_sample, cov, chol, g)
            else:
                ga = 0.0
                gb = 0.0
                for k in range(s):
                    xk = x[idx[k]]
                    sig = 1.0 / (1.0 + exp(-a * xk))
                    r = 2.0 * weight[k] * (a * a + xk * (1.0 + b * sig) - y[idx[k]])
                    ga += r * (2.0 * a + b * xk * xk * sig * (1.0 - sig))
                    gb += r * xk * sig
                g[0] = ga
                g[1] = gb
            if added == 1:
                g[0] += noise_amp * z[lane, step_i, 0]
                g[1] += noise_amp * z[lane, step_i, 1]
            _heavy_ball(wl, g, mom, lane, mu[lane], step[lane])
            d2 = _deviation(wl, ref, delta)
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            escaped = check_escape and (wl[0] - saddle[0]) * normal[0] + (wl[1] - saddle[1]) * normal[1] > 0
            if t >= burn[lane]:
                nbuf = _moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
                if sample_losses and t % stride[lane] == 0:
                    if want_loss:
                        a, b = wl[0], wl[1]
                        val = 0.0
                        for q in range(p):
                            f = a * a + x[q] * (1.0 + b / (1.0 + exp(-a * x[q]))) - y[q]
                            val += f * f
                        _feed_loss(lane, val / p, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                    loss_count[lane] += 1
            if escaped:
                escape_step[lane] = t
                stopped[lane] = True
                break
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if nbuf > 0:
            _flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def _thesis_matched(a, b, x, y, noise_amp, student, z, lane, step, per_sample, cov, chol, g):  # pragma: no cover
    """g = ḡ + noise_amp · L z for the thesis landscape at (a, b): the full gradient ḡ (the mean
    of the P per-sample gradients g_μ) plus matched noise drawn from their covariance, L Lᵀ =
    Σ_μ (g_μ − ḡ)(g_μ − ḡ)ᵀ (:func:`sgdsweep.sim.noise.cholesky_psd`), z = z[lane, step, :2] — times the
    Student-t factor of z[lane, step, 2:2 + ν] when ``student``. As :func:`sgdsweep.sim.noise.added_noise`."""
    p = x.shape[0]
    ma = 0.0
    mb = 0.0
    for k in range(p):  # per-sample gradients (vectorised: vecmath.exp, no division branch)
        xk = x[k]
        sig = 1.0 / (1.0 + exp(-a * xk))
        r = 2.0 * (a * a + xk * (1.0 + b * sig) - y[k])
        ga = r * (2.0 * a + b * xk * xk * sig * (1.0 - sig))
        gb = r * xk * sig
        per_sample[0, k] = ga
        per_sample[1, k] = gb
        ma += ga
        mb += gb
    ma /= p
    mb /= p
    caa = 0.0
    cab = 0.0
    cbb = 0.0
    for k in range(p):
        da = per_sample[0, k] - ma
        db = per_sample[1, k] - mb
        caa += da * da
        cab += da * db
        cbb += db * db
    cov[0, 0] = caa
    cov[1, 0] = cab
    cov[0, 1] = cab
    cov[1, 1] = cbb
    cholesky_psd(cov, chol)
    amp = noise_amp * _student_factor(z, lane, step, 2) if student else noise_amp
    z0, z1 = z[lane, step, 0], z[lane, step, 1]
    g[0] = ma + amp * chol[0, 0] * z0
    g[1] = mb + amp * (chol[1, 0] * z0 + chol[1, 1] * z1)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _advance_two_layer(t0, n_steps, n_u, ust, z, w, mom, step, mu, burn, bound, stride, perm, pos,
                       count, sum_d, sum_dd, sum_d2, sketch, loss_count, sum_loss, sum_test_loss,
                       loss_buf, loss_lag, loss_head, diverged_step, escape_step, reference, noise_buf, noise_lag,
                       sum_gram, stopped,
                       x, y, hidden, label_noise, mode, n_batches, added, noise_amp, map_min, sxx, loss_min,
                       teacher, test_c, omega, want_loss, want_test):  # pragma: no cover - compiled
    """The block loop of :func:`advance` for ``two_layer`` (y = W2 W1 x, w = (vec W1, vec W2))
    with sampled noise (``added`` = 0) or added noise (as in :func:`_advance_affine`: the
    per-sample gradients are linear in G = Σ_μ c_μ e_μ x_μᵀ, g = (W2ᵀ G, G W1ᵀ)). Minima form a
    manifold: |w|² is bounded, and each lane is measured around its weights at its first
    measured step (``reference``)."""
    n_lanes = w.shape[0]
    p, n_in = x.shape
    n_out = y.shape[1]
    n1 = hidden * n_in
    d = n1 + n_out * hidden
    s = n_u if added == 0 else p
    has_label = added == 0 and z.shape[2] > 0
    sample_losses = loss_count.shape[0] > 0
    for lane in range(n_lanes):
        g = np.empty(d)
        prod = np.empty((n_out, n_in))
        gp = np.empty((n_out, n_in))
        e = np.empty(n_out)
        delta = np.empty(d)
        dbuf = np.empty((DELTA_BUFFER, d))  # δ of the buffered measured steps, a row each
        nbuf = 0
        idx = np.arange(s)
        weight = np.full(s, 1.0 / s)
        wl = w[lane]
        ref = reference[lane]
        pl = idx if added else (perm[lane] if mode != 1 else perm[0])
        st_hi, st_lo, inc_hi, inc_lo = ust[lane, 0], ust[lane, 1], ust[lane, 2], ust[lane, 3]
        for step_i in range(n_steps):
            t = t0 + step_i
            if added == 0:
                st_hi, st_lo = _draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx)
            elif added >= 2:
                _matched_weights(z, lane, step_i, p, noise_amp, added == 3, weight)
            _end_to_end(wl, hidden, n_in, n_out, prod)
            if n_out == 1:  # G = Σ_k c_k (x_k·prod − y_k − ε_k) x_k: linear regression's gradient
                _plain_grad(prod[0], x, y, 0, idx, weight, label_noise, z, lane, step_i, has_label, gp[0])
            else:
                _two_layer_rows(prod, x, y, idx, weight, label_noise, z, lane, step_i, has_label, e, gp)
            for hh in range(hidden):  # g1 = W2ᵀ gp, g2 = gp W1ᵀ (innermost loops over inputs)
                for i in range(n_in):
                    g[hh * n_in + i] = 0.0
                for o in range(n_out):
                    c = wl[n1 + o * hidden + hh]
                    for i in range(n_in):
                        g[hh * n_in + i] += c * gp[o, i]
                for o in range(n_out):
                    acc = 0.0
                    for i in range(n_in):
                        acc += gp[o, i] * wl[hh * n_in + i]
                    g[n1 + o * hidden + hh] = acc
            if added == 1:
                for i in range(d):
                    g[i] += noise_amp * z[lane, step_i, i]
            _heavy_ball(wl, g, mom, lane, mu[lane], step[lane])
            d2 = 0.0
            for i in range(d):
                d2 += wl[i] * wl[i]
            measuring = t >= burn[lane]
            if measuring and np.isnan(ref[0]):
                for i in range(d):
                    ref[i] = wl[i]
            if not d2 <= bound[lane]:
                diverged_step[lane] = t
                stopped[lane] = True
                break
            if not measuring:
                continue
            for i in range(d):
                delta[i] = wl[i] - ref[i]
            nbuf = _moments(sum_dd.shape[0] > 0, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega)
            if sample_losses and t % stride[lane] == 0:
                _end_to_end(wl, hidden, n_in, n_out, prod)
                if want_loss:
                    val = 0.0
                    for o in range(n_out):
                        for i in range(n_in):
                            acc = 0.0
                            for j in range(n_in):
                                acc += sxx[i, j] * (prod[o, j] - map_min[o, j])
                            val += (prod[o, i] - map_min[o, i]) * acc
                    _feed_loss(lane, loss_min + 0.5 * val, loss_count, sum_loss, loss_buf, loss_lag, loss_head)
                if want_test:
                    val = 0.0
                    for o in range(n_out):
                        for i in range(n_in):
                            val += (prod[o, i] - teacher[o, i]) ** 2
                    sum_test_loss[lane] += 0.5 * val / n_in + test_c
                loss_count[lane] += 1
        ust[lane, 0] = st_hi  # the lane's generator continues from here
        ust[lane, 1] = st_lo
        if nbuf > 0:
            _flush(dbuf, nbuf, sum_dd, lane)


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _two_layer_rows(prod, x, y, idx, weight, label_noise, z, lane, step, has_label, e, gp):  # pragma: no cover
    """G = Σ_k c_k e_k x_kᵀ, e_k = prod x_k − y_k − ε_k (``prod`` = W2 W1, n_out × n_in; ε from
    z[lane, step] when ``has_label``; ``e``: scratch of n_out) — the two-layer gradient's data sum
    for several outputs (one output runs :func:`_plain_grad`)."""
    n_out, n_in = prod.shape
    gp[:, :] = 0.0
    for k in range(idx.shape[0]):
        row = idx[k]
        for o in range(n_out):
            acc = -y[row, o]
            if has_label:
                acc -= label_noise * z[lane, step, k * n_out + o]
            for i in range(n_in):
                acc += prod[o, i] * x[row, i]
            e[o] = acc * weight[k]
        for o in range(n_out):
            eo = e[o]
            for i in range(n_in):
                gp[o, i] += eo * x[row, i]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _end_to_end(wl, hidden, n_in, n_out, prod):  # pragma: no cover - compiled
    """prod = W2 W1 (n_out × n_in) of the flattened two-layer weights wl."""
    n1 = hidden * n_in
    prod[:, :] = 0.0
    for o in range(n_out):
        for hh in range(hidden):
            c = wl[n1 + o * hidden + hh]
            for i in range(n_in):
                prod[o, i] += c * wl[hh * n_in + i]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _heavy_ball(wl, g, mom, lane, mu, lam):  # pragma: no cover - compiled
    """One update of the lane's weights ``wl`` by the gradient ``g``: m ← μ m + g, w ← w − λ m
    (plain SGD when ``mom`` is empty; ``wl`` and ``g`` may be longer than the momentum, padded
    with zeros that stay 0)."""
    if mom.shape[0] > 0:
        for i in range(mom.shape[1]):
            m = mu * mom[lane, i] + g[i]
            mom[lane, i] = m
            wl[i] -= lam * m
    else:
        for i in range(wl.shape[0]):
            wl[i] -= lam * g[i]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _deviation(wl, ref, delta):  # pragma: no cover - compiled
    """δ = w − ref into ``delta``; returns |δ|² (not finite when w is not). ``wl`` may be
    longer than ``delta`` (padded)."""
    d2 = 0.0
    for i in range(delta.shape[0]):
        delta[i] = wl[i] - ref[i]
        d2 += delta[i] * delta[i]
    return d2


@numba.njit(cache=True, nogil=True, inline="always")
def _draw(st_hi, st_lo, inc_hi, inc_lo, pl, pos, lane, mode, n_batches, p, idx):  # pragma: no cover
    """One step's sample indices into ``idx`` from the lane's next S uniforms, drawn from its
    PCG64 state (st_hi, st_lo) and increment (:func:`sgdsweep.sim.pcg64.next_double`), exactly as
    :func:`sgdsweep.sim.noise.sample_indices` uses ``Generator.random``'s: mode 1 with replacement;
    0 a partial Fisher–Yates shuffle of the lane's permutation ``pl`` from position 0; 2
    continued at ``pos[lane]``. Returns the new state."""
    s = idx.shape[0]
    if mode == 1:
        for k in range(s):
            st_hi, st_lo, u = next_double(st_hi, st_lo, inc_hi, inc_lo)
            j = int(u * p)
            idx[k] = j if j < p else p - 1
        return st_hi, st_lo
    base = pos[lane] * s if mode == 2 else 0
    for k in range(s):
        st_hi, st_lo, u = next_double(st_hi, st_lo, inc_hi, inc_lo)
        a = base + k
        j = a + int(u * (p - a))
        if j >= p:
            j = p - 1
        pj = pl[j]
        pl[j] = pl[a]
        pl[a] = pj
        idx[k] = pj
    if mode == 2:
        pos[lane] = (pos[lane] + 1) % n_batches
    return st_hi, st_lo


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _moments(full, lane, delta, count, sum_d, sum_dd, dbuf, nbuf, sum_d2, sketch, omega):  # pragma: no cover
    """One measured step of :func:`sgdsweep.sim.observables.update_moments`: n, Σδ, and, when
    ``full``, Σδδᵀ through the δ buffer (flushed when it fills up; returns its new fill), else
    Σδ² and the Nyström sketch."""
    d = delta.shape[0]
    count[lane] += 1
    for i in range(d):
        sum_d[lane, i] += delta[i]
    if full:
        for i in range(d):
            dbuf[nbuf, i] = delta[i]
        nbuf += 1
        if nbuf == DELTA_BUFFER:
            _flush(dbuf, nbuf, sum_dd, lane)
            nbuf = 0
        return nbuf
    for i in range(d):
        sum_d2[lane, i] += delta[i] * delta[i]
    if sketch.shape[0] > 0:
        for c in range(omega.shape[1]):
            proj = 0.0
            for i in range(d):
                proj += delta[i] * omega[i, c]
            for i in range(d):
                sketch[lane, i, c] += delta[i] * proj
    return nbuf


@numba.njit(cache=True, nogil=True)
def _feed_loss(lane, val, loss_count, sum_loss, loss_buf, loss_lag, loss_head):  # pragma: no cover
    """One training-loss sample: the sum and the autocorrelation ring buffer
    (:func:`sgdsweep.sim.observables.update_losses`; the caller counts the sample). Called, not
    inlined: it runs once per loss sample, and inlined, its vector loops slowed the step loop
    around them (0.92× on a captured chunk)."""
    k = loss_buf.shape[1]
    if k > 0:
        n = loss_count[lane]
        at = n % k
        loss_buf[lane, at] = val
        if n < k:
            loss_head[lane, n] = val
        m = min(n + 1, k)
        # lags whose sample sits at or before `at`, then the rest (no modulo: an integer division
        # per lag); unsigned indices, which Numba does not check for wraparound (a signed index
        # of unknown sign costs a select per element, and the loop no longer vectorises: 3×)
        top, end = np.uint64(at), np.uint64(at + k)
        for lag in range(np.uint64(min(m, at + 1))):
            loss_lag[lane, lag] += val * loss_buf[lane, top - lag]
        for lag in range(np.uint64(at + 1), np.uint64(m)):
            loss_lag[lane, lag] += val * loss_buf[lane, end - lag]
    sum_loss[lane] += val


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _flush(dbuf, nbuf, out, lane):  # pragma: no cover - compiled
    """Lower triangle of out[lane] (d × d) += Σ_b δ_b δ_bᵀ over the first nbuf rows δ_b of the δ
    buffer dbuf (DELTA_BUFFER × d): two rows of ``out`` and four steps at a time, so each load of
    δ_b[j] feeds two FMAs and each element of ``out`` is loaded and stored once per four steps;
    the innermost loops run along j. Measured against a dot product over the buffer per
    element: 1.1× faster at d = 6, 1.3× at 10, 1.8× at 20, 2.5× at 39, 1.7–2× at 100–200.
    Indexes the arrays directly: a row view costs a reference count update (an atomic
    operation) each time it is made."""
    d = dbuf.shape[1]
    i = 0
    while i + 2 <= d:
        b = 0
        while b + 4 <= nbuf:
            a0, a1, a2, a3 = dbuf[b, i], dbuf[b + 1, i], dbuf[b + 2, i], dbuf[b + 3, i]
            c0, c1, c2, c3 = dbuf[b, i + 1], dbuf[b + 1, i + 1], dbuf[b + 2, i + 1], dbuf[b + 3, i + 1]
            for j in range(i + 1):
                x0, x1, x2, x3 = dbuf[b, j], dbuf[b + 1, j], dbuf[b + 2, j], dbuf[b + 3, j]
                out[lane, i, j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                out[lane, i + 1, j] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
            out[lane, i + 1, i + 1] += c0 * c0 + c1 * c1 + c2 * c2 + c3 * c3
            b += 4
        while b < nbuf:
            a0, c0 = dbuf[b, i], dbuf[b, i + 1]
            for j in range(i + 1):
                out[lane, i, j] += a0 * dbuf[b, j]
                out[lane, i + 1, j] += c0 * dbuf[b, j]
            out[lane, i + 1, i + 1] += c0 * c0
            b += 1
        i += 2
    if i < d:  # odd d: the last row alone
        for b in range(nbuf):
            a0 = dbuf[b, i]
            for j in range(i + 1):
                out[lane, i, j] += a0 * dbuf[b, j]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sym_times(a, u, lo, out):  # pragma: no cover - compiled
    """out[:n] = A u[lo:lo + n] for an n × n A, a dot product per row (measured against a sum of
    rows scaled by u, whose inner loop stores to ``out``: 1.8× at n = 10, 1.1–1.6× at 20–100)."""
    n = a.shape[0]
    for i in range(n):
        acc = 0.0
        for j in range(n):
            acc += a[i, j] * u[lo + j]
        out[i] = acc


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _metric_form(delta, sxx, metric, n_out, n_in):  # pragma: no cover - compiled
    """tr(δᵀ M δ Σxx) for δ (n_out × n_in, flattened), M = metric (identity when empty), as
    Σ_{o,q} M_oq δ_oᵀ (Σxx δ_q): each entry of Σxx δ_q a dot product, used at once (no scratch
    row). Inlined: as a call taking the form through a scratch row, a loss sample cost 67 ns
    more at N = 10 (a captured shard chunk at loss stride 1: 300 → 233 ns per replica-step)."""
    total = 0.0
    for q in range(n_out):
        lq = q * n_in
        for i in range(n_in):
            acc = 0.0
            for j in range(n_in):
                acc += sxx[i, j] * delta[lq + j]
            if metric.shape[0] == 0:
                total += acc * delta[lq + i]
            else:
                for o in range(n_out):
                    total += metric[o, q] * acc * delta[o * n_in + i]
    return total
