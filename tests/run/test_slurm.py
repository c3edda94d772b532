"""A real two-node SLURM cluster on this host (slurmctld, two slurmd and munge, started by a
fixture) runs a sweep twice: through the Snakemake SLURM profile (one SLURM job per shard and per
stage), whose shard jobs run on both nodes and whose ensemble is bitwise that of ``sgdsweep run``
of the same config on this host alone, and with Snakemake local but the Dask workers as
dask-jobqueue SLURM jobs.

The two nodes, ``n1`` and ``n2``, are two ``slurmd`` processes (``slurmd -N n1``, ``slurmd -N n2``)
on this host, each with its own port, spool directory, log and pid file; Debian's slurm-wlm is
built to allow it (``scontrol show config`` lists ``MULTIPLE_SLURMD``). Each node offers all of
this host's cores, and a shard job asks for all of them, so two shard jobs never share a node.

Needs Debian's slurm-wlm and munge (``.ci/run`` installs them) and root; skipped otherwise,
with the reason.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import xarray as xr
from conftest import REPO, run_cli, run_snakemake, tiny_config, write_yaml

from sgdsweep.store.integrity import METADATA_ATTR

pytestmark = [pytest.mark.workflow, pytest.mark.slow]

CONF = Path("/etc/slurm/slurm.conf")  # where srun/sbatch inside jobs look for it
MARK = "# written by the sgdsweep test fixture"
NODES = {"n1": 17001, "n2": 17002}  # node name -> its slurmd's port
CPUS = os.cpu_count() or 1  # per node: a shard job asks for them all
#: The sweep of the SLURM profile's test: 8 points of two data sets (one per ``samples_per_param``)
#: and, with ``shard_work: 0``, one shard job each, which run at once: one on each node.
SWEEP = tiny_config(sweep="two_nodes", grid={"lr": [0.2, 0.4], "batch_size": [2, 4], "samples_per_param": [10, 20]})
#: Root attributes of the machine and time of writing, which two runs of one sweep do not share.
WRITER_ATTRS = ("created_utc", "history", "host", "devices", "python")
#: What a run measures of itself: the wall-clock seconds each point took.
TIMINGS = ("simulation_seconds",)


def _slurm_conf(state: Path) -> str:
    host = platform.node().split(".")[0]
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={CPUS} "
                      "RealMemory=4000 State=UNKNOWN" for name, port in NODES.items())
    return f"""{MARK}
