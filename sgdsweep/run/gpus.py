"""GPU workers on real engines: Dask worker resources, local clusters with one worker per GPU, and
the dask-jobqueue settings that ask SLURM for GPUs.

A shard's task whose points name the GPU backend (``backend: cuda``, :mod:`sgdsweep.sweep.device`)
is submitted with ``resources={"GPU": 1}`` (:func:`task_resources`); Dask then runs it only on a
worker that advertises the resource ``GPU`` — Dask's worker resources, an abstract count that the
scheduler matches, not a device check. Such workers come from

- a local cluster (:func:`gpu_local_cluster`, :func:`gpu_worker_specs`): one worker process per
  GPU, advertising ``GPU: 1``, with ``CUDA_VISIBLE_DEVICES`` set to its own GPU; with
  ``execution.device: auto`` also the CPU workers of ``execution.workers``;
- SLURM (:func:`slurm_gpu_options`): jobs with ``--gres=gpu:N`` that run N worker processes, each
  started with ``--resources GPU=1``;
- an existing scheduler: its workers must advertise ``GPU`` themselves
  (``dask worker ADDRESS --resources GPU=1``); :func:`check_gpu_workers` says so before submitting.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sgdsweep.core.hardware import cuda_devices
from sgdsweep.errors import SgdsweepError
from sgdsweep.sweep.device import CUDA, backend_of

#: The Dask worker resource that GPU tasks ask for, one unit per task.
GPU_RESOURCE = "GPU"


def batch_backend(batch: Sequence[Mapping[str, Any]]) -> str:
    """The backend of a task's points (``cpu`` or ``cuda``); one task's points share it, since
    it is one of their parameters and a task's points are equal in all but lr, momentum and replicas."""
    backends = {backend_of(p["params"]) for p in batch}
    if len(backends) != 1:
        raise ValueError(f"one task's points name different backends ({', '.join(sorted(backends))})")
    return backends.pop()


