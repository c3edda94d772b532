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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sgdsweep.core.identity import replica_stream_key
from sgdsweep.errors import StoreError
from sgdsweep.models import get_model
from sgdsweep.models.predict import predict
from sgdsweep.sim import tangent
from sgdsweep.sim.engine import BATCH_VARYING, Dynamics, run_lanes
from sgdsweep.sim.noise import normals_per_step, uniforms_per_step
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
    # the generators the engine will draw from (the others are not made: ~20 µs each)
    needs = (uniforms_per_step(first["noise"], int(first["batch_size"])) > 0,
             normals_per_step(first["noise"], problem, int(first["batch_size"])) > 0)
    records: list[_PointLanes] = []
    start = 0
    for spec in points:
        p = spec["params"]
        r = int(p["replicas"])
        kept, covered = ({}, 0)
        if spec.get("lanes"):  # an extensible point: its stored replicas are reused, not recomputed
            kept, covered = lanes_store.read_lanes(points_dir, spec["lanes"], r)
        rec = _PointLanes(spec=spec, kept=kept, start=start, lr=p["lr"], momentum=p["momentum"],
                          burn_in=spec["burn_in"] * sub, stride=loss_stride(problem, p, spec["burn_in"], sub))
        random_start = p["init"] not in ("zero", "minimum")
        for gens in replica_streams(int(p["seed"]), replica_stream_key(p), r, start=covered,
                                    needed=(*needs, random_start)):
            rec.streams.append(gens[:2])
            rec.w0.append(problem.initial(p["init"], gens[2]))
        records.append(rec)
        start = rec.stop
    n_new = start  # lanes simulated by this call, every point's new replicas in order
    observe = observe_spec(first)
    bound = first["divergence_threshold"] * problem.divergence_scale()
    lanes = {}
    if n_new:
        total = int(first["steps"]) * sub
        lanes = run_lanes(problem, noise=first["noise"], batch_size=int(first["batch_size"]),
                          steps=int(first["steps"]) * sub, lr=_per_lane(records, lambda q: q.lr),
                          momentum=_per_lane(records, lambda q: q.momentum),
                          burn_in=_per_lane(records, lambda q: q.burn_in), bound=np.full(n_new, bound),
                          w0=np.array([w for q in records for w in q.w0]),
                          streams=[g for q in records for g in q.streams], observe=observe, dynamics=dyn,
                          loss_stride=_per_lane(records, lambda q: q.stride),
                          progress=None if progress is None else (lambda t: progress(t / total)))
    exponents = _exponents(problem, points, first, dyn) if first.get(tangent.PARAM) else None
    elapsed_sim = time.perf_counter() - t_start
    replica_steps = 0
    for rec in records:
        spec, kept, sl = rec.spec, rec.kept, slice(rec.start, rec.stop)
        new = {k: v[sl] for k, v in lanes.items()}
        if kept and new and any(k not in kept or kept[k].dtype != v.dtype or kept[k].shape[1:] != v.shape[1:]
                                for k, v in new.items()):
            raise StoreError(f"stored lanes {spec['lanes']} in {points_dir}/lanes do not match the replicas "
                             "simulated now (other arrays, dtypes or shapes); delete those files and rerun")
        if spec.get("lanes") and rec.n_new:
            lanes_store.write_part(points_dir, spec["lanes"], int(spec["params"]["replicas"]) - rec.n_new, new)
        point_lanes = {k: np.concatenate([kept[k], new[k]]) for k in kept} if kept and new else (kept or new)
        pred = predict(problem, spec["params"])
        arrays, summary = point_result(problem, spec["params"], spec["burn_in"], point_lanes, pred,
                                       loss_stride(problem, spec["params"], spec["burn_in"], sub), sub)
        replica_steps += rec.n_new * int(spec["params"]["steps"]) * sub
        attrs = {"point_hash": spec["hash"], "params": dict(spec["params"]), "summary": summary,
                 "code_version": code_version(),
                 "simulation_seconds": elapsed_sim * rec.n_new / max(1, n_new)}
        if exponents is not None:
            gammas = exponents[spec["hash"]]
            arrays["lyapunov_replica"] = (("replica",), gammas)
            mean, se = tangent.exponent_summary(gammas)
            summary.update(lyapunov=finite_or_none(mean), lyapunov_se=finite_or_none(se))
        described = {k: (*v, point_array_attrs(k)) for k, v in arrays.items()}
        point_store.write_point(point_store.point_path(points_dir, spec["hash"]), described, attrs)
    return {"points": [s["hash"] for s in points], "replica_steps": replica_steps,
            "seconds": time.perf_counter() - t_start}


@dataclass(eq=False)
class _PointLanes:
    """One point of a :func:`simulate_points` call and the lanes it adds to the engine call.

    Attributes:
        spec: the point's spec (``{"hash", "params", "burn_in", …}``).
        kept: its replicas read back from its stored lanes (name → array, one row per replica),
            ``{}`` when none.
        start: the index of its first new replica among the call's lanes.
        lr, momentum: its λ and μ (as in its params).
        burn_in: its burn-in in integrator steps.
        stride: its loss stride in integrator steps (:func:`sgdsweep.sim.replicas.loss_stride`).
        streams: per new replica, its (uniforms, normals) generators (None for those its noise
            does not draw from).
        w0: per new replica, its initial weights, shape (d,).
    """

    spec: Mapping[str, Any]
    kept: dict[str, np.ndarray]
    start: int
    lr: float
    momentum: float
    burn_in: int
    stride: int
    streams: list[tuple[np.random.Generator, np.random.Generator]] = field(default_factory=list)
    w0: list[np.ndarray] = field(default_factory=list)

    @property
    def n_new(self) -> int:
        """Replicas simulated by this call (those not read back)."""
        return len(self.streams)

    @property
    def stop(self) -> int:
        """One past the index of its last new replica among the call's lanes."""
        return self.start + self.n_new


def _per_lane(records: Sequence[_PointLanes], value: Callable[[_PointLanes], Any]) -> np.ndarray:
    """``value`` of each point once per new replica, in lane order, as one array (the engine's
    per-lane argument)."""
    return np.array([value(rec) for rec in records for _ in range(rec.n_new)])


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
