"""``sgdsweep run``: validate the config, take the sweep's lock, start the run's local Dask
cluster, run Snakemake (once, or round by round for a sweep with precision targets or an edge
search) and print the closing summary.

Snakemake's terminal output goes through the logger plugin :data:`LOGGER_PLUGIN`
(``snakemake_plugins/snakemake_logger_plugin_sgdsweep``): its warnings and errors, everything with
``-v``, nothing after Ctrl-C. ``NO_COLOR`` is passed on as ``--nocolor``. The shard jobs learn
from :data:`sgdsweep.run.progress.PROGRESS_ENV` whether their progress may be a line redrawn in
place (:func:`progress_style`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from sgdsweep.errors import SgdsweepError
from sgdsweep.run.progress import PROGRESS_ENV, VERBOSITY_ENV

log = logging.getLogger("sgdsweep")

#: The Snakemake logger plugin of ``sgdsweep run`` (``snakemake_plugins/snakemake_logger_plugin_sgdsweep``).
LOGGER_PLUGIN = "sgdsweep"


def _snakefile() -> Path:
    from sgdsweep.core.paths import workflow_root

    return workflow_root() / "Snakefile"


def run_sweep(args: argparse.Namespace, verbosity: int) -> int:
    """``sgdsweep run`` (``args``: its parsed arguments; ``verbosity``: -1, 0 or 1); returns the
    exit status."""
    import time

    from sgdsweep.run import locking
    from sgdsweep.store.points import complete_points
    from sgdsweep.sweep.burn_in import short_burn_in_warning
    from sgdsweep.sweep.config import load_sweep
    from sgdsweep.sweep.device import device_override, snakemake_config
    from sgdsweep.sweep.execution import scheduler_address
    from sgdsweep.sweep.explain import explain, format_explanation
    from sgdsweep.sweep.plan import PlanFiles, plan_texts, write_plan_file
    from sgdsweep.sweep.stored import hand_over

    t0 = time.monotonic()
    device = device_override(args.config, args.device, args.snakemake_args)  # --device: execution.device
    sweep = load_sweep(args.config, device)  # fail fast, with our message, before Snakemake starts
    scheduler_address(sweep.config["execution"])
    locking.ensure_writable(Path.cwd(), "the working directory, where Snakemake keeps its state (.snakemake),",
                            "or run sgdsweep from a writable directory")
    locking.ensure_writable(sweep.directory)
    # the sweep's lock before anything starts: a second run is refused here, before it starts
    # a Dask cluster; Snakemake inherits the lock (locking.acquire_or_inherit)
    lock = locking.acquire(sweep.directory)
    if not args.dry_run:  # under the lock, before anything is planned: stores of earlier layouts as .npz
        from sgdsweep.store.migrate import migrate_points

        migrate_points(PlanFiles(sweep.directory).points_dir)
    hashes = [p.hash for p in sweep.points]
    stored_before = complete_points(PlanFiles(sweep.directory).points_dir, hashes)
    todo = len(hashes) - len(stored_before)
    cmd = snakemake_command(args, snakemake_config(args.device), verbosity)
    log.info("sweep '%s': %d points, %d stored, %d to simulate; results in %s/", sweep.name, len(hashes),
             len(stored_before), todo, sweep.directory)
    short = short_burn_in_warning(sweep)
    if short:
        log.warning("%s", short)
    reasons = explain(sweep, stored_before)  # before the plan is rewritten: it compares with the previous one
    plan = {} if args.dry_run else plan_texts(sweep, stored_before)  # a sweep beyond max_memory fails here
    log.debug("running %s", " ".join(cmd))
    env = {**os.environ, locking.LOCK_FD_ENV: str(lock.fileno()), VERBOSITY_ENV: str(verbosity)}
    env.update(_job_environment())
    env[PROGRESS_ENV] = progress_style(sweep, stored_before, args.cores)
    # only for a local run: extra Snakemake options (a profile, an executor, a dry run) may mean
    # jobs elsewhere or none; then each shard job uses a cluster of its own. Targets only choose
    # what is built here
    profile = profile_in_use(_snakefile())
    if profile:
        log.info("Snakemake uses the profile %s: each shard job starts a Dask cluster of its own, or uses the "
                 "scheduler or SLURM the config names", profile)
    plain = not args.dry_run and only_targets(args.snakemake_args) and not profile
    # a sweep with precision targets or an edge search runs one Snakemake per round, until a
    # round leaves nothing to simulate (no plan file changes); any other sweep runs once. A
    # plain run's rounds build the ensemble and fits only (the workflow's `fits` target: what
    # the next round is decided from), and one Snakemake more then builds the report and edge
    # summary of the last round, once.
    rounds_target = [ROUNDS_TARGET] if sweep.rounds and not args.dry_run and not args.snakemake_args else []
    with (lock, _stored_file(env) as stored_file, _run_cluster(sweep, env, start=bool(todo) and plain),
          _job_server(sweep, env, start=plain)):
        hand_over(env, stored_file, sweep.directory, hashes, stored_before)  # under the lock: Snakemake's to read
        for _ in range(_max_rounds(sweep) + 2):
            if verbosity >= 0:
                print(format_explanation(sweep, reasons, max_lines=20), file=sys.stderr)
            # the plan on disk is this config's before Snakemake starts (sgdsweep.sweep.plan: each
            # spec named by its content, so Snakemake's own records never decide what reruns)
            files = PlanFiles(sweep.directory)
            for path, text in plan.items():
                write_plan_file(files, path, text)
            code = _snakemake(cmd + rounds_target, lock, env, sweep, stored_file)
            if code != 0 or args.dry_run or not sweep.rounds:
                break
            sweep = load_sweep(args.config, device)  # the next round, decided from what this one stored
            hashes = [p.hash for p in sweep.points]
            stored = complete_points(PlanFiles(sweep.directory).points_dir, hashes)
            hand_over(env, stored_file, sweep.directory, hashes, stored)
            reasons = explain(sweep, stored)
            plan = plan_texts(sweep, stored)
            env[PROGRESS_ENV] = progress_style(sweep, stored, args.cores)
            if not any(_differs(path, text) for path, text in plan.items()):
                break
        if rounds_target and code == 0:
            code = _snakemake(cmd, lock, env, sweep, stored_file)
    if code < 0:  # Snakemake was killed: a run of the same command resumes where it stopped
        raise SgdsweepError(f"Snakemake was killed by signal {-code}; run the same command again to resume "
                            f"(stored points are kept, and only what is missing is computed)")
    if code == 0 and not args.dry_run:
        from sgdsweep.run.summary import run_summary

        print(run_summary(sweep, stored_before, time.monotonic() - t0), file=sys.stderr)
    return code


#: The workflow's target for a round of a precision sweep or an edge search: point stores,
#: ensemble and fits, no report (Snakefile).
ROUNDS_TARGET = "fits"


def only_targets(extra: Sequence[str]) -> bool:
    """Whether the extra Snakemake arguments of ``sgdsweep run`` (after ``--``) are all targets
    (``ensemble``, ``fits``; none at all included): no option, so the jobs run on this machine
    and use the run's own Dask cluster. An option (``--profile``, ``--executor``, ``-n``, ...)
    may put them elsewhere or run none."""
    return not any(a.startswith("-") for a in extra)


def profile_in_use(snakefile: Path) -> str | None:
    """The Snakemake profile a run's Snakemake would load unasked, or None: the one named by
    ``$SNAKEMAKE_PROFILE`` (but ``none``), or a workflow profile where Snakemake looks for one
    (``default`` or ``profiles/default`` in the working directory, ``profiles/default`` beside
    the Snakefile). A profile may put the jobs on other machines or run none, so the run then
    starts no Dask cluster of its own."""
    named = os.environ.get("SNAKEMAKE_PROFILE", "").strip()
    if named and named != "none":
        return f"{named} ($SNAKEMAKE_PROFILE)"
    for candidate in (Path("default"), Path("profiles") / "default", snakefile.parent / "profiles" / "default"):
        if candidate.exists():
            return f"{candidate} (a workflow profile)"
    return None


def no_color() -> bool:
    """Whether ``NO_COLOR`` asks for output without colour (any non-empty value, https://no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def snakemake_command(args: argparse.Namespace, config: Sequence[str], verbosity: int) -> list[str]:
    """The Snakemake command of ``sgdsweep run`` (``args``: its parsed arguments; ``config``:
    ``--config`` arguments; ``verbosity``: -1, 0 or 1).

    A run shows Snakemake's output through the logger plugin :data:`LOGGER_PLUGIN` (warnings and
    errors; everything with ``-v``; nothing after Ctrl-C) unless the extra Snakemake arguments
    name a logger of their own; a dry run shows Snakemake's plan (its job table and, but with
    ``-q``, each job and why) without the banner.
    """
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(_snakefile()), "--configfile",
           str(args.config), *config]
    extra = args.snakemake_args
    if args.dry_run:
        cmd.append("--dry-run")
        if verbosity <= 0:
            cmd += ["--quiet", "host"] + (["rules", "reason", "progress"] if verbosity < 0 else [])
    elif not any(a == "--logger" or a.startswith("--logger=") for a in extra):
        cmd += ["--logger", LOGGER_PLUGIN]
    if no_color():
        cmd.append("--nocolor")
    if verbosity > 0:
        cmd.append("--printshellcmds")
    # the sweep lock excludes every other run of this sweep, so Snakemake's own directory lock is
    # not needed, and what a killed run left incomplete is rerun: no manual --unlock after kill -9.
    # Last before the extra arguments: a target there is not read as a value of --quiet or --logger
    return [*cmd, "--cores", str(args.cores), "--nolock", "--rerun-incomplete", *extra]


