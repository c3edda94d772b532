"""Shared fixtures: a tiny valid config and helpers to run the real workflow."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import shutil
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

#: Environment variable: run the in-process tests on other random numbers — the replica streams
#: and data sets keyed by this STREAM_VERSION instead of sgdsweep's own — to check that the
#: statistical tests hold for more than their seed (docs/testing.md). Subprocesses (snakemake,
#: Dask workers) keep the default.
STREAM_VERSION_ENV = "SGDSWEEP_TEST_STREAM_VERSION"
if os.environ.get(STREAM_VERSION_ENV):
    from sgdsweep.core import identity
    identity.STREAM_VERSION = int(os.environ[STREAM_VERSION_ENV])

TINY: dict[str, Any] = {
    "sweep": "tiny",
    "seed": 3,
    "model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
    "dynamics": {"steps": 3000, "replicas": 8},
    "grid": {"lr": [0.2, 0.4], "batch_size": [2, 4], "samples_per_param": 10},
    # one shard per data set: the tests that run several data sets see one job each
    "execution": {"workers": 2, "points_per_task": 2, "shard_work": 0},
}


#: A sweep with a precision target on one observable (tests/sweep/test_precision.py and the
#: tests of precision sweeps elsewhere).
PRECISE: dict[str, Any] = {
    "sweep": "precise",
    "seed": 3,
    "model": {"kind": "linear", "n_inputs": 4, "label_noise": 0.5},
    "dynamics": {"steps": 3000, "replicas": 8},
    "grid": {"lr": [0.2, 0.4], "batch_size": 2, "samples_per_param": 10},
    "precision": {"observables": {"weight_var": {"rel_se": 0.02}}},
    "execution": {"workers": 1, "points_per_task": 2},
}


def precise_config(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """A deep copy of :data:`PRECISE` with its results under ``tmp_path`` and top-level sections replaced."""
    cfg = copy.deepcopy(PRECISE)
    cfg["results_dir"] = str(tmp_path / "results")
    cfg.update(sections)
    return cfg


def run_rounds(cfg: dict[str, Any], limit: int = 12):
    """Simulate the rounds of the precision sweep ``cfg`` in this process, as `sgdsweep run` does
    through Snakemake; returns the last round's sweep."""
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.sweep.config import build_sweep

    for _ in range(limit):
        sweep = build_sweep(cfg)
        todo = [p for p in sweep.points if sweep.rounds["points"][p.hash]["status"] == "pending"]
        if not todo:
            return sweep
        simulate_points([p.spec() for p in todo], str(sweep.directory / "points"))
    raise AssertionError("the rounds did not end")


def tiny_config(**sections: Any) -> dict[str, Any]:
    """A deep copy of :data:`TINY` with top-level sections replaced or updated."""
    cfg = copy.deepcopy(TINY)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def as_directory_store(path: Path) -> Path:
    """The point store at ``path`` (``<hash>.npz``) rewritten as a Zarr directory store
    ``<hash>.zarr`` (the layout sgdsweep wrote first), through Zarr's public API; the ``.npz``
    removed. Returns the directory."""
    from legacy_layouts import write_zarr_group

    directory = path.with_name(path.name[: -len(".npz")] + ".zarr")
    write_zarr_group(path, directory)
    path.unlink()
    return directory


def write_zarr_zip_point(path: Path, arrays: dict[str, tuple], attrs: dict[str, Any]) -> Path:
    """A point store as sgdsweep wrote it before ``.npz`` stores: one Zarr (format 3) group in a
    zip file ``<hash>.zarr.zip``, written here by Zarr's own ``ZipStore``; ``arrays`` is
    name → (dimension names, array), ``attrs`` the group attributes (``sgdsweep_complete`` added)."""
    import zarr

    store = zarr.storage.ZipStore(path, mode="w")
    try:
        group = zarr.open_group(store=store, mode="w", zarr_format=3,
                                attributes={**attrs, "store_version": 2, "sgdsweep_complete": True})
        for name, (dims, data) in arrays.items():
            group.create_array(name, data=np.asarray(data), dimension_names=list(dims))
    finally:
        store.close()
    return path


