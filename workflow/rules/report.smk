# The self-contained HTML report; its figures also as PNG files for `snakemake --report`.


rule report:
    input:
        receipt=str(PLAN.ensemble_receipt),
        fits=str(PLAN.fits),
        spec=PLAN_INPUT[str(PLAN.report_spec)],
    output:
        done=touch(DONE["report"]),
        report=report(str(PLAN.report), caption="../report/report.rst", category="Report"),
        figures=report(
            directory(str(PLAN.figures)),
            patterns=["{name}.png"],
            caption="../report/figure.rst",
            category="Figures",
        ),
    log:
        str(PLAN.log("report")),
    conda:
        "../../envs/sgdsweep.yaml"
    threads: 4  # processes drawing the figures (Snakemake lowers it to --cores)
    params:
        ensemble=str(PLAN.ensemble),
        cache=str(PLAN.figure_cache),
    shell:
        "python -m sgdsweep report --ensemble {params.ensemble:q} --fits {input.fits:q}"
        " --spec {input.spec:q} --out {output.report:q} --figures {output.figures:q} --jobs {threads}"
        " --figure-cache {params.cache:q} --log {log:q}"
