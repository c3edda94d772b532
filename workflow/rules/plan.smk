# The plan: one spec per shard, and one each for aggregation, fits and the report, each named by
# its content (sgdsweep.sweep.plan.PlanFiles.by_content). A spec whose content changed is a file
# that does not exist yet: this rule writes it (and the readable copy plan/<name>.json, and
# removes the spec's other versions), and what reads it reruns. Nothing depends on Snakemake's
# records, so every entry point and working directory sees every change.
from sgdsweep.sweep.plan import write_plan_job


localrules:
    plan_file,


rule plan_file:
    output:
        str(PLAN.by_content_file("{name}.{digest}")),
    log:
        str(PLAN.log("plan/{name}.{digest}")),
    wildcard_constraints:
        name="shards/[0-9a-f]+|sweep|fit|report",
        digest="[0-9a-f]{16}",
    params:
        path=lambda wildcards, output: PLAN_BY_CONTENT.get(output[0], ""),
    run:
        write_plan_job(PLAN, params.path, PLAN_TEXTS.get(params.path), output[0], log[0])
