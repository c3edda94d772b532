# The plan: one spec per shard, and one each for aggregation, fits and the report, each named by
# its content (sgdsweep.sweep.plan.PlanFiles.by_content). A spec whose content changed is a file
# that does not exist yet: this rule writes it (and the readable copy plan/<name>.json, and
# removes the spec's other versions), and what reads it reruns. Nothing depends on Snakemake's
# records, so every entry point and working directory sees every change.
# The workflow's start (onstart, common.smk) writes each missing one to plan/staged/
# (sgdsweep.sweep.plan.stage_plan_files); the job only moves it into place: a shell command,
# not a Python process that would parse the whole workflow again.


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
    conda:
        "../../envs/sgdsweep.yaml"
    params:
        # the staged copy's path; for a file of no current spec, one that is never a file (a
        # trailing slash: a directory's path, if anything)
        staged=lambda wildcards, output: (
            str(PLAN.staged(output[0])) if output[0] in PLAN_BY_CONTENT else os.path.join(output[0], "")
        ),
        current=lambda wildcards, output: "yes" if output[0] in PLAN_BY_CONTENT else "no",
    shell:
        "if [ -f {params.staged:q} ]; then mv -f {params.staged:q} {output:q} && echo wrote {output:q} > {log:q};"
        " elif [ {params.current} = yes ]; then echo the copy of {output:q} staged when the run started,"
        " {params.staged:q}, is gone '(was plan/staged removed during the run?)': run again >&2; exit 1;"
        " else echo {output:q} is no spec of the current plan: ask for the results of the sweep"
        " '(snakemake default target)', not for a plan file by name >&2; exit 1; fi"
