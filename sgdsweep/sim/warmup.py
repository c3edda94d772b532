"""Dask worker preload: import the simulation code and load the compiled kernels at worker start.

Local clusters (:mod:`sgdsweep.run.cluster`) start their workers with
``preload=["sgdsweep.sim.warmup"]``, so a worker imports NumPy, SciPy, numba and the models, and
loads the compiled kernels from numba's cache as it starts, not when the first task arrives.
Nothing here changes results.
"""

from __future__ import annotations

from typing import Any


def warm() -> None:
    """Run two lanes of a tiny linear regression for a few steps (loads the affine kernel) and
    draw one block of normals (loads the compiled ziggurat, ~0.3 s)."""
    import numpy as np

    from sgdsweep.models import linear
    from sgdsweep.sim.engine import run_lanes
    from sgdsweep.sim.noise import COMPILED_NORMALS_MIN, draw_normals
    from sgdsweep.sim.observables import ObserveSpec
    from sgdsweep.sim.replicas import replica_streams

    problem = linear.make_problem({"n_inputs": 2, "n_outputs": 1, "n_samples": 8, "label_noise": 0.5,
                                   "inputs": "isotropic", "wishart_ratio": None, "labels": "teacher",
                                   "noiseless": False, "seed": 0})
    streams = [g[:2] for g in replica_streams(0, "0" * 16, 2)]
    run_lanes(problem, noise="minibatch", batch_size=2, steps=4, lr=np.full(2, 0.1), momentum=np.zeros(2),
              burn_in=np.zeros(2, np.int64), bound=np.full(2, 1e6), w0=np.zeros((2, 2)), streams=streams,
              observe=ObserveSpec())
    draw_normals(np.random.default_rng(0), np.empty(COMPILED_NORMALS_MIN))


def dask_setup(worker: Any) -> None:
    """Called by Dask when the worker starts."""
    warm()
