"""Record the routing of the suite's own trained gate as a trace the dispatcher study can replay.

    python -m experiments.record_routing --config configs/default.yaml moe.num_experts=16 moe.experts_per_rank=4 \\
        --name markov-e16-top2 --train-steps 200 --batch 32

Trains the model of the config on its Markov data for ``--train-steps`` steps on one process, keeps
every MoE layer's top-k choices for one unseen batch of ``--batch`` sequences, and writes them to
``--out`` (default: results/reference/routing_traces/<name>.npz, where ``trace:<name>`` finds them;
moe_core.dispatch.routing_trace). It then prints the imbalance factor (max tokens per expert / mean)
and the Gini coefficient of every layer's per-expert load, for the data's tokens and for mock tokens
(uniformly random ids through the same model, as benchmark harnesses feed it; DODOCO, arXiv
2605.20982, finds that mock tokens misstate the skew), beside the synthetic skews at the same
experts, top-k and tokens. Exit 2 on bad input.
"""

from __future__ import annotations

import sys
from pathlib import Path

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("model", "moe", "train")


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.add_argument("--name", required=True, help="the trace's name: the workload trace:<name> replays it")
    parser.add_argument("--train-steps", type=int, default=200, help="router training before the trace")
    parser.add_argument("--batch", type=int, default=32, help="sequences of the traced batch")
    parser.add_argument("--out", type=Path, help="where to write it (default: the committed traces' folder)")
    args = parser.parse_intermixed_args(argv)
    if args.train_steps < 0 or args.batch < 1:
        parser.error(f"--train-steps must be >= 0 and --batch >= 1, got {args.train_steps} and {args.batch}")
    from experiments.impl.record_routing import run  # the model and torch: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
