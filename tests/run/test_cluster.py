"""The run's local Dask cluster (sgdsweep/run/cluster.py): its start and its deadlines, its
failures as a waiting job sees them, its owner gone, its workers' environment, and the probe of a
scheduler named by the user."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import dask
import pytest
from conftest import (
    REPO,
)

from sgdsweep.errors import SgdsweepError
from sgdsweep.run import cluster

# --- the run's local cluster: its start, its failures, its workers' environment -----------------

#: A stand-in for ``sgdsweep cluster-daemon``: a Dask scheduler that writes the scheduler file at
#: once and gets its workers (threads), one by one, each the seconds it is given after a client
#: connected or after the one before, as the real one compiles the kernels between the scheduler
#: and the workers; then it waits to be stopped.
FAKE_DAEMON = """
import sys, time
from distributed import LocalCluster
cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=None,
                       scheduler_kwargs={"scheduler_file": sys.argv[1]})
while len(cluster.scheduler.clients) < 2:  # the scheduler's own "fire-and-forget" client, and the job's
    time.sleep(0.01)
for n in range(1, int(sys.argv[3]) + 1):
    time.sleep(float(sys.argv[2]))
    cluster.scale(n)
time.sleep(120)
"""

#: The real ``sgdsweep cluster-daemon`` with a start deadline of 2 s for workers that never start
#: (their preload names no module).
DAEMON_WITHOUT_WORKERS = """
import sys
import sgdsweep.run.cluster as c
c.START_TIMEOUT_S = 2.0
c.WORKER_PRELOAD[:] = ["sgdsweep_no_such_module"]
c.serve(sys.argv[1], 1)
"""


def _fake_daemon(cluster_dir: Path, seconds: float, workers: int = 1) -> subprocess.Popen:
    """:data:`FAKE_DAEMON` in ``cluster_dir``, once its scheduler file names the scheduler."""
    scheduler_file = cluster_dir / cluster.SCHEDULER_FILE
    proc = subprocess.Popen([sys.executable, "-c", FAKE_DAEMON, str(scheduler_file), str(seconds), str(workers)],
                            start_new_session=True)
    while not (scheduler_file.exists() and "address" in scheduler_file.read_text()):
        assert proc.poll() is None, "the stand-in cluster process exited"
        time.sleep(0.05)
    return proc


def _start_environ(texts: dict[str, str]) -> list[dict[str, str]]:
    """Of each worker's ``/proc/self/environ`` (the environment its process started with, which
    glibc's malloc reads), the variables of :data:`cluster.WORKER_ENVIRON`."""
    environs = [dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv) for text in texts.values()]
    return [{k: env.get(k) for k in cluster.WORKER_ENVIRON} for env in environs]


#: Read in a worker (``client.run(START_ENVIRON.read_text)``): the environment its process started with.
START_ENVIRON = Path("/proc/self/environ")


#: The Dask settings of :data:`cluster.QUIET_DASK`, by a short name.
BOOKKEEPING = {"profile": "distributed.worker.profile.enabled",
               "system-monitor": "distributed.admin.system-monitor.interval",
               "tick": "distributed.admin.tick.interval"}


def _bookkeeping(client) -> tuple[dict, dict]:
    """The settings of :data:`BOOKKEEPING` in ``client``'s one worker and in its scheduler."""
    worker, scheduler = {}, {}
    for name, key in BOOKKEEPING.items():
        (worker[name],) = client.run(functools.partial(dask.config.get, key)).values()
        scheduler[name] = client.run_on_scheduler(functools.partial(dask.config.get, key))
    return worker, scheduler


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_compiling_the_kernels_is_not_under_the_start_deadline(tmp_path, monkeypatch, caplog):
    """A cluster whose workers come 8× the start deadline after the job connected to its
    scheduler (the kernels compile between the two) is waited for, with progress lines."""
    monkeypatch.setattr(cluster, "START_TIMEOUT_S", 0.25)
    monkeypatch.setattr(cluster, "PROGRESS_EVERY_S", 0.5)
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    proc = _fake_daemon(tmp_path, 2.0)
    try:
        with caplog.at_level("INFO", logger="sgdsweep.run.cluster"), cluster.dask_client({}) as client:
            assert len(client.scheduler_info()["workers"]) == 1
    finally:
        proc.kill()
        proc.wait()
    assert "waiting for the local Dask cluster: compiling or loading the simulation kernels" in caplog.text


