# The measured training-step sweep (GShard's MoE model under each policy): one torchrun job per
# point (experiments/train_step.py). The points are the config's sweep plus those papers register
# (moe_core.points, e.g. Lina's measured policies).
# GShard's scaling study on the TPU v3 torus, simulated (experiments/gshard.py: Table 1's models at
# 128, 512 and 2048 experts on the committed 64-, 256- and 1024-chip profiles; memory per core; the
# collectives on torus slices; seconds of CPU).

from experiments.gshard import record_points as gshard_record_points
from moe_core.papers.gshard.study import PAPER as GSHARD_PAPER
from moe_core.points import measured_points, point_overrides

TRAIN_POINTS = measured_points(CFG)
# SLURM sizing of each point, computed here, so a world size that cannot fill whole nodes stops the
# workflow before any job.
TRAIN_RESOURCES = {name: measured_resources(p["world_size"]) for name, p in TRAIN_POINTS.items()}
TRAIN_RECORDS = [f"{RESULTS}/raw/{p['paper']}/{CFG.experiment}/{name}.json" for name, p in TRAIN_POINTS.items()]


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
        overrides=lambda wc: quoted(point_overrides(TRAIN_POINTS[wc.point])),
    threads: lambda wc: TRAIN_POINTS[wc.point]["world_size"]
    resources:
        **{key: lambda wc, key=key: TRAIN_RESOURCES[wc.point][key] for key in SLURM_RESOURCE_KEYS},
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} {params.overrides} --nproc {params.world_size} "
        "-- -m experiments.train_step --out {output:q}"


GSHARD_SIM_RECORDS = [
    f"{RESULTS}/raw/{GSHARD_PAPER}/{experiment}/{point}.json"
    for experiment, points in gshard_record_points(CFG).items()
    for point in points
]


rule gshard_simulated:
    """Table 1's models simulated on their tori, Fig 7's memory per core, Fig 9's collectives."""
    input:
        config=RESOLVED_CONFIG,
    output:
        GSHARD_SIM_RECORDS,
    log:
        f"{RESULTS}/logs/gshard_simulated.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments.gshard --config {input.config:q}"


rule gshard_scaling_table:
    """Per model: step time, all-to-all share, steps/s beside Table 3's, training cost, roofline, memory."""
    input:
        records=f"{RESULTS}/tables/records.csv",
    output:
        report(
            f"{RESULTS}/tables/gshard_scaling.csv",
            caption="../../analysis/captions/gshard_scaling_table.rst",
            category="Published vs reproduced",
        ),
    log:
        f"{RESULTS}/logs/gshard_scaling_table.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "logged {log:q} python -m analysis.tables --records {input.records:q} --table gshard_scaling --out {output:q}"
