# One job per shard (points sharing data); inside, the points run as Dask tasks.
# The execution settings never change results: ancient() keeps an edit of them (workers, say)
# from rerunning the shards.


rule simulate:
    input:
        spec=str(PLAN.root / "plan" / "shards" / "{shard}.json"),
        execution=ancient(str(PLAN.execution_spec)),
    output:
        receipt=str(PLAN.root / "shards" / "{shard}.json"),
    log:
        str(PLAN.root / "logs" / "simulate" / "{shard}.log"),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep simulate-shard {input.spec} --receipt {output.receipt}"
        " --execution {input.execution} --log {log}"
