"""What a new user meets first: the cluster's start on a cold cache and a busy machine, progress in
the terminal, the closing summary, the command line's conventions, and a second run refused
before it starts anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import (
    REPO,
    cli,
    cluster_daemons,
    immutable,
    run_cli,
    run_snakemake,
    tiny_config,
    write_yaml,
)

from sgdsweep.errors import SgdsweepError
from sgdsweep.run import cluster, progress
from sgdsweep.run.cli import EXIT_CODES, build_parser

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
    files and its worker processes."""
    proc = cluster.start_run_cluster(tmp_path, 1)
    try:
        monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
        monkeypatch.setenv(cluster.SCHEDULER_FILE_ENV, str(tmp_path / cluster.SCHEDULER_FILE))
        with cluster.dask_client({}) as client:
            seen = client.run(START_ENVIRON.read_text)
            (worker_pid,) = client.run(os.getpid).values()
        assert _start_environ(seen) == [cluster.WORKER_ENVIRON]
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


# --- progress ----------------------------------------------------------------------------------


def test_progress_without_a_terminal_is_plain_lines_with_a_heartbeat(monkeypatch, caplog):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    with caplog.at_level("INFO", logger="sgdsweep.run.execute"):
        p = progress.ShardProgress("0123456789abcdef", points=4, cached=1, total_steps=300)
        assert not p.bar
        p.advance(1, 100)
        p.tick()  # no task finished: still a line
        p.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("2/4 points done (1 stored before)" in line for line in lines)
    assert "100/300 replica-steps (33%)" in lines[0]


def test_progress_says_nothing_of_a_rate_before_one_is_measurable(monkeypatch, caplog):
    """Before any replica-step is done there is no rate: no 'nan replica-steps/s', no '? left'."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="sgdsweep.run.execute"):
        p = progress.ShardProgress("0123456789abcdef", points=4, cached=0, total_steps=4000)
        p.tick()
        p.running(1000.0)  # the running tasks reported a quarter of their steps
        p.tick()
    first, second = (r.getMessage() for r in caplog.records)
    assert re.fullmatch(r"shard 0123456789abcdef: 0/4 points done \(0 stored before\) \| 0/4k replica-steps "
                        r"\(0%\) \| \d+:\d\d:\d\d elapsed", first), first
    assert "1k/4k replica-steps (25%)" in second and "replica-steps/s" in second and " left" in second
    for text in (first, second, p.bar_text()):
        assert "nan" not in text and "?" not in text


def test_progress_counts_print_four_significant_digits():
    assert [progress.count(x) for x in (0, 999, 96000, 1234567, 2.5e9)] == ["0", "999", "96k", "1.235M", "2.5G"]


def test_a_job_with_nothing_to_say_still_says_it_runs(caplog):
    with caplog.at_level("INFO", logger="sgdsweep"), progress.heartbeat("report: drawing", every=0.05):
        time.sleep(0.3)
    beats = [r.getMessage() for r in caplog.records]
    assert len(beats) >= 2 and all(re.fullmatch(r"report: drawing: still running \(\d+ s\)", b) for b in beats)


def _progress_on_a_terminal(env: dict[str, str]) -> bytes:
    """What two shards' progress writes to a terminal (a pty 120 columns wide) in one process."""
    import pty

    parent, child = pty.openpty()
    os.set_blocking(parent, False)
    code = ("from sgdsweep.run.cli import _setup_logging\n"
            "from sgdsweep.run.progress import ShardProgress\n"
            "_setup_logging(None)\n"
            "a = ShardProgress('0123456789abcdef', 4, 0, 400)\n"
            "b = ShardProgress('fedcba9876543210', 2, 0, 200)\n"
            "a.advance(2, 200); b.advance(2, 200); a.advance(2, 200); a.close(); b.close()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120", **env}
    subprocess.run(["stty", "cols", "120", "rows", "0"], stdin=child, check=True)  # rows unknown, as under `script`
    proc = subprocess.run([sys.executable, "-c", code], stderr=child, env=env, timeout=120, check=False)
    os.close(child)
    out = b""
    try:
        while chunk := os.read(parent, 65536):
            out += chunk
    except (BlockingIOError, OSError):
        pass
    os.close(parent)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out


def test_progress_on_a_terminal_is_a_bar():
    out = _progress_on_a_terminal({progress.PROGRESS_ENV: "bar"})
    assert b"\r" in out and b"4/4 points" in out and b"100%" in out
    assert b"\x1b[" not in out  # no escape sequences, colour or cursor


