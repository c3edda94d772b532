"""Run one shard: find the points not yet stored, simulate them as Dask tasks, log progress.

The shard's points that already have a complete store are skipped (that is what makes an added
axis value cost only the new points). The rest are grouped into tasks of up to
``execution.points_per_task`` points that share batch_size and steps (one vectorised kernel
call each) and submitted to the cluster from :func:`sgdsweep.run.cluster.dask_client`. Progress
(points and replica-steps done, rate, time left) goes to the terminal and the log
(:mod:`sgdsweep.run.progress`) as tasks finish and, in between, as the running tasks report the
share of their steps done: each task logs a Dask event (``Worker.log_event``) on the shard's topic
at most every :data:`TASK_REPORT_S` seconds, which the job receives through
``Client.subscribe_topic``. The receipt written at the end records what was simulated and how
long it took.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from sgdsweep.core.paths import atomic_write_text
from sgdsweep.errors import SgdsweepError
from sgdsweep.run.cluster import dask_client
from sgdsweep.run.gpus import check_gpu_workers, task_resources
from sgdsweep.run.progress import REDRAW_S, ShardProgress, verbosity
from sgdsweep.sim.shapes import BATCH_VARYING  # the engine's: what may differ within one call
from sgdsweep.store.leftovers import (
    remove_failed_markers,
    remove_lane_leftovers,
    remove_pack_leftovers,
    remove_stale_temporaries,
)
from sgdsweep.store.migrate import migrate_points, remove_superseded
from sgdsweep.store.packs import label_for, pack_points
from sgdsweep.store.points import complete_points, failed_marker
from sgdsweep.sweep.plan import remove_other_shard_versions

log = logging.getLogger("sgdsweep.run.execute")


#: Shortest interval, in seconds, between two progress reports of one running task.
TASK_REPORT_S = 1.0


def simulate_task(points: Sequence[Mapping[str, Any]], points_dir: str, topic: str | None = None,
                  task: int = 0) -> dict[str, Any]:
    """The Dask task: :func:`sgdsweep.run.simulate.simulate_points`, imported on the worker (the
    shard job that submits it then needs neither the models nor the theory: it starts in a
    fraction of the time). With a ``topic``, on a Dask worker, it reports ``{"task": task,
    "fraction": share of its steps done}`` as events on that topic while it runs."""
    from sgdsweep.run.gpus import refuse_gpu_batch
    from sgdsweep.run.simulate import simulate_points

    refuse_gpu_batch(points)  # a GPU point is never simulated on the CPU under the GPU's name
    return simulate_points(points, points_dir, progress=_task_reporter(topic, task))


def _task_reporter(topic: str | None, task: int) -> Callable[[float], None] | None:
    """A progress callback that logs the fraction done as a Dask event on ``topic``, at most
    every :data:`TASK_REPORT_S` seconds; None without a topic or outside a Dask worker."""
    if topic is None:
        return None
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:  # called in this process, not on a worker: nobody listens
        return None
    last = time.monotonic()

    def report(fraction: float) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= TASK_REPORT_S:
            last = now
            worker.log_event(topic, {"task": task, "fraction": float(fraction)})

    return report


def make_batches(points: Sequence[Mapping[str, Any]], points_per_task: int) -> list[list[Mapping[str, Any]]]:
    """Group points that one engine call can advance together — equal in every parameter but
    those of :data:`sgdsweep.sim.shapes.BATCH_VARYING` (so one shard and one batch_size) — keeping
    sweep order, in chunks of ``points_per_task``."""
    def key(p: Mapping[str, Any]) -> str:
        return json.dumps({k: v for k, v in p["params"].items() if k not in BATCH_VARYING}, sort_keys=True)

    batches: list[list[Mapping[str, Any]]] = []
    for _, group in groupby(sorted(points, key=key), key=key):
        group = list(group)
        for i in range(0, len(group), points_per_task):
            batches.append(group[i : i + points_per_task])
    return batches


def _cost(batch: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(p["params"]["replicas"]) * int(p["params"]["steps"]) for p in batch)


def _collect(fut: Any, batch: Sequence[Mapping[str, Any]], points_dir: str) -> None:
    """Re-raise a finished task's exception here, after marking its points as failed (``sgdsweep
    plan`` reports them); clear the marks of points that succeeded."""
    try:
        fut.result()
    except Exception as exc:
        try:
            for p in batch:
                atomic_write_text(failed_marker(points_dir, p["hash"]),
                                  json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))
        except OSError as unwritable:  # the task's own error, raised below, says why
            log.warning("could not record the failed points in %s (%s)", points_dir, unwritable.strerror)
        raise
    remove_failed_markers(points_dir, (p["hash"] for p in batch))


def _pack(points_dir: str, shard: str, hashes: list[str]) -> None:
    """Pack the shard's single point stores into its pack (:func:`sgdsweep.store.packs.pack_points`,
    when the rule there says so). A pack that cannot be written is a warning, not a failure: the
    points stay stored as single files, and the next run packs them."""
    try:
        pack = pack_points(points_dir, label_for(shard), hashes)
    except OSError as exc:
        log.warning("shard %s: could not pack its point stores (%s); they stay single files, the next run "
                    "packs them", shard, exc.strerror or exc)
        return
    if pack is not None:
        log.info("shard %s: packed its point stores into %s", shard, pack.name)


def run_shard(spec_path: Path, receipt_path: Path, execution: Mapping[str, Any]) -> dict:
    """Simulate the shard described by ``spec_path`` and write its receipt.

    Returns:
        The receipt: shard id, all point hashes, which were simulated, replica-steps, seconds.
    """
    t0 = time.perf_counter()
    from sgdsweep.sweep.plan import read_plan_file

    spec = json.loads(read_plan_file(spec_path))  # as its name says, or refused
    shard, points = spec["shard"], spec["points"]
    points_dir = str(Path(spec["points_dir"]).resolve())  # workers may run in another directory
    # the shard's stores of an earlier layout, rewritten as .npz before its points are looked
    # for (sgdsweep.store.migrate; `sgdsweep run` has done so for every point already)
    migrated = migrate_points(points_dir, (p["hash"] for p in points))
    if migrated.migrated:
        log.info("shard %s: migrated %d point store(s) of an earlier layout to .npz", shard, len(migrated.migrated))
    done = complete_points(points_dir, (p["hash"] for p in points))
    todo = [p for p in points if p["hash"] not in done]
    n_cached = len(points) - len(todo)
    log.info("shard %s: %d points, %d already stored, %d to simulate", shard, len(points), n_cached, len(todo))
    # under the sweep's lock: what killed writes left, of any point or lanes (an earlier round's
    # too), once older than any write in progress (sgdsweep.store.leftovers)
    stale = (remove_stale_temporaries(points_dir, None) + remove_lane_leftovers(points_dir, None)
             + remove_pack_leftovers(points_dir))
    if stale:
        log.info("shard %s: removed %d temporary or cut-short file(s) that killed writes left, e.g. %s", shard,
                 len(stale), stale[0].name)
    batches = make_batches(todo, int(execution.get("points_per_task", 8)))
    total = sum(_cost(b) for b in batches)
    if batches:
        from distributed import wait

        with dask_client(execution) as client:
            check_gpu_workers(client, batches)
            topic = f"sgdsweep-progress-{shard}-{uuid.uuid4().hex[:8]}"
            running: dict[int, float] = {}  # task → fraction of its steps done, as last reported
            finished: set[int] = set()  # a report may arrive after its task's result

            def on_report(event: tuple[float, Mapping[str, Any]]) -> None:  # on the client's event loop
                running[int(event[1]["task"])] = float(event[1]["fraction"])

            client.subscribe_topic(topic, on_report)
            futures = {}
            for i, batch in enumerate(batches):
                fut = client.submit(simulate_task, batch, points_dir, topic, i, retries=2, pure=False,
                                    key=f"simulate-{shard}-{i}-{uuid.uuid4().hex[:8]}",
                                    resources=task_resources(batch))  # {"GPU": 1}: only GPU workers
                futures[fut] = i
            progress = ShardProgress(shard, len(points), n_cached, total, verbosity=verbosity())
            pending = set(futures)
            try:
                while pending:
                    try:
                        done, pending = wait(pending, timeout=REDRAW_S, return_when="FIRST_COMPLETED")
                    except TimeoutError:  # none finished: show how far the running ones are
                        done = set()
                    for fut in done:
                        i = futures[fut]
                        _collect(fut, batches[i], points_dir)
                        finished.add(i)
                        progress.advance(len(batches[i]), _cost(batches[i]))
                    progress.running(sum(f * _cost(batches[i]) for i, f in list(running.items())
                                         if i not in finished))
                    progress.tick()
            finally:
                progress.close()
                with contextlib.suppress(Exception):  # a lost scheduler must not hide the error above
                    client.unsubscribe_topic(topic)
    done = complete_points(points_dir, (p["hash"] for p in points))
    missing = [p["hash"] for p in points if p["hash"] not in done]
    if missing:
        raise SgdsweepError(f"shard {shard}: {len(missing)} point store(s) are still missing after "
                            f"simulation (first: {missing[0]}); see the log above")
    # every point is stored: a temporary of one of them, whatever its age, is from a write that
    # did not finish (a lost worker's; its task was retried) — a writer that is still running
    # finds the store complete and places nothing
    lost = remove_stale_temporaries(points_dir, (p["hash"] for p in points), older_than=0.0)
    lost += remove_lane_leftovers(points_dir, {p["lanes"] for p in points if p.get("lanes")}, older_than=0.0,
                                  parts=False)
    if lost:
        log.info("shard %s: removed %d temporary file(s) of writes that did not finish, e.g. %s", shard,
                 len(lost), lost[0].name)
    old = remove_superseded(points_dir, (p["hash"] for p in points))  # damaged, not migrated, simulated anew
    if old:
        log.info("shard %s: removed %d damaged point store(s) of an earlier layout, simulated anew, e.g. %s",
                 shard, len(old), old[0].name)
    past = remove_failed_markers(points_dir, (p["hash"] for p in points))  # e.g. a killed run's
    if past:
        log.info("shard %s: removed %d failure record(s) of points stored since, e.g. %s", shard, len(past),
                 past[0].name)
    _pack(points_dir, shard, [p["hash"] for p in points])
    seconds = time.perf_counter() - t0
    receipt = {"shard": shard, "points": [p["hash"] for p in points],
               "simulated": [p["hash"] for p in todo], "replica_steps": total, "seconds": seconds}
    atomic_write_text(receipt_path, json.dumps(receipt, indent=1) + "\n")
    remove_other_shard_versions(receipt_path)  # the records of this shard's earlier specs
    log.info("shard %s: simulated %d points in %.1f s", shard, len(todo), seconds)
    return receipt
