"""The run's job server: one process that has imported what the workflow's jobs need, and forks
a process for each job of ``sgdsweep run``, so that a job does not spend 2-4 s of CPU importing
xarray, Zarr, Dask, SciPy and matplotlib before it starts.

``sgdsweep run`` starts it (:func:`start_job_server`) beside its Dask cluster, for a run whose
jobs run on this machine, and names its socket to Snakemake's jobs in
:data:`~sgdsweep.run.jobclient.JOB_SERVER_ENV`. A job (``python -m sgdsweep aggregate …``) then
hands itself over (:mod:`sgdsweep.run.jobclient`): its standard streams, arguments, working
directory, environment and umask. The server forks; the child takes all of them on
(:func:`become`) and runs the job as the command line would; the server sends the child's end
to the client, which ends the same way.

What keeps a job as it would be without the server:

- **Imports that read the environment.** A job is run only when its environment equals the
  server's but for :data:`MAY_DIFFER`: the thread counts and temporary directory Snakemake sets
  per job (applied in the child: BLAS's threads through threadpoolctl, the temporary directory
  through :mod:`tempfile`), what the job's shell sets, and sgdsweep's own variables, which
  sgdsweep reads when it uses them, never at import. Any other difference: the server declines,
  and the job runs by itself.
- **Threads.** The server runs one thread, so a fork copies no lock held by another; it refuses
  to start when an import started one.
- **Ends.** Each job runs in a process group of its own, and every signal goes to the group,
  so that the processes a job starts (the report's drawing processes) end with it. A client that
  is gone (killed) has its job stopped (SIGTERM); the server stopped (SIGTERM, ``sgdsweep run``
  gone, or an error of its own) stops the jobs it runs first. A client relays the signals it gets
  to its job, but those it ignores, which the job ignores too.
- **Requests.** One that is not whole within :data:`REQUEST_TIMEOUT_S` seconds, longer than
  :data:`MAX_REQUEST`, or whose fields are not of their types is declined; the server goes on.
- **Who may connect.** The socket lies in a directory only its user can enter, and the server
  runs only a client of its own user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sgdsweep.run.jobclient import DECLINE, EXITED, KILLED, PID, RELAYED, SERVED

log = logging.getLogger("sgdsweep.jobserver")

#: What the server imports before it serves: every module the served verbs import.
PRELOAD = ("sgdsweep.run.cli", "sgdsweep.run.execute", "sgdsweep.store.aggregate_incremental",
           "sgdsweep.store.aggregate", "sgdsweep.analysis.fit", "sgdsweep.analysis.fit.cache",
           "sgdsweep.analysis.report", "sgdsweep.sweep.precision", "sgdsweep.sweep.execution", "dask.array",
           "distributed")

#: The thread counts Snakemake sets for each job (its ``threads``); the server itself starts with 1.
THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
#: The temporary directory Snakemake sets for each job (its ``tmpdir`` resource).
TMP_VARS = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")
#: What the shell that runs a job's command sets (the command's path, the directory, the depth).
SHELL_VARS = ("_", "PWD", "OLDPWD", "SHLVL")
#: Environment variables in which a job may differ from the server and still be run by it.
MAY_DIFFER = frozenset(THREAD_VARS + TMP_VARS + SHELL_VARS)
#: ... and every variable with this prefix (sgdsweep's own, read when used, never at import).
OWN_PREFIX = "SGDSWEEP_"

#: Seconds the server waits for a client's whole request, and for its jobs to end once it stops.
REQUEST_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 10.0
#: The name of the socket in the server's directory.
SOCKET_NAME = "jobs.sock"
#: The longest request the server reads (bytes).
MAX_REQUEST = 1 << 20


@dataclasses.dataclass
class Job:
    """A job handed to the server: its arguments (the verb first), working directory,
    environment, umask and standard streams (descriptors received from the client)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    umask: int
    fds: list[int]
    #: the signals the client ignores (the job ignores them too)
    ignored: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def parse(cls, request: Any, fds: list[int]) -> Job:
        """The job of a decoded request; ValueError where a field is not of its type."""
        def strings(x: Any) -> bool:
            return isinstance(x, list) and all(isinstance(a, str) for a in x)

        ok = (isinstance(request, dict) and strings(request.get("argv")) and isinstance(request.get("cwd"), str)
              and isinstance(request.get("env"), dict) and strings(list(request["env"].values()))
              and isinstance(request.get("umask"), int) and 0 <= request["umask"] <= 0o777
              and isinstance(request.get("ignored", []), list)
              and all(isinstance(n, int) and 0 < n < signal.NSIG for n in request.get("ignored", [])))
        if not ok:
            raise ValueError("a request whose fields are not of their types")
        return cls(request["argv"], request["cwd"], request["env"], request["umask"], fds, request.get("ignored", []))


