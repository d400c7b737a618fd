# Lina's measured inference (experiments/inference.py): one torchrun job per expert count and path
# length, each writing one record per placement policy (ideal always runs, as the normalisation).

import os

INFERENCE = CFG.inference
INFERENCE_POLICIES = ["ideal", *INFERENCE.policies]
INFERENCE_POINTS = {
    f"ws{INFERENCE.world_size}_e{_experts}_k{INFERENCE.top_k}_l{_l}": dict(experts=_experts, path_length=_l)
    for _experts in INFERENCE.experts
    for _l in INFERENCE.path_lengths
}
INFERENCE_RECORDS = [
    f"{RESULTS}/raw/lina/inference/{_point}_{_policy}_s{CFG.train.seed}.json"
    for _point in INFERENCE_POINTS
    for _policy in INFERENCE_POLICIES
]
INFERENCE_RESOURCES = slurm_resources(CFG, INFERENCE.world_size)


rule lina_inference:
    """Train on skewed data, profile expert paths, then time placed inference under every policy."""
    input:
        config=RESOLVED_CONFIG,
    output:
        [f"{RESULTS}/raw/lina/inference/{{point}}_{p}_s{CFG.train.seed}.json" for p in INFERENCE_POLICIES],
    log:
        f"{RESULTS}/logs/lina_inference/{{point}}.log",
    params:
        overrides=lambda wc: " ".join([
            *INFERENCE.overrides,
            f"parallel.world_size={INFERENCE.world_size}",
            f"moe.num_experts={INFERENCE_POINTS[wc.point]['experts']}",
            f"moe.experts_per_rank={max(1, INFERENCE_POINTS[wc.point]['experts'] // INFERENCE.world_size)}",
            f"inference.path_length={INFERENCE_POINTS[wc.point]['path_length']}",
        ]),
        out_dir=lambda wc, output: os.path.dirname(output[0]),
        world_size=INFERENCE.world_size,  # threads may be capped to --cores; the ranks may not
    threads: INFERENCE.world_size
    conda:
        "../../environment.yml"
    resources:
        **{key: INFERENCE_RESOURCES.get(key) for key in SLURM_RESOURCE_KEYS},
    shell:
        "python -m experiments.launch --config {input.config} {params.overrides} --nproc {params.world_size} "
        "-- -m experiments.inference --out-dir {params.out_dir} > {log} 2>&1"
