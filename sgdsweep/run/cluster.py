"""Which Dask cluster runs the simulations, and its lifetime.

Three cases, in order of precedence:

1. ``SGDSWEEP_SCHEDULER`` (environment) or ``execution.scheduler`` (config) names an existing
   scheduler: connect to it; nothing is started or stopped.
2. Inside a workflow run (``SGDSWEEP_RUN_ID`` set by the Snakefile to the Snakemake process id):
   one *shared* local cluster runs in a small daemon process (``python -m sgdsweep
   cluster-daemon``), started by ``sgdsweep run`` as Snakemake starts when points need
   simulating and no extra Snakemake arguments or profile are given (its workers boot while
   Snakemake builds the DAG), or else by the first shard job that needs workers; the shard jobs
   of the run connect to it. The aggregate job releases it (every shard is done by then), the
   Snakefile's ``onsuccess``/``onerror`` handlers stop it if it still runs; the daemon also
   exits by itself when the Snakemake process is gone (e.g. after ``kill -9``). So a
   run starts at most one cluster, and none at all when nothing needs simulating.
3. Otherwise (a shard job run by hand): a private ``LocalCluster`` for the duration of the job.

Local clusters bind the scheduler and the dashboard to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sgdsweep.errors import SgdsweepError, UsageError
from sgdsweep.sweep.paths import atomic_write_text

SCHEDULER_ENV = "SGDSWEEP_SCHEDULER"
RUN_ID_ENV = "SGDSWEEP_RUN_ID"
_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx)://\S+$")
STATE_FILE = "cluster.json"
START_TIMEOUT_S = 120.0
#: Seconds between the progress lines of a job waiting for the local cluster.
PROGRESS_EVERY_S = 15.0

log = logging.getLogger("sgdsweep.run.cluster")


def run_id(snakemake_pid: int) -> str:
    """Identity of a workflow run: ``<pid>@<host>`` of the Snakemake process."""
    return f"{snakemake_pid}@{platform.node()}"


def current_run_id() -> str:
    """The run id of the workflow whose Snakemake process this is."""
    return run_id(os.getpid())


def _local_run_pid(run: str) -> int | None:
    """The Snakemake pid if ``run`` is a run on this host, else None."""
    pid, _, host = run.partition("@")
    return int(pid) if pid.isdigit() and host == platform.node() else None


def scheduler_address(execution: Mapping[str, Any]) -> str | None:
    """The existing scheduler to use, or None to use a local cluster.

    Raises:
        UsageError: ``SGDSWEEP_SCHEDULER`` is set but is not a scheduler address.
    """
    env = os.environ.get(SCHEDULER_ENV)
    if env is not None and env.strip():
        if not _valid_address(env.strip()):
            raise UsageError(f"environment variable {SCHEDULER_ENV}={env!r} is not a Dask scheduler "
                             "address; expected e.g. tcp://127.0.0.1:8786 (or unset it to start a "
                             "local cluster)")
        return env.strip()
    address = execution.get("scheduler")
    if address is not None and not _valid_address(address):
        raise UsageError(f"config key 'execution.scheduler': {address!r} is not a Dask scheduler address; "
                         "expected e.g. tcp://127.0.0.1:8786 (a host and a port from 1 to 65535), or "
                         "null to start a local cluster")
    return address


def _valid_address(address: str) -> bool:
    """Whether ``address`` is ``protocol://host:port`` with a port in 1–65535 (``inproc://`` takes
    any name)."""
    from urllib.parse import urlsplit

    if not _ADDRESS.match(address):
        return False
    if address.startswith("inproc://"):
        return True
    try:
        parts = urlsplit(address)
        return bool(parts.hostname) and parts.port is not None and 0 < parts.port
    except ValueError:  # a port beyond 65535, an unclosed [ of an IPv6 host
        return False


def worker_count(execution: Mapping[str, Any]) -> int:
    """Worker processes of a local cluster (``auto`` = CPU cores available to this process)."""
    workers = execution.get("workers", "auto")
    if workers == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - non-Linux
            return max(1, os.cpu_count() or 1)
    return int(workers)


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


def _read_state(cluster_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((cluster_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked(cluster_dir: Path) -> Iterator[None]:
    cluster_dir.mkdir(parents=True, exist_ok=True)
    with open(cluster_dir / "cluster.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def start_shared_cluster(cluster_dir: Path, run_id: str, workers: int, host: str = "127.0.0.1") -> None:
    """Start the run's shared local cluster without waiting for it (``sgdsweep run`` calls this
    as Snakemake starts, so the workers boot while Snakemake builds its DAG); nothing happens if
    the run already has one, starting or started. The first shard job's
    :func:`ensure_shared_cluster` then waits for it instead of starting another."""
    with _locked(Path(cluster_dir)):
        if _run_cluster(Path(cluster_dir), run_id) is None:
            _spawn_daemon(Path(cluster_dir), run_id, workers, host)


def ensure_shared_cluster(cluster_dir: Path, run_id: str, workers: int, host: str = "127.0.0.1") -> str:
    """Address of the run's shared local cluster, starting it if this run has none yet (or waiting
    for the one :func:`start_shared_cluster` started).

    The wait follows the daemon's progress, not one wall clock: while it compiles or loads the
    simulation kernels (minutes on the first run of an installation on a busy machine) it may
    take as long as it needs while it lives; the Python start before that and the Dask start
    after it each get :data:`START_TIMEOUT_S`. A progress line is logged every
    :data:`PROGRESS_EVERY_S` seconds.

    Raises:
        SgdsweepError: the daemon died or reported an error (its own message and the end of
            ``daemon.log`` are in the text), or a phase with a deadline overran it.
    """
    cluster_dir = Path(cluster_dir)
    with _locked(cluster_dir):
        state = _run_cluster(cluster_dir, run_id)
        if state is not None and "address" in state:
            return state["address"]
        pid = int(state["pid"]) if state is not None else _spawn_daemon(cluster_dir, run_id, workers, host)
    log_path = cluster_dir / "daemon.log"
    t0 = time.monotonic()
    phase, phase_start, last_note = None, t0, t0
    while True:
        state = _read_state(cluster_dir)
        if not (state and state.get("run_id") == run_id and state.get("pid") == pid):
            state = {}
        if "address" in state:
            log.info("Dask dashboard: %s (scheduler %s, %d workers)", state["dashboard"], state["address"],
                     workers)
            return state["address"]
        if state.get("phase") == "failed" or not _pid_alive(pid):
            reason = state.get("error") or "the process exited"
            raise SgdsweepError(f"the local Dask cluster failed to start: {reason}\n"
                                f"last lines of {log_path}:\n{_tail(log_path)}")
        now = time.monotonic()
        if state.get("phase", "spawned") != phase:
            phase, phase_start = state.get("phase", "spawned"), now
            if phase == "workers" and state.get("kernels_s") is not None:
                log.info("simulation kernels ready in %.0f s; starting %d Dask workers", state["kernels_s"],
                         workers)
        if phase != "kernels" and now - phase_start > START_TIMEOUT_S:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            raise SgdsweepError(f"the local Dask cluster did not start: {_PHASES[phase]} took more than "
                                f"{START_TIMEOUT_S:.0f} s\nlast lines of {log_path}:\n{_tail(log_path)}")
        if now - last_note >= PROGRESS_EVERY_S:
            last_note = now
            log.info("waiting for the local Dask cluster: %s (%.0f s so far)", _PHASES[phase], now - t0)
        time.sleep(0.1)


#: What the daemon is doing in each phase it records, for the waiting job's progress lines.
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


def _run_cluster(cluster_dir: Path, run_id: str) -> dict[str, Any] | None:
    """The state of ``run_id``'s cluster if its daemon is alive (with ``address`` once it is
    ready), else None. Call under :func:`_locked`."""
    state = _read_state(cluster_dir)
    if state and state.get("run_id") == run_id and _pid_alive(int(state["pid"])):
        return state
    return None


def _spawn_daemon(cluster_dir: Path, run_id: str, workers: int, host: str) -> int:
    """Start ``sgdsweep cluster-daemon`` and record it as starting (its pid, no address yet; the
    daemon writes the address when its workers are up). Call under :func:`_locked`."""
    with open(cluster_dir / "daemon.log", "ab") as log_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sgdsweep", "cluster-daemon", "--state", str(cluster_dir / STATE_FILE),
             "--workers", str(workers), "--run-id", run_id, "--host", host],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh, start_new_session=True)
    atomic_write_text(cluster_dir / STATE_FILE, json.dumps({"pid": proc.pid, "run_id": run_id, "workers": workers,
                                                            "phase": "spawned"}))
    return proc.pid


def release_shared_cluster(cluster_dir: Path, run_id: str) -> bool:
    """Ask the run's shared cluster to stop, without waiting for it; return whether it had one.

    For the aggregate job: once it runs, every shard of the run is simulated, and the idle
    scheduler and workers (about a sixth of a core, measured) would only take CPU from
    aggregation, fit and report. The daemon closes its cluster and removes its state file
    itself; a later job that needs workers starts a new cluster.
    """
    state = _read_state(Path(cluster_dir))
    if not state or state.get("run_id") != run_id:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(state["pid"]), signal.SIGTERM)
    return True


def stop_shared_cluster(cluster_dir: Path, run_id: str) -> bool:
    """Stop the run's shared cluster if it has one; return whether one was stopped."""
    cluster_dir = Path(cluster_dir)
    state = _read_state(cluster_dir)
    if not state or state.get("run_id") != run_id:
        return False
    pid = int(state["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        (cluster_dir / STATE_FILE).unlink()
    return True


def serve(state_path: Path, workers: int, run_id: str, host: str = "127.0.0.1") -> None:
    """Run a local cluster until SIGTERM/SIGINT or until process ``run_id`` is gone.

    First the simulation kernels are compiled (or loaded from numba's cache) in this process, so
    that the workers, which preload them (:mod:`sgdsweep.sim.warmup`), find them cached and start in
    seconds. Each phase is recorded in the state file (``phase``: ``kernels``, ``workers``, then
    the scheduler's ``address``) for :func:`ensure_shared_cluster`; an exception is recorded as
    ``phase: failed`` with its message before it propagates.
    """
    stop = False

    def _stop(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watch = _local_run_pid(run_id)
    me = {"pid": os.getpid(), "run_id": run_id, "workers": workers}
    try:
        atomic_write_text(state_path, json.dumps({**me, "phase": "kernels"}))
        t0 = time.monotonic()
        from sgdsweep.sim.warmup import warm

        warm()
        atomic_write_text(state_path, json.dumps({**me, "phase": "workers",
                                                  "kernels_s": time.monotonic() - t0}))
        if stop or (watch is not None and not _pid_alive(watch)):  # the run ended meanwhile
            Path(state_path).unlink(missing_ok=True)
            return
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=host,
                               scheduler_port=0, dashboard_address=f"{host}:0",
                               silence_logs=logging.WARNING, preload=["sgdsweep.sim.warmup"])
    except BaseException as exc:
        with contextlib.suppress(OSError):
            atomic_write_text(state_path, json.dumps({**me, "phase": "failed",
                                                      "error": f"{type(exc).__name__}: {exc}"}))
        raise
    try:
        atomic_write_text(state_path, json.dumps({
            **me, "phase": "ready", "address": cluster.scheduler_address,
            "dashboard": cluster.dashboard_link}))
        while not stop and (watch is None or _pid_alive(watch)):
            time.sleep(0.25)
    finally:
        cluster.close(timeout=20)
        state = None
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(Path(state_path).read_text())
        if state and state.get("pid") == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                Path(state_path).unlink()


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


@contextlib.contextmanager
def _slurm_cluster(execution: Mapping[str, Any]) -> Iterator[Any]:
    """A dask-jobqueue ``SLURMCluster`` of ``execution.slurm.jobs`` jobs (workers of one thread)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise UsageError("execution.cluster: slurm needs dask-jobqueue; install it with "
                         "pip install 'sgdsweep[slurm]'") from None
    s = execution["slurm"]
    cluster = SLURMCluster(cores=s["cores"], processes=s["cores"], memory=s["memory"], walltime=s["walltime"],
                           queue=s["queue"], account=s["account"], scheduler_options={"host": execution["host"]},
                           log_directory=None)
    try:
        cluster.scale(jobs=s["jobs"])
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def dask_client(execution: Mapping[str, Any], cluster_dir: Path) -> Iterator[Any]:
    """A connected ``distributed.Client`` per the rules in the module docstring."""
    from distributed import Client, LocalCluster

    address = scheduler_address(execution)
    external = address is not None
    host = execution.get("host", "127.0.0.1")
    if address is None and execution.get("cluster", "local") == "slurm":
        with _slurm_cluster(execution) as cluster, Client(cluster) as client:
            log.info("Dask on SLURM: %d job(s) of %d worker(s); dashboard %s", execution["slurm"]["jobs"],
                     execution["slurm"]["cores"], cluster.dashboard_link)
            yield client
        return
    run = os.environ.get(RUN_ID_ENV, "")
    if address is None and _local_run_pid(run) is not None:
        address = ensure_shared_cluster(cluster_dir, run, worker_count(execution), host)
    if address is not None:
        if external:
            probe_scheduler(address)
        try:
            client = Client(address, timeout="30s")
        except OSError as exc:
            hint = (f"check that it runs, or unset {SCHEDULER_ENV} / execution.scheduler" if external else
                    f"the workflow's local cluster is gone; see {Path(cluster_dir) / 'daemon.log'}")
            raise SgdsweepError(f"cannot connect to the Dask scheduler at {address} ({exc}); {hint}") from None
        with client:
            if external:
                _check_workers_import_sgdsweep(client, address)
            yield client
        return
    from sgdsweep.sim.warmup import warm

    workers = worker_count(execution)
    log.info("compiling or loading the simulation kernels before starting %d Dask workers", workers)
    warm()  # compiled here, before Dask's start: the workers' preload then loads them from the cache
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=host,
                      scheduler_port=0, dashboard_address=f"{host}:0", silence_logs=logging.WARNING,
                      preload=["sgdsweep.sim.warmup"]) as cluster, Client(cluster) as client:
        log.info("Dask dashboard: %s (private cluster, %d workers)", cluster.dashboard_link, workers)
        yield client


#: Seconds a scheduler named by the user has to complete Dask's handshake.
PROBE_TIMEOUT_S = 30.0


def probe_scheduler(address: str, timeout_s: float | None = None) -> None:
    """Check that ``address`` answers as a Dask scheduler within ``timeout_s`` seconds (default
    :data:`PROBE_TIMEOUT_S`).

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
