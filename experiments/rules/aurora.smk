# Aurora (arXiv 2410.17043): its decisions simulated on the big switch (experiments/aurora.py, the
# simulator's forward executor, one local job of about half a minute, sensitivity runs included) and its
# transmission orders measured with gloo/NCCL (experiments/aurora_a2a.py, one torchrun job). Each job
# writes one record per point.

from experiments.aurora_a2a import EXPERIMENT as AURORA_A2A, measured_points as aurora_measured_points
from moe_core.papers.aurora.study import PAPER as AURORA_PAPER, aurora_points

AURORA_SIM_RECORDS = [
    f"{RESULTS}/raw/{AURORA_PAPER}/{experiment}/{point}.json"
    for experiment, points in aurora_points(CFG).items()
    for point in points
]
RAW_RECORDS += AURORA_SIM_RECORDS
AURORA_A2A_RECORDS = expand(
    f"{RESULTS}/raw/{AURORA_PAPER}/{AURORA_A2A}/{{point}}.json", point=aurora_measured_points(CFG)
)
RAW_RECORDS += AURORA_A2A_RECORDS


rule aurora_simulated:
    """Transmission orders, the four deployment settings (and their sensitivity runs), the gap to the
    brute-force optimum and traffic imprecision on gating traces and Zipf matrices, simulated (about
    half a minute of one CPU, no processes)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        AURORA_SIM_RECORDS,
    log:
        f"{RESULTS}/logs/aurora_simulated.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    priority: LONG_JOB
    localrule: True
    shell:
        "logged {log:q} python -m experiments aurora --config {input.config:q}"


rule aurora_a2a:
    """all_to_all_single vs the ordered all-to-all in each Aurora order, aurora.world_size ranks."""
    input:
        config=RESOLVED_CONFIG,
    output:
        AURORA_A2A_RECORDS,
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/aurora_a2a.log",
    params:
        world_size=CFG.aurora.world_size,
    threads: CFG.aurora.world_size
    resources:
        **measured_resources(CFG.aurora.world_size, "aurora_a2a"),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments aurora_a2a"


# The second stage: the same study at the testbed fitted to Fig 4's and Fig 11's baselines
# (experiments/rules/common.smk).
AT_FIT_PAPERS.append(AURORA_PAPER)
AURORA_AT_FIT_RECORDS = at_fit_records(AURORA_PAPER, aurora_points)
AT_FIT_RECORDS += AURORA_AT_FIT_RECORDS


rule aurora_at_fit:
    """Aurora's decisions simulated again at its fitted testbed."""
    input:
        config=RESOLVED_CONFIG,
        fitted=fitted_layer(AURORA_PAPER),
    output:
        AURORA_AT_FIT_RECORDS,
    params:
        results_dir=at_fit_dir,
    log:
        f"{RESULTS}/logs/aurora_at_fit.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    priority: LONG_JOB
    localrule: True
    shell:
        "logged {log:q} python -m experiments aurora --config {input.config:q} --config {input.fitted:q} "
        "results_dir={params.results_dir:q}"
