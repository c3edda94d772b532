"""What simulating a sweep costs, estimated before any job starts: memory, replica-steps, time.

A sweep's points run as Dask tasks: each task advances the replicas of up to
``execution.points_per_task`` points of one data set and batch size together, as the lanes of one
engine call (:func:`sgdsweep.run.execute.make_batches`, :func:`sgdsweep.run.simulate.simulate_points`).
Memory of one task, in bytes (:class:`Footprint`, from the point's own problem):

- per lane (replica): twice its accumulators (:class:`sgdsweep.sim.observables.Accumulators` for
  this problem and ``dynamics.observe``: the working set, and the results' per-replica
  temporaries or the engine's full-size copy once replicas stop early), its random generators
  (:data:`STREAM_BYTES`), its weights, momentum and start (4·d doubles) and, with sampling noise,
  its permutation of the P samples;
- per task: the problem's arrays, the engine's random-number blocks and the exact theory
  (:func:`theory_bytes`).

Measured against ``tracemalloc`` peaks of :func:`~sgdsweep.run.simulate.simulate_points` (tests in
``tests/sweep/test_plan.py``), the estimate is within a factor of 2. The machine holds the largest
tasks that run at once (:func:`tasks_at_once`), each in a worker process of about
:data:`PROCESS_BYTES` (its Python, NumPy, Numba and Dask). :func:`check_memory` refuses a sweep
whose estimate exceeds ``execution.max_memory``. The time estimate that ``sgdsweep plan`` prints
takes its kernel rate from :mod:`sgdsweep.sweep.rates` (a cached measurement of
:func:`measure_rate`, else a cost model): planning compiles nothing and imports no Numba, SciPy
or theory module, only shapes and constants (:mod:`sgdsweep.sim.shapes`).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sgdsweep.errors import ConfigError

if TYPE_CHECKING:  # config imports this module
    from sgdsweep.sweep.config import Point, Sweep

#: Bytes of one lane's three random generators (``SeedSequence``-spawned PCG64 ``Generator``
#: objects), measured with ``tracemalloc``: 2.8 KiB.
STREAM_BYTES = 3 * 1024
#: Resident memory of one Dask worker process before it simulates (its Python, NumPy, Numba,
#: Dask and compiled kernels; ``benchmarks/memory.py`` measures ~220 MiB, a worker of
#: ``sgdsweep run`` ~200 MiB). Every worker of a cluster counts, busy or not.
PROCESS_BYTES = 256 * 2**20
#: Resident memory of a local run's processes besides its workers, together: ``sgdsweep run``,
#: Snakemake, the cluster process (Dask's scheduler) and the job at work (the shard job that
#: submits the tasks, or the report's); ~1.0 GiB measured on a tiny sweep (``benchmarks/workers_memory.py``).
RUN_BYTES = 2**30
#: Resident memory per point of those processes: ``sgdsweep run`` and Snakemake each hold the
#: sweep, and Snakemake its specs' text too. Measured between 10⁵ and 10⁶ points
#: (``benchmarks/scale.py``'s plan config): ``sgdsweep validate`` 1.5 KiB per point, ``snakemake -n``
#: 2.3 KiB; 4 KiB rounds their sum up.
RUN_BYTES_PER_POINT = 4 * 2**10
#: Fraction of the physical memory that ``execution.max_memory: auto`` allows.
AUTO_FRACTION = 0.8
#: Lanes and seconds of one timing run of :func:`measure_rate`.
CALIBRATION_LANES = 64
CALIBRATION_SECONDS = 0.1

_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "KiB": 2**10, "kiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?) ?([kKMGTP]i?B|B)")


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def parse_size(text: str) -> int:
    """``'16GB'`` → 16·10⁹, ``'512MiB'`` → 512·2²⁰ (bytes); ValueError for anything else."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class Footprint:
    """Memory of the simulation tasks of one shard (bytes): ``fixed`` per task, ``per_lane`` per
    replica; ``dim``: the problem's number of parameters d; ``lane_bytes``: one replica's raw
    lanes (its accumulators and final weights), what a precision sweep stores per replica."""

    fixed: int
    per_lane: int
    dim: int
    lane_bytes: int = 0


