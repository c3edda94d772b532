"""The run's job server (sgdsweep/run/jobserver.py, jobclient.py): a served job behaves as the
same command run by itself (output, exit status, working directory, relative paths), a job whose
environment differs where it may matter runs by itself, a malformed or silent request stalls
nothing, signals reach the job's process group, and a client, a job or the server killed leaves
no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from sgdsweep.run.jobclient import JOB_SERVER_ENV
from sgdsweep.run.jobserver import differs, start_job_server, stop_job_server


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (JOB_SERVER_ENV, "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A job server started as ``sgdsweep run`` starts it; (its socket, its log)."""
    log = tmp_path_factory.mktemp("server") / "job-server.log"
    proc, path = start_job_server(_env(), log)
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield path, log
    stop_job_server(proc, path)
    assert proc.returncode == 0, log.read_text()
    assert not path.parent.exists()


def _job(args: list[str], cwd: Path, served: Path | None, ignore_sigint: bool = False,
         **extra: str) -> subprocess.Popen:
    env = _env(**extra)
    if served is not None:
        env[JOB_SERVER_ENV] = str(served)
    cmd = [sys.executable, "-m", "sgdsweep", *args]
    if ignore_sigint:  # as `cmd &` from a script starts it: SIGINT ignored, kept across exec
        cmd = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *cmd]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _served_pids(log: Path, verb: str) -> list[int]:
    return [int(p) for p in re.findall(rf"job (\d+): {verb}\b", log.read_text())]


def _wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_served_job_has_the_output_status_and_directory_it_has_alone(server, tmp_path):
    """The same commands, served and by themselves: equal stdout, stderr and exit status; a
    relative path is read in the client's working directory; the server ran the served ones."""
    path, log = server
    (tmp_path / "bad.json").write_text("{not json")
    cases = [["report", "--help"],  # exit 0, stdout
             ["fit", "missing.zarr", "--spec", "bad.json", "--out", "f.json"],  # a usage error (exit 2)
             ["aggregate", "bad.json", "--out", "e.zarr", "--receipt", "r.json"]]
    for args in cases:
        before = len(_served_pids(log, args[0]))
        alone = _job(args, tmp_path, None)
        served = _job(args, tmp_path, path)
        out_a, err_a = alone.communicate(timeout=120)
        out_s, err_s = served.communicate(timeout=120)
        assert (served.returncode, out_s, err_s) == (alone.returncode, out_a, err_a), args
        assert len(_served_pids(log, args[0])) == before + 1, log.read_text()
    assert alone.returncode == 2 and "bad.json is not valid JSON" in err_a
    assert not (tmp_path / "e.zarr").exists()


def test_a_job_whose_environment_differs_where_it_may_matter_runs_by_itself(server, tmp_path):
    """A variable an import may read (here DASK_… for dask.config) set otherwise than in the
    server: declined and run by the client itself, with the same result; Snakemake's thread counts,
    the shell's variables and sgdsweep's own may differ."""
    path, log = server
    before = len(_served_pids(log, "report"))
    proc = _job(["report", "--help"], tmp_path, path, DASK_DISTRIBUTED__WORKER__DAEMON="False")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "usage:" in out
    assert len(_served_pids(log, "report")) == before
    assert "declined an environment that differs in DASK_DISTRIBUTED__WORKER__DAEMON" in log.read_text()
    assert differs({"OMP_NUM_THREADS": "2", "_": "/bin/python", "SGDSWEEP_PROGRESS": "bar", "A": "1"},
                   {"OMP_NUM_THREADS": "1", "A": "1"}) == []
    assert differs({"A": "1"}, {"A": "2", "B": ""}) == ["A", "B"]


def test_a_malformed_or_silent_request_is_declined_and_the_server_goes_on(server, tmp_path):
    """Requests with fields of the wrong types, JSON nested past Python's recursion limit, a length
    beyond the limit, and a client that connects and says nothing: each declined within the
    request's deadline, and the next job is served."""
    import json
    import socket
    import struct

    path, log = server

    def send(body: bytes, length: int | None = None) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            conn.sendmsg([struct.pack("!I", len(body) if length is None else length)],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
            try:
                conn.sendall(body)
                conn.settimeout(30)
                return conn.recv(5)
            except (BrokenPipeError, ConnectionResetError):  # closed by the server before reading it all
                return b""

    good = {"argv": ["report", "--help"], "cwd": str(tmp_path), "env": _env(), "umask": 0o22}
    for bad in ({**good, "umask": 1e400}, {**good, "argv": "report"}, {**good, "env": {"A": 1}}):
        assert send(json.dumps(bad).encode()) in (b"", b"R")
    assert send(b"[" * 100_000 + b"]" * 100_000) in (b"", b"R")
    assert send(b"{}", length=0xFFFFFFFF) in (b"", b"R")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(path))
        t0 = time.monotonic()
        before = len(_served_pids(log, "report"))
        proc = _job(["report", "--help"], tmp_path, path)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "usage:" in out
        assert time.monotonic() - t0 < 20  # the silent client held it up for its deadline at most
    assert len(_served_pids(log, "report")) == before + 1, log.read_text()


@pytest.mark.parametrize("how", ["relayed", "client killed", "server stopped", "ignored"])
def test_a_served_job_ends_with_its_client_and_its_server(tmp_path, how):
    """A job blocked reading a FIFO, in a process group of its own: SIGTERM to its client reaches
    it (the client ends by the same signal); a client killed with SIGKILL has its job stopped; a
    server stopped stops its jobs first and removes its socket; a SIGINT the client ignores, the
    job ignores too. No job process is left."""
    log = tmp_path / "job-server.log"
    proc, path = start_job_server(_env(), log)
    try:
        _wait_for(path.exists, "the server's socket", timeout=120)
        fifo = tmp_path / "spec.json"
        os.mkfifo(fifo)
        client = _job(["aggregate", str(fifo), "--out", "e.zarr", "--receipt", "r.json"], tmp_path, path,
                      ignore_sigint=how == "ignored")
        _wait_for(lambda: _served_pids(log, "aggregate"), "the served job")
        job = _served_pids(log, "aggregate")[0]
        time.sleep(0.5)
        assert client.poll() is None and not _gone(job)  # blocked in the FIFO
        assert os.getpgid(job) == job
        if how == "ignored":
            client.send_signal(signal.SIGINT)
            time.sleep(1)
            assert client.poll() is None and not _gone(job)
            how = "relayed"
        if how == "relayed":
            client.send_signal(signal.SIGTERM)
            client.wait(timeout=30)
            assert client.returncode == -signal.SIGTERM
        elif how == "client killed":
            client.kill()
            client.wait(timeout=30)
        else:
            stop_job_server(proc, path)
            client.wait(timeout=30)
            assert client.returncode == -signal.SIGTERM
            assert not path.parent.exists()
        _wait_for(lambda: _gone(job), "the job's end", timeout=30)
        assert re.search(rf"job {job} ended: signal {int(signal.SIGTERM)}", log.read_text()), log.read_text()
    finally:
        stop_job_server(proc, path)
