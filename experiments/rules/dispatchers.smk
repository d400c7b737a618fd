# Which dispatcher when (moe_core/dispatch/study.py): every dispatch path's round trip under routing
# skew, measured on dispatch_study.world_size ranks (one torchrun job) and simulated on the study's
# clusters (one cheap local job); then the table of winners.

from experiments.dispatchers import (
    EXPERIMENT as DISPATCHERS,
    PAPER as DISPATCHERS_PAPER,
    measured_points as dispatcher_measured_points,
)
from experiments.dispatchers_sim import EXPERIMENT as DISPATCHERS_SIM, sim_points as dispatcher_sim_points

DISPATCHER_RECORDS = expand(
    f"{RESULTS}/raw/{DISPATCHERS_PAPER}/{DISPATCHERS}/{{point}}.json", point=dispatcher_measured_points(CFG)
)
RAW_RECORDS += DISPATCHER_RECORDS
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
        **measured_resources(CFG.dispatch_study.world_size),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments.dispatchers"


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
        "logged {log:q} python -m experiments.dispatchers_sim --config {input.config:q}"
