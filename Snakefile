# sgdsweep workflow: config → shards → Dask → Zarr → ensemble → fits → report.
# The logic lives in the sgdsweep package; this file only wires the rules together.
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


# The default sweep is read only when the command line gives no config: `--configfile X` runs the
# sweep X alone, rather than X merged into the default one (Snakemake puts a config given on the
# command line into `config` before it reads this file).
if not config:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/edge.smk"


# Every result, not only the report: a deleted ensemble or fits file is rebuilt from what
# is stored, and every job whose spec changed reruns (Snakemake would not rerun a job only
# because an intermediate file is gone).
rule all:
    default_target: True
    input:
        str(PLAN.ensemble_receipt),
        str(PLAN.fits),
        str(PLAN.report),
        SHARD_RECEIPTS,  # each job's record of the spec version it ran: a missing one is rerun
        DONE["aggregate"],
        DONE["fit"],
        DONE["report"],
        EDGE_TARGETS,


# Only the point stores and the ensemble (no fits, no report): `snakemake ensemble`. Like `all`,
# it asks for every shard's receipt, so a deleted or damaged store is simulated again.
rule ensemble:
    input:
        str(PLAN.ensemble_receipt),
        SHARD_RECEIPTS,
        DONE["aggregate"],


# The point stores, the ensemble and the fits (no report, no edge summary): `snakemake fits`.
# `sgdsweep run` builds a precision sweep's or an edge search's rounds with it, and the report
# once, after the last round.
rule fits:
    input:
        str(PLAN.ensemble_receipt),
        str(PLAN.fits),
        SHARD_RECEIPTS,
        DONE["aggregate"],
        DONE["fit"],
