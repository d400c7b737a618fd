"""MoNTA's performance model at the paper's setting: the strategy ranking and the chunk-count curve.

    python -m experiments monta --config configs/default.yaml

No processes, no torch: the model is closed-form (moe_core/papers/monta/performance_model.py). For
the paper's model (``monta.overrides``) on its testbed (``monta.hardware``), it writes

* ``monta_strategy``: every (tp, ep, dp) layout of the 16 GPUs with its predicted dispatch time
  (MoNTA's pipelined exchange, chunk count chosen by the model), inter-node bytes, expert memory per
  GPU, whether that fits ``monta.device_memory_GB``, and its rank (MoNTA's choice is rank 1);
* ``monta_chunk_model``: the predicted pipelined dispatch time at the largest tensor-parallel size
  of ``monta.sim_tensor_parallel`` for every admissible chunk count, and the count the model picks;
  again at the other end of each unstated parameter's range (``MONTA_UNSTATED``, the NIC count;
  points ``<testbed>_<parameter><value>_...``, param ``unstated``), for the range of that pick.

Records carry ``mode: simulated`` and ``backend: model`` (a testbed of their own, beside the step
simulator's ``sim``), ``results/raw/monta/<experiment>/<point>.json``, all written at the end.

The study, its points and the model's prediction of each, is moe_core.papers.monta.study; this
entry point runs it on the config and writes the records.
"""

from __future__ import annotations

import argparse

from omegaconf import DictConfig

from experiments.benchmark import prediction_record, predictions_main
from moe_core.papers.monta.study import study_points
from moe_core.papers.monta.sweeps import PAPER


def records(cfg: DictConfig) -> list[dict]:
    """Every record of this run, one per point of the study."""
    return [prediction_record(cfg, PAPER, point) for point in study_points(cfg)]


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.monta's command line)."""
    return predictions_main(args, records)
