# MoNTA (arXiv 2411.00662): its dispatch measured alone (experiments/monta_a2a.py, one torchrun
# job); its training steps measured (the measured sweep's rules) and simulated at the paper's scale
# (the simulator's job) are points it registers (moe_core/papers/monta/sweeps.py); the strategy
# ranking is a table of the performance model's predictions next to the simulated layouts.

from experiments.monta_a2a import EXPERIMENT as MONTA_A2A, measured_points as monta_measured_points
from moe_core.papers.monta.study import model_points as monta_model_points
from moe_core.papers.monta.sweeps import PAPER as MONTA_PAPER

MONTA_A2A_RECORDS = expand(
    f"{RESULTS}/raw/{MONTA_PAPER}/{MONTA_A2A}/{{point}}.json", point=monta_measured_points(CFG)
)
RAW_RECORDS += MONTA_A2A_RECORDS


rule monta_a2a:
    """One dispatch per path (duplicate, drop-gather, pipelined chunks) at every monta.tensor_parallel,
    monta.world_size ranks."""
    input:
        config=RESOLVED_CONFIG,
    output:
        MONTA_A2A_RECORDS,
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/monta_a2a.log",
    params:
        world_size=CFG.monta.world_size,
    threads: CFG.monta.world_size
    resources:
        **measured_resources(CFG.monta.world_size, "monta_a2a"),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments monta_a2a"


MONTA_MODEL_RECORDS = [
    f"{RESULTS}/raw/{MONTA_PAPER}/{experiment}/{point}.json"
    for experiment, points in monta_model_points(CFG).items()
    for point in points
]
RAW_RECORDS += MONTA_MODEL_RECORDS


rule monta_model:
    """MoNTA's performance model at the paper's setting: strategy ranking and chunk curve (seconds
    of CPU, no processes)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        MONTA_MODEL_RECORDS,
    log:
        f"{RESULTS}/logs/monta_model.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments monta --config {input.config:q}"
