"""What a new user meets first: the command line's conventions, the closing summary, and a second
run refused before it starts anything (the default sweep on a cold cache and a busy machine:
tests/run/test_cold_start.py; the run's cluster: tests/run/test_cluster.py; progress:
tests/run/test_progress.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    REPO,
    cli,
    cluster_daemons,
    immutable,
    make_finished_sweep,
    run_cli,
    run_snakemake,
    tiny_config,
    write_yaml,
)

from sgdsweep.run import cluster
from sgdsweep.run.cli import EXIT_CODES, build_parser

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


def _snakemake_pid(lock: Path, run: subprocess.Popen, timeout: float = 300.0) -> int:
    """The pid of the Snakemake of ``run`` (an `sgdsweep run`), from the sweep's lock once Snakemake
    has written it there; read again while the record is being rewritten."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(json.loads(lock.read_text())["snakemake_pid"])
        except (FileNotFoundError, ValueError, KeyError):
            assert time.monotonic() < deadline and run.poll() is None, "the run's Snakemake did not start"
            time.sleep(0.1)


@pytest.mark.workflow
def test_a_second_run_is_refused_before_it_starts_a_cluster(tmp_path):
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGDSWEEP_SCHEDULER_FILE", None)
    # the point stores and the ensemble (the workflow's `ensemble` target): a run with a cluster
    first = subprocess.Popen([sys.executable, "-m", "sgdsweep", "run", str(cfg), "--cores", "2", "--", "ensemble"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = sweep / ".cluster" / "scheduler.json"
    deadline = time.monotonic() + 300
    while not (state.exists() and "address" in state.read_text()):
        assert time.monotonic() < deadline and first.poll() is None, "the first run's cluster did not start"
        time.sleep(0.1)
    before = json.loads(state.read_text())
    snakemake = _snakemake_pid(sweep / ".sgdsweep.lock", first)
    os.kill(snakemake, signal.SIGSTOP)  # the first run held still: it cannot finish before the second asks
    try:
        second = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
        assert second.returncode == 3, second.stderr[-2000:]
        assert "another sgdsweep workflow is running" in second.stderr
        assert "starting a local Dask cluster" not in second.stderr
        assert json.loads(state.read_text()) == before  # the first run's cluster is untouched
        assert cluster_daemons(tmp_path) == 1
    finally:
        os.kill(snakemake, signal.SIGCONT)
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-3000:]
    assert cluster_daemons(tmp_path) == 0


#: Snakemake's banner, job tables and per-job messages: not shown by `sgdsweep run` without -v.
SNAKEMAKE_CHATTER = ("SNAKEMAKE", "Building DAG of jobs", "Using shell:", "Provided cores", "Job stats:",
                     "Select jobs to execute", "localrule", "Finished jobid", "steps (100%) done", "Complete log(s)")


@pytest.mark.workflow
def test_a_run_starts_its_cluster_as_snakemake_starts_and_prints_sgdsweep_lines_only(tmp_path):
    """`sgdsweep run` boots the run's cluster as Snakemake starts; the shard job connects to that
    one through its scheduler file (one dashboard, one cluster process), the run stops it, and
    later runs with nothing to simulate start none. What it prints: sgdsweep's own lines, not
    Snakemake's banner; -q only the summary; -v Snakemake's output too."""
    import xarray as xr

    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(grid={"lr": [0.3], "batch_size": [2, 3]}))
    # up to the fits (the workflow's `fits` target): the report is the one job left for -q
    first = run_cli("run", str(cfg), "--cores", "2", "--", "fits", cwd=tmp_path, cluster="own")
    assert first.returncode == 0, first.stderr[-3000:]
    text = first.stdout + first.stderr
    assert "sweep 'tiny': 2 points, 0 stored, 2 to simulate" in text and "points: 2 of 2 stored" in text
    assert re.search(r"starting a local Dask cluster of \d+ workers", text), text[-3000:]
    assert text.count("Dask dashboard: http://127.0.0.1:") == 1
    for chatter in SNAKEMAKE_CHATTER:
        assert chatter not in text, chatter
    sweep = tmp_path / "results" / "tiny"
    assert (sweep / ".cluster" / "daemon.log").read_bytes().count(b"Traceback") == 0
    assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == 2
    assert sorted(p.name for p in (sweep / ".cluster").iterdir()) == ["daemon.log"]  # no scheduler file left
    assert cluster_daemons(tmp_path) == 0
    assert not (sweep / "report.html").exists()  # one job to run, quietly
    quiet = run_cli("run", str(cfg), "--cores", "2", "-q", cwd=tmp_path, cluster="own")
    assert quiet.returncode == 0
    text = quiet.stdout + quiet.stderr
    assert text.startswith("sgdsweep: sweep 'tiny' finished"), text[:3000]  # nothing before the summary
    assert "points: 2 of 2 stored, 0 simulated" in text and "report written to" not in text
    verbose = run_cli("run", str(cfg), "--cores", "2", "-v", cwd=tmp_path, cluster="own")
    assert verbose.returncode == 0
    assert "Building DAG of jobs" in verbose.stderr and "Nothing to be done" in verbose.stderr
    assert "starting a local Dask cluster" not in verbose.stdout + verbose.stderr
    assert cluster_daemons(tmp_path) == 0


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
    """kill -9 of ``sgdsweep run`` leaves its Snakemake going (it holds the sweep) and no file
    behind (the stored points it hands to Snakemake are in a file without a name): the next run's
    refusal names that process and how to stop it. kill -9 of Snakemake makes ``sgdsweep run``
    say so and exit 1, and the next run resumes."""
    import shutil
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    state = tmp_path / "results" / "slow" / ".cluster" / "scheduler.json"
    lock = tmp_path / "results" / "slow" / ".sgdsweep.lock"
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temp)}
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
    snakemake = _snakemake_pid(lock, front)
    # Snakemake held still: its cluster stops once the front end is gone, its shard job then
    # fails, and a Snakemake left running could exit before the next run looks at the lock
    os.kill(snakemake, signal.SIGSTOP)
    front.kill()
    front.wait()
    assert not list(temp.glob("sgdsweep-stored-*")), sorted(p.name for p in temp.iterdir())
    refused = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert f"its Snakemake process (pid {snakemake}" in refused.stderr and f"kill {snakemake}" in refused.stderr
    os.kill(snakemake, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while cluster_daemons(tmp_path):  # the cluster stops by itself once its owner is gone
        assert time.monotonic() < deadline, "the cluster daemon outlived the sgdsweep run that owned it"
        time.sleep(0.2)

    second = start()
    os.kill(_snakemake_pid(lock, second), signal.SIGKILL)
    second.wait(timeout=300)
    out = (tmp_path / "run.log").read_text()
    assert second.returncode == 1, out[-2000:]
    assert "sgdsweep: error: Snakemake was killed by signal 9; run the same command again to resume" in out
    deadline = time.monotonic() + 120
    assert cluster_daemons(tmp_path) == 0  # sgdsweep run stopped its cluster before it exited
    resumed = run_cli("run", str(cfg), "--cores", "2", "--", "ensemble", cwd=tmp_path)  # stores, ensemble
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "points: 8 of 8 stored" in resumed.stderr


@pytest.mark.workflow
def test_ctrl_c_stops_the_run_and_its_cluster_and_the_next_run_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's foreground process group) stops Snakemake and its jobs;
    ``sgdsweep run`` stops the cluster it owns, says how to resume, and the same command resumes
    without any manual unlock."""
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SGDSWEEP_SCHEDULER_FILE", None)
    with open(tmp_path / "run.log", "w") as log:
        # as from a terminal, where Ctrl-C is not ignored (a test run started in the background of a
        # non-interactive shell ignores SIGINT, and its processes would inherit that): the command is
        # exec'ed with SIGINT's default action
        argv = [sys.executable, "-m", "sgdsweep", "run", str(cfg), "--cores", "2"]
        launch = ("import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  f"os.execv({sys.executable!r}, {argv!r})")
        proc = subprocess.Popen([sys.executable, "-c", launch], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
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
    resumed = run_cli("run", str(cfg), "--cores", "2", "--", "ensemble", cwd=tmp_path)  # stores, ensemble
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"points: 8 of 8 stored, {8 - stored} simulated in this run" in resumed.stderr


@pytest.mark.workflow
def test_a_sweep_inside_or_around_another_sweeps_directory_is_refused(tmp_path):
    """A sweep whose directory lies inside another's (its results would be deleted by the outer
    sweep's next run) or holds one is a config error before anything is written. (The outer sweep
    is made in this process: a sweep's directory is known by its plan, sgdsweep.core.paths.nested_sweep.)"""
    outer = make_finished_sweep(tmp_path)
    assert outer == tmp_path / "results" / "tiny"
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
    taken = tmp_path / "taken"  # a sweep's directory known by the lock file a run leaves, plan or not
    taken.mkdir()
    (taken / ".sgdsweep.lock").write_text("{}")
    out = cli("validate", str(write_yaml(tmp_path / "in_taken.yaml", tiny_config(results_dir=str(taken)))))
    assert out.returncode == 2 and f", {taken}: a run of the outer" in out.stderr, out.stderr


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
