"""AxoNN's measured grid sweep: training steps of a dense GPT on every 4D grid the world size allows,
and the overlap ablation on one grid, in one torchrun job of ``axonn.world_size`` ranks.

    python -m experiments.launch --config configs/default.yaml --nproc 4 -- -m experiments axonn_grids
    # the emulated two-node testbed (root; moe_core.host.testbed), eight ranks:
    python -m experiments.launch --config configs/default.yaml hardware_profile=emulated-2x4 \\
        axonn.world_size=8 axonn.global_sequences=16 results_dir=results/emulated-2x4 --nproc 8 \\
        -- -m experiments axonn_grids

Every point (moe_core/papers/axonn/sweeps.py) runs experiments/train_step.py's training loop on its own
process groups: ``axonn.warmup_iters`` + ``axonn.iters`` steps, the worst rank per iteration kept.
Its communication time per step, ``comm_ms``, is the time the ranks wait for the grid's collectives
(``grid_comm_ms``) plus the data-parallel gradient all-reduce after the backward pass
(``allreduce_exposed_ms``). Rank 0 writes ``results/raw/axonn/axonn_grids/<point>.json``: measurements
only. AxoNN's communication model's prediction for each point is a simulated record of its own, with
the same point name and params (``python -m experiments axonn_grid_predictions``, on the testbed's
calibrated profile), which the analysis joins to this one.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig

from experiments.benchmark import measured_main, measured_record
from experiments.train_step import train
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
