"""AxoNN's communication model's prediction for each point of the measured grid sweep.

    python -m experiments axonn_grid_predictions --config configs/default.yaml \\
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

import argparse

from omegaconf import DictConfig

from experiments.benchmark import predicted_record, predictions_main
from moe_core.papers.axonn.sweeps import PAPER, PREDICTED, grid_point_params, grid_points, predicted_metrics
from moe_core.papers.axonn.sweeps import point_config as grid_point_config


def grid_prediction_records(cfg: DictConfig) -> list[dict]:
    """The model's prediction for every point of the measured grid sweep, on the run's testbed:
    each record named and parametrised as the measured point's (grid_points)."""
    out = []
    for name, (grid, variant) in grid_points(cfg).items():
        point = grid_point_config(cfg, grid, variant)
        out.append(
            predicted_record(
                point,
                paper=PAPER,
                experiment=PREDICTED,
                point=name,
                hardware=cfg.hardware.name,
                params=grid_point_params(point, variant),
                metrics=predicted_metrics(point, grid),
                backend="model",
            )
        )
    return out


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.axonn_grid_predictions's command line)."""
    return predictions_main(args, grid_prediction_records)
