"""GShard's scaling study on the TPU v3 torus, simulated (seconds of CPU, no processes).

    python -m experiments gshard --config configs/default.yaml

The models of Table 1 (moe_core/papers/gshard/models.py) at 128, 512 and 2048 experts, one expert per
core, each on the committed profile with as many cores (``gshard.profiles``: 64-, 256- and 1024-chip
tori, one simulated device per chip), with Table 3's batch; every unstated parameter is the ``gshard``
config section's (moe_core/papers/gshard/config.py, with its reasoning). Records:

* ``gshard_scaling/<model>`` (and ``<model>_<parameter><value>``, sensitivity runs at the other ends
  of the unstated parameters' ranges, ``SCALING_UNSTATED``): the simulated step's metrics
  (moe_core.sim.step: step time, all-to-all time and share, gate, experts, the rest of the
  transformer, the gradient all-reduce left after the backward pass), steps/s and the batch it
  carries, each component's roofline (FLOPs at the profile's peak, the all-to-alls at line rate;
  moe_core/papers/gshard/roofline.py), the MoE compute's fraction of its roofline, and memory per
  core by kind in that run (Fig 7's kinds).
* ``gshard_memory/<layers>l_<experts>e``: memory per core by kind of Fig 7's models (12 to 60 layers x
  the profiles' expert counts) at the tokens per core of the 512- and 2048-core runs (GShard's N/D
  constant), against the core's HBM.
* ``gshard_collectives/<collective>_p<partitions>_<bytes>``: an all-to-all and an all-reduce of
  ``gshard.collective_bytes_per_partition`` per core on a torus slice of the largest profile of each
  ``gshard.collective_partitions`` (Fig 9): the simulated time and its line-rate bound.

The study, its points and how each is simulated, is moe_core.papers.gshard.study; this entry point
runs it on the config and writes one record per point (mode simulated), all once every point is done.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig
from tqdm import tqdm

from experiments.benchmark import prediction_record, predictions_main
from moe_core.papers.gshard.study import PAPER, all_scaling_runs, collective_points, memory_points, scaling


def records(cfg: DictConfig) -> list[dict]:
    """Every record of the study (a bad profile fails before any simulation)."""
    runs = all_scaling_runs(cfg)
    scaled = [scaling(cfg, *run) for run in tqdm(runs, desc="gshard scaling runs", file=sys.stderr)]
    return [prediction_record(cfg, PAPER, point) for point in [*scaled, *memory_points(cfg), *collective_points(cfg)]]


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.gshard's command line)."""
    return predictions_main(args, records)
