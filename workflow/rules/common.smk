# Shared set-up: validate the config, write the plan, set up the environment of the jobs.
import os
import sys

sys.path.insert(0, workflow.basedir)  # the package next to this Snakefile, installed or not

from snakemake.exceptions import WorkflowError

from sgdsweep.run import locking
from sgdsweep.run.cluster import RUN_ID_ENV, current_run_id, scheduler_address, stop_shared_cluster
from sgdsweep.sweep.config import build_sweep, check_place
from sgdsweep.errors import ConfigError, SgdsweepError
from sgdsweep.sweep.plan import PlanFiles, explain, format_explanation, write_plan
from sgdsweep.run.progress import VERBOSITY_ENV
from sgdsweep.sweep.schema import read_yaml
from sgdsweep.run.snakemake_state import clear_stale_state

try:
    for _configfile in workflow.configfiles:  # read as `sgdsweep run` reads them: a repeated key or
        read_yaml(_configfile)  # a file that is not UTF-8 fails here too, not only through the CLI
    SWEEP = build_sweep(config)
    check_place(SWEEP)  # not inside another sweep's directory, before anything is written there
    scheduler_address(SWEEP.config["execution"])  # a bad SGDSWEEP_SCHEDULER fails here, before any job
    if workflow.is_main_process:
        # One run per sweep: a kernel lock that dies with this process (never stale after kill -9).
        _SWEEP_LOCK = locking.acquire_or_inherit(SWEEP.directory)
        # Holding it proves no live run owns this sweep: drop what a killed run left behind.
        clear_stale_state(os.getcwd(), SWEEP.directory)
        if os.environ.get(VERBOSITY_ENV) != "-1":  # sgdsweep run -q
            print(format_explanation(SWEEP, explain(SWEEP), max_lines=20), file=sys.stderr)
        PLAN = write_plan(SWEEP)
    else:  # a job re-parsing the workflow (cluster executors): the main process owns the plan
        PLAN = PlanFiles(SWEEP.directory)
except ConfigError as _exc:
    raise WorkflowError(f"invalid sweep configuration: {_exc}") from None
except SgdsweepError as _exc:
    raise WorkflowError(str(_exc)) from None
SHARDS = sorted(SWEEP.shards)

# Jobs run `python -m sgdsweep ...` with this interpreter and this source tree.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
os.environ["PYTHONPATH"] = workflow.basedir + os.pathsep + os.environ.get("PYTHONPATH", "")
# One shared local Dask cluster per workflow run (started by the first shard job that needs it);
# jobs on other hosts (cluster executors) see another host name and use a cluster of their own.
os.environ.setdefault(RUN_ID_ENV, current_run_id())


def _stop_cluster(log):
    if RUN_ID_ENV in os.environ:
        stop_shared_cluster(PLAN.cluster_dir, os.environ[RUN_ID_ENV])


onsuccess:
    _stop_cluster(log)


onerror:
    _stop_cluster(log)