def test_a_job_waits_for_all_the_workers_of_the_runs_cluster(tmp_path, monkeypatch):
    """A job of a cluster of two workers (as ``sgdsweep run`` says in the environment) starts
    once both run, not with the first (a GPU worker may be the second)."""
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    monkeypatch.setenv(cluster.CLUSTER_WORKERS_ENV, "2")
    proc = _fake_daemon(tmp_path, 1.0, workers=2)
    try:
        with cluster.dask_client({}) as client:
            assert len(client.scheduler_info()["workers"]) == 2
    finally:
        proc.kill()
        proc.wait()


def test_a_malformed_worker_count_of_the_runs_cluster_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    monkeypatch.setenv(cluster.CLUSTER_WORKERS_ENV, "two")
    with pytest.raises(SgdsweepError, match=f"{cluster.CLUSTER_WORKERS_ENV}='two': expected a positive integer"), \
            cluster.dask_client({}):
        pass


def test_a_scheduler_that_does_not_start_within_the_deadline_fails_the_job(tmp_path, monkeypatch):
    """A cluster process that never writes its scheduler file: the waiting job fails within the
    start deadline, saying so; the process is its owner's to stop, not the job's."""
    monkeypatch.setattr(cluster, "START_TIMEOUT_S", 0.5)
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        with pytest.raises(SgdsweepError, match="its Dask scheduler did not start within 0.5 s"), \
                cluster.dask_client({}):
            pass
        assert proc.poll() is None
        cluster.stop_run_cluster(proc, tmp_path)
        assert proc.returncode is not None
    finally:
        proc.kill()
        proc.wait()