def test_two_shards_on_one_terminal_write_lines_that_name_them():
    """When ``sgdsweep run`` may run two shard jobs at once it asks for plain lines: no carriage
    return rewrites one shard's line over the other's, and each line names its shard."""
    out = _progress_on_a_terminal({progress.PROGRESS_ENV: "lines"}).decode()
    assert "\r" not in out.replace("\r\n", "\n")  # the pty turns \n into \r\n
    lines = [line for line in out.splitlines() if "points done" in line]
    assert [line.split("shard ")[1][:16] for line in lines] == ["0123456789abcdef", "fedcba9876543210",
                                                               "0123456789abcdef"], lines


# --- the command line's conventions ------------------------------------------------------------

USER_VERBS = ("run", "validate", "plan", "export", "verify", "import", "merge")
WORKFLOW_VERBS = ("simulate-shard", "aggregate", "fit", "report", "cluster-daemon")


def test_version_and_top_level_help():
    """Through the real entry points: ``python -m sgdsweep --version``, and the ``sgdsweep``
    console script refusing a missing config (exit 2, the message, no traceback)."""
    version = run_cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"sgdsweep \S+\n", version.stdout)
    script = Path(sys.executable).with_name("sgdsweep")
    if script.exists():  # an installed environment (the venv), not only a source tree
        refused = subprocess.run([str(script), "validate", "no-such.yaml"], capture_output=True, text=True,
                                 timeout=120, check=False)
        assert refused.returncode == 2 and "'no-such.yaml'; allowed: an existing YAML file" in refused.stderr, \
            refused.stderr
        assert "Traceback" not in refused.stderr
    text = build_parser().format_help()
    for verb in USER_VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", text, re.MULTILINE), verb
    for verb in WORKFLOW_VERBS:  # the workflow's own verbs are not offered to users
        assert not re.search(rf"^\s+{verb}\b", text, re.MULTILINE), verb
    assert "``" not in text  # no raw markup
    for code, meaning in EXIT_CODES.items():
        assert f"  {code}  {meaning}" in text


def _arguments_without_help(help_text: str) -> list[str]:
    """The argument lines of an argparse help text that have no description: a line indented by
    two spaces with nothing after its name and no continuation line below it."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        if re.match(r"^  \S", line) and not re.search(r"\S {2,}\S", line.strip()):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"^ {6,}\S", following):
                bare.append(line.strip())
    return bare


def test_the_help_check_finds_an_argument_without_help():
    import argparse

    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("config")
    parser.add_argument("--out", help="where")
    assert _arguments_without_help(parser.format_help()) == ["config"]


@pytest.mark.parametrize("verb", USER_VERBS + WORKFLOW_VERBS)
def test_every_argument_has_help(verb):
    out = cli(verb, "--help")
    assert out.returncode == 0
    assert _arguments_without_help(out.stdout) == []


# --- whole runs ----------------------------------------------------------------------------------

SLOW = {"grid": {"lr": [0.2, 0.25, 0.3, 0.35], "batch_size": [2, 4]},
        "dynamics": {"steps": 60000, "replicas": 8}, "execution": {"workers": 1, "points_per_task": 1}}


@pytest.mark.workflow
def test_a_second_run_is_refused_before_it_starts_a_cluster(tmp_path):
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGDSWEEP_SCHEDULER_FILE", None)
    first = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(cfg), "--cores", "2"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = sweep / ".cluster" / "scheduler.json"
    deadline = time.monotonic() + 300
    while not (state.exists() and "address" in state.read_text()):
        assert time.monotonic() < deadline and first.poll() is None, "the first run's cluster did not start"
        time.sleep(0.1)
    before = json.loads(state.read_text())
    second = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert second.returncode == 3, second.stderr[-2000:]
    assert "another sgdsweep workflow is running" in second.stderr
    assert "starting a local Dask cluster" not in second.stderr
    assert json.loads(state.read_text()) == before  # the first run's cluster is untouched
    assert cluster_daemons(tmp_path) == 1
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    assert cluster_daemons(tmp_path) == 0


def _busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep a core busy for at most 15 minutes."""
    loop = "import time\nend = time.time() + 900\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


