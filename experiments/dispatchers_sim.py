"""Which dispatcher when, simulated: the round trip of every registered dispatcher that is not
tensor-parallel (moe_core.dispatch_study.simulated_paths) under routing skew on the
``dispatch_study.hardware`` clusters (no processes, no torch).

    python -m experiments dispatchers_sim --config configs/default.yaml

Per cluster, size (``dispatch_study.sim_world_sizes``: the profile grown to that many GPUs with more
nodes of its kind), skew and path: the GPUs, one expert each, route ``sim_tokens_per_rank`` bf16
tokens of ``sim_d_model`` by the same seeded workload as the measured run draws, and the topology
times the dispatch and the combine (moe_core.sim). A skew that cannot route at a size (a recorded
trace of fewer experts than the GPUs) and a path that does not apply there (the hierarchical
exchange within one node) have no cell. A workload that changes between steps is simulated on each
step of its period: ``exchange_ms`` is their mean (the time per iteration of a long run),
``imbalance`` their worst, ``dropped_fraction``, ``useful_bytes`` and ``bytes_moved`` (what the path
sends between ranks: the traffic it states, which the simulator priced) their mean, and the rates
over that time: ``useful_GBps``, ``algbw_GBps`` and ``busbw_GBps`` (moe_core.dispatch_study.bandwidths).
The tensor-parallel dispatchers are not simulated here: the
measured study times them, and at scale they are simulated inside training steps (MoNTA's figures).
Records: ``results/raw/common/dispatchers_sim/<point>.json``.
"""

from __future__ import annotations

import argparse
from itertools import groupby

from omegaconf import DictConfig

from experiments.benchmark import predicted_record, predictions_main
from experiments.dispatchers import PAPER, slug
from experiments.simulate import sized_hardware
from moe_core.config.load import hardware_profile, load_config
from moe_core.dispatch import dispatcher
from moe_core.dispatch.workloads import why_not
from moe_core.dispatch_study import (
    capacity_slots,
    cell_metrics,
    simulated_exchange_ms,
    simulated_paths,
    step_counts,
)
from moe_core.model.capacity import DTYPE_BYTES

EXPERIMENT = "dispatchers_sim"


def sim_cells(cfg: DictConfig) -> list[tuple[str, int, str, str]]:
    """Every simulated (hardware, ranks, skew, path) cell: each profile at each size, every skew that
    can route there (moe_core.dispatch.workloads.why_not: a trace of fewer experts cannot), every
    simulated path that applies (the hierarchical exchange only across nodes)."""
    d = cfg.dispatch_study
    profiles = {profile: hardware_profile(profile) for profile in d.hardware}
    return [
        (profile, ranks, skew, path)
        for profile in d.hardware
        for ranks in d.sim_world_sizes
        for skew in d.skews
        if why_not(skew, experts=ranks, ranks=ranks, top_k=1) is None
        for path in simulated_paths()
        if dispatcher(path).runs_on(ranks, profiles[profile])
    ]


def point_name(profile: str, ranks: int, skew: str, path: str) -> str:
    return f"{profile}_ws{ranks}_{slug(skew)}_{path}"


def sim_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes (pure; the workflow declares them)."""
    return [point_name(*cell) for cell in sim_cells(cfg)]


def simulated_records(cfg: DictConfig) -> list[dict]:
    d, records = cfg.dispatch_study, []
    row_bytes = d.sim_d_model * DTYPE_BYTES["bfloat16"]
    for (profile, ranks, skew), paths in groupby(sim_cells(cfg), key=lambda cell: cell[:3]):
        sized = load_config(overrides=[f"hardware_profile={profile}", f"parallel.world_size={ranks}"], whole_run=False)
        hw = sized_hardware(sized)
        steps = step_counts(skew, ranks, d.sim_tokens_per_rank, d.seed)
        capacity = capacity_slots(d.sim_tokens_per_rank, ranks, d.capacity_factor)
        for *_, path in paths:
            params = {"skew": skew, "path": path, "world_size": ranks, "tensor_parallel": 1}
            params.update(tokens_per_rank=d.sim_tokens_per_rank, capacity=capacity)
            exchange_ms = simulated_exchange_ms(hw, steps, capacity, row_bytes, path)
            metrics = {
                "exchange_ms": exchange_ms,
                **cell_metrics(path, steps, capacity, row_bytes, hw.devices_per_node, exchange_ms),
            }
            records.append(
                predicted_record(
                    cfg,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=point_name(profile, ranks, skew, path),
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