#: Unknowns of the exact theory's direct solve (:data:`sgdsweep.theory.linear.DIRECT_MAX_UNKNOWNS`,
#: restated here so that planning imports no theory module; ``tests/sweep/test_plan_imports.py`` pins the two).
THEORY_DIRECT_MAX_UNKNOWNS = 2500


def theory_bytes(d: int) -> int:
    """Peak bytes of the exact theory of a d-parameter point (:mod:`sgdsweep.theory.linear`): its
    direct solve holds ~4 matrices of d² × d² doubles up to d² = :data:`THEORY_DIRECT_MAX_UNKNOWNS`,
    its eigenbasis method beyond ~256 matrices of d × d (fitted to ``tracemalloc`` peaks at d = 20 … 200)."""
    return 32 * d**4 if d * d <= THEORY_DIRECT_MAX_UNKNOWNS else 2048 * d * d


def footprint(problem: Any, params: Mapping[str, Any]) -> Footprint:
    """The :class:`Footprint` of a point's tasks, from its problem and resolved parameters: shapes
    only (:mod:`sgdsweep.sim.shapes`), nothing compiled, no theory imported."""
    from sgdsweep.sim.shapes import BLOCK_RANDOM_NUMBERS, MODE, lane_accumulator_bytes, observe_spec

    acc_bytes = lane_accumulator_bytes(problem, observe_spec(params), problem.w_min is None)
    d = int(problem.dim)
    permutation = 8 * int(problem.n_samples or 0) if params["noise"] in MODE else 0
    per_lane = 2 * acc_bytes + STREAM_BYTES + 4 * 8 * d + permutation + 16 * 8
    data = sum(v.nbytes for v in vars(problem).values() if isinstance(v, np.ndarray))
    return Footprint(fixed=data + 8 * BLOCK_RANDOM_NUMBERS + theory_bytes(d), per_lane=per_lane, dim=d,
                     lane_bytes=acc_bytes + 8 * d)


@dataclass(frozen=True)
class Task:
    """One Dask task of a sweep: ``points`` (the first one's parameters in ``first``), ``lanes``
    (their replicas), ``replica_steps`` (lanes × integrator steps) and ``memory`` (bytes, the
    estimated peak)."""

    data_set: str
    first: Point
    points: int
    lanes: int
    replica_steps: int
    memory: int


def tasks(sweep: Sweep, hashes: Iterable[str] | None = None) -> list[Task]:
    """The tasks that simulate ``hashes`` (hashes of the sweep's points; default: every point),
    grouped as the shard jobs group them (:func:`sgdsweep.run.execute.make_batches`: the points
    of one data set and batch size, in sweep order, in chunks of ``execution.points_per_task``).
    A data set's points differ only in ``lr``, ``batch_size``, ``momentum`` and ``replicas``, so
    grouping them by batch size is that grouping, without encoding every point's parameters
    (linear in the points). Every point's tasks are made once per sweep (:attr:`Sweep.derived`):
    planning asks for them to check the memory and again to describe the cost."""
    wanted = None if hashes is None else set(hashes)
    if wanted is None or len(wanted) == len(sweep.points):
        if "tasks" not in sweep.derived:
            sweep.derived["tasks"] = _tasks(sweep, None)
        return list(sweep.derived["tasks"])
    return _tasks(sweep, wanted)


def _tasks(sweep: Sweep, wanted: set[str] | None) -> list[Task]:
    per_task = int(sweep.config["execution"]["points_per_task"])
    out: list[Task] = []
    for points in sweep.shards.values():
        groups: dict[Any, list[Point]] = {}
        for p in points:
            if wanted is None or p.hash in wanted:
                groups.setdefault((p.data_set, p.params["batch_size"]), []).append(p)
        for (data_set, _), group in groups.items():
            fp = sweep.footprints[data_set]
            for i in range(0, len(group), per_task):
                batch = group[i : i + per_task]
                lanes = sum(int(p.params["replicas"]) for p in batch)
                p0 = batch[0].params
                substeps = 1 if p0["method"] == "sgd" else round(1.0 / p0["dt_over_lr"])
                out.append(Task(data_set, batch[0], len(batch), lanes, lanes * int(p0["steps"]) * substeps,
                                fp.fixed + lanes * fp.per_lane))
    return out


