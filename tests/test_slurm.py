"""A real single-node SLURM cluster (slurmctld + slurmd + munge, started by a fixture) runs a
tiny sweep twice: through the Snakemake SLURM profile (one SLURM job per shard and per stage),
and with Snakemake local but the Dask workers as dask-jobqueue SLURM jobs.

Needs Debian's slurm-wlm and munge (``.ci/run`` installs them) and root; skipped otherwise,
with the reason.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import xarray as xr
from conftest import REPO, run_snakemake, tiny_config, write_yaml

pytestmark = pytest.mark.workflow

CONF = Path("/etc/slurm/slurm.conf")  # where srun/sbatch inside jobs look for it
MARK = "# written by the sgdsweep test fixture"


def _slurm_conf(state: Path) -> str:
    host = platform.node().split(".")[0]
    return f"""{MARK}
ClusterName=sgdsweep-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
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
NodeName={host} CPUs={os.cpu_count()} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
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
    subprocess.run(["slurmctld", "-f", str(CONF)], check=True)
    subprocess.run(["slurmd", "-f", str(CONF)], check=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False)
            if out.returncode == 0 and "idle" in out.stdout:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"SLURM did not come up: {(state / 'slurmctld.log').read_text()[-2000:]}")
        yield state
    finally:
        subprocess.run(["scontrol", "shutdown"], capture_output=True, check=False)
        time.sleep(2)
        for name in ("slurmctld.pid", "slurmd.pid"):
            pid_file = state / name
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), 9)
                except (ProcessLookupError, ValueError):
                    pass
        CONF.unlink(missing_ok=True)


def test_sweep_through_the_slurm_profile(tmp_path, slurm):
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(sweep="slurm_profile"))
    cores = str(os.cpu_count())
    proc = run_snakemake(
        tmp_path, cfg, "--profile", str(REPO / "workflow" / "profiles" / "slurm"), "--slurm-status-command", "squeue",
        "--slurm-init-seconds-before-status-checks", "2", "--slurm-keep-successful-logs",
        "--set-resources", f"simulate:cpus_per_task={cores}", "simulate:mem_mb=1000", "aggregate:mem_mb=1000",
        "fit:mem_mb=1000", "report:mem_mb=1000", "--default-resources", "mem_mb=1000", "runtime=10",
        "cpus_per_task=1", "--jobs", "2", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    text = proc.stdout + proc.stderr
    assert text.count("has been submitted with SLURM jobid") == 4  # simulate, aggregate, fit, report
    sweep = tmp_path / "results" / "slurm_profile"
    assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == 4
    assert (sweep / "report.html").is_file()
    assert len(list((tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))) == 4


def test_dask_workers_as_slurm_jobs(tmp_path, slurm):
    cfg = tiny_config(sweep="slurm_dask", execution={"cluster": "slurm", "slurm": {"jobs": 1, "cores": 2,
                                                                                  "memory": "1GB"}})
    path = write_yaml(tmp_path / "t.yaml", cfg)
    proc = run_snakemake(tmp_path, path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweep = tmp_path / "results" / "slurm_dask"
    assert xr.open_zarr(sweep / "ensemble.zarr").sizes["point"] == 4
    log = next((sweep / "logs" / "simulate").glob("*.log")).read_text()
    assert "Dask on SLURM: 1 job(s) of 2 worker(s)" in log
