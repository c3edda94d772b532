"""Which Dask cluster runs the simulations, and who owns its lifetime.

Four cases, in order of precedence:

1. ``SGDSWEEP_SCHEDULER`` (environment) or ``execution.scheduler`` (config) names an existing
   scheduler: connect to it; nothing is started or stopped.
2. ``execution.cluster: slurm``: a dask-jobqueue ``SLURMCluster`` for the duration of the job.
3. ``SGDSWEEP_SCHEDULER_FILE`` names a Dask scheduler file: the run's local cluster, owned by
   ``sgdsweep run``. It starts one cluster process (``python -m sgdsweep cluster-daemon``,
   :func:`serve`) as Snakemake starts, passes the scheduler file's path to Snakemake's
   environment, and stops the process when Snakemake ends (also on error and on Ctrl-C); the
   process also stops by itself when ``sgdsweep run`` is gone (e.g. after ``kill -9``). The
   process starts its Dask scheduler at once (which writes the scheduler file), then compiles
   the simulation kernels, then starts its workers. Shard jobs only wait for the scheduler file,
   check that its address answers as a Dask scheduler within :data:`PROBE_TIMEOUT_S`
   (:func:`probe_scheduler`: a stale file naming a port that something else now holds fails
   there, not for ever), connect with ``distributed.Client(scheduler_file=...)`` and wait for
   the cluster's workers (:data:`CLUSTER_WORKERS_ENV`) with ``Client.wait_for_workers``
   (:func:`wait_for_run_cluster`). The cluster process's
   log, ``daemon.log``, is created afresh by each run; a symbolic link there is removed, never
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
#: Environment variable set with :data:`SCHEDULER_FILE_ENV`: how many workers the run's local
#: cluster starts, all of which a shard job waits for (1 when unset).
CLUSTER_WORKERS_ENV = "SGDSWEEP_CLUSTER_WORKERS"
#: Names, in the run's cluster directory, of Dask's scheduler file, of the cluster process's
#: record of why it stopped (written only when it failed or lost its owner) and of its log.
SCHEDULER_FILE, FAILURE_FILE, DAEMON_LOG = "scheduler.json", "failure.txt", "daemon.log"
#: Seconds the cluster process has to start its Dask scheduler, and after the kernels its
#: workers (compiling or loading the kernels between them has no deadline while it lives).
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
#: What the workers of local clusters import as they start: the simulation code and its kernels.
WORKER_PRELOAD = ["sgdsweep.sim.warmup"]
#: Dask's own bookkeeping in local clusters, done less often than Dask's defaults do it
#: (``dask.config`` keys): the workers' statistical profiler (their task threads' stacks sampled
#: every 10 ms, for the dashboard's profile page) off, the event-loop health check every second
#: instead of every 20 ms, the system monitor (CPU, memory and network of each process, for the
#: dashboard) every 2 s instead of 0.5 s. With Dask's defaults an idle scheduler and two workers
#: spend about 5 CPU-seconds a minute on these, with these about 2
#: (``benchmarks/cluster_overhead.py``). :func:`quiet_dask` applies them where nothing else has
#: set the key.
QUIET_DASK = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
              "distributed.admin.system-monitor.interval": "2s"}
#: What the run's cluster does while it has no worker, for the waiting job's progress lines.
_COMPILING = ("compiling or loading the simulation kernels, then starting its workers (the first run of an "
              "installation compiles them: 1-3 min on a busy 2-core machine; later runs load them from numba's "
              "cache)")

log = logging.getLogger("sgdsweep.run.cluster")


def quiet_dask() -> dict[str, Any]:
    """Set, in this process's Dask config, each key of :data:`QUIET_DASK` that the user's Dask
    config (its YAML files and ``DASK_*`` variables, ``dask.config.collect``) does not set and that
    still holds Dask's default (a program may have set it); returns what it set. A Nanny passes
    this process's config to the worker it starts."""
    import dask

    user = dask.config.collect()
    defaults = dask.config.merge(*dask.config.defaults)
    unset = object()
    updates = {key: value for key, value in QUIET_DASK.items()
               if dask.config.get(key, default=unset, config=user) is unset
               and dask.config.get(key, default=unset) == dask.config.get(key, default=unset, config=defaults)}
    dask.config.set(updates)
    return updates


