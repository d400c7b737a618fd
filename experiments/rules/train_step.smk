# Measured training-step sweep: one torchrun job per point of cfg.sweep (experiments/train_step.py).

import sys

from experiments.launch import SLURM_RESOURCE_KEYS, slurm_resources
from moe_core.config import lina_measured_points, point_name, point_overrides, save_config, sweep_points

TRAIN_POINTS, _skipped = sweep_points(CFG)
for _reason in _skipped:
    print(f"sweep: skipping impossible layout {_reason}", file=sys.stderr)
# The sweep's points (paper of the config), then Lina's measured ones (paper lina).
TRAIN_POINTS = {point_name(p): {"paper": CFG.paper, **p} for p in [*TRAIN_POINTS, *lina_measured_points(CFG)]}
# SLURM sizing of each point (nodes, tasks, CPUs, memory, GPUs; experiments/launch.py). Computed
# here, so a world size that cannot fill whole nodes stops the workflow before any job.
TRAIN_RESOURCES = {
    name: slurm_resources(CFG, p["world_size"]) for name, p in TRAIN_POINTS.items()
}
TRAIN_RECORDS = [f"{RESULTS}/raw/{p['paper']}/{CFG.experiment}/{name}.json" for name, p in TRAIN_POINTS.items()]
# The validated, fully resolved config every job of this run starts from, written when this
# workflow starts and only if the config changed: every measured record is then older than a config
# it was not measured with, and Snakemake re-measures it by modification time. (A params trigger
# alone misses the change wherever Snakemake's metadata is gone, e.g. a copied or cleaned results
# directory, and the run would silently reuse records of the old config.) Jobs that re-read this
# Snakefile (cluster jobs) leave the file alone.
RESOLVED_CONFIG = f"{RESULTS}/config/resolved.yaml"
if workflow.is_main_process:
    save_config(CFG, RESOLVED_CONFIG)


rule train_step:
    """One measured sweep point: world_size ranks under torchrun (experiments/launch.py: plain
    loopback, or one network namespace per node on an emulated testbed), gloo on CPU / NCCL on GPU."""
    input:
        config=RESOLVED_CONFIG,
    output:
        f"{RESULTS}/raw/{{paper}}/{CFG.experiment}/{{point}}.json",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/train_step/{{paper}}/{{point}}.log",
    params:
        world_size=lambda wc: TRAIN_POINTS[wc.point]["world_size"],
        overrides=lambda wc: " ".join(point_overrides(TRAIN_POINTS[wc.point])),
    threads: lambda wc: TRAIN_POINTS[wc.point]["world_size"]
    # Locally only threads (and mem_mb with --resources) matter; keys a point leaves unset
    # (e.g. mpi, gpu on CPU) evaluate to None, which Snakemake drops.
    resources:
        **{
            key: lambda wc, key=key: TRAIN_RESOURCES[wc.point].get(key)
            for key in SLURM_RESOURCE_KEYS
        },
    shell:
        "python -m experiments.launch --config {input.config} {params.overrides} --nproc {params.world_size} "
        "-- -m experiments.train_step --out {output} > {log} 2>&1"
