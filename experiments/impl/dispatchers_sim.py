"""What ``python -m experiments.dispatchers_sim`` runs (its docstring describes the records): every
dispatcher's simulated exchange under each skew, and the records."""

from __future__ import annotations

import argparse

from omegaconf import DictConfig

from experiments.dispatchers import PAPER, slug
from experiments.impl.simulate import sized_hardware
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


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.dispatchers_sim's command line)."""
    return predictions_main(args, simulated_records)
