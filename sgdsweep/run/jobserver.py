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
- **Ends.** A client that is gone (killed) has its job's process stopped (SIGTERM); the server
  stopped (SIGTERM, or ``sgdsweep run`` gone) stops the jobs it runs first. A client relays
  the signals it gets to its job.
- **Who may connect.** The socket lies in a directory only its user can enter, and the server
  runs only a client of its own user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
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

from sgdsweep.run.jobclient import DECLINE, EXITED, KILLED, PID, SERVED

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

#: Seconds the server waits for a client's request, and for its jobs to end once it stops.
REQUEST_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
#: The name of the socket in the server's directory.
SOCKET_NAME = "jobs.sock"


@dataclasses.dataclass
class Job:
    """A job handed to the server: its arguments (the verb first), working directory,
    environment, umask and standard streams (descriptors received from the client)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    umask: int
    fds: list[int]


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
    running: dict[int, socket.socket] = {}  # job pid -> its client's connection
    try:
        while not stop and os.getppid() == owner:
            for key, _ in selector.select(timeout=0.25):
                if key.fileobj is listener:
                    job = _accept(listener, selector, running, server_env)
                    if job is not None:  # the forked child
                        return _child(job, listener, selector, running)
                else:  # a client closed its end (killed): stop its job
                    selector.unregister(key.fileobj)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(key.data, signal.SIGTERM)
            _reap(running, selector)
        _stop_jobs(running, selector)
    finally:
        if os.getpid() == me:
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()
    log.info("job server stopped")
    return None


def _accept(listener: socket.socket, selector: selectors.BaseSelector, running: dict[int, socket.socket],
            server_env: dict[str, str]) -> tuple[Job, socket.socket] | None:
    """Take one client's request; decline it, or fork its job. Returns (job, connection) in the
    forked child, None in the server."""
    import json

    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(REQUEST_TIMEOUT_S)
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * 4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4]))
        body = b""
        size = struct.unpack("!I", head)[0] if len(head) == 4 else 0
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                break
            body += chunk
        request = json.loads(body) if size and len(body) == size else None
        job = None if request is None else Job(list(request["argv"]), str(request["cwd"]),
                                                dict(request["env"]), int(request["umask"]), fds)
        why = ("a request that is not whole" if job is None or len(fds) != 3 else
               f"a client of another user (uid {uid})" if uid != os.getuid() else
               f"a verb it does not run ({job.argv[:1]})" if job.argv[:1] not in [[v] for v in SERVED] else
               None)
        if why is None:
            names = differs(job.env, server_env)
            why = f"an environment that differs in {', '.join(names)}" if names else None
        if why is not None:
            log.info("declined %s", why)
            conn.sendall(DECLINE)
            raise _Declined
    except (OSError, ValueError, KeyError, TypeError, _Declined):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        return job, conn
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(PID + struct.pack("!i", pid))
    except OSError:  # the client is gone already
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    running[pid] = conn
    selector.register(conn, selectors.EVENT_READ, pid)
    log.info("job %d: %s", pid, " ".join(job.argv[:1]))
    return None


class _Declined(Exception):
    """A request the server does not run (its reason is logged)."""


def _child(accepted: tuple[Job, socket.socket], listener: socket.socket, selector: selectors.BaseSelector,
           running: dict[int, socket.socket]) -> Job:
    """In the forked child: let go of the server's sockets and signal handlers; the job."""
    job, conn = accepted
    selector.close()
    listener.close()
    conn.close()
    for other in running.values():
        other.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        _reap(running, selector)
    for pid in list(running):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
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
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False,  # noqa: SIM115
                                       encoding=encoding, errors=errors)
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
