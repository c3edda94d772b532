"""A job of ``sgdsweep run`` started through the run's job server (:mod:`sgdsweep.run.jobserver`).

Snakemake starts each job as ``python -m sgdsweep VERB …``. Where ``sgdsweep run`` has named
its job server in :data:`JOB_SERVER_ENV` and the verb is one of :data:`SERVED`, that process
does not import the job's code: it hands its standard streams (the descriptors themselves), its
arguments, working directory, environment and umask to the server, which forks a process that
has everything imported, and that process runs the job in a process group of its own. This
process then relays the signals it gets (SIGTERM, SIGINT, SIGHUP, SIGQUIT; not those it ignores,
which the job then ignores too) to that group and ends as the job ends: with its exit status, or
killed by the same signal. Snakemake sees one job process as before.

This module imports nothing but the standard library's light modules: its whole point is to
start in milliseconds. Where there is no server to talk to, or the server declines (the job's
environment differs from the server's where it could matter), :func:`run_served` returns None
and the caller runs the job itself, as without a server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

#: The environment variable that names the run's job server's socket (set by ``sgdsweep run``).
JOB_SERVER_ENV = "SGDSWEEP_JOB_SERVER"

#: The verbs a job server runs: the workflow's jobs.
SERVED = ("simulate-shard", "aggregate", "fit", "report")

#: Replies of the server: the job's pid follows (``P`` + 4 bytes); the server declines (``R``);
#: the job exited (``X`` + 4 bytes, its exit status) or was killed (``K`` + 4 bytes, the signal).
PID, DECLINE, EXITED, KILLED = b"P", b"R", b"X", b"K"

#: The signals passed on to the job's process.
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def encode_request(argv: list[str]) -> bytes:
    """The request of a job with arguments ``argv`` (the verb first): a 4-byte length, then the
    JSON of the arguments, working directory, environment and umask."""
    umask = os.umask(0)
    os.umask(umask)
    ignored = [int(s) for s in RELAYED if signal.getsignal(s) == signal.SIG_IGN]  # the job ignores them too
    body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": umask,
                       "ignored": ignored}).encode()
    return struct.pack("!I", len(body)) + body


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def run_served(argv: list[str]) -> int | None:
    """Run the job ``argv`` (the verb first) in the run's job server and return its exit status,
    or None when it was not run there (no server named, none listening, a verb it does not
    run, a standard stream that is closed, or the server declined): run it here then."""
    path = os.environ.get(JOB_SERVER_ENV, "").strip()
    if not path or not argv or argv[0] not in SERVED:
        return None
    try:
        fds = [0, 1, 2]
        for fd in fds:
            os.fstat(fd)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
    except OSError:
        return None
    with conn:
        try:
            request = encode_request(argv)
            conn.sendmsg([request[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", *fds))])
            conn.sendall(request[4:])
            reply = _read_exactly(conn, 5)
        except OSError:
            return None
        if reply[:1] != PID:  # declined, or the server went away before it forked
            return None
        pid = struct.unpack("!i", reply[1:])[0]
        return _wait(conn, pid)


def _wait(conn: socket.socket, pid: int) -> int:
    """Relay signals to the job's process ``pid`` until the server sends its end; return its exit
    status, or end this process by the signal that ended the job."""

    def relay(signum: int, frame: object) -> None:
        try:
            os.killpg(pid, signum)  # the job and the processes it started (its own process group)
        except OSError:
            pass

    for signum in RELAYED:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, relay)
    reply = _read_exactly(conn, 5)
    if reply[:1] == EXITED:
        return struct.unpack("!i", reply[1:])[0]
    if reply[:1] == KILLED:
        signum = struct.unpack("!i", reply[1:])[0]
        sys.stdout.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(1)  # the signal ends this process here (a signal that does not: exit as the shell would)
        return 128 + signum
    # the server stopped without the job's end: wait for the job, its status unknown
    while _alive(pid):
        time.sleep(0.1)
    print(f"sgdsweep: error: the run's job server stopped while the job (pid {pid}) ran; its exit status is "
          "unknown (run the same command again: what the job stored is kept)", file=sys.stderr)
    return 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True

