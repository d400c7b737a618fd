# The measured training-step sweep of every paper (GShard's MoE model under each policy): one torchrun job per
# point (experiments/train_step.py). The points are the config's sweep plus those papers register
# (moe_core.schema.points, e.g. Lina's measured policies).

from moe_core.schema.points import measured_points, point_overrides

TRAIN_POINTS = measured_points(CFG)
# SLURM sizing of each point, computed here, so a world size that cannot fill whole nodes stops the
# workflow before any job.
TRAIN_RESOURCES = {name: measured_resources(p["world_size"], "train_step") for name, p in TRAIN_POINTS.items()}
TRAIN_RECORDS = [f"{RESULTS}/raw/{p['paper']}/{CFG.experiment}/{name}.json" for name, p in TRAIN_POINTS.items()]
RAW_RECORDS += TRAIN_RECORDS


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
        "-- -m experiments train_step --out {output:q}"
