"""Lina's inference at the paper's scale, simulated: every placement policy on the paper's testbed.

    python -m experiments.lina_inference_sim --config configs/default.yaml

For each count in ``lina.inference_experts`` (experts = GPUs of ``lina.hardware``): the simulated
training model (``lina.overrides``) with top-1 routing and no capacity, on synthetic routing with
the paper's popularity skew (Fig 6) and path following (Fig 9) (moe_core/papers/lina/routing.py).
``inference.profile_batches`` batches are profiled into expert paths of ``inference.path_length``
layers; then ``lina.inference_batches`` batches run under every policy (``ideal`` and
``inference.policies``), each batch's forward pass simulated (moe_core.sim.forward).

Records (paper ``lina``, experiment ``inference``, mode simulated, backend sim, the profile as
hardware), one per policy and expert count, in the measured inference's schema, so the same
reproducers read both: per batch ``forward_ms`` (Fig 16), ``moe_layer_ms`` (Fig 17) and
``moe_layer_norm`` (over ideal's median), per-phase times, each MoE layer's all-to-all time
``a2a_layer<i>_ms`` (Fig 18) and ``load_imbalance``; for Lina's policies the estimation accuracy
and re-plan rate. Point names start with ``sim_``.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("lina", "inference", "train.seed", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.lina_inference_sim import run  # the models and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
