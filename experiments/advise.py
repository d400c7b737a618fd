"""Which token dispatcher, on my cluster, for my routing: the registered dispatchers ranked by the
simulator's time for one MoE layer.

    python -m experiments.advise --hardware h100-ndr-cluster --ranks 64 --experts 256 --top-k 8 \\
        --tokens 4096 --d-model 7168 --workload zipf:1.0
    python -m experiments.advise --hardware my-cluster.yaml ... --json

Given a hardware profile (a name of configs/hardware/ or your YAML), an MoE layer's shape (experts
over ``--ranks`` expert-parallel ranks, top-k, tokens per rank, hidden size and dtype) and a routing
workload (moe_core.dispatch.workloads: uniform, zipf:<s>, lognormal:<sigma>, or one of Megatron-LM's
imbalance workloads such as hot_rank or source_ragged), every registered dispatcher that applies is
priced by the network model (moe_core.dispatch_study.rank_dispatchers): dispatch then combine,
the tokens each capacity path drops, the part of the exchange left exposed (all of it: none of the
ranked exchanges overlaps compute), the useful bytes, the bytes each path moves and their rates
(busbw: bytes moved per rank over the time). It says which wins and by how
much, which wins among those that drop nothing, and the assumptions. Exit 2 on bad input, naming
the option: every option is checked at parse (ranks within the bound every run has,
moe_core.schema.run_checks.too_many_ranks; a routing draw that fits this host's memory), the
profile's rates where it loads. No processes; seconds of CPU for tens of ranks, but at top-k > 1
the routing draw grows with ranks x tokens x experts (README.md, "Which dispatcher on my cluster?").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from moe_core.dispatch.workloads import IMBALANCE_WORKLOADS, split_name, why_not
from moe_core.dispatch_study import MAX_LOGNORMAL_SIGMA
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.schema.run_checks import host_memory_bytes, too_many_ranks
from moe_core.schema.sections import MAX_SEED

# The widest hidden size a question may ask about: a hundred times the widest of today's MoE models
# (DeepSeek-V3's 7168); beyond, row bytes overflow the model's arithmetic.
MAX_D_MODEL = 2**20
# Published capacity factors are 1 to 2; past this one a capacity path only pads (and its bytes overflow).
MAX_CAPACITY_FACTOR = 100.0


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {value}")
        return value

    return parse


def capacity_factor(text: str) -> float:
    """An argparse type: a finite capacity factor in (0, MAX_CAPACITY_FACTOR]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= MAX_CAPACITY_FACTOR:  # also nan and inf
        raise argparse.ArgumentTypeError(f"must be a number in (0, {MAX_CAPACITY_FACTOR:g}], got {text}")
    return value


def ranks(text: str) -> int:
    """An argparse type: expert-parallel ranks within the bound every run has (moe_core.schema.run_checks)."""
    value = bounded_int(1, sys.maxsize)(text)
    why = too_many_ranks(value)
    if why:
        raise argparse.ArgumentTypeError(f"{why}; ask about fewer")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, every option checked: a message naming the option, exit 2."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    counts = bounded_int(1, 2**31 - 1)
    parser.add_argument("--hardware", required=True, help="a profile of configs/hardware/ or a YAML file")
    parser.add_argument("--ranks", type=ranks, required=True, help="expert-parallel ranks (GPUs) of the layer")
    parser.add_argument("--experts", type=counts, required=True, help="experts, a multiple of --ranks")
    parser.add_argument("--top-k", type=counts, default=2, help="experts per token (default 2)")
    parser.add_argument("--tokens", type=counts, required=True, help="tokens per rank and step")
    parser.add_argument("--d-model", type=bounded_int(1, MAX_D_MODEL), required=True, help="hidden size of a token")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="on the wire")
    parser.add_argument("--workload", default="uniform", help="routing workload (default uniform)")
    parser.add_argument(
        "--capacity-factor", type=capacity_factor, default=1.25, help="of the capacity paths (default 1.25)"
    )
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0, help="of the routing draw")
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    args = parser.parse_args(argv)
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks} (whole experts per rank)")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} exceeds --experts {args.experts}")
    draw = routing_bytes(args)
    if draw > host_memory_bytes():
        parser.error(
            f"--tokens {args.tokens}: the routing draw of {args.ranks} ranks x {args.experts} experts takes about "
            f"{draw / 2**30:.0f} GiB, over this host's {host_memory_bytes() / 2**30:.0f} GiB; ask about fewer tokens"
        )
    why = workload_error(args)
    if why:
        parser.error(f"--workload {args.workload}: {why}")
    return args


def routing_bytes(args: argparse.Namespace) -> int:
    """The memory of the routing draw (moe_core.dispatch.workloads.routing): every rank's choices
    (int64) and one rank's float64 key per token and expert at a time."""
    return 8 * args.tokens * (args.ranks * args.top_k + args.experts)


def workload_error(args: argparse.Namespace) -> str | None:
    """Why ``--workload`` cannot route this layer (None: it can): a malformed name, a sigma that
    overflows, a trace that does not load or fit, a layout the workload cannot heat."""
    names = ", ".join(IMBALANCE_WORKLOADS)
    try:
        kind, parameter = split_name(args.workload)
        if kind == "lognormal" and parameter > MAX_LOGNORMAL_SIGMA:
            return f"sigma above {MAX_LOGNORMAL_SIGMA:g} overflows the expert weights"
        return why_not(args.workload, experts=args.experts, ranks=args.ranks, top_k=args.top_k)
    except ValueError as err:
        return f"{err}; use uniform, zipf:<s>, lognormal:<sigma>, trace:<name> or one of {names}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from experiments.impl.advise import run  # the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
