# The self-contained HTML report.


rule report:
    input:
        ensemble=str(PLAN.ensemble),
        fits=str(PLAN.fits),
        spec=str(PLAN.report_spec),
    output:
        report=report(str(PLAN.report), caption="../report/report.rst", category="Report"),
    log:
        str(PLAN.root / "logs" / "report.log"),
    conda:
        "../../envs/sgdsweep.yaml"
    shell:
        "python -m sgdsweep report --ensemble {input.ensemble} --fits {input.fits}"
        " --spec {input.spec} --out {output.report} --log {log}"
