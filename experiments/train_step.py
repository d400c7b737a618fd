"""Measured MoE training steps: one sweep point, run under torchrun.

    torchrun --standalone --nproc-per-node=4 -m experiments.train_step \\
        --config configs/default.yaml moe.num_experts=8 comm.policy=overlap

Each iteration: barrier, forward, backward, gradient synchronisation (the policy's plan), optimizer
step; a plan with a re-layout hook (moe_core.schedule.plan.Relayout: Lina's ``lina``, ``lina-pack`` pack
experts) re-decides the expert layout between steps and moves the experts when it changes.
Phases are timed per rank (moe_core.host.timing); per iteration the worst rank is kept; the record holds
median and p95 over the timed iterations. Rank 0 writes the record atomically once every rank has
finished, then mirrors it to W&B. ``--profile DIR`` runs a few more steps after the timed ones under
torch.profiler and writes each rank's trace and kernel summary there (moe_core.runtime.profiling). A bad
config exits with code 2 before any process group is created; a failing or hung rank makes every
rank exit non-zero within ``parallel.timeout_s``.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "parallel.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = (
    "paper",
    "experiment",
    "model",
    "moe",
    "parallel",
    "comm",
    "train",
    "hardware_profile",
    "results_dir",
    "sweep.name",
    "wandb",
)


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.add_argument("--out", help="record path (default: results/raw/<paper>/<experiment>/<point>.json)")
    parser.add_argument("--profile", metavar="DIR", help="after the timed steps, trace more under torch.profiler")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps to trace with --profile (default 3)")
    args = parser.parse_intermixed_args(argv)
    if args.profile_steps < 1:
        parser.error(f"--profile-steps must be at least 1, got {args.profile_steps}")
    from experiments.impl.train_step import run  # torch: once the command line is parsed

    return run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