def local_cluster(workers: int, host: str = "127.0.0.1", gpus: int = 0, **kwargs: Any) -> Any:
    """A started ``distributed.LocalCluster`` of ``workers`` one-thread worker processes bound to
    ``host``, whose workers preload :data:`WORKER_PRELOAD` and start with :data:`WORKER_ENVIRON`,
    scheduler and workers with :data:`QUIET_DASK` (:func:`quiet_dask`; this process's config
    afterwards); ``kwargs`` go to ``LocalCluster`` (and replace these defaults). With ``gpus``, ``workers`` CPU
    workers and one worker per GPU advertising the Dask resource ``GPU``
    (:func:`sgdsweep.run.gpus.gpu_local_cluster`; ``kwargs`` then may hold ``scheduler_kwargs``).

    This process's environment holds :data:`WORKER_ENVIRON` afterwards: a Nanny takes each
    variable of ``distributed.nanny.pre-spawn-environ`` from this process's environment where it
    is set there (an earlier cluster of this process leaves Dask's defaults there), and writes
    them there before it spawns a worker, which inherits them at its start (the Nanny's ``env=``
    is applied only after the worker process has started, too late for glibc's malloc).
    """
    import dask
    from distributed import LocalCluster

    from sgdsweep.run.gpus import gpu_local_cluster

    options = {"n_workers": workers, "threads_per_worker": 1, "processes": True, "host": host,
               "scheduler_port": 0, "dashboard_address": f"{host}:0", "silence_logs": logging.WARNING,
               "preload": WORKER_PRELOAD, **kwargs}
    os.environ.update(WORKER_ENVIRON)
    quiet_dask()
    with dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in WORKER_ENVIRON.items()}):
        if gpus:
            return gpu_local_cluster(workers, gpus, host, kwargs.get("scheduler_kwargs"),
                                     {"preload": WORKER_PRELOAD})
        return LocalCluster(**options)


# --- the run's local cluster: started and stopped by `sgdsweep run` ------------------------------


def start_run_cluster(cluster_dir: Path, workers: int, host: str = "127.0.0.1", gpus: int = 0) -> subprocess.Popen:
    """Start the run's cluster process without waiting for it; return the process, which the
    caller stops with :func:`stop_run_cluster`, and which stops by itself when the caller's
    process is gone. What an earlier run left in ``cluster_dir`` is
    removed first (the caller holds the sweep's lock: no live run owns it). A symbolic link at
    ``cluster_dir`` is removed, never followed: the run's files are not written, nor another
    directory's ``scheduler.json`` removed, through it."""
    cluster_dir = Path(cluster_dir)
    if cluster_dir.is_symlink():
        log.warning("%s was a symbolic link (to %s); removed, and the run's cluster files written in a new "
                    "directory there", cluster_dir, os.readlink(cluster_dir))
        cluster_dir.unlink()
    cluster_dir.mkdir(parents=True, exist_ok=True)
    for name in (SCHEDULER_FILE, FAILURE_FILE):
        (cluster_dir / name).unlink(missing_ok=True)
    with create_afresh(cluster_dir / DAEMON_LOG) as log_fh:  # a link there is removed, not followed
        return subprocess.Popen(
            [sys.executable, "-m", "sgdsweep", "cluster-daemon", "--dir", str(cluster_dir),
             "--workers", str(workers), "--host", host, "--owner", str(os.getpid()),
             *(["--gpus", str(gpus)] if gpus else [])],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh, start_new_session=True)


def stop_run_cluster(proc: subprocess.Popen, cluster_dir: Path, timeout_s: float = 20.0) -> None:
    """Stop the run's cluster process started by :func:`start_run_cluster`: SIGTERM, then after
    ``timeout_s`` seconds SIGKILL to its process group (its workers); of its files only its log
    is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for name in (SCHEDULER_FILE, FAILURE_FILE):
        (Path(cluster_dir) / name).unlink(missing_ok=True)


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a text file, indented (or a note that it is empty/missing)."""
    try:
        text = Path(path).read_text(errors="replace").rstrip()
    except OSError:
        return "  (no log)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:]) if text else "  (empty)"


