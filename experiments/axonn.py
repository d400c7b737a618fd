"""AxoNN at Perlmutter scale, simulated: weak scaling against a Megatron-LM-style baseline, the overlap
ablation, and the ranking of every grid for the largest model (seconds of CPU, no processes). The
model's prediction for each point of the measured grid sweep: experiments/axonn_grid_predictions.py.

    python -m experiments.axonn --config configs/default.yaml

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
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("axonn", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.axonn import run  # the models and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
