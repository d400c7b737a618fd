"""Aurora's simulated experiments: its decisions timed by the simulator on its big switch.

    python -m experiments.aurora --config configs/default.yaml [key=value ...]

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and Communication
Scheduling", arXiv 2410.17043 (reference/papers.md §5). The workloads, the points and the run are
moe_core.papers.aurora.study, the simulated inference moe_core.papers.aurora.inference_sim; this
entry point loads the config and the two networks' hardware profiles, runs the study at the chosen
values of the unstated parameters and the deployment experiment again at the other ends of their
ranges (moe_core.papers.aurora.config.AURORA_UNSTATED), and writes one record per point (mode
simulated, backend sim). All records are computed first and written at the end (each atomically), so
a failing run writes none.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("aurora", "model", "train.seed", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.aurora import run  # torch and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