def memory_limit(execution: Mapping[str, Any]) -> tuple[int, str]:
    """``execution.max_memory`` in bytes, and where it comes from (in words)."""
    value = execution.get("max_memory", "auto")
    if value != "auto":
        return (int(value) if isinstance(value, int) else parse_size(value)), "execution.max_memory"
    if execution.get("cluster") == "slurm":
        from sgdsweep.sweep.limits import slurm_memory_bytes

        memory = execution.get("slurm", {}).get("memory", "4GB")
        return slurm_memory_bytes(memory), f"auto: slurm.memory {memory} of one job"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(AUTO_FRACTION * total), f"auto: {AUTO_FRACTION:.0%} of this machine's {format_bytes(total)}"


def tasks_at_once(execution: Mapping[str, Any]) -> tuple[int, str]:
    """How many tasks share the memory of ``execution.max_memory``, and why: the workers of a
    local cluster, the worker processes of one SLURM job, or one (a worker of an external
    scheduler, whose machines sgdsweep does not see)."""
    from sgdsweep.sweep.execution import SCHEDULER_ENV, worker_count

    if execution.get("scheduler") or os.environ.get(SCHEDULER_ENV):
        return 1, "one per worker of the external scheduler"
    if execution.get("cluster") == "slurm":
        cores = int(execution.get("slurm", {}).get("cores", 1))
        return cores, f"{cores} per SLURM job (slurm.cores)"
    workers = worker_count(execution)
    return workers, f"{workers} local worker(s)"


@dataclass(frozen=True)
class MemoryEstimate:
    """The memory a sweep's simulation needs at once: ``total`` bytes for ``at_once`` tasks (the
    largest, ``largest``), ``processes`` worker processes of :data:`PROCESS_BYTES` each and
    ``run_bytes`` of the run's other processes, against ``limit`` (from ``source``)."""

    total: int
    at_once: int
    why: str
    largest: Task | None
    limit: int
    source: str
    processes: int = 0
    run_bytes: int = 0

    def parts(self) -> str:
        """The estimate's processes in words, for messages."""
        out = f"{format_bytes(PROCESS_BYTES)} per worker process for {self.processes} worker process(es)"
        if self.run_bytes:
            out += (f" and {format_bytes(self.run_bytes)} of the run's own processes (sgdsweep, Snakemake, "
                    "Dask's scheduler)")
        return out

    @property
    def fits(self) -> bool:
        return self.total <= self.limit


