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
    """Every placement policy at the paper's scale, simulated (seconds, no processes)."""
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
    localrule: True
    shell:
        "logged {log:q} python -m experiments lina_inference_sim --config {input.config:q}"
