"""AxoNN's measured grid sweep: training steps of a dense GPT on every 4D grid the world size allows,
and the overlap ablation on one grid, in one torchrun job of ``axonn.world_size`` ranks.

    python -m experiments.launch --config configs/default.yaml --nproc 4 -- -m experiments.axonn_grids
    # the emulated two-node testbed (root; moe_core.host.testbed), eight ranks:
    python -m experiments.launch --config configs/default.yaml hardware_profile=emulated-2x4 \\
        axonn.world_size=8 axonn.global_sequences=16 results_dir=results/emulated-2x4 --nproc 8 \\
        -- -m experiments.axonn_grids

Every point (moe_core/papers/axonn/sweeps.py) runs experiments/train_step.py's training loop on its own
process groups: ``axonn.warmup_iters`` + ``axonn.iters`` steps, the worst rank per iteration kept.
Its communication time per step, ``comm_ms``, is the time the ranks wait for the grid's collectives
(``grid_comm_ms``) plus the data-parallel gradient all-reduce after the backward pass
(``allreduce_exposed_ms``). Rank 0 writes ``results/raw/axonn/axonn_grids/<point>.json``: measurements
only. AxoNN's communication model's prediction for each point is a simulated record of its own, with
the same point name and params (``python -m experiments.axonn_grid_predictions``, on the testbed's
calibrated profile), which the analysis joins to this one.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "axonn.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = ("axonn", "model", "train", "hardware_profile", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> None:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.axonn_grids import run  # torch: once the command line is parsed

    run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
