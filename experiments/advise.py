"""Which token dispatcher, on my cluster, for my routing: the registered dispatchers ranked by the
simulator's time for one MoE layer.

    python -m experiments.advise --hardware h100-ndr-cluster --ranks 64 --experts 256 --top-k 8 \\
        --tokens 4096 --d-model 7168 --workload zipf:1.0
    python -m experiments.advise --hardware my-cluster.yaml ... --json

Given a hardware profile (a name of configs/hardware/ or your YAML), an MoE layer's shape (experts
over ``--ranks`` expert-parallel ranks, top-k, tokens per rank, hidden size and dtype) and a routing
workload (moe_core.dispatch.workloads: uniform, zipf:<s>, lognormal:<sigma>, or one of Megatron-LM's
imbalance workloads such as hot_rank or source_ragged), every registered dispatcher that applies is
priced by the network model (moe_core.dispatch.study.rank_dispatchers): dispatch then combine,
the tokens each capacity path drops, the part of the exchange left exposed (all of it: none of the
ranked exchanges overlaps compute), the useful bytes, the bytes each path moves and their rates
(busbw: bytes moved per rank over the time). It says which wins and by how
much, which wins among those that drop nothing, and the assumptions. Exit 2 on bad input, naming
the option. No processes, seconds of CPU.
"""

from __future__ import annotations

import argparse
import sys

from moe_core.dispatch.study import MAX_LOGNORMAL_SIGMA
from moe_core.dispatch.workloads import IMBALANCE_WORKLOADS, split_name
from moe_core.model.capacity import DTYPE_BYTES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", required=True, help="a profile of configs/hardware/ or a YAML file")
    parser.add_argument("--ranks", type=int, required=True, help="expert-parallel ranks (GPUs) of the layer")
    parser.add_argument("--experts", type=int, required=True, help="experts, a multiple of --ranks")
    parser.add_argument("--top-k", type=int, default=2, help="experts per token (default 2)")
    parser.add_argument("--tokens", type=int, required=True, help="tokens per rank and step")
    parser.add_argument("--d-model", type=int, required=True, help="hidden size of a token")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="on the wire")
    parser.add_argument("--workload", default="uniform", help="routing workload (default uniform)")
    parser.add_argument("--capacity-factor", type=float, default=1.25, help="of the capacity paths (default 1.25)")
    parser.add_argument("--seed", type=int, default=0, help="of the routing draw")
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    args = parser.parse_args(argv)
    for name in ("ranks", "experts", "top_k", "tokens", "d_model"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks} (whole experts per rank)")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    if not args.capacity_factor > 0:
        parser.error(f"--capacity-factor must be > 0, got {args.capacity_factor}")
    try:
        kind, parameter = split_name(args.workload)
    except ValueError as err:
        names = ", ".join(IMBALANCE_WORKLOADS)
        parser.error(f"--workload: {err}; use uniform, zipf:<s>, lognormal:<sigma> or one of {names}")
    if kind == "lognormal" and parameter > MAX_LOGNORMAL_SIGMA:
        parser.error(f"--workload: sigma above {MAX_LOGNORMAL_SIGMA:g} overflows the expert weights")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from experiments.impl.advise import run  # the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
