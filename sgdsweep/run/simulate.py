"""Simulate a batch of points and write their stores (the body of one Dask task).

All points of a batch share the problem (model and data), ``batch_size``, ``noise``, ``steps``
and the dynamics; their replicas become the lanes of one :func:`sgdsweep.sim.engine.run_lanes`
call. Each lane's randomness comes from ``SeedSequence([seed, *hash_words(replica_stream_key(params)),
replica])`` (:func:`sgdsweep.core.identity.replica_stream_key`, :func:`sgdsweep.sim.noise.lane_streams`),
so results do not depend on how points are batched or which worker runs them, nor on the
simulation version that decides whether they rerun; and for an extensible point (a sweep with
``precision:``) replica r is the same whatever the point's number of replicas.

A point with ``lyapunov: true`` (every point of an edge search) also stores each replica's
estimate of the top Lyapunov exponent of SGD linearised about the minimum
(:mod:`sgdsweep.sim.tangent`): ``lyapunov_replica``, and ``lyapunov``, ``lyapunov_se`` in its
summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sgdsweep.core.identity import replica_stream_key
from sgdsweep.errors import StoreError
from sgdsweep.models import get_model
from sgdsweep.models.predict import predict
from sgdsweep.sim import tangent
from sgdsweep.sim.engine import BATCH_VARYING, Dynamics, run_lanes
from sgdsweep.sim.replicas import loss_stride, replica_streams
from sgdsweep.sim.results import finite_or_none, point_result
from sgdsweep.sim.shapes import observe_spec
from sgdsweep.store import lanes as lanes_store
from sgdsweep.store import points as point_store
from sgdsweep.store.provenance import code_version
from sgdsweep.store.variables import point_array_attrs


def simulate_points(points: Sequence[Mapping[str, Any]], points_dir: str,
                    progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Simulate ``points`` together and write one store per point.

    Args:
        points: point specs ``{"hash", "params", "burn_in"}`` sharing problem, batch_size,
            noise, steps and dynamics (as grouped by :mod:`sgdsweep.sweep.plan`). A spec with
            ``"lanes": key`` (:class:`sgdsweep.sweep.config.Point`) keeps its lanes
            (:mod:`sgdsweep.store.lanes`): the replicas already stored under ``key`` are read
            back, only the others are simulated and stored, and the point's store is computed
            from all of them.
        points_dir: directory of the point stores.
        progress: called while the replicas are simulated, after each block of steps, with the
            fraction (0 to 1) of the call's steps done.

    Returns:
        ``{"points": [hashes written or found], "replica_steps": int (simulated by this call),
        "seconds": float}``.
    """
    t_start = time.perf_counter()
    first = points[0]["params"]
    for spec in points[1:]:
        diff = sorted(k for k in set(first) | set(spec["params"])
                      if k not in BATCH_VARYING and first.get(k) != spec["params"].get(k))
        if diff:
            raise ValueError(f"points {points[0]['hash']} and {spec['hash']} differ in {diff}: one call simulates "
                             f"points equal in everything but {', '.join(BATCH_VARYING)} (group them with "
                             "sgdsweep.run.execute.make_batches)")
    model = get_model(first["model"])
    problem = model.make_problem(model.data_params(first))
    dyn = Dynamics(first["method"], first["dt_over_lr"])
    sub = dyn.substeps
    lr, mom, burn, streams, w0, slices, strides, stored = [], [], [], [], [], [], [], []
    for spec in points:
        p = spec["params"]
        r = int(p["replicas"])
        kept, covered = ({}, 0)
        if spec.get("lanes"):  # an extensible point: its stored replicas are reused, not recomputed
            kept, covered = lanes_store.read_lanes(points_dir, spec["lanes"], r)
        stored.append(kept)
        start = len(streams)
        for gens in replica_streams(int(p["seed"]), replica_stream_key(p), r, start=covered):
            streams.append(gens[:2])
            w0.append(problem.initial(p["init"], gens[2]))
        slices.append(slice(start, len(streams)))
        n_new = r - covered
        lr += [p["lr"]] * n_new
        mom += [p["momentum"]] * n_new
        burn += [spec["burn_in"] * sub] * n_new
        strides += [loss_stride(problem, p, spec["burn_in"], sub)] * n_new
    observe = observe_spec(first)
    bound = first["divergence_threshold"] * problem.divergence_scale()
    lanes = {}
    if streams:
        total = int(first["steps"]) * sub
        lanes = run_lanes(problem, noise=first["noise"], batch_size=int(first["batch_size"]),
                          steps=int(first["steps"]) * sub, lr=np.array(lr), momentum=np.array(mom),
                          burn_in=np.array(burn), bound=np.full(len(streams), bound), w0=np.array(w0),
                          streams=streams, observe=observe, dynamics=dyn, loss_stride=np.array(strides),
                          progress=None if progress is None else (lambda t: progress(t / total)))
    exponents = _exponents(problem, points, first, dyn) if first.get(tangent.PARAM) else None
    elapsed_sim = time.perf_counter() - t_start
    replica_steps = 0
    for spec, sl, kept in zip(points, slices, stored):
        new = {k: v[sl] for k, v in lanes.items()}
        if kept and new and any(k not in kept or kept[k].dtype != v.dtype or kept[k].shape[1:] != v.shape[1:]
                                for k, v in new.items()):
            raise StoreError(f"stored lanes {spec['lanes']} in {points_dir}/lanes do not match the replicas "
                             "simulated now (other arrays, dtypes or shapes); delete those files and rerun")
        if spec.get("lanes") and sl.stop > sl.start:
            lanes_store.write_part(points_dir, spec["lanes"], int(spec["params"]["replicas"]) - (sl.stop - sl.start),
                                   new)
        point_lanes = {k: np.concatenate([kept[k], new[k]]) for k in kept} if kept and new else (kept or new)
        pred = predict(problem, spec["params"])
        arrays, summary = point_result(problem, spec["params"], spec["burn_in"], point_lanes, pred,
                                       loss_stride(problem, spec["params"], spec["burn_in"], sub), sub)
        replica_steps += (sl.stop - sl.start) * int(spec["params"]["steps"]) * sub
        attrs = {"point_hash": spec["hash"], "params": dict(spec["params"]), "summary": summary,
                 "code_version": code_version(),
                 "simulation_seconds": elapsed_sim * (sl.stop - sl.start) / max(1, len(streams))}
        if exponents is not None:
            gammas = exponents[spec["hash"]]
            arrays["lyapunov_replica"] = (("replica",), gammas)
            mean, se = tangent.exponent_summary(gammas)
            summary.update(lyapunov=finite_or_none(mean), lyapunov_se=finite_or_none(se))
        described = {k: (*v, point_array_attrs(k)) for k, v in arrays.items()}
        point_store.write_point(point_store.point_path(points_dir, spec["hash"]), described, attrs)
    return {"points": [s["hash"] for s in points], "replica_steps": replica_steps,
            "seconds": time.perf_counter() - t_start}


