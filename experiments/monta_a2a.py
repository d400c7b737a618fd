"""MoNTA's exchange measured: one MoE dispatch of tokens the tensor-parallel ranks hold in duplicate.

Run under torchrun (every rank runs this file), usually through the launcher::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments.monta_a2a [key=value ...]

For every ``monta.tensor_parallel`` size t on ``monta.world_size`` ranks (layout dp x ep x tp with
ep = world / t, tp innermost as moe_core.parallel.layout places it), every rank holds a dispatch buffer of
``monta.bytes_per_rank`` bytes (float32 rows of ``monta.d_model``; one block per expert-parallel
rank), the same on the ranks of a "tp" group. One exchange moves it along each path:

* ``duplicate``: the whole buffer through the "ep" all-to-all (every tp rank sends its copy);
* ``drop-gather``: 1/t of it through the all-to-all, then an all-gather over "tp" (DeepSpeed);
* ``monta-n<k>``: the same in k pipelined chunks (moe_core.comm.all_to_all.tp_exchange), for every
  ``monta.chunks`` count that divides the slots a rank sends;
* at t = 1, ``flat`` (all_to_all_single) and, when the "ep" group spans nodes of
  ``hardware.devices_per_node`` ranks, ``hierarchical`` (moe_core.comm.hierarchical_a2a).

Every path's output is checked against ``duplicate``'s (``flat``'s at t = 1) before timing.
Methodology as experiments/collectives.py: ``monta.warmup_iters``, then ``monta.iters`` timed
exchanges, a barrier before each, the worst rank per iteration kept. A record per point also carries
MoNTA's performance-model prediction and chunk choice for this buffer on ``cfg.hardware`` when the
profile states its links (moe_core/papers/monta/performance_model.py); rank 0 writes all records at
the end, ``results/raw/monta/monta_a2a/<point>.json``.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "monta.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = ("monta", "hardware_profile", "parallel.timeout_s", "results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> None:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.monta_a2a import run  # torch: once the command line is parsed

    run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
