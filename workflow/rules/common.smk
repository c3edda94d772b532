# Shared set-up: validate the config, say what would be simulated and why, and compute the plan
# in memory. Parsing writes nothing and changes no environment: when jobs are about to run
# (onstart) the sweep's lock is taken and the plan files are written, for the rules in plan.smk
# to move into place; `sgdsweep run` sets up the jobs' environment.
import os
import sys

from snakemake.exceptions import WorkflowError

from sgdsweep.errors import ConfigError, SgdsweepError
from sgdsweep.run import locking
from sgdsweep.run.cluster import SCHEDULER_FILE_ENV
from sgdsweep.sweep.execution import scheduler_address, uses_local_cluster, worker_count
from sgdsweep.sweep.config import build_sweep, check_place
from sgdsweep.core.paths import write_if_changed
from sgdsweep.run.progress import VERBOSITY_ENV
from sgdsweep.store.points import complete_points
from sgdsweep.sweep.explain import explain, format_explanation
from sgdsweep.sweep.plan import (
    PlanFiles,
    plan_texts,
    remove_other_versions,
    stage_plan_files,
)
from sgdsweep.sweep.schema import read_yaml
from sgdsweep.sweep.stored import read_stored

try:
    for _configfile in workflow.configfiles:  # read as `sgdsweep run` reads them: a repeated key or
        read_yaml(_configfile)  # a file that is not UTF-8 fails here too, not only through the CLI
    SWEEP = build_sweep(config)
    check_place(SWEEP)  # not inside another sweep's directory
    locking.check_writable(SWEEP.directory)  # without writing: a blocked path or a read-only mount
    scheduler_address(SWEEP.config["execution"])  # a bad SGDSWEEP_SCHEDULER fails here, before any job
    PLAN = PlanFiles(SWEEP.directory)
    # which points are stored: as `sgdsweep run` found them under the lock it holds, else each store opened once
    _hashes = [p.hash for p in SWEEP.points]
    STORED = read_stored(SWEEP.directory, PLAN.points_dir, _hashes) if workflow.is_main_process else None
    if STORED is None:
        STORED = complete_points(PLAN.points_dir, _hashes)
    if workflow.is_main_process and VERBOSITY_ENV not in os.environ:  # sgdsweep run has said it
        print(format_explanation(SWEEP, explain(SWEEP, STORED), max_lines=20), file=sys.stderr)
    PLAN_TEXTS = {str(path): text for path, text in plan_texts(SWEEP, STORED).items()}
    # what the jobs read: each spec under its name by content (sgdsweep.sweep.plan); a changed
    # spec is a missing file, which the plan rule writes and which then reruns what reads it
    PLAN_INPUT = {path: str(PLAN.by_content(path, text)) for path, text in PLAN_TEXTS.items()}
    PLAN_BY_CONTENT = {PLAN_INPUT[path]: path for path in PLAN_TEXTS}
    # the jobs' records name the spec version they ran: a record of another version is no record
    SHARD_VERSIONS = [
        PLAN.version(PLAN.shard_spec(s), PLAN_TEXTS[str(PLAN.shard_spec(s))]) for s in sorted(SWEEP.shards)
    ]
    SHARD_RECEIPTS = [str(PLAN.shard_receipt(version)) for version in SHARD_VERSIONS]
    DONE = {
        job: str(PLAN.done(job, spec, PLAN_TEXTS[str(spec)]))
        for job, spec in (
            ("aggregate", PLAN.sweep_spec),
            ("fit", PLAN.fit_spec),
            ("report", PLAN.report_spec),
            ("edge", PLAN.report_spec),
        )
    }
except ConfigError as _exc:
    raise WorkflowError(f"invalid sweep configuration: {_exc}") from None
except SgdsweepError as _exc:
    raise WorkflowError(str(_exc)) from None
# The cores of a shard job (rule simulate's threads; Snakemake lowers them to --cores, and the job
# starts a cluster of at most that many workers): its own cluster's workers (execution.workers,
# auto: this machine's cores), or one where the job submits to a cluster it does not start (the
# run's shared cluster under `sgdsweep run`, a named scheduler, SLURM).
_OWN_CLUSTER = uses_local_cluster(SWEEP.config["execution"]) and not os.environ.get(SCHEDULER_FILE_ENV, "").strip()
SIMULATE_THREADS = max(1, worker_count(SWEEP.config["execution"])) if _OWN_CLUSTER else 1
# a sweep with fit targets keeps each round's fits (sgdsweep.sweep.precision reads them back)
FIT_ARCHIVE = ["--archive", str(PLAN.fit_archive)] if SWEEP.config.get("precision", {}).get("fits") else []
SWEEP_LOCK = []  # the lock held while this run's jobs run


# One run per sweep: a kernel lock that dies with this process (never stale after kill -9),
# inherited from `sgdsweep run` when it started this Snakemake process. Then the execution
# settings, which are no job's input (they never change results), for the shard jobs to read, and
# the plan files whose version is missing, for the plan jobs to move into place.
onstart:
    try:
        SWEEP_LOCK.append(locking.acquire_or_inherit(SWEEP.directory))
    except SgdsweepError as exc:
        raise WorkflowError(str(exc)) from None
    write_if_changed(PLAN.execution_spec, PLAN_TEXTS[str(PLAN.execution_spec)])
    remove_other_versions(PLAN, set(DONE.values()))
    stage_plan_files(PLAN, PLAN_TEXTS)  # for the plan jobs to move into place
