"""Shards: which points one workflow job simulates.

A shard job starts a Python process, imports the simulation and connects to the Dask cluster
before it simulates anything (seconds), so a job per data set makes a sweep over many data sets
cost many times its simulation. Points are therefore grouped by work: each data set (the points
that differ only in ``lr``, ``batch_size``, ``momentum`` and ``replicas``, :attr:`Point.data_set`)
goes to one of ``2^k`` shards by its hash, with ``2^k`` the smallest power of two that brings the
sweep's replica-steps per shard to ``execution.shard_work`` or below (never more shards than
data sets, rounded up to a power of two). The grouping is stable: adding points or data sets
leaves every other data set in its shard (its spec, and so its job, changes only when a point of
its own does), until the sweep doubles in work and ``k`` grows. ``shard_work: 0`` gives one shard
per data set. Which points share a shard never changes results: each point is simulated, stored
and read by its own hash.
"""

from __future__ import annotations

import dataclasses
import math

from sgdsweep.sweep.config import Point, Sweep

#: Replica-steps a shard job aims at (``execution.shard_work``'s default): about a minute of two
#: workers at 10⁶ replica-steps/s, against a job's start of a few seconds.
DEFAULT_SHARD_WORK = 10**8


def point_work(point: Point) -> int:
    """Replica-steps of integration of ``point`` (replicas × steps × integrator substeps)."""
    params = point.params
    substeps = 1 if params.get("method", "sgd") == "sgd" else round(1.0 / float(params["dt_over_lr"]))
    return int(params["replicas"]) * int(params["steps"]) * substeps


def shard_count_exponent(work: dict[str, int], target: int) -> int:
    """``k`` of the ``2^k`` shards for data sets of replica-steps ``work`` at ``target`` per shard."""
    total = sum(work.values())
    if target <= 0 or total <= target:
        return 0
    return min(math.ceil(math.log2(total / target)), math.ceil(math.log2(max(len(work), 1))))


def shard_id(data_set: str, k: int) -> str:
    """The shard of data set ``data_set`` (a hex hash) among ``2^k``: ``<k:02x><bucket:08x>``."""
    return f"{k:02x}{int(data_set[:8], 16) % (1 << k):08x}"


def assign_shards(sweep: Sweep) -> Sweep:
    """``sweep`` with each point's shard set by work (module docstring)."""
    target = int(sweep.config["execution"].get("shard_work", DEFAULT_SHARD_WORK))
    if target <= 0:
        ids = {p.data_set: p.data_set for p in sweep.points}
    else:
        work: dict[str, int] = {}
        for p in sweep.points:
            work[p.data_set] = work.get(p.data_set, 0) + point_work(p)
        k = shard_count_exponent(work, target)
        ids = {d: shard_id(d, k) for d in work}
    points = tuple(p.in_shard(ids[p.data_set]) for p in sweep.points)
    return dataclasses.replace(sweep, points=points, _shards={})