def _failed(cluster_dir: Path, why: str | None = None) -> SgdsweepError:
    """The error of a job whose run's cluster failed: the cluster process's own record of why
    (:data:`FAILURE_FILE`), else ``why``, and the end of its log."""
    with contextlib.suppress(OSError):
        why = (cluster_dir / FAILURE_FILE).read_text().strip() or why
    return SgdsweepError(f"the run's local Dask cluster failed to start: {why}\n"
                         f"last lines of {cluster_dir / DAEMON_LOG}:\n{_tail(cluster_dir / DAEMON_LOG)}")


def wait_for_run_cluster(client: Any, cluster_dir: Path, workers: int = 1) -> None:
    """Wait until the run's cluster, connected to by ``client``, runs ``workers`` workers.
    Compiling or loading the kernels before the workers start has no deadline
    while the cluster lives; a progress line is logged every :data:`PROGRESS_EVERY_S` seconds.

    Raises:
        SgdsweepError: the cluster process recorded a failure in ``cluster_dir`` (its message and
            the end of its log are in the text) or its scheduler no longer answers.
    """
    t0 = last_note = time.monotonic()
    while True:
        if (cluster_dir / FAILURE_FILE).exists():
            raise _failed(cluster_dir)
        try:
            client.wait_for_workers(workers, timeout=min(1.0, PROGRESS_EVERY_S))
            return
        except TimeoutError:  # distributed's WorkerStartTimeoutError
            pass
        except OSError as exc:  # the scheduler is gone (the cluster process exited)
            raise _failed(cluster_dir, f"its scheduler stopped answering ({type(exc).__name__}: {exc})") from None
        if time.monotonic() - last_note >= PROGRESS_EVERY_S:
            last_note = time.monotonic()
            log.info("waiting for the local Dask cluster: %s (%.0f s so far)", _COMPILING, last_note - t0)


def _wait_for_scheduler_file(scheduler_file: Path) -> str:
    """Wait until ``scheduler_file`` names a scheduler (at most :data:`START_TIMEOUT_S` seconds)
    and return its address.

    Raises:
        SgdsweepError: the cluster process recorded a failure, or the deadline passed (the end of
            its log is in the text); or the file names no scheduler (:func:`_file_address`).
    """
    cluster_dir = Path(scheduler_file).parent
    t0 = last_note = time.monotonic()
    found = None  # when the file was first seen: Dask writes it in place, not by a rename
    while True:
        if (cluster_dir / FAILURE_FILE).exists():
            raise _failed(cluster_dir)
        if Path(scheduler_file).exists():
            found = found or time.monotonic()
            try:
                return _file_address(Path(scheduler_file))
            except SgdsweepError:
                if time.monotonic() - found > 1.0:
                    raise
        now = time.monotonic()
        if now - t0 > START_TIMEOUT_S:
            raise _failed(cluster_dir, f"its Dask scheduler did not start within {START_TIMEOUT_S:g} s")
        if now - last_note >= PROGRESS_EVERY_S:
            last_note = now
            log.info("waiting for the local Dask cluster: its process is starting (%.0f s so far)", now - t0)
        time.sleep(0.05)