@pytest.mark.workflow
@pytest.mark.slow
def test_default_sweep_from_a_cold_numba_cache_on_a_saturated_machine(tmp_path):
    """The README's first command on a machine whose cores are all busy, with nothing compiled:
    it succeeds, says what it is doing first, and ends with the summary."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    path = write_yaml(tmp_path / "default.yaml", cfg)
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    busy = _busy_loops(os.cpu_count() or 2)
    try:
        t0 = time.monotonic()
        out = run_cli("run", str(path), "--cores", "2", cwd=tmp_path, env={"NUMBA_CACHE_DIR": str(cache)},
                      timeout=1500, cluster="own")
        seconds = time.monotonic() - t0
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert any(cache.rglob("*.nbi")), "the kernels were not compiled into the empty cache"
    first = text.splitlines()[:3]
    assert any("16 to simulate" in line for line in first), first
    assert any("compiles the simulation kernels" in line for line in first), first
    assert "sgdsweep: sweep 'default' finished" in text
    assert "points: 16 of 16 stored, 16 simulated in this run" in text
    assert re.search(r"\[ok\] Power law .*: a = \S+ \[\S+, \S+\]; exact theory \S+ \(inside\)", text)
    assert "[not run] Momentum scaling" in text
    assert f"report: {tmp_path / 'results' / 'default' / 'report.html'}" in text
    print(f"cold, saturated first run: {seconds:.0f} s")


#: Snakemake's banner, job tables and per-job messages: not shown by `sgdsweep run` without -v.
SNAKEMAKE_CHATTER = ("SNAKEMAKE", "Building DAG of jobs", "Using shell:", "Provided cores", "Job stats:",
                     "Select jobs to execute", "localrule", "Finished jobid", "steps (100%) done", "Complete log(s)")


@pytest.mark.workflow
def test_quiet_run_prints_the_summary_only(tmp_path):
    """A run shows sgdsweep's own lines, not Snakemake's banner; -q only the summary; -v Snakemake's
    output too."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    first = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    text = first.stdout + first.stderr
    assert "sweep 'tiny': 4 points, 0 stored, 4 to simulate" in text and "points: 4 of 4 stored" in text
    for chatter in SNAKEMAKE_CHATTER:
        assert chatter not in text, chatter
    (tmp_path / "results" / "tiny" / "report.html").unlink()  # one job to run, quietly
    quiet = run_cli("run", str(cfg), "--cores", "2", "-q", cwd=tmp_path)
    assert quiet.returncode == 0
    text = quiet.stdout + quiet.stderr
    assert text.startswith("sgdsweep: sweep 'tiny' finished"), text[:3000]  # nothing before the summary
    assert "points: 4 of 4 stored, 0 simulated" in text and "report written to" not in text
    verbose = run_cli("run", str(cfg), "--cores", "2", "-v", cwd=tmp_path)
    assert verbose.returncode == 0
    assert "Building DAG of jobs" in verbose.stderr and "Nothing to be done" in verbose.stderr


