# All point stores of the sweep → one xarray/Zarr ensemble.
# The rule's output is a receipt, not the ensemble: the job replaces the ensemble atomically once
# the new one is whole, so the previous one stays while it runs, if it fails, and if Snakemake
# itself is killed; then it writes the receipt. A deleted ensemble is rebuilt: the plan's
# sweep.json then changes (sgdsweep.sweep.plan.plan_texts).


rule aggregate:
    input:
        sweep=str(PLAN.sweep_spec),
        receipts=expand(str(PLAN.root / "shards" / "{shard}.json"), shard=SHARDS),
    output:
        receipt=str(PLAN.ensemble_receipt),
    log:
        str(PLAN.root / "logs" / "aggregate.log"),
    conda:
        "../../envs/sgdsweep.yaml"
    params:
        ensemble=str(PLAN.ensemble),
    shell:
        "python -m sgdsweep aggregate {input.sweep} --out {params.ensemble} --receipt {output.receipt} --log {log}"
