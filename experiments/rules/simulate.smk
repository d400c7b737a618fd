# Simulated paper-scale sweep: one cheap local job per (hardware, world size, policy) point
# (experiments/simulate.py), in the same record schema as the measured points (mode: simulated).

from moe_core.config import point_name as _train_point_name

SIM = CFG.sim_sweep
SIM_POINTS = {}
for _hw in SIM.hardware:
    for _ws in SIM.world_size:
        for _policy in SIM.policy:
            _experts = _ws * SIM.experts_per_rank
            _params = dict(world_size=_ws, num_experts=_experts, experts_per_rank=SIM.experts_per_rank,
                           policy=_policy, seed=CFG.train.seed)
            SIM_POINTS[f"{_hw}_{_train_point_name(_params)}"] = [
                f"hardware_profile={_hw}", f"parallel.world_size={_ws}", f"moe.num_experts={_experts}",
                f"moe.experts_per_rank={SIM.experts_per_rank}", f"comm.policy={_policy}", f"paper={SIM.paper}",
            ]
SIM_RECORDS = expand(f"{RESULTS}/raw/{SIM.paper}/sim_train_step/{{point}}.json", point=SIM_POINTS)


rule sim_train_step:
    """One simulated training step on a modelled cluster (no processes, seconds of CPU)."""
    input:
        config=rules.resolved_config.output[0],
    output:
        f"{RESULTS}/raw/{SIM.paper}/sim_train_step/{{point}}.json",
    log:
        f"{RESULTS}/logs/sim_train_step/{{point}}.log",
    params:
        overrides=lambda wc: " ".join([*SIM.overrides, *SIM_POINTS[wc.point]]),
    conda:
        "../../environment.yml"
    resources:
        runtime=10,
        mem_mb=2000,
    localrule: True
    shell:
        "python -m experiments.simulate --config {input.config} --out {output} {params.overrides} > {log} 2>&1"
