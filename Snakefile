"""MoE communication benchmark suite: measured sweeps -> tables -> figures -> report.

    snakemake --cores 2                                  # embedded default (configs/default.yaml)
    snakemake --cores 2 --configfile configs/ci.yaml     # smallest smoke run
    snakemake --cores 2 --config 'train={iters: 20}'     # any key of moe_core/config.py (YAML)
"""

from moe_core.config import ConfigError, load_config

from snakemake.utils import min_version

min_version("9.0")


configfile: "configs/default.yaml"


try:
    # The structured schema (the core's sections and every paper's) is the single source of truth:
    # bad keys or values stop here, before any job.
    CFG = load_config(data=config)
except ConfigError as err:
    raise ValueError(f"invalid configuration: {err}") from None

RESULTS = CFG.results_dir


include: "experiments/rules/common.smk"
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
        f"{RESULTS}/tables/monta_strategies.csv",
        f"{RESULTS}/tables/dispatchers.csv",
        f"{RESULTS}/tables/axonn_grid_validation.csv",
        f"{RESULTS}/tables/axonn_scaling.csv",
        f"{RESULTS}/tables/gshard_scaling.csv",
        FIGURES,
