"""Aurora's transmission orders measured: the library all-to-all vs the ordered all-to-all on gating traces.

Run under torchrun (every rank runs this file), usually through the launcher::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments.aurora_a2a [key=value ...]

Rank 0 traces our MoE model's routing on ``aurora.world_size`` GPUs for every ``aurora.gating_zipf``
(experiments.aurora.token_workloads, the simulated executor's workloads) and broadcasts the token
matrices; each is scaled so that every rank sends ``aurora.bytes_per_rank`` per layer (float32
elements). For every workload and order one "forward pass" is the dispatch all-to-all of each of
the ``aurora.moe_layers`` layers, barrier before each: ``library`` is ``all_to_all_single`` with the
trace's uneven splits; ``aurora`` (Algorithm 1), ``sjf``, ``rcs`` and ``exact`` run
moe_core.comm.ordered_a2a.ordered_all_to_all_single in that moe_core.comm.transmission order. After the
warm-up every order's output is checked against the library's.

Methodology as experiments/collectives.py: ``aurora.warmup_iters``, then ``aurora.iters`` timed
iterations; a rank's sample is the sum of its per-layer times, the worst rank per iteration is kept.
Rank 0 writes one record per (workload, order), ``results/raw/aurora/aurora_a2a/<point>.json``, all
of them at the end.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "aurora.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = (
    "aurora",
    "model",
    "train",
    "hardware_profile",
    "parallel.timeout_s",
    "results_dir",
    "sweep.name",
    "wandb",
)


def main(argv: list[str] | None = None) -> None:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.aurora_a2a import run  # torch: once the command line is parsed

    run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
