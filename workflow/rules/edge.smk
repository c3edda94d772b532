# An edge search's result: results/<sweep>/edge.json, per combination of the other axes the
# measured bracket of the almost-sure edge beside the exact mean-square edge
# (sgdsweep.sweep.search.edge_summary), from the rounds recorded in plan/report.json.
EDGE_TARGETS = [str(PLAN.edge), DONE["edge"]] if "search" in SWEEP.config else []


localrules:
    edge,


rule edge:
    input:
        spec=PLAN_INPUT[str(PLAN.report_spec)],
    output:
        str(PLAN.edge),
        touch(DONE["edge"]),
    log:
        str(PLAN.log("edge")),
    run:
        from sgdsweep.sweep.search import write_edge_summary

        write_edge_summary(input.spec, output[0], log[0])
