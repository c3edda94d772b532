# sgdsweep workflow: config → shards → Dask → Zarr → ensemble → fits → report.
# The logic lives in the sgdsweep package; this file only wires the rules together.
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"

if not workflow.overwrite_configfiles:  # `--configfile X` replaces the default sweep, not merges into it

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/simulate.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        PLAN.report,
    default_target: True
