# Measured training-step sweep: one torchrun job per point of cfg.sweep (experiments/train_step.py).

import sys

from omegaconf import OmegaConf

from moe_core.config import point_name, point_overrides, sweep_points

TRAIN_POINTS, _skipped = sweep_points(CFG)
for _reason in _skipped:
    print(f"sweep: skipping impossible layout {_reason}", file=sys.stderr)
TRAIN_POINTS = {point_name(p): p for p in TRAIN_POINTS}
TRAIN_RECORDS = expand(
    f"{RESULTS}/raw/{CFG.paper}/{CFG.experiment}/{{point}}.json", point=TRAIN_POINTS
)


rule resolved_config:
    """The validated, fully resolved config every job of this run starts from."""
    output:
        f"{RESULTS}/config/resolved.yaml",
    log:
        f"{RESULTS}/logs/resolved_config.log",
    params:
        # Rerun (and so re-measure) when any config value changes.
        config=OmegaConf.to_yaml(CFG),
    localrule: True
    run:
        from moe_core.config import save_config

        save_config(CFG, output[0])
        shell("echo 'resolved config written to {output}' > {log}")


rule train_step:
    """One measured sweep point: world_size ranks under torchrun (experiments/launch.py: plain
    loopback, or one network namespace per node on an emulated testbed), gloo on CPU / NCCL on GPU."""
    input:
        config=rules.resolved_config.output[0],
    output:
        f"{RESULTS}/raw/{CFG.paper}/{CFG.experiment}/{{point}}.json",
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/train_step/{{point}}.log",
    params:
        world_size=lambda wc: TRAIN_POINTS[wc.point]["world_size"],
        overrides=lambda wc: " ".join(point_overrides(TRAIN_POINTS[wc.point])),
    threads: lambda wc: TRAIN_POINTS[wc.point]["world_size"]
    resources:
        runtime=30,
        mem_mb=lambda wc: 1500 * TRAIN_POINTS[wc.point]["world_size"],
    shell:
        "python -m experiments.launch --config {input.config} {params.overrides} --nproc {params.world_size} "
        "-- -m experiments.train_step --out {output} > {log} 2>&1"
