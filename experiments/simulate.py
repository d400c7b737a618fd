"""Simulated MoE training steps on a modelled cluster (no processes, no GPUs): one point, or every
point of the config's simulated sweeps.

    python -m experiments.simulate --config configs/default.yaml hardware_profile=lina-a100-4x4 \\
        parallel.world_size=16 moe.num_experts=16 moe.experts_per_rank=1 comm.policy=overlap
    python -m experiments.simulate --config configs/default.yaml --sweep

``--trace PATH`` also writes the point's simulated timeline as a Chrome trace that
https://ui.perfetto.dev opens (moe_core.sim.trace); one point only, so not with ``--sweep``.

``--sweep`` simulates every point of :func:`moe_core.schema.points.sim_points` (the paper-scale sweep and
Lina's) in this one process, which is what the workflow runs: a point takes a fraction of a second,
far less than starting a Python process with torch. Records are written once all points succeeded.

Each point gives a record in the measured runs' schema with ``mode: simulated`` and ``backend: sim`` (one
sample per metric: the model is deterministic). A cluster profile smaller than ``world_size`` is
grown with more nodes of its kind. For the ``overlap`` policy the same step is also simulated with
``sequential``, and the slowdown (overlap / sequential) of every backward all-to-all that a gradient
all-reduce overlaps is kept as samples (``a2a_bwd_slowdown``, Lina Fig 3 at paper scale: its CDF is
of the all-to-alls "overlapping DDP allreduce").
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = (
    "paper",
    "model",
    "moe",
    "parallel",
    "comm",
    "train",
    "sim_sweep",
    "hardware_profile",
    "results_dir",
    "sweep.name",
    "wandb",
)


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.add_argument(
        "--out", help="record path of a single point (default: results/raw/<paper>/sim_train_step/<point>.json)"
    )
    parser.add_argument("--sweep", action="store_true", help="simulate every point of the config's simulated sweeps")
    parser.add_argument("--trace", metavar="PATH", help="also write the point's timeline as a Chrome/Perfetto trace")
    args = parser.parse_intermixed_args(argv)
    if args.sweep and args.out:
        parser.error("--out names one record; --sweep writes one per point under results_dir")
    if args.sweep and args.trace:
        parser.error("--trace writes one point's timeline; drop --sweep and give the point's overrides")
    from experiments.impl.simulate import run  # the simulator (torch's meta device): once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
