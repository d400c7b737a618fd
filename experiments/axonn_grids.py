"""AxoNN's measured grid sweep: training steps of a dense GPT on every 4D grid the world size allows,
and the overlap ablation on one grid, in one torchrun job of ``axonn.world_size`` ranks.

    python -m experiments.launch --config configs/default.yaml --nproc 4 -- -m experiments.axonn_grids
    # the emulated two-node testbed (root; moe_core.testbed), eight ranks:
    python -m experiments.launch --config configs/default.yaml hardware_profile=emulated-2x4 \\
        axonn.world_size=8 axonn.global_sequences=16 results_dir=results/emulated-2x4 --nproc 8 \\
        -- -m experiments.axonn_grids

Every point (moe_core/papers/axonn/sweeps.py) runs experiments/train_step.py's training loop on its own
process groups: ``axonn.warmup_iters`` + ``axonn.iters`` steps, the worst rank per iteration kept.
Its communication time per step, ``comm_ms``, is the time the ranks wait for the grid's collectives
(``grid_comm_ms``) plus the data-parallel gradient all-reduce after the backward pass
(``allreduce_exposed_ms``). Every record also carries AxoNN's communication model's prediction of
it, ``predicted_comm_ms`` (no overlap; moe_core/papers/axonn/comm_model.py), on
``axonn.model_profile``: the testbed's calibrated profile in the workflow (the rules pass it), the
run's own profile when empty, whose link rates must then be stated. Rank 0 writes
``results/raw/axonn/axonn_grids/<point>.json``.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from experiments.train_step import train
from moe_core.benchmark import benchmark_main, measured_record
from moe_core.config import ConfigError
from moe_core.distributed import Env
from moe_core.grid import Grid
from moe_core.papers.axonn.sweeps import (
    MEASURED,
    PAPER,
    grid_points,
    measured_communication,
    model_profile,
    point_config,
)
from moe_core.points import point_params

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "axonn.world_size"


def prediction(cfg: DictConfig, grid: Grid) -> dict[str, float]:
    """AxoNN's model of one step's communication on ``grid`` (ms, and its breakdown) for ``cfg``'s
    model, on ``axonn.model_profile``."""
    seconds = measured_communication(cfg, model_profile(cfg), grid)
    total = seconds.pop("total_s")
    return {
        "predicted_comm_ms": total * 1e3,
        **{f"predicted_{k.removesuffix('_s')}_ms": v * 1e3 for k, v in seconds.items()},
    }


def run(cfg: DictConfig, env: Env) -> list[dict]:
    records = []
    for name, (grid, variant) in grid_points(cfg).items():
        point_cfg = point_config(cfg, grid, variant)
        samples, single = train(point_cfg, env)
        samples["comm_ms"] = [g + a for g, a in zip(samples["grid_comm_ms"], samples["allreduce_exposed_ms"])]
        if env.rank == 0:
            single.update(prediction(point_cfg, grid))
            params = {**point_params(point_cfg), "overlap_variant": variant}
            records.append(
                measured_record(
                    point_cfg,
                    paper=PAPER,
                    experiment=MEASURED,
                    point=name,
                    params=params,
                    samples=samples,
                    extra_metrics=single,
                )
            )
            print(f"{name}: comm {sorted(samples['comm_ms'])[len(samples['comm_ms']) // 2]:.2f} ms", file=sys.stderr)
    return records


def check(cfg: DictConfig) -> None:
    """Before any process starts: the model's profile states the links it prices (ConfigError if not)."""
    for grid, _ in grid_points(cfg).values():
        try:
            prediction(point_config(cfg, grid, "none"), grid)
        except ValueError as err:
            raise ConfigError(f"config key 'axonn.model_profile': {err}") from None


def main(argv: list[str] | None = None) -> None:
    benchmark_main(argv, __doc__, WORLD_SIZE_KEY, run, check)


if __name__ == "__main__":
    main()
