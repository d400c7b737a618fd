# AxoNN (arXiv 2305.13525): its grid sweep measured (experiments/axonn_grids.py, one torchrun job,
# measurements only), the communication model's prediction for each of its points on this testbed's
# calibrated profile (experiments/axonn_grid_predictions.py, records of their own that the analysis
# joins to the measured ones), and its Perlmutter-scale study simulated (experiments/axonn.py: weak
# scaling against the Megatron-style baseline, the overlap ablation, the ranking of every grid;
# seconds of CPU).

from moe_core.papers.axonn.study import record_points as axonn_record_points
from moe_core.papers.axonn.sweeps import (
    MEASURED as AXONN_MEASURED,
    PAPER as AXONN_PAPER,
    PREDICTED as AXONN_PREDICTED,
    grid_points,
)

AXONN_GRID_POINTS = list(grid_points(CFG))
AXONN_GRID_RECORDS = expand(f"{RESULTS}/raw/{AXONN_PAPER}/{AXONN_MEASURED}/{{point}}.json", point=AXONN_GRID_POINTS)
RAW_RECORDS += AXONN_GRID_RECORDS
# the model's prediction for each measured point: the same point names
AXONN_PREDICTION_RECORDS = expand(
    f"{RESULTS}/raw/{AXONN_PAPER}/{AXONN_PREDICTED}/{{point}}.json", point=AXONN_GRID_POINTS
)
RAW_RECORDS += AXONN_PREDICTION_RECORDS
AXONN_SIM_RECORDS = [
    f"{RESULTS}/raw/{AXONN_PAPER}/{experiment}/{point}.json"
    for experiment, points in axonn_record_points(CFG).items()
    for point in points
]
RAW_RECORDS += AXONN_SIM_RECORDS


rule axonn_grids:
    """Every grid of axonn.world_size ranks, then the overlap variants on axonn.ablation_grid, measured."""
    input:
        config=RESOLVED_CONFIG,
    output:
        AXONN_GRID_RECORDS,
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/axonn_grids.log",
    params:
        world_size=CFG.axonn.world_size,
    threads: CFG.axonn.world_size
    resources:
        **measured_resources(CFG.axonn.world_size, "axonn_grids"),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments axonn_grids"


rule axonn_grid_predictions:
    """AxoNN's communication model's prediction for every point of axonn_grids, on the calibrated
    profile of this testbed (seconds of CPU)."""
    input:
        config=RESOLVED_CONFIG,
        profile=rules.calibrate.output[0],
    output:
        AXONN_PREDICTION_RECORDS,
    log:
        f"{RESULTS}/logs/axonn_grid_predictions.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments axonn_grid_predictions --config {input.config:q} "
        "axonn.model_profile={input.profile:q}"


rule axonn_simulated:
    """AxoNN and the Megatron-style baseline at Perlmutter scale, the overlap ablation, the grid ranking."""
    input:
        config=RESOLVED_CONFIG,
    output:
        AXONN_SIM_RECORDS,
    log:
        f"{RESULTS}/logs/axonn_simulated.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments axonn --config {input.config:q}"


# The second stage: the study at the testbed fitted to Megatron's PFLOP/s (experiments/rules/common.smk).
AT_FIT_PAPERS.append(AXONN_PAPER)
AXONN_AT_FIT_RECORDS = at_fit_records(AXONN_PAPER, axonn_record_points)
AT_FIT_RECORDS += AXONN_AT_FIT_RECORDS


rule axonn_at_fit:
    """AxoNN and the Megatron-style baseline simulated again at the fitted testbed."""
    input:
        config=RESOLVED_CONFIG,
        fitted=fitted_layer(AXONN_PAPER),
    output:
        AXONN_AT_FIT_RECORDS,
    params:
        results_dir=at_fit_dir,
    log:
        f"{RESULTS}/logs/axonn_at_fit.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments axonn --config {input.config:q} --config {input.fitted:q} "
        "results_dir={params.results_dir:q}"