def task_resources(batch: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """The Dask ``resources=`` of the task that simulates ``batch``: ``{"GPU": 1}`` for GPU points,
    None (any worker) for CPU points."""
    return {GPU_RESOURCE: 1} if batch_backend(batch) == CUDA else None


def local_gpus(execution: Mapping[str, Any]) -> int:
    """GPU workers of a local cluster under ``execution.device``: one per CUDA device for cuda and
    auto, none for cpu."""
    return 0 if execution.get("device", "cpu") == "cpu" else cuda_devices()


def local_cpu_workers(execution: Mapping[str, Any], cpu_workers: int) -> int:
    """CPU workers of a local cluster: none with device cuda when GPU workers run every point,
    else ``cpu_workers``."""
    return 0 if execution.get("device", "cpu") == CUDA and local_gpus(execution) else cpu_workers


def device_ids(gpus: int) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each of ``gpus`` GPU workers: the i-th entry of this
    process's own ``CUDA_VISIBLE_DEVICES`` where it is set (SLURM and other schedulers set it to the
    job's GPUs), else ``i``."""
    import os

    given = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if given and len(given) < gpus:
        raise ValueError(f"{gpus} GPU workers but CUDA_VISIBLE_DEVICES={','.join(given)} names {len(given)} device(s)")
    return given[:gpus] if given else [str(i) for i in range(gpus)]


def gpu_worker_specs(cpu_workers: int, gpus: int, host: str = "127.0.0.1",
                     worker_options: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The ``SpecCluster`` worker specifications of ``cpu_workers`` one-thread Nannies named
    ``cpu-i`` and ``gpus`` one-thread Nannies named ``gpu-i`` that advertise ``{"GPU": 1}``, worker
    ``gpu-i`` seeing only GPU i (:func:`device_ids`), all bound to ``host``; ``worker_options`` go
    to every Nanny."""
    from distributed import Nanny

    if cpu_workers < 0 or gpus < 0 or cpu_workers + gpus == 0:
        raise ValueError(f"cpu_workers={cpu_workers}, gpus={gpus}: need at least one worker and no negative count")
    common = {"nthreads": 1, "host": host, "silence_logs": logging.WARNING, **(worker_options or {})}
    workers: dict[str, dict[str, Any]] = {
        f"cpu-{i}": {"cls": Nanny, "options": dict(common)} for i in range(cpu_workers)}
    for i, gpu in enumerate(device_ids(gpus)):
        env = {**common.get("env", {}), "CUDA_VISIBLE_DEVICES": gpu}
        workers[f"gpu-{i}"] = {"cls": Nanny, "options": {**common, "resources": {GPU_RESOURCE: 1}, "env": env}}
    return workers


def gpu_local_cluster(cpu_workers: int, gpus: int, host: str = "127.0.0.1",
                      scheduler_options: Mapping[str, Any] | None = None,
                      worker_options: Mapping[str, Any] | None = None) -> Any:
    """A started ``distributed.SpecCluster`` on this host of the workers of
    :func:`gpu_worker_specs`. Scheduler and dashboard bind to ``host`` on free ports;
    ``scheduler_options`` and ``worker_options`` go to the Scheduler and to every Nanny."""
    from distributed import Scheduler, SpecCluster

    workers = gpu_worker_specs(cpu_workers, gpus, host, worker_options)
    scheduler = {"cls": Scheduler, "options": {"host": host, "port": 0, "dashboard_address": f"{host}:0",
                                               **(scheduler_options or {})}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.WARNING)


def slurm_gpu_options(execution: Mapping[str, Any]) -> dict[str, Any]:
    """dask-jobqueue ``SLURMCluster`` keyword arguments that ask for ``execution.slurm.gpus`` GPUs per
    job when ``execution.device`` is cuda or auto: ``job_extra_directives=["--gres=gpu:N"]``, N
    worker processes per job (``processes``) each started with ``--resources GPU=1``
    (``worker_extra_args``); empty for device cpu or 0 GPUs."""
    gpus = int(execution.get("slurm", {}).get("gpus", 0))
    if execution.get("device", "cpu") == "cpu" or gpus == 0:
        return {}
    return {"processes": gpus, "job_extra_directives": [f"--gres=gpu:{gpus}"],
            "worker_extra_args": ["--resources", f"{GPU_RESOURCE}=1"]}


def check_gpu_workers(client: Any, batches: Sequence[Sequence[Mapping[str, Any]]]) -> None:
    """Raise :class:`SgdsweepError` when some of ``batches`` are GPU tasks and no worker of
    ``client``'s cluster advertises the ``GPU`` resource (Dask would hold such tasks for ever)."""
    if not any(task_resources(b) for b in batches):
        return
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if any(w.get("resources", {}).get(GPU_RESOURCE, 0) >= 1 for w in workers.values()):
        return
    raise SgdsweepError(f"{sum(1 for b in batches if task_resources(b))} task(s) of GPU points (backend cuda) and "
                        f"none of the cluster's {len(workers)} worker(s) advertises the Dask resource "
                        f"{GPU_RESOURCE}: start GPU workers with 'dask worker ADDRESS --resources {GPU_RESOURCE}=1', "
                        "or run the sweep with execution.device cpu")


def refuse_gpu_batch(batch: Sequence[Mapping[str, Any]]) -> None:
    """Raise :class:`SgdsweepError` for a batch of GPU points: the GPU shard path (streaming moments,
    losses, divergence and escape on the device, written as point stores) is not built yet, so no
    such point is simulated on the CPU under the GPU's name (docs/gpu.md)."""
    if batch_backend(batch) == CUDA:
        raise SgdsweepError(f"point {batch[0]['hash']} names backend cuda, but sgdsweep has no GPU shard path yet "
                            "(docs/gpu.md, 'To be built'); run the sweep with execution.device cpu")
