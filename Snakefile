"""MoE communication benchmark suite: measured sweeps -> tables -> figures -> report.

    snakemake --cores 2                                  # embedded default (configs/default.yaml)
    snakemake --cores 2 --configfile configs/ci.yaml     # smallest smoke run
    snakemake --cores 2 --config 'train={iters: 20}'     # any key of moe_core/schema.py (YAML)
"""

from pathlib import Path

from moe_core.config import ConfigError, load_config, refuse_templates, save_config
from moe_core.papers import RECORD_FOLDERS
from moe_core.points import POINT_NAME_PATTERN
from moe_core.results import ResultsDirError, check_results_dir

from snakemake.utils import min_version

min_version("9.0")


configfile: "configs/default.yaml"


try:
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


include: "experiments/rules/gshard.smk"
include: "experiments/rules/collectives.smk"
include: "experiments/rules/simulator.smk"
include: "experiments/rules/lina.smk"
include: "experiments/rules/aurora.smk"
include: "experiments/rules/monta.smk"
include: "experiments/rules/axonn.smk"
include: "experiments/rules/dispatchers.smk"
include: "experiments/rules/analysis.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/tables/comparison.csv",
        f"{RESULTS}/tables/sim_validation.csv",
        f"{RESULTS}/tables/external_validation.csv",
        f"{RESULTS}/tables/external_steps.csv",
        f"{RESULTS}/tables/monta_strategies.csv",
        f"{RESULTS}/tables/dispatchers.csv",
        f"{RESULTS}/tables/axonn_grid_validation.csv",
        f"{RESULTS}/tables/axonn_scaling.csv",
        f"{RESULTS}/tables/gshard_scaling.csv",
        FIGURES,
