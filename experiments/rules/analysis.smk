# Raw records -> tidy tables -> published-vs-reproduced comparison -> tables and figures (with report
# captions). The table and figure rules come from what analysis/papers/<paper>.py registers.

from analysis.figures import FIGURE_REGISTRY
from analysis.tables import TABLE_REGISTRY

# Every figure registered with @figure(paper=...), in its paper's folder.
FIGURES = [f"{RESULTS}/figures/{fig.paper}/{name}.png" for name, fig in FIGURE_REGISTRY.items()]
# Every table registered with @table(paper=..., file=...): name -> results/tables/<file>.csv.
TABLES = {name: f"{RESULTS}/tables/{table.file}.csv" for name, table in TABLE_REGISTRY.items()}


rule collect:
    """Every raw record of this run into tidy CSV tables (one row per point x metric, and samples)."""
    input:
        RAW_RECORDS,
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


rule fitted_settings:
    """Each paper's testbed fitted to its baseline rows (analysis.fit), as a config layer its at-fit
    rules simulate the paper on (the second stage: experiments/rules/common.smk)."""
    input:
        records=rules.collect.output.records,
        samples=rules.collect.output.samples,
        registry="analysis/published.yaml",
    output:
        [fitted_layer(paper) for paper in AT_FIT_PAPERS],
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/fitted_settings.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.compare --records {input.records:q} --samples {input.samples:q} "
        "--fitted-settings {output:q}"


rule collect_at_fit:
    """The records of the runs at the fitted testbeds into tables of their own."""
    input:
        AT_FIT_RECORDS,
    output:
        records=f"{RESULTS}/tables/records_at_fit.csv",
        samples=f"{RESULTS}/tables/samples_at_fit.csv",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/collect_at_fit.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.collect --out-records {output.records:q} --out-samples {output.samples:q} {input:q}"


rule compare:
    """Published numbers (analysis/published.yaml) next to ours, with verdicts at each paper's testbed
    fitted to its baseline rows (analysis.fit) and simulated there, and the fits."""
    input:
        records=rules.collect.output.records,
        samples=rules.collect.output.samples,
        at_fit_records=rules.collect_at_fit.output.records,
        at_fit_samples=rules.collect_at_fit.output.samples,
        registry="analysis/published.yaml",
    output:
        # The comparison, the verdicts per paper and the fits are in the report as their HTML pages (rule
        # report_pages): the report's view of a CSV downloads it instead of showing it.
        comparison=f"{RESULTS}/tables/comparison.csv",
        summary=f"{RESULTS}/tables/verdict_summary.csv",
        fits=f"{RESULTS}/tables/testbed_fit.csv",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/compare.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.compare --records {input.records:q} --samples {input.samples:q} "
        "--out {output.comparison:q} --summary {output.summary:q} --fits {output.fits:q} "
        "--at-fit {input.at_fit_records:q} {input.at_fit_samples:q}"


rule report_pages:
    """The report's own pages: the comparison, the verdicts per paper and the testbed fits as sortable HTML,
    which the report opens inline, and the run's facts (commits, testbeds, verdict counts), which its
    landing page (analysis/captions/landing.rst) includes."""
    input:
        comparison=rules.compare.output.comparison,
        summary=rules.compare.output.summary,
        fits=rules.compare.output.fits,
        records=RAW_RECORDS,
    output:
        comparison=report(
            f"{RESULTS}/report/comparison.html",
            caption="../../analysis/captions/comparison.rst",
            category="Published vs reproduced",
        ),
        summary=report(
            f"{RESULTS}/report/verdict_summary.html",
            caption="../../analysis/captions/verdict_summary.rst",
            category="Published vs reproduced",
        ),
        fits=report(
            f"{RESULTS}/report/testbed_fit.html",
            caption="../../analysis/captions/testbed_fit.rst",
            category="Published vs reproduced",
        ),
        facts=report(
            f"{RESULTS}/report/run.rst",
            caption="../../analysis/captions/run_facts.rst",
            category="Published vs reproduced",
        ),
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/report_pages.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.report --comparison {input.comparison:q} --summary {input.summary:q} "
        "--out-comparison {output.comparison:q} --out-summary {output.summary:q} --out-facts {output.facts:q} "
        "--fits {input.fits:q} --out-fits {output.fits:q} {input.records:q}"