def _exponents(problem, points: Sequence[Mapping[str, Any]], first: Mapping[str, Any],
               dyn: Dynamics) -> dict[str, np.ndarray]:
    """Point hash → its replicas' Lyapunov exponents (:func:`sgdsweep.sim.tangent.lyapunov_exponents`,
    every replica of every point of the batch in one call)."""
    sub = dyn.substeps
    steps = int(first["steps"]) * sub
    lr, mom, burn, streams, sizes = [], [], [], [], []
    for spec in points:
        p = spec["params"]
        r = int(p["replicas"])
        streams += tangent.tangent_streams(int(p["seed"]), replica_stream_key(p), r)
        lr += [p["lr"]] * r
        mom += [p["momentum"]] * r
        burn += [tangent.tangent_burn_in(spec["burn_in"] * sub, steps)] * r
        sizes.append(r)
    gammas = tangent.lyapunov_exponents(problem, noise=first["noise"], batch_size=int(first["batch_size"]),
                                        steps=steps, lr=np.array(lr), momentum=np.array(mom),
                                        burn_in=np.array(burn, dtype=np.int64), streams=streams, dynamics=dyn)
    out, start = {}, 0
    for spec, r in zip(points, sizes):
        out[spec["hash"]] = gammas[start:start + r]
        start += r
    return out
