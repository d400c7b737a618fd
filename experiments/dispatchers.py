"""Which dispatcher when: every dispatch path's round trip under routing skew (moe_core.dispatch_study).

Measured, under torchrun (usually through the launcher)::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments.dispatchers

Its simulated executor is experiments/dispatchers_sim.py.

Measured: every registered token dispatcher (moe_core.dispatch) that applies on
``dispatch_study.world_size`` ranks, one expert per rank (per expert-parallel rank for the
tensor-parallel dispatchers, with ``dispatch_study.tensor_parallel`` ranks sharing tokens); for every
skew every rank routes its tokens by the same seeded counts, and each dispatcher moves them to their
experts and back: float32 rows of ``d_model``, capacity C = ceil(capacity_factor * tokens / E)
rounded to a multiple of tp * chunks. ``hierarchical`` runs only when the group spans nodes of
``hardware.devices_per_node`` ranks. A skew is a routing workload (moe_core.dispatch.workloads);
one that changes between steps runs its steps in turn, iteration i on step i mod its period. Before
timing, every cell is checked against a single-process reference on every step's routing: each
expert multiplies the rows it received by 2 + its index (no expert leaves them as they are), and
every row must come back to its rank as its expert left it (``Dispatcher.routed``: the rows a rank
sends and their experts), so a row sent to the wrong expert or to none, lost, duplicated or
returned to the wrong place counts; then a backward pass must bring every row its exact gradient
(``Paths.wrong_rows``). ``#wrong`` is the rows whose value or gradient differ, summed over ranks and
steps; a cell with any is not timed, and once the others are recorded the run exits 1 naming it.
Methodology as experiments/collectives.py: warm-up, timed iterations with a barrier before each,
the worst rank per iteration, ``dispatch_study.repeats`` repeats of that (each with its own
warm-up; in one process, not separate launches) summarised by their medians' mean and its 95%
interval (experiments.benchmark.repeated_iterations). A record's ``imbalance`` is its steps'
worst, ``dropped_fraction``, ``useful_bytes`` (what had to cross between ranks, there and back) and
``bytes_moved`` (what the path sends between ranks: its traffic,
moe_core.dispatch.base.Dispatcher.traffic, the description the simulator prices) their mean;
``useful_GBps`` is the useful bytes over the median time, ``algbw_GBps`` the same per rank and
``busbw_GBps`` the bytes moved per rank over it (moe_core.dispatch_study.bandwidths). Rank 0 prints
the cells as a table in the manner of nccl-tests. Records:
``results/raw/common/dispatchers/<point>.json``, all written at the end.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "dispatch_study.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = ("dispatch_study", "hardware_profile", "parallel.timeout_s", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> None:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.dispatchers import run  # torch: once the command line is parsed

    run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
