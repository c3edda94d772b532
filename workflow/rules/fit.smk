# Scaling-law fits on the ensemble.


rule fit:
    input:
        ensemble=str(PLAN.ensemble),
        spec=str(PLAN.fit_spec),
    output:
        fits=report(str(PLAN.fits), caption="../report/fits.rst", category="Fits"),
    log:
        str(PLAN.root / "logs" / "fit.log"),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep fit {input.ensemble} --spec {input.spec} --out {output.fits} --log {log}"
