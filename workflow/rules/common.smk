# Shared set-up: validate the config, write the plan, set up the environment of the jobs.
import os
import sys

sys.path.insert(0, workflow.basedir)  # the package next to this Snakefile, installed or not

from snakemake.exceptions import WorkflowError

from sgdsweep.cluster import RUN_ID_ENV, stop_shared_cluster
from sgdsweep.config import build_sweep
from sgdsweep.errors import SgdsweepError
from sgdsweep.plan import write_plan

try:
    SWEEP = build_sweep(config)
except SgdsweepError as _exc:
    raise WorkflowError(f"invalid sweep configuration: {_exc}") from None
PLAN = write_plan(SWEEP)
SHARDS = sorted(SWEEP.shards)

# Jobs run `python -m sgdsweep ...` with this interpreter and this source tree.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
os.environ["PYTHONPATH"] = workflow.basedir + os.pathsep + os.environ.get("PYTHONPATH", "")
# One shared local Dask cluster per workflow run (started by the first shard job that needs it).
# Only for local execution: jobs on other hosts cannot watch this process.
if workflow.local_exec:
    os.environ.setdefault(RUN_ID_ENV, str(os.getpid()))


def _stop_cluster(log):
    if RUN_ID_ENV in os.environ:
        stop_shared_cluster(PLAN.cluster_dir, os.environ[RUN_ID_ENV])


onsuccess:
    _stop_cluster(log)


onerror:
    _stop_cluster(log)
