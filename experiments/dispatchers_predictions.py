"""The simulator's prediction for every measured cell of the dispatcher study, on the testbed.

    python -m experiments dispatchers_predictions --config configs/default.yaml \\
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

import argparse

from omegaconf import DictConfig

from experiments.benchmark import predicted_record, predictions_main
from experiments.dispatchers import PAPER, cell_params, measured_cells
from experiments.simulate import sized_hardware
from moe_core.config.load import ConfigError, derive_config
from moe_core.dispatch_study import measured_capacity, simulated_exchange_ms, step_counts
from moe_core.model.capacity import DTYPE_BYTES

EXPERIMENT = "dispatchers_predictions"


def testbed(cfg: DictConfig) -> DictConfig:
    """The hardware the cells are predicted on: ``dispatch_study.model_profile`` (or the run's own),
    with nodes enough for the study's ranks."""
    d = cfg.dispatch_study
    overrides = [f"parallel.world_size={d.world_size}", f"moe.num_experts={d.world_size}", "moe.experts_per_rank=1"]
    if d.model_profile:
        overrides.append(f"hardware_profile={d.model_profile}")
    return sized_hardware(derive_config(cfg, overrides))


def prediction_records(cfg: DictConfig) -> list[dict]:
    """One record per measured cell the simulator prices: its predicted round trip on the testbed."""
    d, hw, records = cfg.dispatch_study, testbed(cfg), []
    row_bytes, capacity = d.d_model * DTYPE_BYTES["float32"], measured_capacity(d, d.world_size)
    for skew, path, point in measured_cells(cfg, simulated_only=True):
        steps = step_counts(skew, d.world_size, d.tokens_per_rank, d.seed)
        try:
            exchange_ms = simulated_exchange_ms(hw, steps, capacity, row_bytes, path)
        except ValueError as err:  # the profile cannot price the cell (a link rate it lacks)
            raise ConfigError(f"config key 'dispatch_study.model_profile': {err}") from None
        records.append(
            predicted_record(
                cfg,
                paper=PAPER,
                experiment=EXPERIMENT,
                point=point,
                hardware=cfg.hardware.name,
                params=cell_params(cfg, skew, path, capacity),
                metrics={"predicted_exchange_ms": exchange_ms},
                backend="sim",
            )
        )
    return records


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.dispatchers_predictions's command line)."""
    return predictions_main(args, prediction_records)
