"""AxoNN at Perlmutter scale, simulated: weak scaling against a Megatron-LM-style baseline, the overlap
ablation, and the ranking of every grid for the largest model (seconds of CPU, no processes). The
model's prediction for each point of the measured grid sweep: experiments/axonn_grid_predictions.py.

    python -m experiments axonn --config configs/default.yaml

Every training step is the step simulator's (moe_core.sim.step) on ``axonn.hardware``, built from the
same config and decisions as a measured run: the grid's collectives (moe_core.parallel.grid), the plan's
overlaps, the data-parallel all-reduce after the backward pass (AxoNN's). Records:

* ``axonn_scaling/<model>_<system>``: each model of moe_core/papers/axonn/models.py on its GPUs,
  trained on ``axonn.sequences_per_gpu`` sequences per GPU,
  ``axonn`` on the grid AxoNN's communication model ranks first (all three overlaps), ``megatron``
  on the baseline's layout (tensor parallelism in a node x pipeline x data): one pipeline stage of
  one micro-batch simulated alone and with its data-parallel replicas (the difference is the
  gradient all-reduce after the pipeline flush), composed by the 1F1B schedule
  (the layout moe_core/papers/axonn/baseline.py's, the schedule moe_core.sim.pipeline's). Time per
  batch, model FLOP/s and their share of peak.
* ``axonn_ablation/<variant>``: the ~2B model under every overlap variant, on the best grid on which
  every overlap acts.
* ``axonn_ranking/<grid>``: the model's prediction for every grid of the largest model that fits in
  memory (rank, predicted communication and its breakdown, memory), and the simulated step of the
  ``axonn.ranked_grids`` best.
* Sensitivity runs (``<point>_<parameter><value>``, param ``unstated``): what the abstract's numbers are
  read from (the 80B model's two systems, the 2B model without and with every overlap) again at the
  other end of each unstated parameter's range that is simulated (``AXONN_UNSTATED``: the batch per
  GPU and the NICs' share of line rate; moe_core/papers/axonn/config.py gives every value and why).

Neither system's simulated step recomputes activations (both train under the memory of full
recomputation, as Megatron-AxoNN's scripts run): both lack the same extra forward pass.

The study, its points and how each is simulated, is moe_core.papers.axonn.study; this entry point
runs it on the config and writes one record per point (mode simulated, backend sim), all once every
point is done.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig
from tqdm import tqdm

from experiments.benchmark import prediction_record, predictions_main
from moe_core.papers.axonn.study import PAPER, ranking_points, run_points, study_runs


def records(cfg: DictConfig) -> list[dict]:
    """Every record of the study: each run's scaling and ablation (``study_runs``), with that run's
    config, and the ranking at the chosen values (``ranking_points``: none in a run at a setting)."""
    out = []
    for suffix, overrides, models, variants in tqdm(study_runs(cfg), desc="axonn runs", file=sys.stderr):
        run_cfg, points = run_points(cfg, overrides, models, variants, suffix)
        out += [prediction_record(run_cfg, PAPER, point) for point in points]
    return [*out, *(prediction_record(cfg, PAPER, point) for point in ranking_points(cfg))]


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.axonn's command line)."""
    return predictions_main(args, records)
