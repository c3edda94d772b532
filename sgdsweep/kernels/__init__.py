"""Compiled kernels: a block of steps of many lanes in one compiled loop.

:func:`sgdsweep.engine.run_lanes` can advance lanes with numpy, one vectorised step at a time;
where :func:`supports` says a kernel exists, it runs each block of steps here instead, on the
same random numbers: :func:`prepare` picks the problem's family and packs its arrays,
:func:`advance` runs the block. The layout:

- :mod:`.loop`: the one block loop (:func:`.loop.block_loop`), the lane state :class:`Lanes`
  and the driver :func:`advance` (chunks of lanes, threads);
- :mod:`.common`: the steps every family shares (sample draws, update, moments, loss samples);
- one module per family, which plugs its gradient, noise, losses and escape test into the loop
  as compiled hooks: :mod:`.affine` (``linear``, ``digits``, ``matrix``), :mod:`.two_layer`,
  :mod:`.landscape` (``quadratic`` and the double well: a polynomial gradient with additive
  noise; the thesis landscape);
- :mod:`.entries`: the compiled, cached kernels, one pair per family.

The kernels consume exactly the random numbers the numpy engine consumes (the same per-lane
uniform and normal streams, the same partial Fisher–Yates shuffle), so both give the same
trajectories up to floating-point rounding (``tests/test_fused.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..models.affine import AffineProblem
from ..models.landscape import Thesis
from ..models.two_layer import TwoLayerProblem
from ..noise import MODE, matched_by_covariance, normals_per_step
from . import affine, entries, landscape, two_layer
from .affine import EIGHT_ROWS_MIN, PAD_INPUTS
from .common import DELTA_BUFFER
from .loop import CHUNK_LANES, THREADS_ENV, Common, Lanes, advance, threads

__all__ = ["ADDED_CODE", "CHUNK_LANES", "DELTA_BUFFER", "EIGHT_ROWS_MIN", "PAD_INPUTS", "THREADS_ENV", "Common",
           "Kernel", "Lanes", "advance", "prepare", "supports", "threads"]

#: Added-noise types of the polynomial family.
ADDITIVE = ("gaussian", "student_t")
#: ``Common.added`` of each added-noise type (0: sampled noise).
ADDED_CODE = {"gaussian": 1, "gaussian_matched": 2, "student_t": 3}


class Kernel(NamedTuple):
    """A family's compiled kernels and their problem arguments, for :func:`advance`."""

    pair: tuple[Any, Any]  #: (with Σδδᵀ, with Σδ² and the sketch)
    common: Common
    data: tuple  #: the family's named tuple of problem arrays


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Whether a kernel can run this call (otherwise the numpy engine does)."""
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


def prepare(problem, noise: str, batch_size: int, noise_scale: float, omega: np.ndarray, want_loss: bool,
            want_test: bool, escape: bool, noise_lags: list[int] = ()) -> Kernel:
    """The kernels and arguments for ``problem`` under ``noise`` at batch size S = ``batch_size``
    (``noise_scale``: the SDE's factor on the noise, 1 for SGD; ``omega``: the sketch's test
    matrix, or empty; ``noise_lags``: the lags m of D(m), 0 first, when the gradient noise is
    observed — affine problems only). Call only where :func:`supports` holds."""
    added = ADDED_CODE.get(noise, 0)
    if isinstance(problem, (AffineProblem, Thesis, TwoLayerProblem)):
        n_samples = problem.n_samples
        amp = noise_amplitude(problem, noise, batch_size, noise_scale)
        n_batches = max(1, n_samples // batch_size) if noise in MODE else 1
        common = Common(added, amp, MODE.get(noise, 0), n_batches, n_samples, omega, want_loss)
    else:
        common = Common(added, float(noise_scale), 0, 1, 0, omega, want_loss)
    has_label = normals_per_step(noise, problem, batch_size) > 0
    if isinstance(problem, AffineProblem):
        return Kernel(entries.AFFINE, common, affine.data(problem, added, want_test, has_label, noise_lags))
    if isinstance(problem, TwoLayerProblem):
        return Kernel(entries.TWO_LAYER, common, two_layer.data(problem, added, want_test, has_label))
    if isinstance(problem, Thesis):
        return Kernel(entries.THESIS, common, landscape.thesis_data(problem, escape))
    return Kernel(entries.POLYNOMIAL, common, landscape.polynomial_data(problem, batch_size))


def noise_amplitude(problem, noise: str, batch_size: int, noise_scale: float) -> float:
    """The amplitude a of added noise on a data set: √(f/P) with f = (P−S)/(S(P−1)) for
    ``gaussian_matched`` and ``student_t`` (:mod:`.affine`), the standard deviation
    √(gaussian_noise_var) per coordinate for ``gaussian`` — times the SDE's ``noise_scale``;
    0 for sampled noise."""
    added = ADDED_CODE.get(noise, 0)
    if added == 1:
        return noise_scale * float(np.sqrt(problem.gaussian_noise_var(batch_size)))
    if added:
        p = problem.n_samples
        f = (p - batch_size) / (batch_size * (p - 1))
        return noise_scale * float(np.sqrt(f / p))
    return 0.0
