"""Compiled kernels: a block of steps of many lanes in one compiled loop.

:func:`sgdsweep.sim.engine.run_lanes` can advance lanes with numpy, one vectorised step at a
time; where :func:`supports` says a kernel exists, it runs each block of steps here instead, on
the same random numbers: :func:`prepare` packs the problem's arrays for its family's kernels,
:func:`advance` runs a block. The layout:

- :mod:`.loop`: the lane state :class:`Lanes`, the call's settings :class:`Common`, the shape
  every block loop has, the factory of the compiled kernels and the driver :func:`advance`;
- :mod:`.common`: the steps every family's loop shares (sample draws, update, moments, loss
  samples, weights of matched noise);
- one plug-in module per family, named by the problem class's ``kernel`` (:data:`FAMILIES`):
  what it supports, its arguments, its block loop (gradient, noise, losses, escape) and its
  compiled kernels (``KERNELS``);
- :mod:`.digest`: the digest of the sources compiled into a kernel (its cache key).

The kernels consume exactly the random numbers the numpy engine consumes (the same per-lane
uniform and normal streams, the same partial Fisher–Yates shuffle), so both give the same
trajectories up to floating-point rounding (``tests/sim/test_fused.py``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from sgdsweep.sim.kernels import additive, affine, thesis, two_layer
from sgdsweep.sim.kernels.affine import EIGHT_ROWS_MIN, PAD_INPUTS
from sgdsweep.sim.kernels.common import ADDED_CODE, DELTA_BUFFER
from sgdsweep.sim.kernels.loop import CHUNK_LANES, THREADS_ENV, Common, Lanes, advance, threads
from sgdsweep.sim.noise import MODE

__all__ = ["ADDED_CODE", "CHUNK_LANES", "DELTA_BUFFER", "EIGHT_ROWS_MIN", "FAMILIES", "PAD_INPUTS", "THREADS_ENV",
           "Common", "Kernel", "Lanes", "advance", "family", "frozen", "prepare", "supports", "threads"]

#: Kernel family (a problem class's ``kernel``, :data:`sgdsweep.models.base.KERNELS`) → its
#: plug-in: ``supports(problem, noise, dynamics_kind, noise_lags, escape)``,
#: ``amplitude(problem, noise, batch_size, noise_scale)``, ``data(problem, noise, batch_size,
#: want_test, escape, noise_lags)`` and ``KERNELS``.
FAMILIES: dict[str, ModuleType] = {"affine": affine, "two_layer": two_layer, "additive": additive,
                                   "thesis": thesis}


class Kernel(NamedTuple):
    """A family's compiled kernels and their arguments, for :func:`advance`."""

    pair: tuple[Any, Any]  #: (with Σδδᵀ, with Σδ² and the sketch)
    common: Common
    data: tuple  #: the family's named tuple of problem arrays


def family(problem) -> ModuleType | None:
    """The plug-in of ``problem``'s kernel family, or None where its class names none."""
    return FAMILIES.get(type(problem).kernel)


def supports(problem, noise: str, dynamics_kind: str, noise_lags: list[int], escape: bool) -> bool:
    """Whether a kernel can run this call (otherwise the numpy engine does): ``noise_lags``, the
    lags of D(m) where the gradient noise is observed; ``escape``, whether lanes stop on escape."""
    plug = family(problem)
    return plug is not None and plug.supports(problem, noise, dynamics_kind, list(noise_lags), escape)


def prepare(problem, noise: str, batch_size: int, noise_scale: float, dt_over_lr: float, omega: np.ndarray,
            want_loss: bool, want_test: bool, escape: bool, noise_lags: list[int] = ()) -> Kernel:
    """The kernels and arguments for ``problem`` under ``noise`` at batch size S = ``batch_size``
    (``noise_scale``: the SDE's factor on the noise, 1 for SGD; ``dt_over_lr``: the integrator's
    step over λ, 1 for SGD; ``omega``: the sketch's test matrix, or empty; ``noise_lags``: the
    lags m of D(m), 0 first, when the gradient noise is observed). Call only where
    :func:`supports` holds."""
    plug = family(problem)
    n_samples = problem.n_samples or 0
    n_batches = max(1, n_samples // batch_size) if noise in MODE else 1
    common = Common(ADDED_CODE.get(noise, 0), plug.amplitude(problem, noise, batch_size, noise_scale),
                    MODE.get(noise, 0), n_batches, n_samples, omega, want_loss, float(dt_over_lr))
    return Kernel(plug.KERNELS, common, frozen(plug.data(problem, noise, batch_size, want_test, escape,
                                                        list(noise_lags))))


def frozen(data: tuple) -> tuple:
    """``data`` (a family's named tuple of problem arrays) with every array read-only and
    C-contiguous (a read-only view, or a contiguous copy of a strided one). Numba compiles a
    kernel once per argument type, and an array's writability and layout are part of its type:
    without this, a problem's own (read-only) array in one field, a fresh (writable) one or a
    strided slice in another sweep, would each compile the whole kernel again (tens of seconds)."""
    def one(value: Any) -> Any:
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            return value
        out = value if value.flags.c_contiguous else np.ascontiguousarray(value)
        if out.flags.writeable:
            out = out.view()
            out.flags.writeable = False
        return out

    return type(data)(*(one(value) for value in data))
