"""Which dispatcher when, simulated: the round trip of every registered dispatcher that is not
tensor-parallel (moe_core.dispatch_study.simulated_paths) under routing skew on the
``dispatch_study.hardware`` clusters (no processes, no torch).

    python -m experiments.dispatchers_sim --config configs/default.yaml

Per cluster, size (``dispatch_study.sim_world_sizes``: the profile grown to that many GPUs with more
nodes of its kind), skew and path: the GPUs, one expert each, route ``sim_tokens_per_rank`` bf16
tokens of ``sim_d_model`` by the same seeded workload as the measured run draws, and the topology
times the dispatch and the combine (moe_core.sim). A skew that cannot route at a size (a recorded
trace of fewer experts than the GPUs) and a path that does not apply there (the hierarchical
exchange within one node) have no cell. A workload that changes between steps is simulated on each
step of its period: ``exchange_ms`` is their mean (the time per iteration of a long run),
``imbalance`` their worst, ``dropped_fraction``, ``useful_bytes`` and ``bytes_moved`` (what the path
sends between ranks: the traffic it states, which the simulator priced) their mean, and the rates
over that time: ``useful_GBps``, ``algbw_GBps`` and ``busbw_GBps`` (moe_core.dispatch_study.bandwidths).
The tensor-parallel dispatchers are not simulated here: the
measured study times them, and at scale they are simulated inside training steps (MoNTA's figures).
Records: ``results/raw/common/dispatchers_sim/<point>.json``.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("dispatch_study", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.dispatchers_sim import run  # the models and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
