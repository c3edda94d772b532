"""Which Dask cluster runs the simulations, and who owns its lifetime.

Four cases, in order of precedence:

1. ``SGDSWEEP_SCHEDULER`` (environment) or ``execution.scheduler`` (config) names an existing
   scheduler: connect to it; nothing is started or stopped.
2. ``execution.cluster: slurm``: a dask-jobqueue ``SLURMCluster`` for the duration of the job.
3. ``SGDSWEEP_SCHEDULER_FILE`` names a Dask scheduler file: the run's local cluster, owned by
   ``sgdsweep run``. It starts one cluster process (``python -m sgdsweep cluster-daemon``,
   :func:`serve`) as Snakemake starts, passes the scheduler file's path to Snakemake's
   environment, and stops the process when Snakemake ends (also on error and on Ctrl-C); the
   process also stops by itself when ``sgdsweep run`` is gone (e.g. after ``kill -9``). Shard
   jobs only wait for it (:func:`wait_for_run_cluster`), check that the address in the scheduler
   file answers as a Dask scheduler within :data:`PROBE_TIMEOUT_S` (:func:`probe_scheduler`: a
   stale file naming a port that something else now holds fails there, not for ever) and
   connect with ``distributed.Client(scheduler_file=...)``. The cluster process's log,
   ``daemon.log``, is created afresh by each run; a symbolic link there is removed, never
   written through.
4. Otherwise (plain ``snakemake``, or a shard job run by hand): a ``LocalCluster`` inside the job
   for the duration of the job.

Local clusters bind the scheduler and the dashboard to ``execution.host`` (127.0.0.1 by
default) and start their workers with :data:`WORKER_ENVIRON` through Dask's
``distributed.nanny.pre-spawn-environ`` setting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sgdsweep.core.paths import atomic_write_text
from sgdsweep.errors import SgdsweepError, UsageError
from sgdsweep.run.locking import create_afresh
from sgdsweep.sweep.execution import SCHEDULER_ENV, scheduler_address, valid_address, worker_count

#: Environment variable set by ``sgdsweep run`` for its Snakemake process: the path of the Dask
#: scheduler file of the run's local cluster.
SCHEDULER_FILE_ENV = "SGDSWEEP_SCHEDULER_FILE"
#: Names, in the run's cluster directory, of Dask's scheduler file, the cluster process's phase
#: record and its log.
SCHEDULER_FILE, STATUS_FILE, DAEMON_LOG = "scheduler.json", "status.json", "daemon.log"
#: Seconds each of the Python start and the Dask start of the run's cluster may take (compiling
#: or loading the kernels between them has no deadline while the process lives).
START_TIMEOUT_S = 120.0
#: Seconds between the progress lines of a job waiting for the run's cluster.
PROGRESS_EVERY_S = 15.0
#: Seconds a scheduler named by the user has to complete Dask's handshake.
PROBE_TIMEOUT_S = 30.0
#: Environment of every local Dask worker process, set before it starts
#: (``distributed.nanny.pre-spawn-environ``). Dask's own default there,
#: ``MALLOC_TRIM_THRESHOLD_=65536``, switches off glibc's dynamic mmap threshold, so that every
#: numpy temporary above 128 KiB would be mapped and page-faulted again on each engine step;
#: these values keep arrays up to 32 MiB on the heap and at most 128 MiB of free heap per worker.
WORKER_ENVIRON = {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
                  "MALLOC_TRIM_THRESHOLD_": str(128 * 1024 * 1024)}

log = logging.getLogger("sgdsweep.run.cluster")




def local_cluster(workers: int, host: str = "127.0.0.1", gpus: int = 0, **kwargs: Any) -> Any:
    """A started ``distributed.LocalCluster`` of ``workers`` one-thread worker processes bound to
    ``host``, whose workers preload :mod:`sgdsweep.sim.warmup` and start with
    :data:`WORKER_ENVIRON`; ``kwargs`` go to ``LocalCluster`` (and replace these defaults). With
    ``gpus``, ``workers`` CPU workers and one worker per GPU advertising the Dask resource ``GPU``
    (:func:`sgdsweep.run.gpus.gpu_local_cluster`; ``kwargs`` then may hold ``scheduler_kwargs``)."""
    import dask
    from distributed import LocalCluster

    from sgdsweep.run.gpus import gpu_local_cluster

    options = {"n_workers": workers, "threads_per_worker": 1, "processes": True, "host": host,
               "scheduler_port": 0, "dashboard_address": f"{host}:0", "silence_logs": logging.WARNING,
               "preload": ["sgdsweep.sim.warmup"], **kwargs}
    environ = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_ENVIRON.items()}
    # read by each Nanny as it is created, inside LocalCluster(). A Nanny reads this process's
    # environment before the setting, and copies its own settings into that environment when it
    # spawns a worker: an earlier cluster of this process with Dask's defaults would override
    # ours, so the environment holds ours while the workers start.
    with dask.config.set(environ), _environment(WORKER_ENVIRON):
        if gpus:
            return gpu_local_cluster(workers, gpus, host, kwargs.get("scheduler_kwargs"),
                                     {"preload": options["preload"]})
        return LocalCluster(**options)


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` for the block, then as it was."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- the run's local cluster: started and stopped by `sgdsweep run` ------------------------------


def start_run_cluster(cluster_dir: Path, workers: int, host: str = "127.0.0.1", gpus: int = 0) -> subprocess.Popen:
    """Start the run's cluster process without waiting for it; return the process, which the
    caller stops with :func:`stop_run_cluster`. What an earlier run left in ``cluster_dir`` is
    removed first (the caller holds the sweep's lock: no live run owns it). A symbolic link at
    ``cluster_dir`` is removed, never followed: the run's files are not written, nor another
    directory's ``scheduler.json`` removed, through it."""
    cluster_dir = Path(cluster_dir)
    if cluster_dir.is_symlink():
        log.warning("%s was a symbolic link (to %s); removed, and the run's cluster files written in a new "
                    "directory there", cluster_dir, os.readlink(cluster_dir))
        cluster_dir.unlink()
    cluster_dir.mkdir(parents=True, exist_ok=True)
    (cluster_dir / SCHEDULER_FILE).unlink(missing_ok=True)
    log_fh = create_afresh(cluster_dir / DAEMON_LOG)  # a link there is removed, not followed
    # until the process records its own phases, the record names this (its owner) process
    _write_status(cluster_dir, os.getpid(), "spawned")
    with log_fh:
        return subprocess.Popen(
            [sys.executable, "-m", "sgdsweep", "cluster-daemon", "--dir", str(cluster_dir),
             "--workers", str(workers), "--host", host, *(["--gpus", str(gpus)] if gpus else [])],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh, start_new_session=True)


def stop_run_cluster(proc: subprocess.Popen, cluster_dir: Path, timeout_s: float = 20.0) -> None:
    """Stop the run's cluster process started by :func:`start_run_cluster`: SIGTERM, then after
    ``timeout_s`` seconds SIGKILL to its process group (its workers); its scheduler file and
    status record are gone afterwards."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for name in (SCHEDULER_FILE, STATUS_FILE):
        (Path(cluster_dir) / name).unlink(missing_ok=True)


def _write_status(cluster_dir: Path, pid: int, phase: str, **extra: Any) -> None:
    atomic_write_text(Path(cluster_dir) / STATUS_FILE, json.dumps({"pid": pid, "phase": phase, **extra}))


def _read_status(cluster_dir: Path) -> dict[str, Any]:
    try:
        status = json.loads((Path(cluster_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie — exited, not yet reaped by its parent — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (macOS): kill(0) is all there is
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


#: What the cluster process is doing in each phase it records, for the waiting job's lines.
_PHASES = {
    "spawned": "its process is starting",
    "kernels": ("compiling or loading the simulation kernels (the first run of an installation compiles "
                "them: 1-3 min on a busy 2-core machine; later runs load them from numba's cache)"),
    "workers": "its scheduler and workers are starting",
}


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a text file, indented (or a note that it is empty/missing)."""
    try:
        text = Path(path).read_text(errors="replace").rstrip()
    except OSError:
        return "  (no log)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:]) if text else "  (empty)"


def wait_for_run_cluster(scheduler_file: Path) -> dict[str, Any]:
    """Wait until the run's cluster, whose Dask scheduler file is ``scheduler_file``, is ready;
    return its status record (``address``, ``dashboard``, ``workers``).

    The wait follows the cluster process's phases, not one wall clock: while it compiles or
    loads the simulation kernels it may take as long as it needs while it lives; the Python
    start before that and the Dask start after it each get :data:`START_TIMEOUT_S`. A progress
    line is logged every :data:`PROGRESS_EVERY_S` seconds.

    Raises:
        SgdsweepError: the process is gone or reported an error (its own message and the end of
            its log are in the text), or a phase with a deadline overran it.
    """
    cluster_dir = Path(scheduler_file).parent
    log_path = cluster_dir / DAEMON_LOG
    t0 = time.monotonic()
    phase, phase_start, last_note = None, t0, t0
    while True:
        status = _read_status(cluster_dir)
        if status.get("phase") == "ready" and Path(scheduler_file).exists():
            return status
        if status.get("phase") == "failed" or not (status and _pid_alive(int(status["pid"]))):
            reason = status.get("error") or ("the process exited" if status else "it is not running")
            raise SgdsweepError(f"the run's local Dask cluster failed to start: {reason}\n"
                                f"last lines of {log_path}:\n{_tail(log_path)}")
        now = time.monotonic()
        if status["phase"] != phase:
            phase, phase_start = status["phase"], now
            if phase == "workers" and status.get("kernels_s") is not None:
                log.info("simulation kernels ready in %.0f s; starting the Dask workers", status["kernels_s"])
        if phase != "kernels" and now - phase_start > START_TIMEOUT_S:
            raise SgdsweepError(f"the run's local Dask cluster did not start: {_PHASES.get(phase, phase)} took "
                                f"more than {START_TIMEOUT_S:.0f} s\nlast lines of {log_path}:\n{_tail(log_path)}")
        if now - last_note >= PROGRESS_EVERY_S:
            last_note = now
            log.info("waiting for the local Dask cluster: %s (%.0f s so far)", _PHASES.get(phase, phase), now - t0)
        time.sleep(0.1)


def serve(cluster_dir: Path, workers: int, host: str = "127.0.0.1", gpus: int = 0) -> None:
    """Run the run's local cluster until SIGTERM/SIGINT or until the parent process is gone.

    First the simulation kernels are compiled (or loaded from numba's cache) in this process, so
    that the workers, which preload them (:mod:`sgdsweep.sim.warmup`), find them cached and start
    in seconds. Each phase is recorded in ``status.json`` (``kernels``, ``workers``, then
    ``ready`` with the scheduler's ``address``) for :func:`wait_for_run_cluster`; the scheduler
    writes Dask's scheduler file ``scheduler.json``. An exception is recorded as ``failed`` with
    its message before it propagates.
    """
    cluster_dir = Path(cluster_dir)
    stop = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    parent, me = os.getppid(), os.getpid()

    def running() -> bool:
        return not stop and os.getppid() == parent

    try:
        _write_status(cluster_dir, me, "kernels")
        t0 = time.monotonic()
        from sgdsweep.sim.warmup import warm

        warm()
        _write_status(cluster_dir, me, "workers", kernels_s=time.monotonic() - t0)
        if not running():  # the run ended meanwhile
            return
        cluster = local_cluster(workers, host, gpus,
                                scheduler_kwargs={"scheduler_file": str(cluster_dir / SCHEDULER_FILE)})
    except BaseException as exc:
        with contextlib.suppress(OSError):
            _write_status(cluster_dir, me, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    try:
        _write_status(cluster_dir, me, "ready", address=cluster.scheduler_address,
                      dashboard=cluster.dashboard_link, workers=workers)
        while running():
            time.sleep(0.25)
    finally:
        cluster.close(timeout=20)
        for name in (STATUS_FILE, SCHEDULER_FILE):
            with contextlib.suppress(FileNotFoundError):
                (cluster_dir / name).unlink()


# --- the shard job's client ------------------------------------------------------------------------


def _check_workers_import_sgdsweep(client: Any, address: str) -> None:
    """Fail clearly when an existing cluster's workers cannot run sgdsweep's tasks."""
    import importlib.util

    found = client.run(lambda: importlib.util.find_spec("sgdsweep") is not None)
    missing = [w for w, ok in found.items() if not ok]
    if not found:
        raise SgdsweepError(f"the Dask scheduler at {address} has no workers; start some "
                            f"(dask worker {address})")
    if not client.run_on_scheduler(lambda: importlib.util.find_spec("sgdsweep") is not None):
        missing = ["scheduler"] + missing
    if missing:
        raise SgdsweepError(f"Dask workers/scheduler {', '.join(missing)} of the scheduler at {address} cannot "
                            "import sgdsweep: install sgdsweep in the workers' environment "
                            "(pip install -e <repository>) or start them with PYTHONPATH=<repository>")


def slurm_cluster_kwargs(execution: Mapping[str, Any]) -> dict[str, Any]:
    """The dask-jobqueue ``SLURMCluster`` keyword arguments of ``execution.slurm``: jobs of
    ``cores`` one-thread workers, or with GPUs those of :func:`sgdsweep.run.gpus.slurm_gpu_options`."""
    from sgdsweep.run.gpus import slurm_gpu_options

    s = execution["slurm"]
    return {"cores": s["cores"], "processes": s["cores"], "memory": s["memory"], "walltime": s["walltime"],
            "queue": s["queue"], "account": s["account"], "scheduler_options": {"host": execution["host"]},
            "log_directory": None, **slurm_gpu_options(execution)}


@contextlib.contextmanager
def _slurm_cluster(execution: Mapping[str, Any]) -> Iterator[Any]:
    """A dask-jobqueue ``SLURMCluster`` of ``execution.slurm.jobs`` jobs (workers of one thread)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise UsageError("execution.cluster: slurm needs dask-jobqueue; install it with "
                         "pip install 'sgdsweep[slurm]'") from None
    cluster = SLURMCluster(**slurm_cluster_kwargs(execution))
    try:
        cluster.scale(jobs=execution["slurm"]["jobs"])
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def dask_client(execution: Mapping[str, Any]) -> Iterator[Any]:
    """A connected ``distributed.Client`` per the rules in the module docstring.

    Raises:
        SgdsweepError: the named scheduler or the run's cluster cannot be reached or does not
            answer as a Dask scheduler within :data:`PROBE_TIMEOUT_S`, or the named scheduler's
            workers cannot import sgdsweep.
    """
    from distributed import Client

    address = scheduler_address(execution)
    if address is not None:
        probe_scheduler(address)
        try:
            client = Client(address, timeout="30s")
        except OSError as exc:
            raise SgdsweepError(f"cannot connect to the Dask scheduler at {address} ({exc}); check that it "
                                f"runs, or unset {SCHEDULER_ENV} / execution.scheduler") from None
        with client:
            _check_workers_import_sgdsweep(client, address)
            yield client
        return
    if execution.get("cluster", "local") == "slurm":
        with _slurm_cluster(execution) as cluster, Client(cluster) as client:
            log.info("Dask on SLURM: %d job(s) of %d worker(s); dashboard %s", execution["slurm"]["jobs"],
                     execution["slurm"]["cores"], cluster.dashboard_link)
            yield client
        return
    scheduler_file = os.environ.get(SCHEDULER_FILE_ENV, "").strip()
    if scheduler_file:
        status = wait_for_run_cluster(Path(scheduler_file))
        probe_scheduler(_file_address(Path(scheduler_file)),
                        fix=(f"the scheduler file {scheduler_file} ({SCHEDULER_FILE_ENV}) is stale or not the "
                             f"run's own: run the workflow with 'sgdsweep run', or unset {SCHEDULER_FILE_ENV} to "
                             "start a cluster for this job"))
        try:
            client = Client(scheduler_file=scheduler_file, timeout="30s")
        except OSError as exc:
            raise SgdsweepError(f"cannot connect to the run's local Dask cluster ({exc}); see "
                                f"{Path(scheduler_file).parent / DAEMON_LOG}") from None
        with client:
            log.info("Dask dashboard: %s (scheduler %s, %s workers)", status.get("dashboard"),
                     status.get("address"), status.get("workers"))
            yield client
        return
    from sgdsweep.run.gpus import local_cpu_workers, local_gpus
    from sgdsweep.sim.warmup import warm

    workers, gpus = local_cpu_workers(execution, worker_count(execution)), local_gpus(execution)
    log.info("compiling or loading the simulation kernels before starting %d Dask workers", workers + gpus)
    warm()  # compiled here, before Dask's start: the workers' preload then loads them from the cache
    with local_cluster(workers, execution.get("host", "127.0.0.1"), gpus) as cluster, Client(cluster) as client:
        log.info("Dask dashboard: %s (scheduler %s, this job's cluster, %d workers)", cluster.dashboard_link,
                 cluster.scheduler_address, workers + gpus)
        yield client


def _file_address(scheduler_file: Path) -> str:
    """The scheduler address recorded in the Dask scheduler file ``scheduler_file``.

    Raises:
        SgdsweepError: naming the file, when it cannot be read or records no address."""
    try:
        address = json.loads(Path(scheduler_file).read_text()).get("address")
    except (OSError, ValueError, AttributeError) as exc:
        address, why = None, getattr(exc, "strerror", None) or exc
    else:
        why = f"its 'address' is {address!r}"
    if not isinstance(address, str) or not valid_address(address):
        raise SgdsweepError(f"the Dask scheduler file {scheduler_file} ({SCHEDULER_FILE_ENV}) names no scheduler "
                            f"({why}; expected JSON with an address such as tcp://127.0.0.1:8786); run the "
                            f"workflow with 'sgdsweep run', or unset {SCHEDULER_FILE_ENV}")
    return address


def probe_scheduler(address: str, timeout_s: float | None = None, fix: str | None = None) -> None:
    """Check that ``address`` answers as a Dask scheduler within ``timeout_s`` seconds (default
    :data:`PROBE_TIMEOUT_S`); ``fix`` replaces the way out that the error messages suggest
    (by default, to check the address or unset :data:`SCHEDULER_ENV`).

    ``Client(address, timeout=...)`` bounds the TCP connect but not Dask's handshake: a listener
    that is not Dask (a web server, say) accepts the connection and never answers, and the client
    waits for ever. This sends the scheduler's ``identity`` request under one deadline.

    Raises:
        SgdsweepError: naming the address, when nothing listens there, it does not answer within
            the deadline, or what answers is not a Dask scheduler.
    """
    import asyncio

    from distributed.comm import connect

    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s

    async def _identity() -> Any:
        comm = await connect(address, timeout=timeout_s)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    if fix is None:
        fix = f"check the address, or unset {SCHEDULER_ENV} / execution.scheduler to start a local cluster"
    try:
        reply = asyncio.run(asyncio.wait_for(_identity(), timeout_s))
    except (asyncio.TimeoutError, TimeoutError):
        raise SgdsweepError(f"no Dask scheduler answered at {address} within {timeout_s:.0f} s (nothing "
                            f"listens there, or something that is not Dask does); {fix}") from None
    except OSError as exc:
        raise SgdsweepError(f"cannot connect to the Dask scheduler at {address} ({exc}); {fix}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the peer sent, it was not a scheduler's answer
        raise SgdsweepError(f"{address} did not answer as a Dask scheduler ({type(exc).__name__}: {exc}); "
                            f"{fix}") from None
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise SgdsweepError(f"{address} answered, but not as a Dask scheduler (got {str(reply)[:200]!r}); {fix}")
