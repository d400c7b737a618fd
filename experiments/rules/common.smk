# What every rules file shares: the resolved config, the SLURM sizing of measured jobs, and how a
# command line is built (every value quoted: config values never reach a shell unquoted).

import shlex

from experiments.launch import SLURM_RESOURCE_KEYS, slurm_resources
from moe_core.config.load import config_digest
from moe_core.records.run_lock import lock_results_dir


# One workflow run per results_dir (moe_core/records/run_lock.py): a second run on it, from another
# checkout or working directory, stops here naming the first. Taken when the run starts its jobs,
# not when the workflow is parsed, so dry runs, --summary and --lint, and the Snakemake a job runs
# in on a cluster (started with --no-hooks), never take it.
onstart:
    lock_results_dir(RESULTS)


# The validated, fully resolved config every job of this run reads, named by its content and
# written by a job, never when the workflow is parsed. So a dry run, --summary or --lint writes
# nothing, and a later invocation with another config gets a snapshot of its own, so it cannot
# change the config of jobs another invocation has planned. A changed config is a new input file,
# newer than every record, so Snakemake re-measures what reads it, also where its metadata is gone
# (a copied or cleaned results directory). The Snakefile's rule resolved_config writes it.
RESOLVED_CONFIG = f"{RESULTS}/config/resolved-{config_digest(CFG)}.yaml"

# Every raw record file of the run: each rules file adds the records its rules write
# (``RAW_RECORDS += ...``), results/raw/<paper or "common">/<experiment>/<point>.json. The analysis
# collects them all; a paper's target (the Snakefile) makes its folder's.
RAW_RECORDS = []


def quoted(words):
    """One shell-safe string of ``words`` (config overrides, names, paths)."""
    return shlex.join(str(word) for word in words)


def measured_resources(world_size):
    """Snakemake resources of a measured job of ``world_size`` ranks (experiments/launch.py sizes
    nodes, tasks, CPUs, memory, GPUs for SLURM; locally only threads matter). Keys a job leaves
    unset (e.g. mpi, gpu on CPU) evaluate to None, which Snakemake drops."""
    sizes = slurm_resources(CFG, world_size)
    return {key: sizes.get(key) for key in SLURM_RESOURCE_KEYS}
