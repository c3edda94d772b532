"""The compiled kernels: :func:`sgdsweep.kernels.loop.block_loop` with each family's hooks,
twice per family — keeping the full second moment Σδδᵀ (``*_full``) or Σδ² and the sketch
(``*_diagonal``), so that the other's accumulators are dead code in each.

Each kernel is called as ``kernel(t0, n_steps, n_u, lanes, common, data)`` (:class:`.Lanes`,
:class:`.Common`, the family's data tuple) and is cached by Numba. Numba checks only this
file's stamp before it loads a cached kernel, while the code built into the kernels comes from
:data:`COMPILED_DEPENDENCIES`: their digest is kept here (:data:`DEPENDENCY_DIGEST`), and
``tests/test_fused.py`` fails until it is updated after any of them changes — that edit makes
Numba compile the kernels again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numba

from . import affine, landscape, two_layer
from .common import FAST
from .loop import block_loop, no_escape, no_finish, no_observe

#: The sources (relative to the ``sgdsweep`` package) whose compiled functions and constants
#: are built into these kernels, and their SHA-256 (16 hex digits, :func:`dependency_digest`).
COMPILED_DEPENDENCIES = ("kernels/affine.py", "kernels/common.py", "kernels/landscape.py", "kernels/loop.py",
                         "kernels/two_layer.py", "noise.py", "observables.py", "pcg64.py", "vecmath.py")
DEPENDENCY_DIGEST = "b72f576a4c4b1712"


def dependency_digest() -> str:
    """SHA-256 (16 hex digits) of the sources of :data:`COMPILED_DEPENDENCIES`, in that order."""
    digest = hashlib.sha256()
    root = Path(__file__).parent.parent
    for name in COMPILED_DEPENDENCIES:
        digest.update((root / name).read_text(encoding="utf-8").replace("\r\n", "\n").encode())
    return digest.hexdigest()[:16]


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def affine_full(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """Affine problems (:mod:`.affine`) with Σδδᵀ."""
    block_loop(True, t0, n_steps, n_u, lanes, common, data, affine.begin, affine.gradient, affine.deviation,
               no_escape, affine.observe, affine.losses, affine.finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def affine_diagonal(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """Affine problems with Σδ² and the sketch."""
    block_loop(False, t0, n_steps, n_u, lanes, common, data, affine.begin, affine.gradient, affine.deviation,
               no_escape, affine.observe, affine.losses, affine.finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def two_layer_full(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """The two-layer network (:mod:`.two_layer`) with Σδδᵀ."""
    block_loop(True, t0, n_steps, n_u, lanes, common, data, two_layer.begin, two_layer.gradient,
               two_layer.deviation, no_escape, no_observe, two_layer.losses, no_finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def two_layer_diagonal(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """The two-layer network with Σδ² and the sketch."""
    block_loop(False, t0, n_steps, n_u, lanes, common, data, two_layer.begin, two_layer.gradient,
               two_layer.deviation, no_escape, no_observe, two_layer.losses, no_finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def polynomial_full(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """Polynomial gradients with additive noise (:mod:`.landscape`) with Σδδᵀ."""
    block_loop(True, t0, n_steps, n_u, lanes, common, data, landscape.polynomial_begin,
               landscape.polynomial_gradient, landscape.deviation, landscape.polynomial_escaped, no_observe,
               landscape.polynomial_losses, no_finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST)
def polynomial_diagonal(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """Polynomial gradients with additive noise with Σδ² and the sketch."""
    block_loop(False, t0, n_steps, n_u, lanes, common, data, landscape.polynomial_begin,
               landscape.polynomial_gradient, landscape.deviation, landscape.polynomial_escaped, no_observe,
               landscape.polynomial_losses, no_finish)


# NumPy's error model: no division-by-zero branch, which would stop the sample loop vectorising
@numba.njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def thesis_full(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """The thesis landscape (:mod:`.landscape`) with Σδδᵀ."""
    block_loop(True, t0, n_steps, n_u, lanes, common, data, landscape.thesis_begin, landscape.thesis_gradient,
               landscape.deviation, landscape.thesis_escaped, no_observe, landscape.thesis_losses, no_finish)


@numba.njit(cache=True, nogil=True, fastmath=FAST, error_model="numpy")
def thesis_diagonal(t0, n_steps, n_u, lanes, common, data):  # pragma: no cover - compiled
    """The thesis landscape with Σδ² and the sketch."""
    block_loop(False, t0, n_steps, n_u, lanes, common, data, landscape.thesis_begin, landscape.thesis_gradient,
               landscape.deviation, landscape.thesis_escaped, no_observe, landscape.thesis_losses, no_finish)


#: Each family's pair (with Σδδᵀ, with Σδ² and the sketch).
AFFINE = (affine_full, affine_diagonal)
TWO_LAYER = (two_layer_full, two_layer_diagonal)
POLYNOMIAL = (polynomial_full, polynomial_diagonal)
THESIS = (thesis_full, thesis_diagonal)
