# Raw records -> tidy tables -> published-vs-reproduced comparison -> figures (with report captions).

from analysis.figures import FIGURE_REGISTRY

# Every figure that analysis/papers/<paper>.py registers with @figure(paper=...), in its paper's folder.
FIGURES = [f"{RESULTS}/figures/{fig.paper}/{name}.png" for name, fig in FIGURE_REGISTRY.items()]


rule collect:
    """Every raw record of this run into tidy CSV tables (one row per point x metric, and samples)."""
    input:
        TRAIN_RECORDS,
        COLLECTIVE_RECORDS,
        SIM_RECORDS,
        AURORA_SIM_RECORDS,
        AURORA_A2A_RECORDS,
        INFERENCE_RECORDS,
        LINA_SIM_INFERENCE_RECORDS,
        MONTA_A2A_RECORDS,
        MONTA_MODEL_RECORDS,
        DISPATCHER_RECORDS,
        DISPATCHER_SIM_RECORDS,
        AXONN_GRID_RECORDS,
        AXONN_SIM_RECORDS,
        GSHARD_SIM_RECORDS,
        EXTERNAL_RECORDS,
        EXTERNAL_STEP_RECORDS,
    output:
        records=f"{RESULTS}/tables/records.csv",
        samples=f"{RESULTS}/tables/samples.csv",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/collect.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.collect --out-records {output.records:q} --out-samples {output.samples:q} {input:q}"


rule compare:
    """Published numbers (analysis/published.yaml) next to ours, with verdicts."""
    input:
        records=rules.collect.output.records,
        samples=rules.collect.output.samples,
        registry="analysis/published.yaml",
    output:
        comparison=report(
            f"{RESULTS}/tables/comparison.csv",
            caption="../../analysis/captions/comparison.rst",
            category="Published vs reproduced",
        ),
        summary=report(
            f"{RESULTS}/tables/verdict_summary.csv",
            caption="../../analysis/captions/verdict_summary.rst",
            category="Published vs reproduced",
        ),
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/compare.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.compare --records {input.records:q} --samples {input.samples:q} "
        "--out {output.comparison:q} --summary {output.summary:q}"


# One rule per figure (a loop, not copies): report captions cannot take wildcards.
for _name, _figure in FIGURE_REGISTRY.items():

    rule:
        name:
            f"figure_{_name}"
        input:
            records=rules.collect.output.records,
            samples=rules.collect.output.samples,
            validation=rules.validate.output[0] if _figure.reads_validation else [],
        output:
            png=report(
                f"{RESULTS}/figures/{_figure.paper}/{_name}.png",
                caption=f"../../analysis/captions/{_name}.rst",
                category="Figures",
                subcategory=_figure.paper,
            ),
            pdf=f"{RESULTS}/figures/{_figure.paper}/{_name}.pdf",
        params:
            name=_name,
            validation=lambda wc, input: quoted(["--validation", input.validation]) if input.validation else "",
        conda:
            "../../environment.yml"
        log:
            f"{RESULTS}/logs/figure_{_name}.log",
        localrule: True
        shell:
            "logged {log:q} python -m analysis.figures --records {input.records:q} --samples {input.samples:q} "
            "{params.validation} --figure {params.name:q} --out {output.png:q}"