def test_workers_past_their_start_deadline_fail_the_waiting_job_with_the_clusters_error(tmp_path, monkeypatch):
    """The real cluster process, whose workers cannot start: it gives up after its start
    deadline, and the job connected to its scheduler fails with that error, not waiting for ever."""
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    with open(tmp_path / cluster.DAEMON_LOG, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", DAEMON_WITHOUT_WORKERS, str(tmp_path)], stdout=log,
                                stderr=log, start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        with pytest.raises(SgdsweepError, match="failed to start: WorkerStartTimeoutError"), cluster.dask_client({}):
            pass
    finally:
        cluster.stop_run_cluster(proc, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [cluster.DAEMON_LOG]


def test_a_cluster_that_fails_to_start_reports_its_own_error(tmp_path, monkeypatch):
    """Binding to an address that is not this machine's fails in the real cluster process; the
    message carries Dask's own reason, not only the path of a log."""
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    proc = cluster.start_run_cluster(tmp_path, 1, host="192.0.2.1")
    try:
        with pytest.raises(SgdsweepError) as info, cluster.dask_client({}):
            pass
    finally:
        cluster.stop_run_cluster(proc, tmp_path)
    text = str(info.value)
    assert "failed to start: RuntimeError: Cluster failed to start" in text
    assert "Cannot assign requested address" in text and "daemon.log" in text


def test_a_shard_job_connects_through_the_scheduler_file_and_the_owner_stops_the_cluster(tmp_path, monkeypatch):
    """The real cluster process: the job connects with Dask's scheduler file, its workers start
    with sgdsweep's malloc settings (Dask's pre-spawn environment), and stopping it removes its
    files and its worker processes. Scheduler and workers keep Dask's bookkeeping quiet
    (``cluster.QUIET_DASK``), but for what the user's own Dask config sets through Dask's
    environment variables: here the event-loop check's interval, and the profiler switched on,
    which is Dask's default."""
    monkeypatch.setenv("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "500ms")
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
    proc = cluster.start_run_cluster(tmp_path, 1)
    try:
        monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
        monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
        with cluster.dask_client({}) as client:
            seen = client.run(START_ENVIRON.read_text)
            (worker_pid,) = client.run(os.getpid).values()
            worker_config, scheduler_config = _bookkeeping(client)
        assert _start_environ(seen) == [cluster.WORKER_ENVIRON]
        quiet = {"profile": True, "system-monitor": "2s", "tick": "500ms"}
        assert worker_config == quiet
        assert scheduler_config == quiet
        address = json.loads((tmp_path / cluster.SCHEDULER_FILE).read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
    finally:
        cluster.stop_run_cluster(proc, tmp_path)
    assert proc.returncode is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [cluster.DAEMON_LOG]
    deadline = time.monotonic() + 30
    while _running(worker_pid):
        assert time.monotonic() < deadline, "a worker outlived its cluster"
        time.sleep(0.1)


def test_quiet_dask_leaves_what_the_user_or_a_program_set(monkeypatch):
    """``quiet_dask`` sets a key of ``QUIET_DASK`` only where it holds Dask's default and the
    user's Dask config does not name it, even with Dask's default value."""
    defaults = dask.config.merge(*dask.config.defaults)
    with dask.config.set({key: dask.config.get(key, config=defaults) for key in cluster.QUIET_DASK}):
        for name in ("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL",
                     "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL"):
            monkeypatch.delenv(name, raising=False)
        assert cluster.quiet_dask() == cluster.QUIET_DASK
        assert {key: dask.config.get(key) for key in cluster.QUIET_DASK} == cluster.QUIET_DASK
    with dask.config.set({key: dask.config.get(key, config=defaults) for key in cluster.QUIET_DASK}):
        monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")  # the user's, = Dask's default
        dask.config.set({"distributed.admin.tick.interval": "300ms"})  # a program's
        assert cluster.quiet_dask() == {"distributed.admin.system-monitor.interval": "2s"}
        assert dask.config.get("distributed.worker.profile.enabled") is True
        assert dask.config.get("distributed.admin.tick.interval") == "300ms"


def test_a_cluster_process_whose_owner_is_gone_stops_and_says_so(tmp_path, monkeypatch):
    """``sgdsweep run`` killed (here: the process that started the cluster process exits at
    once): the cluster process stops by itself, and a job that waits for it fails at once,
    saying why."""
    starter = ("import sys, time; from pathlib import Path; from sgdsweep.run import cluster; "
               "p = cluster.start_run_cluster(Path(sys.argv[1]), 1); print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", starter, str(tmp_path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    daemon = int(out.stdout.split()[0])
    deadline = time.monotonic() + 300
    while _running(daemon):
        assert time.monotonic() < deadline, "the cluster process outlived the process that started it"
        time.sleep(0.1)
    assert not (tmp_path / cluster.SCHEDULER_FILE).exists()
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
    with pytest.raises(SgdsweepError, match=r"failed to start: sgdsweep run \(pid \d+\), which started it, is gone"), \
            cluster.dask_client({}):
        pass


def _unset(monkeypatch: pytest.MonkeyPatch, names: list[str]) -> None:
    """Remove ``names`` from this process's environment for the test (and put back what was)."""
    for name in names:
        monkeypatch.setenv(name, os.environ.get(name, ""))
        monkeypatch.delenv(name)


def test_a_jobs_own_cluster_starts_its_workers_with_the_malloc_settings(monkeypatch):
    """Without a run's cluster (plain snakemake) the job's own LocalCluster starts its workers
    with the same environment; Dask's default would be MALLOC_TRIM_THRESHOLD_=65536 and no mmap
    threshold."""
    _unset(monkeypatch, [cluster.SCHEDULER_FILE_ENV, cluster.SCHEDULER_ENV, *cluster.WORKER_ENVIRON])
    with cluster.dask_client({"workers": 1}) as client:
        seen = client.run(START_ENVIRON.read_text)
    assert _start_environ(seen) == [cluster.WORKER_ENVIRON]


def test_a_cluster_started_after_one_with_dasks_defaults_keeps_the_malloc_settings(monkeypatch):
    """A Nanny copies its settings into this process's environment, and later Nannies read that
    first: after a cluster with Dask's defaults in the same process, ours must still win."""
    _unset(monkeypatch, [cluster.SCHEDULER_FILE_ENV, cluster.SCHEDULER_ENV, *cluster.WORKER_ENVIRON])
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # what Dask's default Nanny leaves behind
    with cluster.dask_client({"workers": 1}) as client:
        seen = client.run(START_ENVIRON.read_text)
    assert _start_environ(seen) == [cluster.WORKER_ENVIRON]


# --- a scheduler named by the user that is not Dask ------------------------------------------


class _Silent(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.mark.timeout(180)
def test_a_scheduler_address_that_is_not_dask_fails_within_the_probe_deadline(tmp_path, monkeypatch):
    """A web server accepts the connection and never answers Dask's handshake: the job must fail,
    naming the address, not wait for ever."""
    server = HTTPServer(("127.0.0.1", 0), _Silent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"tcp://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv(cluster.SCHEDULER_ENV, address)
    monkeypatch.setattr(cluster, "PROBE_TIMEOUT_S", 3.0)
    try:
        with pytest.raises(SgdsweepError, match=re.escape(address)), cluster.dask_client({}):
            pass
    finally:
        server.shutdown()


def test_the_probe_accepts_a_real_scheduler():
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as local:
        cluster.probe_scheduler(local.scheduler_address, timeout_s=30)
