# Simulated sweeps (paper-scale and Lina's): one cheap local job per point
# (experiments/simulate.py), in the same record schema as the measured points (mode: simulated).

from moe_core.config import sim_points

SIM_POINTS = sim_points(CFG)  # the paper-scale sweep and Lina's: name -> (paper, complete overrides)
SIM_RECORDS = [f"{RESULTS}/raw/{paper}/sim_train_step/{name}.json" for name, (paper, _) in SIM_POINTS.items()]


rule sim_train_step:
    """One simulated training step on a modelled cluster (no processes, seconds of CPU)."""
    input:
        config=rules.resolved_config.output[0],
    output:
        f"{RESULTS}/raw/{{paper}}/sim_train_step/{{point}}.json",
    log:
        f"{RESULTS}/logs/sim_train_step/{{paper}}/{{point}}.log",
    params:
        overrides=lambda wc: " ".join(SIM_POINTS[wc.point][1]),
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "python -m experiments.simulate --config {input.config} --out {output} {params.overrides} > {log} 2>&1"
