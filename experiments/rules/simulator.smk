# The simulator: every simulated training step of the run (the paper-scale sweep and the points papers
# register, moe_core.schema.points) in one cheap local job, in the measured record schema (mode:
# simulated); then calibration on this run's measured records and validation on the held-out ones
# (moe_core.sim.calibrate.calibration_split decides which is which).

import os

from moe_core.schema.points import sim_points

SIM_POINTS = sim_points(CFG)  # name -> (paper, complete overrides)
SIM_RECORDS = [f"{RESULTS}/raw/{paper}/sim_train_step/{name}.json" for name, (paper, _) in SIM_POINTS.items()]
RAW_RECORDS += SIM_RECORDS


rule sim_train_step:
    """Every simulated training step of the sweeps on its modelled cluster, in one process (no
    ranks; a point takes a fraction of a second, less than starting Python with torch)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        SIM_RECORDS,
    log:
        f"{RESULTS}/logs/sim_train_step.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    priority: LONG_JOB
    localrule: True
    shell:
        "logged {log:q} python -m experiments simulate --config {input.config:q} --sweep"


rule calibrate:
    """Fit the measured testbed's profile (link bandwidths, collective terms, compute rate)."""
    input:
        config=RESOLVED_CONFIG,
        records=[*TRAIN_RECORDS, *COLLECTIVE_RECORDS],
    output:
        f"{RESULTS}/calibration/{CFG.hardware.name}-calibrated.yaml",
    log:
        f"{RESULTS}/logs/calibrate.log",
    conda:
        "../../environment.yml"
    # it measures how this host time-slices ranks that outnumber its cores: it holds them all (capped
    # at --cores; a number, not workflow.cores, which a cluster executor leaves undefined)
    threads: len(os.sched_getaffinity(0))
    localrule: True
    shell:
        "logged {log:q} python -m experiments calibrate --config {input.config:q} --out {output:q} {input.records:q}"


rule validate:
    """Predict every held-out measured point with the calibrated simulator."""
    input:
        calibrated=rules.calibrate.output[0],
        records=[*TRAIN_RECORDS, *COLLECTIVE_RECORDS],
    output:
        report(
            f"{RESULTS}/tables/sim_validation.csv",
            caption="../../analysis/captions/sim_validation_table.rst",
            category="Simulator validation",
        ),
    log:
        f"{RESULTS}/logs/validate.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "logged {log:q} python -m experiments validate --calibrated {input.calibrated:q} --out {output:q} {input.records:q} "


from experiments.external_validation import record_points as external_points

EXTERNAL_RECORDS = expand(f"{RESULTS}/raw/common/external_validation/{{point}}.json", point=external_points(CFG))
RAW_RECORDS += EXTERNAL_RECORDS


rule external_validation:
    """The simulator against published hardware measurements (analysis/external_hardware.yaml), nothing fitted."""
    input:
        config=RESOLVED_CONFIG,
        published="analysis/external_hardware.yaml",
    output:
        EXTERNAL_RECORDS,
    log:
        f"{RESULTS}/logs/external_validation.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "logged {log:q} python -m experiments external_validation --config {input.config:q}"


from experiments.external_dispatch import record_points as external_dispatch_points

EXTERNAL_DISPATCH_RECORDS = expand(
    f"{RESULTS}/raw/common/external_dispatch/{{point}}.json", point=external_dispatch_points(CFG)
)
RAW_RECORDS += EXTERNAL_DISPATCH_RECORDS


rule external_dispatch:
    """The kernel model against published expert-parallel kernel tables (analysis/external_dispatch.yaml)."""
    input:
        config=RESOLVED_CONFIG,
        published="analysis/external_dispatch.yaml",
    output:
        EXTERNAL_DISPATCH_RECORDS,
    log:
        f"{RESULTS}/logs/external_dispatch.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "logged {log:q} python -m experiments external_dispatch --config {input.config:q}"


from experiments.external_steps import record_points as external_step_points

EXTERNAL_STEP_RECORDS = expand(
    f"{RESULTS}/raw/common/external_steps/{{point}}.json", point=external_step_points(CFG)
)
RAW_RECORDS += EXTERNAL_STEP_RECORDS


rule external_steps:
    """The simulator against published GPU training steps (analysis/external_steps.yaml), nothing fitted."""
    input:
        config=RESOLVED_CONFIG,
        published="analysis/external_steps.yaml",
    output:
        EXTERNAL_STEP_RECORDS,
    log:
        f"{RESULTS}/logs/external_steps.log",
    conda:
        "../../environment.yml"
    localrule: True
    shell:
        "logged {log:q} python -m experiments external_steps --config {input.config:q}"
