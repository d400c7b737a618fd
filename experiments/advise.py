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
the tokens each capacity path drops, the useful bytes and their rate. It says which wins and by how
much, which wins among those that drop nothing, and the assumptions. Exit 2 on bad input, naming
the option. No processes, seconds of CPU.
"""

from __future__ import annotations

import argparse
import json
import sys

from omegaconf import OmegaConf

from experiments.simulate import sized_hardware
from moe_core.config.load import ConfigError, hardware_profile
from moe_core.dispatch import DISPATCHERS
from moe_core.dispatch.study import MAX_LOGNORMAL_SIGMA, rank_dispatchers, study_steps
from moe_core.dispatch.workloads import IMBALANCE_WORKLOADS, split_name
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.records.console import table


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


def advice(args: argparse.Namespace) -> dict:
    """The ranking, the winners and the assumptions, as one JSON-able object."""
    hw = sized_hardware(
        OmegaConf.create({"hardware": hardware_profile(args.hardware), "parallel": {"world_size": args.ranks}})
    )
    ranking = rank_dispatchers(
        hw,
        ranks=args.ranks,
        experts=args.experts,
        top_k=args.top_k,
        tokens_per_rank=args.tokens,
        row_bytes=args.d_model * DTYPE_BYTES[args.dtype],
        capacity_factor=args.capacity_factor,
        workload=args.workload,
        seed=args.seed,
    )
    lossless = [row for row in ranking if row["dropped_fraction"] == 0]
    nodes = -(-args.ranks // hw.devices_per_node)
    skipped = [name for name, d in DISPATCHERS.items() if d.tensor_parallel]
    return {
        "inputs": {**vars(args), "hardware": hw.name},
        "ranking": ranking,
        "fastest": ranking[0]["dispatcher"],
        "fastest_without_drops": lossless[0]["dispatcher"] if lossless else None,
        "assumptions": [
            "one MoE layer's dispatch then combine, not overlapped with compute: all of it is exposed",
            f"the network model of '{hw.name}' (moe_core.sim): {args.ranks} ranks on {nodes} node(s) of "
            f"{hw.devices_per_node}, intra-node {hw.intra_node_GBps:g} GB/s, {hw.nics_per_node} NIC(s) of "
            f"{hw.nic_GBps:g} GB/s per node; a prediction, not a measurement (a measured run's "
            "tables/dispatchers_vs_model.csv says how close it comes on that testbed)",
            f"{args.experts // args.ranks} expert(s) per rank, contiguous; capacity paths keep "
            f"ceil({args.capacity_factor:g} x top-k x tokens / experts) slots per expert and source rank",
            f"routing: workload '{args.workload}', seed {args.seed}, mean over its "
            f"{study_steps(args.workload, args.ranks)} step(s)",
            f"not ranked: the tensor-parallel dispatchers ({', '.join(skipped)}), simulated inside "
            "training steps (experiments/simulate.py)",
        ],
    }


def report(result: dict) -> str:
    """The advice as text: the table, the winners by how much, the assumptions."""
    a, ranking = result["inputs"], result["ranking"]
    lines = [
        f"Which dispatcher: {a['ranks']} ranks of {a['hardware']}, {a['experts']} experts, top-{a['top_k']}, "
        f"{a['tokens']} tokens per rank of {a['d_model']} {a['dtype']}, workload {a['workload']} "
        f"(imbalance {ranking[0]['imbalance']:.2f}: max tokens per expert / mean)",
        "",
        table(
            [
                {
                    "dispatcher": row["dispatcher"],
                    "time(ms)": row["exchange_ms"],
                    "vs fastest(x)": row["vs_fastest"],
                    "dropped": row["dropped_fraction"],
                    "useful(GB/s)": row.get("useful_GBps"),
                }
                for row in ranking
            ],
            floatfmt=("", ".3f", ".2f", ".1%", ".1f"),
        ),
    ]
    best = ranking[0]
    lines.append("")
    if len(ranking) > 1:
        lines.append(
            f"Fastest: {best['dispatcher']}, {ranking[1]['vs_fastest']:.2f}x faster than {ranking[1]['dispatcher']}"
            + (f", but it drops {best['dropped_fraction']:.1%} of the tokens" if best["dropped_fraction"] else "")
            + "."
        )
    lossless = [row for row in ranking if row["dropped_fraction"] == 0]
    if lossless and lossless[0] is not best:
        margin = (
            f", {lossless[1]['exchange_ms'] / lossless[0]['exchange_ms']:.2f}x faster than {lossless[1]['dispatcher']}"
            if len(lossless) > 1
            else ""
        )
        lines.append(
            f"Fastest that drops nothing: {lossless[0]['dispatcher']}{margin} "
            f"({lossless[0]['vs_fastest']:.2f}x the fastest's time)."
        )
    lines += ["", "Assumptions:", *(f"- {item}" for item in result["assumptions"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = advice(args)
    except (ConfigError, ValueError) as err:  # a profile that does not load, or lacks a rate the model needs
        print(f"error: --hardware {args.hardware}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
