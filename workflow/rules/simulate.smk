# One job per shard (points sharing data); inside, the points run as Dask tasks. The wildcard is
# the shard's spec version, <shard>.<digest>: its receipt names the spec it ran.
# The execution settings never change results: they are no input (an edit of them, workers say,
# reruns nothing) but a file written before the jobs start (common.smk's onstart).


rule simulate:
    input:
        spec=str(PLAN.by_content_file("shards/{version}")),
    output:
        receipt=str(PLAN.shard_receipt("{version}")),
    log:
        str(PLAN.shard_log("{version}")),
    wildcard_constraints:
        version="[0-9a-f]+[.][0-9a-f]{16}",
    conda:
        "../../envs/sgdsweep.yaml"
    threads: SIMULATE_THREADS
    params:
        execution=str(PLAN.execution_spec),
    shell:
        "python -m sgdsweep simulate-shard {input.spec:q} --receipt {output.receipt:q}"
        " --execution {params.execution:q} --threads {threads} --log {log:q}"
