# Lina's measured inference (experiments/inference.py): one torchrun job per expert count and path
# length, each writing one record per placement policy (ideal always runs, as the normalisation).
# Lina's training points are part of the measured sweep (train_step.smk) and the simulator's
# (simulator.smk), through moe_core.papers.lina.sweeps.

import os

from moe_core.papers.lina.sweeps import inference_points

INFERENCE = CFG.inference
INFERENCE_POLICIES = ["ideal", *INFERENCE.policies]
INFERENCE_POINTS = inference_points(CFG)  # name -> overrides
INFERENCE_RECORDS = [
    f"{RESULTS}/raw/lina/inference/{point}_{policy}_s{CFG.train.seed}.json"
    for point in INFERENCE_POINTS
    for policy in INFERENCE_POLICIES
]
RAW_RECORDS += INFERENCE_RECORDS


rule lina_inference:
    """Train on skewed data, profile expert paths, then time placed inference under every policy."""
    input:
        config=RESOLVED_CONFIG,
    output:
        [f"{RESULTS}/raw/lina/inference/{{point}}_{p}_s{CFG.train.seed}.json" for p in INFERENCE_POLICIES],
    log:
        f"{RESULTS}/logs/lina_inference/{{point}}.log",
    params:
        overrides=lambda wc: quoted(INFERENCE_POINTS[wc.point]),
        out_dir=lambda wc, output: os.path.dirname(output[0]),
        world_size=INFERENCE.world_size,  # threads may be capped to --cores; the ranks may not
    threads: INFERENCE.world_size
    conda:
        "../../environment.yml"
    resources:
        **measured_resources(INFERENCE.world_size, "lina_inference", jobs=len(INFERENCE_POINTS)),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} {params.overrides} --nproc {params.world_size} "
        "-- -m experiments inference --out-dir {params.out_dir:q}"


from experiments.lina_inference_sim import record_points as lina_sim_inference_points

LINA_SIM_INFERENCE_RECORDS = expand(
    f"{RESULTS}/raw/lina/inference/{{point}}.json", point=lina_sim_inference_points(CFG)
)
RAW_RECORDS += LINA_SIM_INFERENCE_RECORDS


rule lina_inference_simulated:
    """Every placement policy at the paper's scale, simulated (no processes; the longest simulated job)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        LINA_SIM_INFERENCE_RECORDS,
    log:
        f"{RESULTS}/logs/lina_inference_simulated.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    priority: LONG_JOB
    localrule: True
    shell:
        "logged {log:q} python -m experiments lina_inference_sim --config {input.config:q}"


# The second stage: Lina's simulated training steps and inference at the testbed fitted to Table 1 and
# Figs 2, 3 and 6 (experiments/rules/common.smk).
AT_FIT_PAPERS.append("lina")
LINA_AT_FIT_CONFIG = at_setting_config("lina")
LINA_AT_FIT_TRAINING_RECORDS = [
    f"{AT_FIT}/raw/lina/sim_train_step/{name}.json"
    for name, (paper, _) in sim_points(LINA_AT_FIT_CONFIG).items()
    if paper == "lina"
]
LINA_AT_FIT_INFERENCE_RECORDS = expand(
    f"{AT_FIT}/raw/lina/inference/{{point}}.json", point=lina_sim_inference_points(LINA_AT_FIT_CONFIG)
)
AT_FIT_RECORDS += LINA_AT_FIT_TRAINING_RECORDS + LINA_AT_FIT_INFERENCE_RECORDS


rule lina_training_at_fit:
    """Lina's simulated training steps again at its fitted testbed."""
    input:
        config=RESOLVED_CONFIG,
        fitted=fitted_layer("lina"),
    output:
        LINA_AT_FIT_TRAINING_RECORDS,
    params:
        results_dir=at_fit_dir,
    log:
        f"{RESULTS}/logs/lina_training_at_fit.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "logged {log:q} python -m experiments simulate --config {input.config:q} --config {input.fitted:q} "
        "--sweep --paper lina results_dir={params.results_dir:q}"


rule lina_inference_at_fit:
    """Lina's simulated inference again at its fitted testbed."""
    input:
        config=RESOLVED_CONFIG,
        fitted=fitted_layer("lina"),
    output:
        LINA_AT_FIT_INFERENCE_RECORDS,
    params:
        results_dir=at_fit_dir,
    log:
        f"{RESULTS}/logs/lina_inference_at_fit.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    priority: LONG_JOB
    localrule: True
    shell:
        "logged {log:q} python -m experiments lina_inference_sim --config {input.config:q} --config {input.fitted:q} "
        "results_dir={params.results_dir:q}"
