"""Which dispatcher when, simulated: the round trip of every registered dispatcher that is not
tensor-parallel (moe_core.dispatch.study.simulated_paths) under routing skew on the
``dispatch_study.hardware`` clusters (no processes, no torch).

    python -m experiments.dispatchers_sim --config configs/default.yaml

Per cluster (grown to ``dispatch_study.sim_world_size`` GPUs with more nodes of its kind), skew and
path: ``sim_world_size`` GPUs with one expert each route ``sim_tokens_per_rank`` bf16 tokens of
``sim_d_model`` by the same seeded workload as the measured run draws, and the topology times the
dispatch and the combine (moe_core.sim). A workload that changes between steps is simulated on each
step of its period: ``exchange_ms`` is their mean (the time per iteration of a long run),
``imbalance`` their worst, ``dropped_fraction`` and ``useful_bytes`` their mean, ``useful_GBps`` the
useful bytes over that time (where any had to move). The tensor-parallel dispatchers are not simulated here: the
measured study times them, and at scale they are simulated inside training steps (MoNTA's figures).
Records: ``results/raw/common/dispatchers_sim/<point>.json``.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from experiments.dispatchers import PAPER, slug
from experiments.simulate import sized_hardware
from moe_core.config.load import load_config
from moe_core.dispatch import dispatcher
from moe_core.dispatch.study import (
    capacity_slots,
    routing_metrics,
    simulated_exchange_ms,
    simulated_paths,
    step_counts,
    useful_rate,
)
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.runtime.benchmark import predicted_record, predictions_main

EXPERIMENT = "dispatchers_sim"


def sim_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes (pure; the workflow declares them)."""
    d = cfg.dispatch_study
    return [
        f"{hw}_ws{d.sim_world_size}_{slug(skew)}_{path}"
        for hw in d.hardware
        for skew in d.skews
        for path in simulated_paths()
    ]


def simulated_records(cfg: DictConfig) -> list[dict]:
    d, records, paths = cfg.dispatch_study, [], simulated_paths()
    for profile in d.hardware:
        sized = load_config(
            overrides=[f"hardware_profile={profile}", f"parallel.world_size={d.sim_world_size}"], whole_run=False
        )
        hw = sized_hardware(sized)
        for skew in d.skews:
            steps = step_counts(skew, d.sim_world_size, d.sim_tokens_per_rank, d.seed)
            capacity = capacity_slots(d.sim_tokens_per_rank, d.sim_world_size, d.capacity_factor)
            row_bytes = d.sim_d_model * DTYPE_BYTES["bfloat16"]
            for path in paths:
                params = {"skew": skew, "path": path, "world_size": d.sim_world_size, "tensor_parallel": 1}
                params.update(tokens_per_rank=d.sim_tokens_per_rank, capacity=capacity)
                metrics = {
                    "exchange_ms": simulated_exchange_ms(hw, steps, capacity, row_bytes, path),
                    **routing_metrics(steps, capacity, dispatcher(path).drops, row_bytes),
                }
                metrics.update(useful_rate(metrics["useful_bytes"], metrics["exchange_ms"]))
                records.append(
                    predicted_record(
                        cfg,
                        paper=PAPER,
                        experiment=EXPERIMENT,
                        point=f"{profile}_ws{d.sim_world_size}_{slug(skew)}_{path}",
                        hardware=hw.name,
                        params=params,
                        metrics=metrics,
                        backend="sim",
                    )
                )
    return records


def main(argv: list[str] | None = None) -> int:
    return predictions_main(argv, __doc__, simulated_records)


if __name__ == "__main__":
    sys.exit(main())
