"""MoE communication benchmark suite: measured sweeps -> tables -> figures -> report.

    snakemake --cores 2                                  # embedded default (configs/default.yaml)
    snakemake --cores 2 --configfile configs/ci.yaml     # smallest smoke run
    snakemake --cores 2 --config 'train={iters: 20}'     # any key of moe_core/schema/core.py (YAML)
"""

from pathlib import Path

from moe_core.config.load import ConfigError, load_config, load_yaml, refuse_templates, save_config
from moe_core.papers import PAPERS, RECORD_FOLDERS
from moe_core.schema.points import POINT_NAME_PATTERN
from moe_core.records.results import ResultsDirError, check_results_dir

from snakemake.utils import min_version

min_version("9.0")


configfile: "configs/default.yaml"


# The report's landing page: what was run and how to read a verdict, with the run's facts (rule report_pages).
report: "analysis/captions/landing.rst"


try:
    # Snakemake has parsed its config files before this line runs, without the loader's limits (a
    # file's size, its nesting, what its aliases expand to): read each again as the loader reads one,
    # before anything walks `config`, which a file over them would hang or overflow the stack of.
    for _configfile in workflow.configfiles:
        load_yaml(Path(_configfile))
    # Config files are trusted code: Snakemake evaluates a YTE template (`__use_yte__: true`) as
    # Python when it reads the file, before this line runs. Refuse to go on with one.
    refuse_templates(workflow.overwrite_configfiles)
    # The structured schema (the core's sections and every paper's) is the single source of truth:
    # bad keys or values stop here, before any job.
    CFG = load_config(data=config)
    check_results_dir(CFG.results_dir)
except (ConfigError, ResultsDirError) as err:
    raise ValueError(f"invalid configuration: {err}") from None

RESULTS = CFG.results_dir


# Wildcards match only what the workflow can make: a registered paper's folder, a point name
# without a path separator; no requested target resolves outside results_dir.
wildcard_constraints:
    paper="|".join(RECORD_FOLDERS),
    point=POINT_NAME_PATTERN,


# Every rule's shell command is `logged {log:q} <command>`: its output goes to the rule's log and,
# when it fails, the log's last lines also go to Snakemake's own stderr, so the line that names a
# failed rank or a bad key shows where Snakemake reports the failed job, not only inside the log.
# (The prefix replaces Snakemake's default one, bash strict mode, which it keeps.)
shell.prefix(
    "set -euo pipefail; "
    'logged() {{ local log=$1; shift; "$@" > "$log" 2>&1 || {{ local status=$?; tail -n 3 "$log" >&2; return $status; }}; }}; '
)


include: "experiments/rules/common.smk"


rule resolved_config:
    """The run's validated, fully resolved config, which every job reads (experiments/rules/common.smk)."""
    output:
        RESOLVED_CONFIG,
    log:
        f"{RESULTS}/logs/resolved_config.log",
    localrule: True
    run:
        save_config(CFG, output[0])
        Path(log[0]).write_text(f"{output[0]}: the resolved config of this run\n")


# The paper-neutral experiments first (their record lists and rules are what papers' rules build on:
# the measured training-step sweep, the collectives, the simulator and its calibration, the
# dispatchers), then one rules file per registered paper (moe_core.papers), then the analysis, whose
# table and figure rules come from the analysis registries.
include: "experiments/rules/train_step.smk"
include: "experiments/rules/collectives.smk"
include: "experiments/rules/simulator.smk"
include: "experiments/rules/dispatchers.smk"


for _paper in PAPERS:

    include: f"experiments/rules/{_paper}.smk"


include: "experiments/rules/analysis.smk"


rule all:
    default_target: True
    input:
        rules.compare.output,
        rules.report_pages.output,
        rules.wandb_analysis.output,
        rules.validate.output,
        TABLES.values(),
        FIGURES,


# `snakemake plan`: what the config's measured jobs ask of a cluster (jobs, nodes, GPUs each, GPU-hours at
# most), before anything is submitted; it runs nothing else.
rule plan:
    """What the config's measured jobs ask of a cluster, on the console and in its log."""
    log:
        f"{RESULTS}/logs/plan.log",
    localrule: True
    run:
        print_plan(log[0])


# `snakemake <paper>`: one paper's experiments alone, every raw record of results/raw/<paper>/
# (measured and simulated, and the calibration its simulated points read). Its tables and figures
# come with the whole run: they are drawn from the tables of every record (rule collect).
for _paper in PAPERS:

    rule:
        name:
            _paper
        input:
            [path for path in RAW_RECORDS if path.startswith(f"{RESULTS}/raw/{_paper}/")],
        localrule: True