def estimate_memory(sweep: Sweep, task_list: list[Task]) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of running ``task_list``: its largest tasks at once, every
    worker process that holds the memory (all the workers of a local cluster or of one SLURM job,
    busy or not; one worker of an external scheduler) and, for a local cluster, the run's own
    processes (:data:`RUN_BYTES`, and :data:`RUN_BYTES_PER_POINT` for each of the sweep's points).
    Measured on a tiny sweep at 1, 2 and 24 local workers, the
    estimate is within a factor of 2 of the run's peak (the resident memory of its whole
    process tree; ``benchmarks/workers_memory.py``)."""
    from sgdsweep.sweep.execution import uses_local_cluster

    execution = sweep.config["execution"]
    limit, source = memory_limit(execution)
    slots, why = tasks_at_once(execution)
    biggest = sorted(task_list, key=lambda t: t.memory, reverse=True)[:slots]
    run = RUN_BYTES + RUN_BYTES_PER_POINT * len(sweep.points) if uses_local_cluster(execution) else 0
    total = sum(t.memory for t in biggest) + slots * PROCESS_BYTES + run
    return MemoryEstimate(total, len(biggest), why, biggest[0] if biggest else None, limit, source, slots, run)


def _replicas_key(sweep: Sweep) -> str:
    if sweep.rounds.get("kind") == "precision":  # a later round's replicas: the budget allows them
        return "precision.budget.max_replicas"
    if "replicas" in sweep.config["grid"]:
        return "grid.replicas"
    return "points" if any("replicas" in p for p in sweep.config.get("points", [])) else "dynamics.replicas"


def check_memory(sweep: Sweep, hashes: Iterable[str] | None = None) -> MemoryEstimate:
    """Raise :class:`ConfigError` if simulating ``hashes`` (default: every point) needs more
    memory than ``execution.max_memory``, naming the estimate and how to lower it; else return
    the estimate."""
    est = estimate_memory(sweep, tasks(sweep, hashes))
    if est.fits or est.largest is None:
        return est
    per_point = est.run_bytes - RUN_BYTES if est.run_bytes else 0
    if est.total - per_point <= est.limit:  # the sweep's size, not its tasks, is what does not fit
        n = len(sweep.points)
        raise ConfigError(
            "points" if sweep.config.get("points") else "grid", f"{n} points",
            f"a sweep whose run fits in execution.max_memory = {format_bytes(est.limit)} ({est.source})",
            f"Its estimated memory is {format_bytes(est.total)}, of which {format_bytes(per_point)} is the "
            f"{n} points held by the run's own processes ({format_bytes(RUN_BYTES_PER_POINT)} per point: "
            "sgdsweep run and Snakemake each hold the sweep). Split the sweep into several (each its own "
            "sweep name), use fewer workers (execution.workers), or raise execution.max_memory if the "
            "machine has the memory")
    t = est.largest
    fp = sweep.footprints[t.data_set]
    replicas = t.first.params["replicas"]
    key = _replicas_key(sweep)
    raise ConfigError(
        key, sweep.config["precision"]["budget"]["max_replicas"] if key.startswith("precision") else replicas,
        f"a sweep whose simulation fits in execution.max_memory = {format_bytes(est.limit)} ({est.source})",
        (f"Round {sweep.rounds['round']} extends points to {replicas} replicas. " if key.startswith("precision")
         else "")
        + f"Its estimated memory is {format_bytes(est.total)}: {est.at_once} task(s) at once ({est.why}), the "
        f"largest {t.points} point(s) × {replicas} replicas = {t.lanes} lanes of a d = {fp.dim} model, "
        f"{format_bytes(fp.per_lane)} per replica and {format_bytes(fp.fixed)} per task = "
        f"{format_bytes(t.memory)}, plus {est.parts()}. Use fewer "
        "replicas, fewer points per task (execution.points_per_task), fewer workers (execution.workers), "
        "a smaller model (n_inputs, hidden_width, dynamics.observe.cov_max_dim), or raise "
        "execution.max_memory if the machine has the memory")


def measure_rate(point: Point, lanes: int) -> float:
    """Replica-steps per second of the engine on ``point``'s own problem, in this process with
    the kernel's threads of a worker (``$SGDSWEEP_THREADS``, default 1): ``min(lanes, 64)``
    lanes, every step measured (observables on; burn-in steps cost less), timed over ever longer
    runs until one takes :data:`CALIBRATION_SECONDS`. A wall-clock measurement: an estimate."""
    from sgdsweep.core.identity import replica_stream_key
    from sgdsweep.models import get_model
    from sgdsweep.sim.engine import Dynamics, run_lanes
    from sgdsweep.sim.replicas import replica_streams
    from sgdsweep.sim.shapes import observe_spec

    p = point.params
    model = get_model(p["model"])
    problem = model.make_problem(model.data_params(p))
    n = max(1, min(lanes, CALIBRATION_LANES))
    gens = replica_streams(int(p["seed"]), replica_stream_key(p), n)
    w0 = np.array([problem.initial(p["init"], g[2]) for g in gens])
    bound = float(p["divergence_threshold"]) * problem.divergence_scale()

    def lane_steps_per_s(steps: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        out = run_lanes(problem, noise=p["noise"], batch_size=int(p["batch_size"]), steps=steps,
                        lr=np.full(n, float(p["lr"])), momentum=np.full(n, float(p["momentum"])),
                        burn_in=np.zeros(n, np.int64), bound=np.full(n, bound), w0=w0.copy(),
                        streams=[g[:2] for g in gens], observe=observe_spec(p),
                        dynamics=Dynamics(p["method"], p["dt_over_lr"]))
        seconds = time.perf_counter() - t0
        stopped = np.maximum(out["diverged_step"], out["escape_step"])
        done = float(np.where(stopped >= 0, stopped + 1, steps).sum())
        return seconds, done / seconds if seconds > 0 else math.inf

    lane_steps_per_s(4)  # loads the compiled kernels
    steps = 16
    while True:
        seconds, rate = lane_steps_per_s(steps)
        if seconds >= CALIBRATION_SECONDS or steps >= 2**20:
            return rate
        steps *= 2


def _sci(x: float, digits: int = 3) -> str:
    """``2.05e+07`` as ``2.05e7``."""
    return f"{x:.{digits}g}".replace("e+0", "e").replace("e+", "e")


def format_duration(seconds: float) -> str:
    """``3725`` → ``'1 h 2 min'``; ``42`` → ``'42 s'``."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 60:
        return f"{seconds:.2g} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{seconds / 86400:.1f} days"


