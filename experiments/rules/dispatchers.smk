# Which dispatcher when (moe_core/dispatch_study.py): every dispatch path's round trip under routing
# skew, measured on dispatch_study.world_size ranks (one torchrun job), each measured cell predicted
# on this testbed's calibrated profile (records of their own, so a new calibration re-measures
# nothing), and simulated on the study's clusters (cheap local jobs); then the tables.

from experiments.dispatchers import (
    EXPERIMENT as DISPATCHERS,
    PAPER as DISPATCHERS_PAPER,
    measured_points as dispatcher_measured_points,
)
from experiments.dispatchers_predictions import EXPERIMENT as DISPATCHER_PREDICTIONS
from experiments.dispatchers_sim import EXPERIMENT as DISPATCHERS_SIM, sim_points as dispatcher_sim_points

DISPATCHER_RECORDS = expand(
    f"{RESULTS}/raw/{DISPATCHERS_PAPER}/{DISPATCHERS}/{{point}}.json", point=dispatcher_measured_points(CFG)
)
RAW_RECORDS += DISPATCHER_RECORDS
DISPATCHER_PREDICTION_RECORDS = expand(
    f"{RESULTS}/raw/{DISPATCHERS_PAPER}/{DISPATCHER_PREDICTIONS}/{{point}}.json",
    point=dispatcher_measured_points(CFG, simulated_only=True),
)
RAW_RECORDS += DISPATCHER_PREDICTION_RECORDS
DISPATCHER_SIM_RECORDS = expand(
    f"{RESULTS}/raw/{DISPATCHERS_PAPER}/{DISPATCHERS_SIM}/{{point}}.json", point=dispatcher_sim_points(CFG)
)
RAW_RECORDS += DISPATCHER_SIM_RECORDS


rule dispatchers:
    """Every dispatch path under every skew, dispatch_study.world_size ranks."""
    input:
        config=RESOLVED_CONFIG,
    output:
        DISPATCHER_RECORDS,
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/dispatchers.log",
    params:
        world_size=CFG.dispatch_study.world_size,
    threads: CFG.dispatch_study.world_size
    resources:
        **measured_resources(CFG.dispatch_study.world_size, "dispatchers"),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments dispatchers"


rule dispatchers_predictions:
    """The simulator's prediction for every measured cell it prices, on the calibrated profile of
    this testbed (seconds of CPU)."""
    input:
        config=RESOLVED_CONFIG,
        profile=rules.calibrate.output[0],
    output:
        DISPATCHER_PREDICTION_RECORDS,
    log:
        f"{RESULTS}/logs/dispatchers_predictions.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments dispatchers_predictions --config {input.config:q} "
        "dispatch_study.model_profile={input.profile:q}"


rule dispatchers_simulated:
    """The non-tensor-parallel paths on the study's clusters (seconds of CPU, no processes)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        DISPATCHER_SIM_RECORDS,
    log:
        f"{RESULTS}/logs/dispatchers_simulated.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments dispatchers_sim --config {input.config:q}"
