"""MoNTA's performance model at the paper's setting: the strategy ranking and the chunk-count curve.

    python -m experiments.monta --config configs/default.yaml

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
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("monta", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.monta import run  # the models and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