#: Task kinds (data set and batch size) whose rate ``python -m sgdsweep.sweep.rates`` measures, the
#: costliest first.
CALIBRATED_KINDS = 4


def task_kinds(task_list: list[Task]) -> dict[tuple[str, int], list[Task]]:
    """(data set, batch size) → its tasks: the kinds that run at one kernel rate."""
    kinds: dict[tuple[str, int], list[Task]] = {}
    for t in task_list:
        kinds.setdefault((t.data_set, int(t.first.params["batch_size"])), []).append(t)
    return kinds


def describe(sweep: Sweep, hashes: Iterable[str] | None = None, measure: bool = True) -> list[str]:
    """Lines for ``sgdsweep plan``: the estimated cost of simulating ``hashes`` (default: every
    point): tasks and replica-steps, memory per task and at once against the limit, and (when
    ``measure``) the time at each task kind's kernel rate (:mod:`sgdsweep.sweep.rates`: the rate
    cached for it on this machine, else the cost model); nothing is compiled or run."""
    from sgdsweep.sweep import rates as kernel_rates

    task_list = tasks(sweep, hashes)
    if not task_list:
        return ["cost: nothing to simulate"]
    est = estimate_memory(sweep, task_list)
    big = est.largest
    total = sum(t.replica_steps for t in task_list)
    per_task = sweep.config["execution"]["points_per_task"]
    lines = [f"cost (estimates): {len(task_list)} task(s) of up to {per_task} points, "
             + f"{_sci(total)} replica-steps",
             f"  memory: {format_bytes(big.memory)} for the largest task ({big.points} point(s), {big.lanes} "
             + f"replicas); {format_bytes(est.total)} with {est.at_once} task(s) at once ({est.why}) and "
             + f"{est.parts()}; limit {format_bytes(est.limit)} ({est.source})"]
    if "precision" in sweep.config:  # the lanes it keeps to extend its points (docs/precision.md)
        from sgdsweep.store.lanes import stored_bytes
        from sgdsweep.sweep.precision import lane_disk

        disk = lane_disk(sweep)
        lines.append(f"  disk: up to {format_bytes(disk.total)} of stored lanes ({disk.points} point(s) × "
                     f"max_replicas {disk.max_replicas} × {format_bytes(disk.per_replica)} per replica), "
                     f"{format_bytes(stored_bytes(sweep.directory / 'points'))} stored now; limit "
                     f"{format_bytes(disk.limit)} (precision.budget.disk)")
    if not measure:
        return lines
    kinds = task_kinds(task_list)
    cached = kernel_rates.read_cache()
    rates: dict[tuple[str, int], float] = {}
    measured = 0
    for kind, members in kinds.items():
        params = members[0].first.params
        rate = cached.get(kernel_rates.kind_key(params))
        measured += rate is not None
        rates[kind] = rate if rate is not None else kernel_rates.model_rate(params, sweep.footprints[kind[0]].dim)
    seconds = [t.replica_steps / rates[(t.data_set, int(t.first.params["batch_size"]))] for t in task_list]
    slots = min(tasks_at_once(sweep.config["execution"])[0], len(task_list))
    wall = max(sum(seconds) / slots, max(seconds))
    low, high = min(rates.values()), max(rates.values())
    shown = _sci(low, 2) if _sci(low, 2) == _sci(high, 2) else f"{_sci(low, 2)}–{_sci(high, 2)}"
    if measured == len(kinds):
        source = f"measured on this machine ({kernel_rates.cache_path()})"
    else:
        source = ("the cost model's rate, an estimate" if not measured else
                  f"measured on this machine for {measured} of {len(kinds)} task kind(s), the cost model's "
                  "for the others")
        source += "; `python -m sgdsweep.sweep.rates CONFIG` measures and caches the kernel rate"
    lines.append(f"  time: about {format_duration(wall)} on {slots} worker(s) ({format_duration(sum(seconds))} "
                 f"of one worker), at {shown} replica-steps/s per worker: {source}")
    return lines
