# nccl-tests-style collective microbenchmark: one torchrun job writes one record per
# (collective, concurrent, size) point (experiments/collectives.py).

from experiments.collectives import EXPERIMENT as COLLECTIVES, PAPER as COLLECTIVES_PAPER
from experiments.collectives import collective_points

COLLECTIVE_RECORDS = expand(
    f"{RESULTS}/raw/{COLLECTIVES_PAPER}/{COLLECTIVES}/{{point}}.json",
    point=collective_points(CFG),
)
RAW_RECORDS += COLLECTIVE_RECORDS


rule collectives:
    """All-reduce, all-to-all and all-to-all-v from min_bytes to max_bytes, alone and paired."""
    input:
        config=RESOLVED_CONFIG,
    output:
        COLLECTIVE_RECORDS,
    conda:
        "../../environment.yml"
    log:
        f"{RESULTS}/logs/collectives.log",
    params:
        world_size=CFG.collectives.world_size,
    threads: CFG.collectives.world_size
    resources:
        **measured_resources(CFG.collectives.world_size, "collectives"),
    shell:
        "logged {log:q} python -m experiments.launch --config {input.config:q} --nproc {params.world_size} "
        "-- -m experiments collectives"
