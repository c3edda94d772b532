# All point stores of the sweep → one xarray/Zarr ensemble.
# The rule's output is a receipt, not the ensemble: the job replaces the ensemble atomically once
# the new one is whole, so the previous one stays while it runs, if it fails, and if Snakemake
# itself is killed; then it writes the receipt. A deleted ensemble is rebuilt: the plan's
# sweep.json then changes (sgdsweep.sweep.plan.plan_texts).


rule aggregate:
    input:
        sweep=PLAN_INPUT[str(PLAN.sweep_spec)],
        receipts=SHARD_RECEIPTS,
    output:
        receipt=str(PLAN.ensemble_receipt),
        done=touch(DONE["aggregate"]),
    log:
        str(PLAN.log("aggregate")),
    conda:
        "../../envs/sgdsweep.yaml"
    params:
        ensemble=str(PLAN.ensemble),
    shell:
        "python -m sgdsweep aggregate {input.sweep:q} --out {params.ensemble:q} --receipt {output.receipt:q} --log {log:q}"
