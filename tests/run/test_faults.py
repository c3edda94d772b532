"""Faults with real processes: kill -9 of the workflow, a lost Dask worker, a read-only results
directory, corrupted point stores, and two runs at once. Also bitwise determinism across worker
counts and task chunking."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from conftest import (
    REPO,
    SHARED_CLUSTER,
    checksummed_zip,
    cli,
    cluster_daemons,
    immutable,
    npy,
    run_cli,
    run_snakemake,
    tiny_config,
    write_yaml,
)

from sgdsweep.store import points as point_store

pytestmark = pytest.mark.workflow

# 8 points of ~0.5 s each, one per task, on one worker: a run long enough to interrupt.
SLOW = {"grid": {"lr": [0.2, 0.25, 0.3, 0.35], "batch_size": [2, 4]},
        "dynamics": {"steps": 40000, "replicas": 8}, "execution": {"workers": 1, "points_per_task": 1}}


def _start(workdir: Path, cfg: Path, *targets: str) -> subprocess.Popen:
    """Plain ``snakemake`` of ``cfg`` in ``workdir`` started, its shard jobs on their own clusters;
    ``targets`` as :func:`conftest.run_snakemake` takes them."""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--snakefile", str(REPO / "Snakefile"), "--directory",
           str(workdir), "--cores", "2", "--configfile", str(cfg)]
    env = {k: v for k, v in os.environ.items() if k not in ("SGDSWEEP_SCHEDULER_FILE", "SGDSWEEP_SCHEDULER")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _wait_for(predicate, timeout=180.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _members(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and the metadata of the point store at ``path``, read with numpy alone."""
    with np.load(path, allow_pickle=False) as npz:
        members = {name: npz[name] for name in npz.files}
    return members, json.loads(bytes(members.pop("sgdsweep_meta")[()]))


def _stores(sweep: Path) -> dict[str, int]:
    """Point stores → inode of their file (changes if a store is rewritten)."""
    return {p.name: p.stat().st_ino for p in (sweep / "points").glob("*.npz")}


def _ensemble(sweep: Path) -> xr.Dataset:
    return xr.open_zarr(sweep / "ensemble.zarr").load()