def differs(job_env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The variables in which a job's environment differs from the server's and may matter
    (not in :data:`MAY_DIFFER`, not sgdsweep's own), sorted."""
    names = set(job_env) | set(server_env)
    return sorted(n for n in names if job_env.get(n) != server_env.get(n)
                  and n not in MAY_DIFFER and not n.startswith(OWN_PREFIX))


# --- started by `sgdsweep run` ---------------------------------------------------------------------


def supported() -> bool:
    """Whether this platform has what the server needs: ``fork``, Unix sockets that pass
    descriptors, and the peer's credentials (Linux). Elsewhere every job runs by itself."""
    return all(hasattr(os, "fork") and hasattr(socket, name) for name in ("AF_UNIX", "SCM_RIGHTS", "SO_PEERCRED"))


def start_job_server(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen, Path]:
    """Start a job server for jobs with the environment ``env`` (that of Snakemake), logging to
    ``log_path``; return its process and the path of its socket, which exists once the server is
    ready (until then a job runs by itself). Stop it with :func:`stop_job_server`."""
    directory = Path(tempfile.mkdtemp(prefix="sgdsweep-jobs-"))  # short (a socket's path is), mode 0700
    path = directory / SOCKET_NAME
    from sgdsweep.run.locking import create_afresh

    server_env = {**env, **dict.fromkeys(THREAD_VARS, "1")}  # no BLAS threads in a process that forks
    with create_afresh(log_path, "w") as log_fh:  # a link there is removed, not followed
        proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "job-server", "--socket", str(path),
                                 "--owner", str(os.getpid())], env=server_env, stdin=subprocess.DEVNULL,
                                stdout=log_fh, stderr=log_fh, start_new_session=True)
    return proc, path


def stop_job_server(proc: subprocess.Popen, path: Path) -> None:
    """Stop the server started by :func:`start_job_server` (SIGTERM: it stops its jobs first; after
    :data:`STOP_TIMEOUT_S` more seconds SIGKILL to its process group) and remove its directory."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    shutil.rmtree(path.parent, ignore_errors=True)


# --- the server ------------------------------------------------------------------------------------


def serve(path: Path, owner: int) -> Job | None:
    """Import :data:`PRELOAD`, listen at ``path`` and fork a process for each job, until SIGTERM
    or until the process ``owner`` is gone. Returns None in the server once it has stopped, and
    the :class:`Job` in each forked child, which the caller runs (:func:`become`, then the
    command line's ``main``)."""
    stop = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the jobs through their clients
    t0 = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:
        log.warning("job server not started: importing the jobs' modules started a thread (%s)",
                    ", ".join(t.name for t in threading.enumerate()))
        return None
    server_env = dict(os.environ)
    me = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ready = path.with_name(path.name + ".new")
    listener.bind(str(ready))
    listener.listen(64)
    os.replace(ready, path)  # clients connect only to a server that listens
    log.info("job server ready in %.1f s at %s", time.monotonic() - t0, path)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}  # job pid (= its process group) -> its client's connection
    gc.freeze()  # what is imported stays out of the collections of the forked jobs (less memory copied)
    try:
        while not stop and os.getppid() == owner:
            for key, _ in selector.select(timeout=0.25):
                if key.fileobj is listener:
                    accepted = _accept(listener, selector, running, server_env)
                    if accepted is not None:  # the forked child
                        return _child(accepted, listener, selector, running)
                else:  # a client sends nothing after its request: readable = closed (killed): stop its job
                    selector.unregister(key.fileobj)
                    _signal_job(key.data, signal.SIGTERM)
            _reap(running, selector)
    finally:
        if os.getpid() == me:
            _stop_jobs(running, selector)
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()
            with contextlib.suppress(OSError):
                path.parent.rmdir()
    log.info("job server stopped")
    return None


