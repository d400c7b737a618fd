# GShard's scaling study on the TPU v3 torus, simulated (experiments/gshard.py: Table 1's models at
# 128, 512 and 2048 experts on the committed 64-, 256- and 1024-chip profiles; memory per core; the
# collectives on torus slices; seconds of CPU). GShard's measured points are in the training-step
# sweep (train_step.smk).

from moe_core.papers.gshard.study import PAPER as GSHARD_PAPER, record_points as gshard_record_points

GSHARD_SIM_RECORDS = [
    f"{RESULTS}/raw/{GSHARD_PAPER}/{experiment}/{point}.json"
    for experiment, points in gshard_record_points(CFG).items()
    for point in points
]
RAW_RECORDS += GSHARD_SIM_RECORDS


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
        "logged {log:q} python -m experiments gshard --config {input.config:q}"


# The second stage: the same study at the testbed fitted to Table 3's steps/s (experiments/rules/common.smk).
AT_FIT_PAPERS.append(GSHARD_PAPER)
GSHARD_AT_FIT_RECORDS = at_fit_records(GSHARD_PAPER, gshard_record_points)
AT_FIT_RECORDS += GSHARD_AT_FIT_RECORDS


rule gshard_at_fit:
    """Table 1's models simulated again at GShard's fitted testbed."""
    input:
        config=RESOLVED_CONFIG,
        fitted=fitted_layer(GSHARD_PAPER),
    output:
        GSHARD_AT_FIT_RECORDS,
    params:
        results_dir=at_fit_dir,
    log:
        f"{RESULTS}/logs/gshard_at_fit.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments gshard --config {input.config:q} --config {input.fitted:q} "
        "results_dir={params.results_dir:q}"
