# All point stores of the sweep → one xarray/Zarr ensemble.
# update(): Snakemake keeps the existing ensemble while the job runs (and puts it back if the job
# fails) instead of deleting it first; the job replaces it atomically once the new one is whole.


rule aggregate:
    input:
        sweep=str(PLAN.sweep_spec),
        receipts=expand(str(PLAN.root / "shards" / "{shard}.json"), shard=SHARDS),
    output:
        ensemble=update(directory(str(PLAN.ensemble))),
    log:
        str(PLAN.root / "logs" / "aggregate.log"),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep aggregate {input.sweep} --out {output.ensemble} --log {log}"