def progress_style(sweep: Any, stored: set[str] | frozenset[str], cores: int) -> str:
    """What the shard jobs show on a terminal (:data:`sgdsweep.run.progress.PROGRESS_ENV`):
    ``bar`` (a line redrawn in place) when at most one shard job runs at a time, else ``lines``
    (two redrawn lines on one terminal would overwrite each other)."""
    busy = sum(1 for points in sweep.shards.values() if any(p.hash not in stored for p in points))
    return "bar" if busy <= 1 or cores <= 1 else "lines"


def _snakemake(cmd: list[str], lock: Any, env: dict[str, str], sweep: Any, stored: IO[bytes] | None) -> int:
    """Run Snakemake (``cmd``) under the sweep's ``lock`` and return its exit status; it inherits
    the lock and the file of ``stored`` points (:mod:`sgdsweep.sweep.stored`) where there is one."""
    from sgdsweep.run import locking

    fds = (lock.fileno(),) if stored is None else (lock.fileno(), stored.fileno())
    with subprocess.Popen(cmd, pass_fds=fds, env=env) as proc:
        locking.record_holder(Path(sweep.directory) / locking.LOCK_NAME, proc.pid)
        try:
            return proc.wait()
        except KeyboardInterrupt:  # Snakemake got the same Ctrl-C: let it stop its jobs first
            proc.wait()
            raise


