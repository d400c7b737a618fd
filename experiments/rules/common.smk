# What every rules file shares: the resolved config, the SLURM sizing of measured jobs, and how a
# command line is built (every value quoted: config values never reach a shell unquoted).

import shlex

from experiments.launch import SLURM_RESOURCE_KEYS, slurm_resources
from moe_core.config import save_config

# The validated, fully resolved config every job of this run starts from, written when this
# workflow starts and only if the config changed: every measured record is then older than a config
# it was not measured with, and Snakemake re-measures it by modification time. (A params trigger
# alone misses the change wherever Snakemake's metadata is gone, e.g. a copied or cleaned results
# directory, and the run would silently reuse records of the old config.) Jobs that re-read this
# Snakefile (cluster jobs) leave the file alone.
RESOLVED_CONFIG = f"{RESULTS}/config/resolved.yaml"
if workflow.is_main_process:
    save_config(CFG, RESOLVED_CONFIG)


def quoted(words):
    """One shell-safe string of ``words`` (config overrides, names, paths)."""
    return shlex.join(str(word) for word in words)


def measured_resources(world_size):
    """Snakemake resources of a measured job of ``world_size`` ranks (experiments/launch.py sizes
    nodes, tasks, CPUs, memory, GPUs for SLURM; locally only threads matter). Keys a job leaves
    unset (e.g. mpi, gpu on CPU) evaluate to None, which Snakemake drops."""
    sizes = slurm_resources(CFG, world_size)
    return {key: sizes.get(key) for key in SLURM_RESOURCE_KEYS}
