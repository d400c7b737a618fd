"""AxoNN's communication model's prediction for each point of the measured grid sweep.

    python -m experiments.axonn_grid_predictions --config configs/default.yaml \\
        axonn.model_profile=results/calibration/local-cpu-calibrated.yaml

Writes ``axonn_grid_predictions/<point>``: for every point of experiments/axonn_grids.py
(moe_core/papers/axonn/sweeps.py), on the run's testbed (its ``hardware``), the model's
communication per step, ``predicted_comm_ms`` and its breakdown ``predicted_<kind>_<axis>_ms`` (no
overlap; moe_core/papers/axonn/comm_model.py), priced on ``axonn.model_profile``: the testbed's
calibrated profile in the workflow (the rules pass it), the run's own profile when empty; exit 2
naming the key if that profile lacks a link rate it prices. Its params are the measured record's,
so the analysis joins the two. A job of its own, simulated: the measured grid sweep never reads a
calibration.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("axonn", "hardware_profile", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.axonn_grid_predictions import (
        run,  # the models and the simulator: once the command line is parsed
    )

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