def _max_rounds(sweep: Any) -> int:
    """Most rounds a sweep may run (0 without precision or search)."""
    cfg = sweep.config
    if "precision" in cfg:
        return int(cfg["precision"]["budget"]["max_rounds"])
    if "search" in cfg:
        return int(cfg["search"]["max_rounds"])
    return 0


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_text() != text
    except OSError:
        return True


def _job_environment() -> dict[str, str]:
    """PATH and PYTHONPATH for the Snakemake process of ``sgdsweep run`` and its jobs: ``python``
    is this interpreter, ``sgdsweep`` this package, installed or not, and Snakemake finds the
    logger plugin :data:`LOGGER_PLUGIN`."""
    here = Path(__file__).resolve()
    package_root, plugins = str(here.parents[2]), str(here.parent / "snakemake_plugins")
    return {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join(p for p in (package_root, plugins, os.environ.get("PYTHONPATH")) if p)}


@contextlib.contextmanager
def _stored_file(env: dict[str, str]) -> Iterator[IO[bytes] | None]:
    """A temporary file without a name for the run's stored points (:mod:`sgdsweep.sweep.stored`;
    None where none can be made: the stores are then opened by Snakemake too), closed, and
    unnamed in ``env``, after the block. It has no name, so nothing is left behind however the
    run ends."""
    from sgdsweep.sweep.stored import STORED_FD_ENV

    try:
        file = tempfile.TemporaryFile(prefix="sgdsweep-stored-")  # noqa: SIM115 - closed after the block
    except OSError:
        yield None
        return
    try:
        yield file
    finally:
        env.pop(STORED_FD_ENV, None)
        file.close()