def _assert_same_results(a: xr.Dataset, b: xr.Dataset) -> None:
    for name in ("weight_var", "weight_var_se", "weight_var_replica", "loss", "weight_var_theory", "diverged"):
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    np.testing.assert_array_equal(a["point"].values, b["point"].values)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The slow sweep's ensemble, simulated without interruption in this process, one point per
    call as the workflow's tasks are, and aggregated as the workflow's aggregate job does (a
    point's store is the same bytes in any process and batch:
    :func:`test_point_stores_are_bitwise_identical_across_processes_and_batching`)."""
    from sgdsweep.run.execute import make_batches, simulate_task
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    work = tmp_path_factory.mktemp("ref")
    sweep = build_sweep(tiny_config(sweep="slow", results_dir=str(work / "results"), **SLOW))
    files = write_plan(sweep)
    for batch in make_batches([p.spec() for p in sweep.points], SLOW["execution"]["points_per_task"]):
        simulate_task(batch, str(files.points_dir))
    write_ensemble(build_ensemble(json.loads(files.sweep_spec.read_text())), files.ensemble)
    return _ensemble(files.root)


def test_kill_9_mid_sweep_then_resume(tmp_path, reference):
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    proc = _start(tmp_path, cfg)
    _wait_for(lambda: len(_stores(sweep)) >= 2, what="two finished points")
    os.killpg(proc.pid, signal.SIGKILL)  # the workflow and its jobs, as a batch system would
    proc.wait()
    finished = _stores(sweep)
    assert 2 <= len(finished) < 8
    # plain snakemake keeps Snakemake's own locking: the killed run's lock stays until --unlock
    plain = run_snakemake(tmp_path, cfg)
    assert plain.returncode != 0 and "Directory cannot be locked" in plain.stdout + plain.stderr
    # sgdsweep run holds the sweep's lock, so it passes --nolock --rerun-incomplete: no manual step
    # (the point stores and the ensemble: the workflow's `ensemble` target)
    rerun = run_cli("run", str(cfg), "--cores", "2", "--", "ensemble", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = _stores(sweep)
    assert len(after) == 8
    assert all(after[name] == inode for name, inode in finished.items())  # none recomputed
    _assert_same_results(_ensemble(sweep), reference)
    assert cluster_daemons(tmp_path) == 0  # the run stopped the cluster it started


def test_lost_dask_worker_mid_task(tmp_path, reference):
    from distributed import Client

    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    proc = _start(tmp_path, cfg, "ensemble")
    logs = sweep / "logs" / "simulate"

    def job_scheduler() -> str | None:  # the shard job's own cluster (plain snakemake), from its log
        for log in logs.glob("*.log") if logs.is_dir() else []:
            found = re.search(r"\(scheduler (tcp://\S+), this job's cluster", log.read_text())
            if found:
                return found.group(1)
        return None

    _wait_for(lambda: job_scheduler() is not None, what="the local cluster")
    address = job_scheduler()
    assert address.startswith("tcp://127.0.0.1:")  # the local cluster binds to localhost only
    with Client(address, timeout="30s") as client:
        _wait_for(lambda: len(_stores(sweep)) >= 1, what="a finished point")
        (pid,) = client.run(os.getpid).values()
        os.kill(pid, signal.SIGKILL)  # mid-task: the worker is busy with the next point
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    _assert_same_results(_ensemble(sweep), reference)


def test_two_runs_at_once_second_refuses(tmp_path):
    cfg = write_yaml(tmp_path / "slow.yaml", tiny_config(sweep="slow", **SLOW))
    sweep = tmp_path / "results" / "slow"
    first = _start(tmp_path, cfg, "ensemble")  # the point stores and the ensemble: what the runs contend for
    lock = sweep / ".sgdsweep.lock"
    _wait_for(lambda: lock.exists() and '"snakemake_pid"' in lock.read_text(), what="the first run to start")
    os.kill(first.pid, signal.SIGSTOP)  # the first run held still: it cannot finish before the others ask
    try:
        # refused by Snakemake itself: its lock, or, while a job of the first run is in flight, that
        # job's output marked incomplete (Snakemake checks that first)
        second = run_snakemake(tmp_path, cfg)
        said = second.stdout + second.stderr
        assert second.returncode != 0 and ("Directory cannot be locked" in said or "Incomplete files" in said), said
        refused = cli("run", str(cfg), "--cores", "1", cwd=tmp_path)  # refused by the sweep's lock
        assert refused.returncode == 3
        assert "another sgdsweep workflow is running" in refused.stderr and f"pid {first.pid} on " in refused.stderr
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]  # the first run was not disturbed
    assert len(_stores(sweep)) == 8
    after = run_cli("run", str(cfg), "--cores", "1", "-v", "--", "ensemble", cwd=tmp_path)  # and afterwards a run works
    assert after.returncode == 0 and "Nothing to be done" in after.stdout + after.stderr  # -v: Snakemake's output


def test_corrupted_point_store_is_recomputed(tmp_path):
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(grid={"lr": [0.2, 0.4, 0.6], "batch_size": [2, 4]}))
    assert run_snakemake(tmp_path, cfg, targets=("ensemble",)).returncode == 0
    sweep = tmp_path / "results" / "tiny"
    before = _ensemble(sweep)
    stores = sorted((sweep / "points").glob("*.npz"))
    stores[0].write_bytes(stores[0].read_bytes()[: stores[0].stat().st_size // 2])  # cut to half its size
    with np.load(stores[2], allow_pickle=False) as npz:
        chunk = npz["weight_cov"].tobytes()
    raw = bytearray(stores[2].read_bytes())
    raw[raw.index(chunk) + 3] ^= 0x10  # a flipped bit inside an array
    stores[2].write_bytes(bytes(raw))
    members, meta = _members(stores[1])  # a store missing an array...
    del members["weight_cov"], meta["arrays"]["weight_cov"]
    meta["attributes"]["sgdsweep_complete"] = False  # ...and no longer marked complete
    stores[1].unlink()
    point_store.place_members(stores[1], members, meta)
    shutil.copyfile(stores[3], stores[4])  # another point's whole store under this point's name
    intact = {p.name: p.stat().st_ino for p in (stores[3], stores[5])}
    # what a write killed long ago left beside the truncated store goes at once; a young one may
    # be live until the point is stored, then it goes too
    orphan = stores[0].with_name(f".{stores[0].name}.tmp-0badf00d")
    young = stores[0].with_name(f".{stores[0].name}.tmp-live0001")
    for path in (orphan, young):
        path.write_bytes(b"PK partial")
    past = time.time() - point_store.STALE_TEMPORARY_SECONDS - 60
    os.utime(orphan, (past, past))
    plan = cli("plan", str(cfg), cwd=tmp_path)
    assert plan.returncode == 0 and "4 to simulate (3 corrupt, 1 misnamed)" in plan.stdout, plan.stdout
    proc = run_snakemake(tmp_path, cfg, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = next((sweep / "logs" / "simulate").glob("*.log")).read_text()
    assert "4 to simulate" in log
    assert "removed 1 temporary or cut-short file(s) that killed writes left" in log
    assert "removed 1 temporary file(s) of writes that did not finish, e.g. " + young.name in log
    assert not orphan.exists() and not young.exists()
    assert {name: ino for name, ino in _stores(sweep).items() if name in intact} == intact  # not recomputed
    _assert_same_results(_ensemble(sweep), before)


def _files(directory: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_deleted_results_are_rebuilt_without_simulating(tmp_path):
    """A deleted ensemble, fits file or report is rebuilt by the next run from the point stores
    (none is simulated again); what a killed run left is removed: an aggregate's temporary
    ensemble, and failure records of points that were stored after all."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    assert run_snakemake(tmp_path, cfg).returncode == 0
    sweep = tmp_path / "results" / "tiny"
    stores, before = _stores(sweep), _ensemble(sweep)
    fits = (sweep / "fits.json").read_text()
    # the last step first: every run starts from results that are up to date but for the one
    # deleted. The default target (`snakemake`, `sgdsweep run`) plans the job that rebuilds it
    # (a dry run); the workflow's target that holds it (`all`, `fits`, `ensemble`) rebuilds it,
    # so the report is built once more, not after each deletion
    for lost, job, targets in (("report.html", "report", ()), ("fits.json", "fit", ("fits",)),
                               ("ensemble.zarr", "aggregate", ("ensemble",))):
        target = sweep / lost
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        planned = run_snakemake(tmp_path, cfg, "-n")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 0 and f"rule {job}:" in said and "rule simulate:" not in said, said[-3000:]
        proc = run_snakemake(tmp_path, cfg, targets=targets)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Nothing to be done" not in proc.stdout + proc.stderr and "rule simulate" not in proc.stderr
        assert target.exists(), lost
        assert _stores(sweep) == stores
    _assert_same_results(_ensemble(sweep), before)
    assert json.loads((sweep / "fits.json").read_text()) == json.loads(fits)
    # a run that was adding points and was killed: while aggregating (its temporary ensemble),
    # and while simulating (failure records of points a worker stored before it died)
    orphan = sweep / ".ensemble.zarr.tmp-0badf00d"
    shutil.copytree(sweep / "ensemble.zarr", orphan)
    markers = [point_store.failed_marker(sweep / "points", name.split(".")[0]) for name in sorted(stores)[:2]]
    for marker in markers:
        marker.write_text(json.dumps({"error": "KilledWorker: ..."}))
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config(grid={"lr": [0.2, 0.4, 0.3]}))
    proc = run_snakemake(tmp_path, cfg, targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not orphan.exists() and not any(m.exists() for m in markers)
    assert [p.name for p in sweep.iterdir() if p.name.startswith(".ensemble")] == []
    after = _stores(sweep)
    assert len(after) == 6 and {name: after[name] for name in stores} == stores


def test_failed_aggregate_keeps_the_ensemble(tmp_path):
    """An aggregate that fails (here on a point store whose checksum and metadata are intact but
    one of whose arrays is a pickled object array, refused) exits non-zero naming the store, and
    the previous ensemble stays as it was; the next aggregate, with the store repaired, succeeds."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    assert run_snakemake(tmp_path, cfg, targets=("ensemble",)).returncode == 0
    sweep = tmp_path / "results" / "tiny"
    ensemble = _files(sweep / "ensemble.zarr")
    victim = min((sweep / "points").glob("*.npz"))
    good = victim.read_bytes()
    members, meta = _members(victim)
    files = {f"{name}.npy": npy(data) for name, data in members.items()}
    files["sgdsweep_meta.npy"] = npy(np.array(json.dumps(meta).encode()))
    table = meta["arrays"]["weight_var_replica"]["table"]  # the member holding it, with its neighbours
    files[f"{table}.npy"] = npy(np.array([{"a": 1}], dtype=object), allow_pickle=True)
    checksummed_zip(victim, files)  # complete, checksum intact: read, and refused as it is read
    proc = run_snakemake(tmp_path, cfg, "--forcerun", "aggregate", targets=("ensemble",))
    assert proc.returncode != 0
    assert f"point store results/tiny/points/{victim.name}" in proc.stdout + proc.stderr
    assert _files(sweep / "ensemble.zarr") == ensemble
    victim.write_bytes(good)
    proc = run_snakemake(tmp_path, cfg, "--forcerun", "aggregate", targets=("ensemble",))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_immutable_points_directory_is_named(tmp_path):
    """A points directory that refuses writes gives a clear error naming it and the fix, without
    a traceback. Tests run as root, where permission bits do not stop writes; the directory is
    made immutable with ``chattr +i`` before the run (a run where it becomes immutable midway
    fails at its next write, the same way)."""
    cfg = write_yaml(tmp_path / "t.yaml", tiny_config())
    points = tmp_path / "results" / "tiny" / "points"
    points.mkdir(parents=True)
    with immutable(points):
        proc = run_cli("run", str(cfg), "--cores", "2", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    log = next((tmp_path / "results" / "tiny" / "logs" / "simulate").glob("*.log")).read_text()
    assert proc.returncode != 0
    assert f"the directory {points} is not writable" in out and f"'chattr -i {points}'" in out
    assert "Traceback" not in out and "Traceback" not in log
    assert os.listdir(points) == []


def test_unwritable_results_directory(tmp_path):
    cfg_path = tmp_path / "t.yaml"
    # a results_dir that cannot be created (a file is in the way)
    (tmp_path / "blocker").write_text("not a directory")
    write_yaml(cfg_path, tiny_config(results_dir=str(tmp_path / "blocker" / "results")))
    proc = run_snakemake(tmp_path, cfg_path)
    assert proc.returncode != 0 and "is not writable" in proc.stdout + proc.stderr
    assert (tmp_path / "blocker").read_text() == "not a directory"
    # a read-only file system under finished results: clear error, nothing changed
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the blocked-path case above ran")
    try:
        write_yaml(cfg_path, tiny_config(results_dir=str(mnt / "results")))
        assert run_snakemake(tmp_path, cfg_path, targets=("ensemble",)).returncode == 0
        snapshot = {p: p.read_bytes() for p in (mnt / "results").rglob("*") if p.is_file()}
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=False).returncode == 0
        write_yaml(cfg_path, tiny_config(results_dir=str(mnt / "results"), grid={"lr": [0.2, 0.4, 0.3]}))
        proc = run_snakemake(tmp_path, cfg_path)
        assert proc.returncode != 0
        assert "is not writable" in proc.stdout + proc.stderr and "Read-only" in proc.stdout + proc.stderr
        refused = cli("run", str(cfg_path), "--cores", "1", cwd=tmp_path)
        assert refused.returncode != 0 and "is not writable" in refused.stdout + refused.stderr
        assert {p: p.read_bytes() for p in (mnt / "results").rglob("*") if p.is_file()} == snapshot
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_point_stores_are_bitwise_identical_across_processes_and_batching(tmp_path):
    """Each point's store holds the same bytes whichever process simulates it and whatever batch it
    is in: in this process one point per call, and the task body the shard job submits run in
    batches of 2 and of 3 on the two worker processes of a real Dask cluster, each worker named
    for its batches so that both run some."""
    from distributed import Client

    from sgdsweep.run.execute import make_batches, simulate_task
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    runs: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    with Client(SHARED_CLUSTER.start(), timeout="60s") as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 2
        for per_task in (1, 2, 3):
            cfg = tiny_config(results_dir=str(tmp_path / f"batches-of-{per_task}"),
                              grid={"lr": [0.2, 0.3, 0.4], "batch_size": [2, 4]})
            sweep = build_sweep(cfg)
            files = write_plan(sweep)
            batches = make_batches([p.spec() for p in sweep.points], per_task)
            if per_task == 1:
                for batch in batches:
                    simulate_task(batch, str(files.points_dir))
            else:
                futures = [client.submit(simulate_task, batch, str(files.points_dir), pure=False,
                                         workers=[workers[i % 2]], allow_other_workers=False)
                           for i, batch in enumerate(batches)]
                client.gather(futures)
            stores = {path.name: _members(path)[0] for path in files.points_dir.glob("*.npz")}
            assert len(stores) == 6
            runs[per_task] = stores
    for per_task in (2, 3):
        assert runs[per_task].keys() == runs[1].keys()
        for name, arrays in runs[1].items():
            other = runs[per_task][name]
            assert arrays.keys() == other.keys()
            for key, value in arrays.items():
                np.testing.assert_array_equal(value, other[key], err_msg=f"{name}:{key}, batches of {per_task}")
