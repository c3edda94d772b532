# One job per shard (points sharing data); inside, the points run as Dask tasks.


rule simulate:
    input:
        spec=str(PLAN.root / "plan" / "shards" / "{shard}.json"),
    output:
        receipt=str(PLAN.root / "shards" / "{shard}.json"),
    log:
        str(PLAN.root / "logs" / "simulate" / "{shard}.log"),
    params:
        execution=str(PLAN.execution_spec),
        cluster_dir=str(PLAN.cluster_dir),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep simulate-shard {input.spec} --receipt {output.receipt}"
        " --execution {params.execution} --cluster-dir {params.cluster_dir} --log {log}"