@contextlib.contextmanager
def _job_server(sweep: Any, env: dict[str, str], start: bool) -> Iterator[None]:
    """The run's job server (:mod:`sgdsweep.run.jobserver`) for the block, when ``start`` (the jobs
    run on this machine): it starts while Snakemake builds the DAG, is named to the jobs in
    ``env``, and is stopped when the block ends in any way. A job that comes before it is ready
    runs by itself."""
    from sgdsweep.run.jobclient import JOB_SERVER_ENV
    from sgdsweep.run.jobserver import start_job_server, stop_job_server, supported
    from sgdsweep.sweep.plan import PlanFiles

    env.pop(JOB_SERVER_ENV, None)  # an enclosing run's server is not this run's
    if not (start and supported()):
        yield
        return
    proc, path = start_job_server(env, PlanFiles(sweep.directory).log("job-server"))
    env[JOB_SERVER_ENV] = str(path)
    try:
        yield
    finally:
        env.pop(JOB_SERVER_ENV, None)
        stop_job_server(proc, path)


@contextlib.contextmanager
def _run_cluster(sweep: Any, env: dict[str, str], start: bool) -> Iterator[None]:
    """The run's local Dask cluster for the block, when ``start`` and the sweep's shard jobs would
    use a local one (:mod:`sgdsweep.run.cluster`): started first (its workers boot while Snakemake
    builds the DAG), named to the jobs through the scheduler file's path and its number of
    workers in ``env``, and stopped
    when the block ends in any way."""
    from sgdsweep.run.cluster import (
        CLUSTER_WORKERS_ENV,
        SCHEDULER_FILE,
        SCHEDULER_FILE_ENV,
        start_run_cluster,
        stop_run_cluster,
    )
    from sgdsweep.sweep.execution import uses_local_cluster, worker_count
    from sgdsweep.sweep.plan import PlanFiles

    execution = sweep.config["execution"]
    for name in (SCHEDULER_FILE_ENV, CLUSTER_WORKERS_ENV):  # an enclosing run's cluster is not this run's
        env.pop(name, None)
    if not (start and uses_local_cluster(execution)):
        yield
        return
    from sgdsweep.run.gpus import local_cpu_workers, local_gpus

    cluster_dir = PlanFiles(sweep.directory).cluster_dir
    workers, gpus = local_cpu_workers(execution, worker_count(execution)), local_gpus(execution)
    log.info("starting a local Dask cluster of %d workers; it first compiles the simulation kernels "
             "(the first run of an installation: 1-3 min on a busy 2-core machine; later runs load them "
             "from numba's cache in seconds)", workers + gpus)
    proc = start_run_cluster(cluster_dir, workers, execution.get("host", "127.0.0.1"), gpus)
    env[SCHEDULER_FILE_ENV] = str(cluster_dir / SCHEDULER_FILE)
    env[CLUSTER_WORKERS_ENV] = str(workers + gpus)
    try:
        yield
    finally:
        stop_run_cluster(proc, cluster_dir)
