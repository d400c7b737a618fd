"""What ``python -m experiments.axonn_grids`` runs (its docstring describes the sweep): every grid
point's training steps on its own process groups, and their records."""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig

from experiments.benchmark import measured_main, measured_record
from experiments.impl.train_step import train
from moe_core.papers.axonn.sweeps import MEASURED, PAPER, grid_point_params, grid_points, point_config
from moe_core.runtime.distributed import Env


def grid_records(cfg: DictConfig, env: Env) -> list[dict]:
    """Every grid point's training steps; rank 0's records."""
    records = []
    for name, (grid, variant) in grid_points(cfg).items():
        point_cfg = point_config(cfg, grid, variant)
        samples, single = train(point_cfg, env)
        samples["comm_ms"] = [g + a for g, a in zip(samples["grid_comm_ms"], samples["allreduce_exposed_ms"])]
        if env.rank == 0:
            records.append(
                measured_record(
                    point_cfg,
                    paper=PAPER,
                    experiment=MEASURED,
                    point=name,
                    params=grid_point_params(point_cfg, variant),
                    samples=samples,
                    extra_metrics=single,
                )
            )
            print(f"{name}: comm {sorted(samples['comm_ms'])[len(samples['comm_ms']) // 2]:.2f} ms", file=sys.stderr)
    return records


def run(args: argparse.Namespace, world_size_key: str) -> None:
    """The sweep on every rank for ``args`` (experiments.axonn_grids' command line)."""
    measured_main(args, world_size_key, grid_records)
