# The plan: one spec per shard, and one each for aggregation, fits, report and execution.
# Each file's content is its rule's params: Snakemake reruns a rule whose params changed, so a
# file is rewritten only when its content changes, and only the jobs that depend on it rerun.
from sgdsweep.sweep.paths import atomic_write_text


localrules:
    shard_plan,
    plan_file,


rule shard_plan:
    output:
        str(PLAN.root / "plan" / "shards" / "{shard}.json"),
    log:
        str(PLAN.root / "logs" / "plan" / "shards" / "{shard}.log"),
    params:
        content=lambda wildcards: PLAN_TEXTS[str(PLAN.shard_spec(wildcards.shard))],
    run:
        atomic_write_text(output[0], params.content)
        atomic_write_text(log[0], f"wrote {output[0]} ({len(params.content)} characters)\n")


rule plan_file:
    output:
        str(PLAN.root / "plan" / "{name}.json"),
    log:
        str(PLAN.root / "logs" / "plan" / "{name}.log"),
    wildcard_constraints:
        name="sweep|fit|report|execution",
    params:
        content=lambda wildcards: PLAN_TEXTS[str(PLAN.root / "plan" / f"{wildcards.name}.json")],
    run:
        atomic_write_text(output[0], params.content)
        atomic_write_text(log[0], f"wrote {output[0]} ({len(params.content)} characters)\n")