def checksummed_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> None:
    """A zip of ``members`` (name → bytes) carrying a valid sgdsweep checksum comment, as a
    crafted point store would (the CRC-32 of every byte before the digits)."""
    from sgdsweep.store.points import CHECKSUM_MARKER

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.comment = CHECKSUM_MARKER + b"0" * 8
    raw = bytearray(buf.getvalue())
    raw[-8:] = b"%08x" % zlib.crc32(raw[:-8])
    path.write_bytes(bytes(raw))


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    """The ``.npy`` file of ``array`` (with ``allow_pickle``, an object array pickled)."""
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=allow_pickle)
    return out.getvalue()


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def quiet_dask_environ() -> dict[str, str]:
    """Dask's environment variables (``DASK_DISTRIBUTED__…``) of the settings sgdsweep's local
    clusters start with (``sgdsweep.run.cluster.QUIET_DASK``), for Dask processes started here."""
    from sgdsweep.run.cluster import QUIET_DASK

    return {"DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split(".")): str(value)
            for key, value in QUIET_DASK.items()}


class _SharedCluster:
    """A real ``dask scheduler`` and one ``dask worker`` process (2 worker processes of one
    thread) on 127.0.0.1, with the Dask settings of sgdsweep's own local clusters
    (:func:`quiet_dask_environ`), started on first use and stopped when the test run ends: the workflow
    tests that are not about a cluster's lifetime run their shard jobs on it through
    ``SGDSWEEP_SCHEDULER`` (case 1 of :mod:`sgdsweep.run.cluster`) instead of starting a cluster
    in each job. The tests of the run's own cluster pass ``cluster="own"``."""

    def __init__(self) -> None:
        self.address: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.dir: Path | None = None

    def start(self) -> str:
        import json
        import tempfile
        import time

        if self.address is not None and all(p.poll() is None for p in self.procs):
            return self.address
        self.stop()
        self.dir = Path(tempfile.mkdtemp(prefix="sgdsweep-test-cluster-"))
        sched_file = self.dir / "scheduler.json"
        bindir = Path(sys.executable).parent
        env = {**quiet_dask_environ(), **os.environ,
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop(STREAM_VERSION_ENV, None)  # subprocesses keep the default streams
        self.procs.append(subprocess.Popen(
            [str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=self.dir))
        deadline = time.monotonic() + 120
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        self.procs.append(subprocess.Popen(
            [str(bindir / "dask"), "worker", address, "--nworkers", "2", "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env, cwd=self.dir))
        from distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        self.address = address
        return address

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        self.procs, self.address = [], None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


SHARED_CLUSTER = _SharedCluster()


@pytest.fixture(scope="session", autouse=True)
def _stop_the_shared_cluster() -> Iterator[None]:
    yield
    SHARED_CLUSTER.stop()


def _cluster_env(cluster: str, env: dict[str, str] | None) -> dict[str, str]:
    """``env`` with the shared test cluster's address for ``cluster="shared"`` (unless ``env``
    names a scheduler itself); as given for ``cluster="own"``."""
    if cluster not in ("shared", "own"):
        raise ValueError(f"cluster={cluster!r}: 'shared' or 'own'")
    env = dict(env or {})
    if cluster == "shared" and "SGDSWEEP_SCHEDULER" not in env and "SGDSWEEP_SCHEDULER_FILE" not in env:
        env["SGDSWEEP_SCHEDULER"] = SHARED_CLUSTER.start()
    return env


def run_snakemake(workdir: Path, configfile: Path | None = None, *extra: str,
                  env: dict[str, str] | None = None, timeout: float = 600,
                  cluster: str = "shared", targets: tuple[str, ...] = (),
                  pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run the real ``snakemake`` on the repository's Snakefile in ``workdir``. Its shard jobs
    use the test run's shared Dask cluster, or with ``cluster="own"`` each starts its own (as
    plain ``snakemake`` does for a user). ``targets``: Snakemake's targets (default: the workflow's
    ``all``), e.g. ``("ensemble",)`` for a test that inspects the point stores and the ensemble
    only (the workflow's ``ensemble`` rule: no fit, no report). ``pass_fds``: descriptors it
    inherits."""
    cmd = [sys.executable, "-m", "snakemake", *targets, "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(workdir), "--cores", "2"]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    cmd += list(extra)
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGDSWEEP_SCHEDULER_FILE", "SGDSWEEP_SCHEDULER")}
    # plain snakemake: the jobs' `python` is the one that has sgdsweep installed
    full_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + full_env.get("PATH", "")
    full_env.update(_cluster_env(cluster, env))
    return subprocess.run(cmd, cwd=workdir, env=full_env, capture_output=True, text=True, timeout=timeout,
                          check=False, pass_fds=pass_fds)


#: The commands that run shard jobs, and so a cluster.
_RUNS_JOBS = {"run", "simulate-shard"}


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 600, cluster: str = "shared") -> subprocess.CompletedProcess:
    """Run ``python -m sgdsweep ARGS`` in a subprocess; a command that runs shard jobs uses the
    test run's shared Dask cluster, or with ``cluster="own"`` the cluster the command starts."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("SGDSWEEP_SCHEDULER_FILE", "SGDSWEEP_SCHEDULER")}
    full_env.update(_cluster_env(cluster, env) if args and args[0] in _RUNS_JOBS else (env or {}))
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "sgdsweep", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@dataclasses.dataclass
class CliResult:
    """What :func:`cli` returns: the fields of :class:`subprocess.CompletedProcess` the tests read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> CliResult:
    """Run ``sgdsweep ARGS`` in this process (``sgdsweep.run.cli.main``), as :func:`run_cli` runs
    it in a subprocess but without the 1–3 s of a new interpreter and its imports.

    Use ``cli`` for what ends before any process starts: a refusal (exit 2 or 3 with its message,
    nothing written), ``--help`` and usage errors, ``validate``, ``plan``, ``verify``, ``export``,
    ``import``, ``merge`` and the quick workflow verbs. Use :func:`run_cli` for a command that starts
    Snakemake or a cluster, or that depends on the state of a process: signals, Ctrl-C, what happens
    at interpreter exit, a reader that closes the pipe, a terminal, the environment before Python
    starts, the modules a fresh process imports; and keep one :func:`run_cli` per verb family so
    that the real entry point (``python -m sgdsweep``) is tested.

    For the call: stdout and stderr are captured; the working directory is ``cwd``; ``env``'s
    variables are set in ``os.environ`` and ``SGDSWEEP_SCHEDULER``/``SGDSWEEP_SCHEDULER_FILE`` are
    removed unless ``env`` names them (as :func:`run_cli` does); argparse's ``SystemExit``
    (``--help``, ``--version``, a usage error) becomes the return code. Afterwards the directory,
    the environment (values and absent variables alike), the ``sgdsweep`` logger (the handlers,
    level and propagation that ``cli._setup_logging`` set; its handlers closed) and
    ``identity.STREAM_VERSION`` are as they were. An exception that ``main`` does not turn into an
    exit status (a traceback, for a subprocess) propagates and fails the test.
    """
    import logging

    from sgdsweep.core import identity
    from sgdsweep.run.cli import main

    changes = {"SGDSWEEP_SCHEDULER": None, "SGDSWEEP_SCHEDULER_FILE": None, **(env or {})}
    saved_env = {key: os.environ.get(key) for key in changes}
    logger = logging.getLogger("sgdsweep")
    saved_log = (list(logger.handlers), logger.level, logger.propagate)
    saved_stream = identity.STREAM_VERSION
    saved_cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse: --help, --version, a usage error
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for handler in logger.handlers:
            if handler not in saved_log[0]:
                handler.close()
        logger.handlers[:] = saved_log[0]
        logger.setLevel(saved_log[1])
        logger.propagate = saved_log[2]
        identity.STREAM_VERSION = saved_stream
    return CliResult(list(args), code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """``directory`` made immutable (``chattr +i``) for the block; the test is skipped where that
    is not possible. Tests run as root, where permission bits do not stop writes."""
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)], check=False).returncode:
        pytest.skip("chattr +i is not available here (needs root on ext4/xfs/btrfs)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def cluster_daemons(workdir: Path) -> int:
    """Cluster daemons (``sgdsweep cluster-daemon``) running in ``workdir``; their ``--state``
    path may be relative to it, so they are found by their working directory."""
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            here = os.readlink(proc / "cwd") == str(workdir)
        except OSError:
            continue
        count += here and b"cluster-daemon" in cmdline
    return count


@pytest.fixture
def tiny() -> dict[str, Any]:
    return tiny_config()


def make_finished_sweep(root: Path, **sections: Any) -> Path:
    """Simulate, aggregate and fit a tiny sweep in-process (no Snakemake, no report); return its directory.

    Points whose store exists are not simulated again.
    """
    import json

    from sgdsweep.analysis.fit import fit_ensemble
    from sgdsweep.core.paths import atomic_write_text
    from sgdsweep.run.execute import make_batches
    from sgdsweep.run.simulate import simulate_points
    from sgdsweep.store.aggregate import build_ensemble, write_ensemble
    from sgdsweep.store.points import is_complete, point_path
    from sgdsweep.sweep.config import build_sweep
    from sgdsweep.sweep.plan import write_plan

    cfg = tiny_config(results_dir=str(root / "results"), dynamics={"steps": 1500, "replicas": 4}, **sections)
    sweep = build_sweep(cfg)
    files = write_plan(sweep)
    todo = [p.spec() for p in sweep.points if not is_complete(point_path(files.points_dir, p.hash))]
    for batch in make_batches(todo, 4):
        simulate_points(batch, str(files.points_dir))
    ds = build_ensemble(json.loads(files.sweep_spec.read_text()))
    write_ensemble(ds, files.ensemble)
    atomic_write_text(files.fits, json.dumps(fit_ensemble(ds, sweep.config["fit"])))
    return files.root


#: The most processes ``-n auto`` runs the tests in (pyproject's ``addopts``): each starts its own
#: shared Dask cluster, and the workflow tests run Snakemake on 2 cores.
MAX_TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process per core, at most :data:`MAX_TEST_PROCESSES`."""
    return max(1, min(os.cpu_count() or 1, MAX_TEST_PROCESSES))


#: The files of ``slow`` tests in the order they run, last of all. pytest-xdist hands a process its
#: next file while it still has two tests to run, so a file of one or two tests brings the next file
#: to the same process: the cold start (one test, about a minute) takes the browser's file with it,
#: and the SLURM file (about a minute and a half, mostly waiting for SLURM) comes last, alone on the
#: other process. In the collected order the SLURM file followed the cold start on one process,
#: and the run ended on it with the other process idle.
SLOW_FILES = ("test_cold_start.py", "test_report_browser.py", "test_slurm.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order of the run. Files with ``workflow`` tests (real Snakemake and Dask processes, the
    longest) first, so that a parallel run (pytest-xdist, one file per process at a time) does not
    end on one of them; the tests marked ``slow`` (a cold compile on a saturated machine, the real
    SLURM cluster, the browser; each in a file of its own) after all the others, so that a failure
    elsewhere shows first, in the order of :data:`SLOW_FILES`. Otherwise in the collected order."""
    def marked(marker: str) -> set[Path]:
        return {item.path for item in items if item.get_closest_marker(marker) is not None}

    def slow_rank(item: pytest.Item) -> int:
        return SLOW_FILES.index(item.path.name) if item.path.name in SLOW_FILES else len(SLOW_FILES)

    slow, workflow = marked("slow"), marked("workflow")
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None, slow_rank(item),
                                 item.path in slow, item.path not in workflow))
