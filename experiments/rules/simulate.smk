# Simulated sweeps (paper-scale and Lina's): one cheap local job for all their points
# (experiments/simulate.py --sweep), in the same record schema as the measured points (mode: simulated).

from moe_core.config import sim_points

SIM_POINTS = sim_points(CFG)  # the paper-scale sweep and Lina's: name -> (paper, complete overrides)
SIM_RECORDS = [f"{RESULTS}/raw/{paper}/sim_train_step/{name}.json" for name, (paper, _) in SIM_POINTS.items()]


rule sim_train_step:
    """Every simulated training step of the sweeps on its modelled cluster, in one process (no
    ranks; a point takes a fraction of a second, less than starting Python with torch)."""
    input:
        config=RESOLVED_CONFIG,
    output:
        SIM_RECORDS,
    log:
        f"{RESULTS}/logs/sim_train_step.log",
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "python -m experiments.simulate --config {input.config} --sweep > {log} 2>&1"
