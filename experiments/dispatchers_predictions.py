"""The simulator's prediction for every measured cell of the dispatcher study, on the testbed.

    python -m experiments.dispatchers_predictions --config configs/default.yaml \\
        dispatch_study.model_profile=results/calibration/local-cpu-calibrated.yaml

For every cell experiments/dispatchers.py measures whose path the simulator prices on its own (the
non-tensor-parallel ones, moe_core.dispatch_study.simulated_paths): the same routing step by step,
capacity and float32 rows on ``dispatch_study.world_size`` ranks, timed on
``dispatch_study.model_profile`` (the testbed's calibrated profile in the workflow, the rules pass
it; the run's own when empty; exit 2 naming the key when it lacks a link rate the cell needs):
``predicted_exchange_ms``, the mean over the workload's steps. Each record is named and
parametrised as its measured cell, so the analysis sets the two side by side with their ratio
(table ``dispatchers_vs_model``). A job of its own, simulated: the measured study never reads a
calibration.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("dispatch_study", "hardware_profile", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.dispatchers_predictions import (
        run,  # the models and the simulator: once the command line is parsed
    )

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
