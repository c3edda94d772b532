"""Simulate a batch of points and write their stores (the body of one Dask task).

All points of a batch share the data set, ``batch_size``, ``noise`` and ``steps``; their
replicas become the lanes of one :func:`sgdsweep.kernel.run_lanes` call. Each lane's random
stream is ``SeedSequence([seed, *hash_words(point_hash), replica])``, so results do not depend
on how points are batched or which worker runs them.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import numpy as np

from . import store
from .identity import hash_words
from .kernel import run_lanes
from .models import get_model
from .provenance import code_version
from .theory import linear as linear_theory


def replica_generators(seed: int, point_hash: str, replicas: int) -> list[np.random.Generator]:
    """One independent generator per replica, keyed by (root seed, point hash, replica index)."""
    words = hash_words(point_hash)
    return [np.random.default_rng(np.random.SeedSequence([seed, *words, r])) for r in range(replicas)]


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _point_result(data, params: Mapping[str, Any], burn_in: int, sums, lanes: slice):
    """Arrays and summary attributes of one point from its lanes' streaming sums."""
    n = data.n_inputs
    count = sums.count[lanes]
    div = sums.diverged_step[lanes]
    ok = (div < 0) & (count > 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m_rep = sums.sum_outer[lanes] / count[:, None, None]
        mean_rep = sums.sum_delta[lanes] / count[:, None]
        var_rep = np.where(ok, np.trace(m_rep, axis1=1, axis2=2) / n, np.nan)
        loss_rep = np.where(ok, data.loss_min + 0.5 * np.einsum("ij,rij->r", data.hessian, m_rep), np.nan)
    n_ok = int(ok.sum())

    def mean_se(values: np.ndarray) -> tuple[float, float]:
        v = values[ok]
        if n_ok == 0:
            return math.nan, math.nan
        se = float(np.std(v, ddof=1) / np.sqrt(n_ok)) if n_ok > 1 else math.nan
        return float(np.mean(v)), se

    theory_error = None
    try:
        theory_m = linear_theory.stationary_second_moment(
            data, params["lr"], params["batch_size"], params["momentum"], params["noise"])
    except (RuntimeError, np.linalg.LinAlgError, MemoryError, ValueError) as exc:
        # never lose a simulation to its theory: store NaN and say why
        theory_m, theory_error = np.full((n, n), np.nan), f"{type(exc).__name__}: {exc}"
    wv, wv_se = mean_se(var_rep)
    loss, loss_se = mean_se(loss_rep)
    cov = m_rep[ok].mean(axis=0) if n_ok else np.full((n, n), np.nan)
    mean = mean_rep[ok].mean(axis=0) if n_ok else np.full(n, np.nan)
    arrays = {
        "weight_var_replica": (("replica",), var_rep),
        "loss_replica": (("replica",), loss_rep),
        "diverged_step": (("replica",), div.astype(np.int64)),
        "weight_mean": (("param",), mean),
        "weight_cov": (("param", "param_t"), cov),
        "weight_cov_theory": (("param", "param_t"), theory_m),
    }
    summary = {
        "weight_var": _finite_or_none(wv),
        "weight_var_se": _finite_or_none(wv_se),
        "weight_var_theory": _finite_or_none(linear_theory.weight_var(theory_m)),
        "loss": _finite_or_none(loss),
        "loss_se": _finite_or_none(loss_se),
        "loss_theory": _finite_or_none(linear_theory.training_loss(data, theory_m)),
        "diverged": bool(np.any(div >= 0)),
        "diverged_replicas": int(np.sum(div >= 0)),
        "measured_steps": int(count[ok].max()) if n_ok else 0,
        "burn_in": int(burn_in),
        "n_samples": int(data.n_samples),
        "theory_error": theory_error,
    }
    return arrays, summary


def simulate_points(points: Sequence[Mapping[str, Any]], points_dir: str) -> dict[str, Any]:
    """Simulate ``points`` together and write one store per point.

    Args:
        points: point specs ``{"hash", "params", "burn_in"}`` sharing data, batch_size, noise
            and steps (as grouped by :mod:`sgdsweep.plan`).
        points_dir: directory of the point stores.

    Returns:
        ``{"points": [hashes written or found], "replica_steps": int, "seconds": float}``.
    """
    t_start = time.perf_counter()
    first = points[0]["params"]
    model = get_model(first["model"])
    data = model.make_data(model.data_params(first))
    lr, mom, burn, gens, slices = [], [], [], [], []
    for spec in points:
        p = spec["params"]
        r = int(p["replicas"])
        start = len(gens)
        gens.extend(replica_generators(int(p["seed"]), spec["hash"], r))
        slices.append(slice(start, start + r))
        lr += [p["lr"]] * r
        mom += [p["momentum"]] * r
        burn += [spec["burn_in"]] * r
    bound = first["divergence_threshold"] * (1.0 + float(data.w_hat @ data.w_hat))
    w0 = data.w_hat if first["init"] == "minimum" else np.zeros(data.n_inputs)
    sums = run_lanes(data.x, data.y, data.w_hat, w0, lr=np.array(lr), momentum=np.array(mom),
                     burn_in=np.array(burn), bound=np.full(len(gens), bound),
                     batch_size=int(first["batch_size"]), replace=first["noise"] == "minibatch_replace",
                     steps=int(first["steps"]), generators=gens)
    elapsed_sim = time.perf_counter() - t_start
    replica_steps = 0
    for spec, lanes in zip(points, slices):
        arrays, summary = _point_result(data, spec["params"], spec["burn_in"], sums, lanes)
        replica_steps += int(spec["params"]["replicas"]) * int(spec["params"]["steps"])
        attrs = {"point_hash": spec["hash"], "params": dict(spec["params"]), "summary": summary,
                 "code_version": code_version(),
                 "simulation_seconds": elapsed_sim * (lanes.stop - lanes.start) / len(gens)}
        store.write_point(store.point_path(points_dir, spec["hash"]), arrays, attrs)
    return {"points": [s["hash"] for s in points], "replica_steps": replica_steps,
            "seconds": time.perf_counter() - t_start}
