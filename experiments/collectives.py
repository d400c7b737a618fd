"""nccl-tests-style microbenchmark of the collectives an MoE layer uses, alone and in pairs.

Run under torchrun (every rank runs this file)::

    torchrun --standalone --nproc-per-node=4 -m experiments.collectives [--config FILE]... [key=value]... [--check]

For every size S from ``collectives.min_bytes`` to ``max_bytes`` (times ``step_factor``) it times

* ``all_reduce``: an fp32 tensor of S bytes, summed in place;
* ``all_gather``: every rank's S/n bytes gathered into an S-byte tensor on every rank, and
  ``reduce_scatter``: an S-byte tensor summed over the ranks, each keeping its S/n bytes (the two
  collectives of the dispatchers' all-gather path);
* ``all_to_all``: ``all_to_all_single`` of an S-byte buffer per rank, equal splits;
* ``all_to_all_v``: ``all_to_all_single`` with the uneven splits of
  :func:`moe_core.comm.workloads.zipf_traffic_matrix` (every rank sends S bytes, a few receive most);
* each all-to-all again while an S-byte all-reduce runs concurrently on its own process group (the
  gradient all-reduce of data parallelism overlapping the expert all-to-all; PARAM's
  ``commsOverlapBench``), and the all-reduce next to another (the dense and the expert gradients
  of an MoE, all-reduced over their two data-parallel groups at once). Paired and alone iterations
  alternate in the same loop, so ``slowdown`` compares numbers taken under the same conditions.

Methodology (reference/peers.md §4): warm-up iterations, then per timed iteration a barrier and
one timed call (more iterations for latency-bound sizes: experiments.impl.collectives.timed_iterations)
(``perf_counter`` on CPU, CUDA events on GPU); each iteration keeps the worst rank.
``algbw = S / t`` and ``busbw = algbw * factor`` with the nccl-tests factors
(experiments.impl.collectives.bus_bandwidth_factor); GB/s are 1e9 bytes/s. ``--check`` checks every point's result
before timing it (all-reduce, reduce-scatter: the sum of the rank ids; all-gather: each rank's
chunk of its rank id, in rank order; all-to-alls: from each peer exactly its
elements, of its rank id) and counts the wrong elements over all ranks: a point with any is not
timed, and the run exits 1 naming it once the others are measured; a passed check leaves
``wrong_elements: 0`` in the record. Rank 0 prints a row of nccl-tests' table as each point
finishes (size, count, type, time, algbw, busbw, #wrong; slowdown for the pairs) and writes one
record per (collective, concurrent, size) to ``results/raw/common/collectives/<point>.json``, all
of them at the end, so a failed run leaves no partial set of new records.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "collectives.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = ("collectives", "hardware_profile", "parallel.timeout_s", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> None:
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.add_argument(
        "--check",
        action="store_true",
        help="check every point's result before timing it: #wrong in the table, wrong_elements in its record",
    )
    args = parser.parse_intermixed_args(argv)
    from experiments.impl.collectives import run  # torch: once the command line is parsed

    run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