ClusterName=sgdsweep-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
MpiDefault=none
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _node_states() -> dict[str, str]:
    """Node name -> state, as ``sinfo`` reports them (empty while slurmctld does not answer)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, check=False)
    if out.returncode:
        return {}
    return dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)


def _kill_daemon(pid_file: Path, name: str) -> None:
    """SIGKILL the process of ``pid_file`` if it still runs ``name`` (a pid may have been reused)."""
    try:
        pid = int(pid_file.read_text())
        if Path(f"/proc/{pid}/comm").read_text().strip() == name:
            os.kill(pid, 9)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The two-node cluster, up (both nodes idle) for the module's tests, stopped after them;
    yields its state directory (logs ``slurmctld.log``, ``slurmd-<node>.log``)."""
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch", "squeue") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing); .ci/run installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld/slurmd/munged needs root")
    if CONF.exists() and MARK not in CONF.read_text():
        pytest.skip(f"{CONF} belongs to a real SLURM installation; not touching it")
    state = tmp_path_factory.mktemp("slurm")
    (state / "ctld").mkdir()
    (state / "spool").mkdir()
    CONF.parent.mkdir(parents=True, exist_ok=True)
    CONF.write_text(_slurm_conf(state))
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True, check=False).returncode != 0:
        subprocess.run(["munged", "--force"], check=True, capture_output=True)
    try:
        subprocess.run(["slurmctld", "-f", str(CONF)], check=True)
        for name in NODES:
            subprocess.run(["slurmd", "-f", str(CONF), "-N", name], check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = _node_states()
            if all(states.get(name) == "idle" for name in NODES):
                break
            time.sleep(0.5)
        else:
            logs = "\n".join(f"{p.name}: {p.read_text()[-1000:]}" for p in sorted(state.glob("*.log")))
            pytest.fail(f"SLURM's nodes did not all come up idle (sinfo: {_node_states()}):\n{logs}")
        yield state
    finally:
        subprocess.run(["scontrol", "shutdown"], capture_output=True, check=False)  # slurmctld and every slurmd
        time.sleep(2)
        _kill_daemon(state / "slurmctld.pid", "slurmctld")
        for name in NODES:
            _kill_daemon(state / f"slurmd-{name}.pid", "slurmd")
        CONF.unlink(missing_ok=True)


def _slurm_jobs(snakemake_output: str) -> dict[str, dict[str, str]]:
    """The SLURM jobs a Snakemake run submitted (job id -> ``scontrol show job`` fields: the
    ``Comment`` the executor gives it, ``rule_<rule>_wildcards_<…>``, and ``NodeList``); SLURM
    keeps finished jobs for ``MinJobAge`` (600 s)."""
    jobs = {}
    for job_id in re.findall(r"has been submitted with SLURM jobid (\d+)", snakemake_output):
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
        jobs[job_id] = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
    return jobs


def _ensemble(sweep_dir: Path) -> xr.Dataset:
    """The sweep's ensemble, loaded, without the attributes of the machine and time of writing
    (:data:`WRITER_ATTRS`) and the run's timings (:data:`TIMINGS`, checked to be there); of the
    digests of its metadata, those of its arrays (its attributes' digest covers the writer's)."""
    ds = xr.open_zarr(sweep_dir / "ensemble.zarr").load()
    for key in WRITER_ATTRS:
        ds.attrs.pop(key)
    digests = ds.attrs.pop(METADATA_ATTR)
    ds.attrs["array_digests"] = digests["arrays"]
    for name in TIMINGS:
        assert (ds[name] > 0).all(), ds[name]
    return ds.drop_vars(TIMINGS)


def _local_run(work: Path) -> Path:
    """:data:`SWEEP` run in ``work`` by ``sgdsweep run`` on this host alone (no SLURM: one local
    Dask cluster for all the shards; the point stores and the ensemble: the workflow's `ensemble`
    target); returns the sweep's directory."""
    work.mkdir()
    proc = run_cli("run", str(write_yaml(work / "t.yaml", SWEEP)), "--cores", "2", "--", "ensemble", cwd=work,
                   timeout=900, cluster="own")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return work / "results" / SWEEP["sweep"]


def test_sweep_through_the_slurm_profile_on_two_nodes_equals_a_local_run(tmp_path, slurm):
    work = tmp_path / "slurm"
    work.mkdir()
    with ThreadPoolExecutor(1) as pool:  # the local run meanwhile: the SLURM run mostly waits
        local_run = pool.submit(_local_run, tmp_path / "local")
        proc = run_snakemake(
            work, write_yaml(work / "t.yaml", SWEEP), "--profile", str(REPO / "workflow" / "profiles" / "slurm"),
            "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
            "--slurm-keep-successful-logs", "--set-resources", f"simulate:cpus_per_task={CPUS}",
            "simulate:mem_mb=1000", "aggregate:mem_mb=1000", "fit:mem_mb=1000", "report:mem_mb=1000",
            "--default-resources", "mem_mb=1000", "runtime=10", "cpus_per_task=1", "--jobs", "2", timeout=900,
            cluster="own")
        local_sweep = local_run.result()
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    jobs = _slurm_jobs(proc.stdout + proc.stderr)
    rules = sorted(re.match(r"rule_([a-z_]+?)(_wildcards_|$)", job["Comment"]).group(1) for job in jobs.values())
    assert rules == ["aggregate", "fit", "report", "simulate", "simulate"], jobs
    shard_nodes = {job["NodeList"] for job in jobs.values() if job["Comment"].startswith("rule_simulate")}
    assert shard_nodes == set(NODES), f"shard jobs ran on {shard_nodes}: {jobs}"
    assert all(job["JobState"] == "COMPLETED" for job in jobs.values()), jobs
    sweep = work / "results" / SWEEP["sweep"]
    assert (sweep / "report.html").is_file()
    assert len(list((work / ".snakemake" / "slurm_logs").rglob("*.log"))) == 5
    ensemble, local = _ensemble(sweep), _ensemble(local_sweep)
    assert ensemble.sizes["point"] == 8
    xr.testing.assert_identical(ensemble, local)  # every array, coordinate and attribute
    for name, var in local.variables.items():  # numbers bit for bit (NaN payloads, signed zeros)
        assert var.dtype == ensemble[name].dtype, name
        if var.dtype.kind in "biufcmM":
            assert var.values.tobytes() == ensemble[name].values.tobytes(), name


def test_dask_workers_as_slurm_jobs(tmp_path, slurm):
    cfg = tiny_config(sweep="slurm_dask", execution={"cluster": "slurm", "slurm": {"jobs": 1, "cores": 2,
                                                                                  "memory": "1GB"}})
    path = write_yaml(tmp_path / "t.yaml", cfg)
    proc = run_snakemake(tmp_path, path, targets=("ensemble",), timeout=900, cluster="own")  # stores, ensemble
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweep = tmp_path / "results" / "slurm_dask"
    assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == 4
    log = next((sweep / "logs" / "simulate").glob("*.log")).read_text()
    assert "Dask on SLURM: 1 job(s) of 2 worker(s)" in log
