# Scaling-law fits on the ensemble.


rule fit:
    input:
        receipt=str(PLAN.ensemble_receipt),
        spec=PLAN_INPUT[str(PLAN.fit_spec)],
    output:
        done=touch(DONE["fit"]),
        fits=report(str(PLAN.fits), caption="../report/fits.rst", category="Fits"),
    log:
        str(PLAN.log("fit")),
    conda:
        "../../envs/sgdsweep.yaml"
    params:
        ensemble=str(PLAN.ensemble),
        archive=FIT_ARCHIVE,
        cache=str(PLAN.fit_cache),
    shell:
        "python -m sgdsweep fit {params.ensemble:q} --spec {input.spec:q} --out {output.fits:q} {params.archive:q}"
        " --fit-cache {params.cache:q} --log {log:q}"