def test_an_unwritable_working_directory_is_named(tmp_path):
    """Snakemake keeps its state in the working directory: one that refuses writes (immutable;
    tests run as root, where permission bits do not stop writes) is named before Snakemake
    starts, with the fix, and no traceback."""
    workdir = tmp_path / "wd"
    workdir.mkdir()
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(results_dir=str(tmp_path / "results")))
    with immutable(workdir):
        proc = cli("run", str(cfg), "--cores", "2", cwd=workdir)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-2000:]
    assert f"the working directory, where Snakemake keeps its state (.snakemake), {workdir} is not writable" in text
    assert "run sgdsweep from a writable directory" in text and "Traceback" not in text
    assert os.listdir(workdir) == [] and not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_a_killed_front_end_is_named_and_a_killed_snakemake_is_reported(tmp_path):
    """kill -9 of ``sgdsweep run`` leaves its Snakemake going (it holds the sweep): the next run's
    refusal names that process and how to stop it. kill -9 of Snakemake makes ``sgdsweep run``
    say so and exit 1, and the next run resumes."""
    import shutil
    import signal

    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    state = tmp_path / "results" / "slow" / ".cluster" / "scheduler.json"
    lock = tmp_path / "results" / "slow" / ".sgdsweep.lock"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGDSWEEP_SCHEDULER_FILE", None)

    def start() -> subprocess.Popen:
        shutil.rmtree(tmp_path / "results" / "slow" / "points", ignore_errors=True)  # work to do
        log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - a file, not a pipe: Snakemake outlives the front end
        proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(cfg), "--cores", "2"],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        log.close()
        deadline = time.monotonic() + 300
        while not (state.exists() and "address" in state.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the run's cluster did not start"
            time.sleep(0.1)
        return proc

    front = start()
    snakemake = json.loads(lock.read_text())["snakemake_pid"]
    front.kill()
    front.wait()
    refused = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert refused.returncode == 3
    assert f"its Snakemake process (pid {snakemake}" in refused.stderr and f"kill {snakemake}" in refused.stderr
    os.kill(snakemake, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while cluster_daemons(tmp_path):  # the cluster stops by itself once its owner is gone
        assert time.monotonic() < deadline, "the cluster daemon outlived the sgdsweep run that owned it"
        time.sleep(0.2)

    second = start()
    os.kill(json.loads(lock.read_text())["snakemake_pid"], signal.SIGKILL)
    second.wait(timeout=300)
    out = (tmp_path / "run.log").read_text()
    assert second.returncode == 1, out[-2000:]
    assert "sgdsweep: error: Snakemake was killed by signal 9; run the same command again to resume" in out
    deadline = time.monotonic() + 120
    assert cluster_daemons(tmp_path) == 0  # sgdsweep run stopped its cluster before it exited
    resumed = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "points: 8 of 8 stored" in resumed.stderr


@pytest.mark.workflow
def test_ctrl_c_stops_the_run_and_its_cluster_and_the_next_run_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's foreground process group) stops Snakemake and its jobs;
    ``sgdsweep run`` stops the cluster it owns, says how to resume, and the same command resumes
    without any manual unlock."""
    import signal

    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGDSWEEP_SCHEDULER_FILE", None)
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(cfg), "--cores", "2"], cwd=tmp_path,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while not any((sweep / "points").glob("*.npz")):
        assert time.monotonic() < deadline and proc.poll() is None, "no point was stored"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=300)
    out = (tmp_path / "run.log").read_text()
    assert proc.returncode == 130, out[-3000:]
    # one line says it: not the jobs too, and none of Snakemake's errors about the jobs it cancelled
    assert out.count("interrupted") == 1, out[-3000:]
    assert out.rstrip().endswith("sgdsweep: interrupted (run the same command again to resume)"), out[-3000:]
    for fallout in ("Traceback", "RuleException", "WorkflowError", "Error in rule", "Terminating processes"):
        assert fallout not in out, out[-3000:]
    assert cluster_daemons(tmp_path) == 0
    assert sorted(p.name for p in (sweep / ".cluster").iterdir()) == ["daemon.log"]  # its log only
    stored = len(list((sweep / "points").glob("*.npz")))
    resumed = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"points: 8 of 8 stored, {8 - stored} simulated in this run" in resumed.stderr


@pytest.mark.workflow
def test_a_sweep_inside_or_around_another_sweeps_directory_is_refused(tmp_path):
    """A sweep whose directory lies inside another's (its results would be deleted by the outer
    sweep's next run) or holds one is a config error before anything is written."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    assert run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path).returncode == 0
    outer = tmp_path / "results" / "tiny"
    before = sorted(p.relative_to(outer) for p in outer.rglob("*"))
    cases = {"inside": tiny_config(sweep="ensemble.zarr", results_dir=str(outer)),
             "in its points": tiny_config(sweep="points", results_dir=str(outer)),
             "around": tiny_config(sweep="results", results_dir=str(tmp_path))}
    for name, config in cases.items():
        path = write_yaml(tmp_path / f"{name.replace(' ', '_')}.yaml", config)
        for verb in ("validate", "run"):
            out = cli(verb, str(path), cwd=tmp_path)
            assert out.returncode == 2, (name, verb, out.stderr[-2000:])
            assert "config key 'results_dir'" in out.stderr, out.stderr
            assert f", {outer}: a run of the outer" in out.stderr, out.stderr
            assert "Traceback" not in out.stderr
    direct = run_snakemake(tmp_path, write_yaml(tmp_path / "direct.yaml", cases["inside"]))
    assert direct.returncode != 0 and "lies inside another sweep's directory" in direct.stdout + direct.stderr
    after = sorted(p.relative_to(outer) for p in outer.rglob("*"))
    assert after == before, (set(after) ^ set(before))  # nothing written there
    beside = write_yaml(tmp_path / "beside.yaml", tiny_config(sweep="other"))
    assert cli("validate", str(beside), cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("where, address", [("env", "tcp://127.0.0.1:99999"), ("env", "tcp://[::1"),
                                            ("config", "tcp://host-without-port"), ("config", "tcp://h:0")])
def test_a_malformed_scheduler_address_is_refused_before_anything_starts(tmp_path, where, address):
    cfg = tiny_config(execution={"scheduler": address} if where == "config" else {})
    path = write_yaml(tmp_path / "t.yaml", cfg)
    env = {cluster.SCHEDULER_ENV: address} if where == "env" else {cluster.SCHEDULER_ENV: ""}
    out = cli("run", str(path), "--cores", "2", cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "is not a Dask scheduler address" in out.stderr and repr(address) in out.stderr
    assert not (tmp_path / "results").exists() and "Traceback" not in out.stderr
