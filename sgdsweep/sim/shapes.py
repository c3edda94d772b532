"""What a simulation holds, stated without compiling or importing anything heavy: the observables'
spec, the shapes of a lane's accumulators, the random-number block size and the noise types that
keep a permutation of the samples.

Planning a sweep (:func:`sgdsweep.sweep.cost.footprint`) reads these to estimate memory; the
engine (:mod:`sgdsweep.sim.engine`, :mod:`sgdsweep.sim.observables`, :mod:`sgdsweep.sim.noise`)
allocates from the same definitions, so the estimate and the simulation cannot drift apart. The
shard job groups points into engine calls by :data:`BATCH_VARYING`. This module imports only
NumPy and the noise-type registry: no Numba, no SciPy, no theory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sgdsweep.core.noise_types import MODE  # a lane of these noise types keeps a permutation of the P samples

__all__ = ["BATCH_VARYING", "BLOCK_RANDOM_NUMBERS", "MODE", "ObserveSpec", "Slot", "accumulator_layout",
           "lane_accumulator_bytes", "noise_lag_list", "observe_spec", "sketch_width"]

#: Upper bound on the random numbers held per block of the numpy loop, and per lane chunk of a
#: kernel's block (memory ≈ 8 bytes each).
BLOCK_RANDOM_NUMBERS = 1_000_000
#: The point parameters that may differ between the points of one engine call
#: (:func:`sgdsweep.sim.engine.run_lanes` takes them per lane: λ, μ, and the number of lanes a
#: point has); every other parameter is the call's.
BATCH_VARYING: tuple[str, ...] = ("lr", "momentum", "replicas")


@dataclass(frozen=True)
class ObserveSpec:
    """Which observables to accumulate (``dynamics.observe`` in the config).

    Attributes:
        cov_max_dim: full covariance up to this many parameters, diagonal beyond (plus the
            leading ``n_eigenpairs`` eigenpairs from a streaming sketch).
        n_eigenpairs: eigenpairs estimated beyond ``cov_max_dim``.
        loss: accumulate the training loss (and its autocorrelation).
        test_loss: accumulate the test loss (models that define one).
        autocorr_lags: K, lags of the loss autocorrelation ring buffer (0 = off).
        autocorr_stride: steps between loss samples fed to the autocorrelation buffer.
        noise_lags: lags m of D(m) (0 included automatically); empty = off.
        escape: stop lanes when the model says they escaped and record the step.
    """

    cov_max_dim: int = 64
    n_eigenpairs: int = 8
    loss: bool = True
    test_loss: bool = True
    autocorr_lags: int = 128
    autocorr_stride: int = 1
    noise_lags: tuple[int, ...] = ()
    escape: bool = False


def observe_spec(params: Mapping[str, Any]) -> ObserveSpec:
    """The :class:`ObserveSpec` of the config's ``dynamics.observe`` (in a point's ``params``)."""
    o = params["observe"]
    return ObserveSpec(cov_max_dim=int(o["cov_max_dim"]), n_eigenpairs=int(o["n_eigenpairs"]), loss=bool(o["loss"]),
                       test_loss=bool(o["test_loss"]), autocorr_lags=int(o["autocorr_lags"]) if o["loss"] else 0,
                       noise_lags=tuple(o["noise_lags"]) if o["gradient_noise"] else (),
                       escape=bool(o["escape"]))


def noise_lag_list(spec: ObserveSpec) -> list[int]:
    """Lags of D(m): 0 first, then the configured ones."""
    return [0] + sorted(m for m in set(spec.noise_lags) if m > 0)


def sketch_width(spec: ObserveSpec, d: int) -> int:
    """Columns of the random test matrix: the eigenpairs wanted plus 24 for oversampling (a
    Nyström estimate is biased low by the energy of the spectrum's tail beyond the sketch)."""
    return min(d, spec.n_eigenpairs + 24)


#: An accumulator: its shape after the leading lane dimension, its data type, its initial value.
Slot = tuple[tuple[int, ...], type, float]


def accumulator_layout(problem: Any, spec: ObserveSpec, reference_per_lane: bool) -> dict[str, Slot]:
    """Name → (shape per lane, dtype, fill) of every accumulator a lane of ``problem`` holds
    (:class:`sgdsweep.sim.observables.Accumulators`, whose module docstring says what each sums).
    ``problem`` needs ``dim``, and with ``noise_lags`` also ``linear_in_w``, ``n_inputs`` and
    ``n_outputs``."""
    d = int(problem.dim)
    out: dict[str, Slot] = {"n": ((), np.int64, 0), "sum_d": ((d,), np.float64, 0.0),
                            "diverged_step": ((), np.int64, -1), "escape_step": ((), np.int64, -1)}
    if d <= spec.cov_max_dim:
        out["sum_dd"] = ((d, d), np.float64, 0.0)
    else:
        out["sum_d2"] = ((d,), np.float64, 0.0)
        if spec.n_eigenpairs > 0:
            out["sketch"] = ((d, sketch_width(spec, d)), np.float64, 0.0)
    if reference_per_lane:
        out["reference"] = ((d,), np.float64, float("nan"))
    if spec.loss or spec.test_loss:
        out["loss_count"] = ((), np.int64, 0)
    if spec.loss:
        out["sum_loss"] = ((), np.float64, 0.0)
        if spec.autocorr_lags > 0:
            k = spec.autocorr_lags
            for name in ("loss_buf", "loss_lag", "loss_head"):
                out[name] = ((k,), np.float64, 0.0)
    if spec.test_loss:
        out["sum_test_loss"] = ((), np.float64, 0.0)
    if spec.noise_lags and problem.linear_in_w:
        n_in, kmax = int(problem.n_inputs), max(spec.noise_lags) + 1
        out["noise_buf"] = ((kmax, int(problem.n_outputs), n_in), np.float64, 0.0)
        out["noise_lag"] = ((len(noise_lag_list(spec)), n_in, n_in), np.float64, 0.0)
        out["sum_gram"] = ((n_in, n_in), np.float64, 0.0)
    return out


def lane_accumulator_bytes(problem: Any, spec: ObserveSpec, reference_per_lane: bool) -> int:
    """Bytes of one lane's accumulators (:func:`accumulator_layout`)."""
    total = 0
    for shape, dtype, _ in accumulator_layout(problem, spec, reference_per_lane).values():
        n = 1
        for s in shape:
            n *= s
        total += n * np.dtype(dtype).itemsize
    return total
