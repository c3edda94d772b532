# One job per shard (points sharing data); inside, the points run as Dask tasks. The wildcard is
# the shard's spec version, <shard>.<digest>: its receipt names the spec it ran.
# The execution settings never change results: they are no input (an edit of them, workers say,
# reruns nothing) but a file written before the jobs start (common.smk's onstart).


rule simulate:
    input:
        spec=str(PLAN.root / "plan" / "by-content" / "shards" / "{version}.json"),
    output:
        receipt=str(PLAN.root / "shards" / "{version}.json"),
    log:
        str(PLAN.shard_log("{version}")),
    wildcard_constraints:
        version="[0-9a-f]+[.][0-9a-f]{16}",
    params:
        execution=str(PLAN.execution_spec),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep simulate-shard {input.spec} --receipt {output.receipt}"
        " --execution {params.execution} --log {log}"