def _accept(listener: socket.socket, selector: selectors.BaseSelector, running: dict[int, socket.socket],
            server_env: dict[str, str]) -> tuple[Job, socket.socket] | None:
    """Take one client's request; decline it, or fork its job. Returns (job, connection) in the
    forked child, None in the server."""
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        deadline = time.monotonic() + REQUEST_TIMEOUT_S  # for the whole request: a slow client stalls no other

        def wait() -> None:
            conn.settimeout(max(0.001, deadline - time.monotonic()))

        wait()
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * 4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4]))
        size = struct.unpack("!I", head)[0] if len(head) == 4 else 0
        if not 0 < size <= MAX_REQUEST:
            raise ValueError(f"a request of {size} bytes")
        body = bytearray()
        while len(body) < size:
            wait()
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("a request that is not whole")
            body += chunk
        job = Job.parse(json.loads(body), fds)
        why = ("a request without its three standard streams" if len(fds) != 3 else
               f"a client of another user (uid {uid})" if uid != os.getuid() else
               f"a verb it does not run ({job.argv[:1]})" if job.argv[:1] not in [[v] for v in SERVED] else
               None)
        if why is None:
            names = differs(job.env, server_env)
            why = f"an environment that differs in {', '.join(names)}" if names else None
        if why is not None:
            conn.sendall(DECLINE)
            raise ValueError(why)
    except Exception as exc:  # noqa: BLE001 - whatever a client sends, the server goes on
        log.info("declined %s", exc if isinstance(exc, ValueError) else f"a request ({type(exc).__name__}: {exc})")
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)  # its own process group: a signal reaches the processes it starts too
        return job, conn
    with contextlib.suppress(OSError):  # also here, so that the group exists before any signal to it
        os.setpgid(pid, pid)
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(PID + struct.pack("!i", pid))
    except OSError:  # the client is gone already
        _signal_job(pid, signal.SIGTERM)
    running[pid] = conn
    selector.register(conn, selectors.EVENT_READ, pid)
    log.info("job %d: %s", pid, " ".join(job.argv[:1]))
    return None


def _signal_job(pid: int, signum: int) -> None:
    """Send ``signum`` to the job ``pid`` and the processes it started (its process group)."""
    try:
        os.killpg(pid, signum)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _child(accepted: tuple[Job, socket.socket], listener: socket.socket, selector: selectors.BaseSelector,
           running: dict[int, socket.socket]) -> Job:
    """In the forked child: let go of the server's sockets and signal handlers; the job."""
    job, conn = accepted
    selector.close()
    listener.close()
    conn.close()
    for other in running.values():
        other.close()
    for signum in RELAYED:  # as in a process started by the client: ignored where it ignores them
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, signal.SIG_IGN if int(signum) in job.ignored else default)
    return job


def _reap(running: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """Send each ended job's end to its client and close the connection."""
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall((KILLED + struct.pack("!i", -code)) if code < 0 else (EXITED + struct.pack("!i", code)))
        conn.close()
        log.info("job %d ended: %s", pid, f"signal {-code}" if code < 0 else f"exit {code}")


def _stop_jobs(running: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """SIGTERM to every running job, then SIGKILL to those still running after :data:`STOP_TIMEOUT_S`."""
    for pid in list(running):
        _signal_job(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap(running, selector)
    for pid in list(running):
        _signal_job(pid, signal.SIGKILL)
    while running:
        time.sleep(0.05)
        _reap(running, selector)


# --- the forked child ------------------------------------------------------------------------------


def become(job: Job) -> None:
    """Make this forked process the job's: its standard streams, working directory, umask and
    environment (with the thread counts and temporary directory applied), and ``sys.argv``."""
    for target, fd in enumerate(job.fds):
        os.dup2(fd, target)
    for fd in job.fds:
        if fd > 2:
            os.close(fd)
    os.chdir(job.cwd)
    os.umask(job.umask)
    os.environ.clear()
    os.environ.update(job.env)
    tempfile.tempdir = None  # the job's TMPDIR, not the one the server saw
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = open(0, closefd=False, encoding=encoding)  # noqa: SIM115
    unbuffered = bool(job.env.get("PYTHONUNBUFFERED")) or sys.flags.unbuffered
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) or unbuffered else -1,  # noqa: SIM115
                                       closefd=False, encoding=encoding, errors=errors)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False, encoding=encoding,  # noqa: SIM115
                                       errors="backslashreplace")
    sys.argv = [sys.argv[0], *job.argv]
    _blas_threads(job.env)


def _blas_threads(env: dict[str, str]) -> None:
    """The BLAS threads the job's environment asks for (the server imported numpy with one)."""
    wanted = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS")
    try:
        threads = int(wanted) if wanted else os.cpu_count() or 1
    except ValueError:
        return
    if threads != 1:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")