def serve(cluster_dir: Path, workers: int, host: str = "127.0.0.1", gpus: int = 0, owner: int | None = None) -> None:
    """Run the run's local cluster until SIGTERM/SIGINT or until its owner, the parent process
    ``owner`` (by default the parent process at the call), is gone.

    The Dask scheduler starts first and writes Dask's scheduler file ``scheduler.json``, so that
    shard jobs connect while the simulation kernels are compiled (or loaded from numba's cache)
    in this process; then the workers start, which preload the kernels
    (:mod:`sgdsweep.sim.warmup`), find them cached and start in seconds, all within
    :data:`START_TIMEOUT_S`. A failure is recorded with its message in :data:`FAILURE_FILE`: one
    of the scheduler's start propagates; after it, the scheduler stays up until the owner stops
    it, so that the jobs connected to it read the record rather than lose their connection. The
    loss of the owner is recorded too.
    """
    cluster_dir = Path(cluster_dir)
    stop = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    parent = os.getppid() if owner is None else owner

    def running() -> bool:
        return not stop and os.getppid() == parent

    try:
        # the scheduler alone; each CPU worker later gets the share of memory of one of `workers`
        cluster = local_cluster(0, host, memory_limit=1 / max(workers, 1),
                                scheduler_kwargs={"scheduler_file": str(cluster_dir / SCHEDULER_FILE)})
    except BaseException as exc:
        _record_failure(cluster_dir, exc)
        raise
    try:
        try:
            _start_workers(cluster, workers, gpus, host, running)
        except Exception as exc:
            log.exception("the cluster's workers did not start")
            _record_failure(cluster_dir, exc)
        while running():
            time.sleep(0.25)
    finally:
        if os.getppid() != parent:
            _record_failure(cluster_dir, f"sgdsweep run (pid {parent}), which started it, is gone")
        cluster.close(timeout=20)
        (cluster_dir / SCHEDULER_FILE).unlink(missing_ok=True)


def _start_workers(cluster: Any, workers: int, gpus: int, host: str, running: Any) -> None:
    """Compile or load the kernels, then start ``workers`` CPU and ``gpus`` GPU workers in
    ``cluster`` and wait :data:`START_TIMEOUT_S` seconds at most for them all (unless
    ``running()`` turns false meanwhile)."""
    from sgdsweep.sim.warmup import warm

    t0 = time.monotonic()
    warm()
    if not running():  # the run ended meanwhile
        return
    log.info("simulation kernels ready in %.0f s; starting %d Dask workers", time.monotonic() - t0, workers + gpus)
    if gpus:
        from sgdsweep.run.gpus import gpu_worker_specs

        cluster.worker_spec.update(gpu_worker_specs(workers, gpus, host, {"preload": WORKER_PRELOAD}))
    cluster.scale(workers + gpus)
    cluster.wait_for_workers(workers + gpus, timeout=START_TIMEOUT_S)


def _record_failure(cluster_dir: Path, why: BaseException | str) -> None:
    """Record ``why`` the cluster process stops in :data:`FAILURE_FILE`, for the waiting jobs."""
    text = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
    with contextlib.suppress(OSError):
        atomic_write_text(Path(cluster_dir) / FAILURE_FILE, text)


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
        workers = _cluster_workers()
        probe_scheduler(_wait_for_scheduler_file(Path(scheduler_file)),
                        fix=(f"the scheduler file {scheduler_file} ({SCHEDULER_FILE_ENV}) is stale or not the "
                             f"run's own: run the workflow with 'sgdsweep run', or unset {SCHEDULER_FILE_ENV} to "
                             "start a cluster for this job"))
        try:
            client = Client(scheduler_file=scheduler_file, timeout="30s")
        except OSError as exc:
            raise SgdsweepError(f"cannot connect to the run's local Dask cluster ({exc}); see "
                                f"{Path(scheduler_file).parent / DAEMON_LOG}") from None
        with client:
            wait_for_run_cluster(client, Path(scheduler_file).parent, workers)
            log.info("Dask dashboard: %s (scheduler %s, the run's cluster of %d workers)", client.dashboard_link,
                     client.scheduler.address, workers)
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


def _cluster_workers() -> int:
    """The workers of the run's cluster, from :data:`CLUSTER_WORKERS_ENV` (1 when unset).

    Raises:
        SgdsweepError: the variable is set to anything but a positive integer."""
    text = os.environ.get(CLUSTER_WORKERS_ENV, "").strip() or "1"
    if not (text.isdigit() and int(text) > 0):
        raise SgdsweepError(f"{CLUSTER_WORKERS_ENV}={text!r}: expected a positive integer, the workers of the run's "
                            f"cluster (sgdsweep run sets it); unset it, or run the workflow with 'sgdsweep run'")
    return int(text)


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