rule wandb_analysis:
    """The run's analysis as one W&B run in the run's group: the verdicts and the comparison as tables,
    every figure as an image (analysis/tracking.py); offline unless the config or WANDB_MODE says
    otherwise, nothing when disabled."""
    input:
        config=RESOLVED_CONFIG,
        summary=rules.compare.output.summary,
        comparison=rules.compare.output.comparison,
        figures=FIGURES,
    output:
        f"{RESULTS}/wandb/analysis.json",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/wandb_analysis.log",
    localrule: True
    shell:
        "logged {log:q} python -m analysis.tracking --config {input.config:q} --summary {input.summary:q} "
        "--comparison {input.comparison:q} --out {output:q} {input.figures:q}"


# The table a figure reads when it is not drawn from the tidy tables (analysis.registry.FIGURE_SOURCES).
FIGURE_TABLES = {"validation": rules.validate.output[0], "comparison": rules.compare.output.comparison}


# One rule per table and one per figure (loops, not copies): report captions cannot take wildcards.
for _name, _table in TABLE_REGISTRY.items():

    rule:
        name:
            f"table_{_table.file}"
        input:
            records=rules.collect.output.records,
            at_fit=rules.collect_at_fit.output.records,
        output:
            csv=TABLES[_name],
            # in the report as its HTML page: the report's view of a CSV downloads it instead of showing it
            html=report(
                f"{RESULTS}/report/tables/{_table.file}.html",
                caption=f"../../analysis/captions/{_table.file}_table.rst",
                category=_table.category,
            ),
        params:
            name=_name,
        conda:
            "../../environment.yml"
        log:
            f"{RESULTS}/logs/table_{_table.file}.log",
        localrule: True
        shell:
            "logged {log:q} python -m analysis.tables --records {input.records:q} --at-fit {input.at_fit:q} "
            "--table {params.name:q} --out {output.csv:q} --out-html {output.html:q}"



# One rule per paper and source table draws all of that paper's figures in one process: the plotting
# stack's import and the tables' read are most of a figure's time. Each figure keeps its own caption.
# Figures and tables read the runs at the papers' fitted testbeds too: they draw what the verdicts score
# (analysis.collect.as_judged). A paper whose figures draw their verdicts' ranges (``judged`` figures)
# has its figures read the comparison as well, so its rule waits for rule compare.
FIGURE_GROUPS = {}  # rule name -> (paper, source table, the names of its figures)
for _name, _figure in FIGURE_REGISTRY.items():
    _rule = f"figures_{_figure.paper}" + ("" if _figure.reads == "tables" else f"_{_figure.reads}")
    FIGURE_GROUPS.setdefault(_rule, (_figure.paper, _figure.reads, []))[2].append(_name)


for _rule, (_paper, _reads, _names) in FIGURE_GROUPS.items():
    _pngs = [f"{RESULTS}/figures/{_paper}/{name}.png" for name in _names]
    _source = "comparison" if any(FIGURE_REGISTRY[name].judged for name in _names) else _reads

    rule:
        name:
            _rule
        input:
            records=rules.collect.output.records,
            samples=rules.collect.output.samples,
            at_fit_records=rules.collect_at_fit.output.records,
            at_fit_samples=rules.collect_at_fit.output.samples,
            table=FIGURE_TABLES.get(_source, []),
        output:
            png=[
                report(png, caption=f"../../analysis/captions/{name}.rst", category="Figures", subcategory=_paper)
                for name, png in zip(_names, _pngs)
            ],
            pdf=[png.removesuffix(".png") + ".pdf" for png in _pngs],
        # Only the table a figure reads besides the tidy tables is a param: the report lists a job's
        # params under every figure's caption. The figures are named by their outputs (<figure>.png).
        params:
            table=quoted([f"--{_source}", FIGURE_TABLES[_source]]) if _source != "tables" else "",
        conda:
            "../../environment.yml"
        log:
            f"{RESULTS}/logs/{_rule}.log",
        localrule: True
        shell:
            "logged {log:q} python -m analysis.figures --records {input.records:q} --samples {input.samples:q} "
            "--at-fit {input.at_fit_records:q} {input.at_fit_samples:q} {params.table} --out {output.png:q}"
