"""A point's replicas: their random streams and how often their loss is sampled.

Each replica's randomness comes from ``SeedSequence([seed, *hash_words(replica_stream_key(params)),
replica])`` (:func:`sgdsweep.core.identity.replica_stream_key`, :func:`sgdsweep.sim.noise.lane_streams`),
so results do not depend on how points are batched or which worker runs them, nor on the
simulation version that decides whether they rerun; and for an extensible point (a sweep with
``precision:``) replica r is the same whatever the point's number of replicas. The task that
simulates a batch of points and writes their stores is :func:`sgdsweep.run.simulate.simulate_points`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sgdsweep.core.identity import hash_words
from sgdsweep.sim.noise import child_streams


def replica_streams(seed: int, stream_key: str, replicas: int, start: int = 0,
                    needed: tuple[bool, bool, bool] = (True, True, True)
                    ) -> list[tuple[np.random.Generator | None, ...]]:
    """Per replica ``start`` … ``replicas − 1`` its (uniforms, normals, initialisation)
    generators, keyed by (root seed, the point's
    :func:`sgdsweep.core.identity.replica_stream_key`, replica index); None for those not
    ``needed`` (:func:`sgdsweep.sim.noise.lane_streams`)."""
    words = hash_words(stream_key)
    return [child_streams([seed, *words, r], needed=needed) for r in range(start, replicas)]


def loss_stride(problem, params: Mapping[str, Any], burn_in: int, substeps: int) -> int:
    """Integrator steps between loss samples of a point: an eighth of its relaxation time
    (successive samples closer than that carry almost no new information), but at least
    2·autocorr_lags + 2 samples in the measured window (slow modes must not starve the mean)."""
    tau = problem.relaxation_steps(params["lr"], params["momentum"])
    by_tau = int(tau * substeps / 8) if math.isfinite(tau) else 1
    window = (int(params["steps"]) - int(burn_in)) * substeps
    by_window = window // (2 * int(params["observe"]["autocorr_lags"]) + 2)
    return max(1, min(by_tau, by_window))
