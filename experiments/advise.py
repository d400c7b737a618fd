"""Which token dispatcher, on my cluster, for my routing: the registered dispatchers ranked by the
simulator's time for one MoE layer.

    python -m experiments advise --hardware h100-ndr-cluster --ranks 64 --experts 256 --top-k 8 \\
        --tokens 4096 --d-model 7168 --workload zipf:1.0
    python -m experiments advise --hardware h800-cx7-cluster --ranks 64 --experts 256 --top-k 8 \\
        --d-model 7168 --shape decode        # 128 tokens per rank; --shape prefill: 4,096
    python -m experiments advise --hardware my-cluster.yaml ... --json

Given a hardware profile (a name of configs/hardware/ or your YAML), an MoE layer's shape (experts
over ``--ranks`` expert-parallel ranks, top-k, tokens per rank, hidden size and dtype) and a routing
workload (moe_core.dispatch.workloads: uniform, zipf:<s>, lognormal:<sigma>, or one of Megatron-LM's
imbalance workloads such as hot_rank or source_ragged), every registered dispatcher that applies is
priced by the network model (moe_core.dispatch_study.rank_dispatchers): dispatch then combine,
the tokens each capacity path drops, the part of the exchange left exposed (all of it: none of the
ranked exchanges overlaps compute), the useful bytes, the bytes each path moves and their rates
(each labelled by kind: logical, the bytes the layer had to move, or wire, the bytes the path puts on
the links; neither is nccl-tests' busbw). The kernel libraries' dispatchers (node-forwarding,
direct-sends) are priced by the kernel model (moe_core.sim.ep_kernels) at the profile's
``hardware.ep_kernels``. It says which wins and by how much, which wins among those that drop nothing,
how sure it is (runners-up within :data:`MARGIN_WITHIN_ERROR` of the winner, kernel rows priced at
borrowed shares), and the assumptions. Exit 2 on bad input, naming
the option: every option is checked at parse (ranks within the bound every run has,
moe_core.schema.run_checks.too_many_ranks; a routing draw that fits this host's memory), the
profile's rates where it loads. No processes; seconds of CPU for tens of ranks, but at top-k > 1
the routing draw grows with ranks x tokens x experts (README.md, "Which dispatcher on my cluster?").
"""

from __future__ import annotations

import argparse
import json
import sys

from omegaconf import DictConfig, OmegaConf

from experiments.simulate import sized_hardware
from moe_core.config.load import ERROR_KEY, ConfigError, hardware_profile
from moe_core.dispatch import DISPATCHERS
from moe_core.dispatch_study import rank_dispatchers, study_steps, why_not_priced
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.records.console import table
from moe_core.schema.run_checks import too_many_ranks
from moe_core.sim.ep_kernels import kernels_stated
from moe_core.sim.topology import build_topology

# The model's errors on the fabrics it has been checked on: the kernel model's worst leave-one-out |error| on
# DeepEP's H800 tables (results/tables/external_dispatch.csv; tests/test_ep_kernels.py fails when the table's
# grows past it) and the collective model's worst on published NCCL and DeepEP numbers
# (results/tables/external_validation.csv; tests/test_external_validation.py likewise).
KERNEL_MODEL_ERROR = 0.11
COLLECTIVE_MODEL_ERROR = 0.31
# A margin under this is within those errors: two predictions each off by ~15% in opposite directions (the
# kernel model's worst, or half the collective model's) make a 1.3x ratio. Below it, run an A/B.
MARGIN_WITHIN_ERROR = 1.3
# The bandwidths advise shows, each labelled by what it counts (never mixed with nccl-tests' busbw of a
# collective of the same size, which none of these is)
BANDWIDTH_KINDS = {
    "useful_GBps": "logical: the bytes the layer had to move between ranks (each routed token once per "
    "expert rank, there and back), all ranks', over the time",
    "busbw_GBps": "wire: the bytes the path actually puts on the links (padding, copies, forwarding and "
    "second crossings included), per rank, over the time",
}


def priced_profile(args: argparse.Namespace) -> DictConfig:
    """``--hardware`` grown to ``--ranks`` (moe_core.config.load.hardware_profile checks its rates; its
    devices within the bound on ranks), once the network model can price it; ValueError whose message
    starts with the option at fault."""
    try:
        profile = hardware_profile(args.hardware)
    except ConfigError as err:
        raise ValueError(f"--hardware {args.hardware}: {err}") from None
    why = too_many_ranks(profile.nodes * profile.devices_per_node)
    if why:
        raise ValueError(f"--hardware {args.hardware}: hardware.nodes x devices_per_node: {why}")
    unpriced = why_not_priced(profile)
    if unpriced:
        raise ValueError(f"--hardware {args.hardware}: {unpriced}")
    try:
        hw = sized_hardware(OmegaConf.create({"hardware": profile, "parallel": {"world_size": args.ranks}}))
    except ConfigError as err:
        raise ValueError(f"--ranks {args.ranks}: {ERROR_KEY.sub('', str(err))}") from None
    try:
        build_topology(hw)
    except ValueError as err:  # a rate the network model needs that the profile leaves unknown
        raise ValueError(f"--hardware {args.hardware}: {err}") from None
    return hw


def advice(args: argparse.Namespace, hw: DictConfig) -> dict:
    """The ranking on ``hw`` (:func:`priced_profile`), the winners and the assumptions, as one
    JSON-able object."""
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
    for row in ranking:
        row["exposed_ms"] = exposed_ms(row)
    lossless = [row for row in ranking if row["dropped_fraction"] == 0]
    nodes = -(-args.ranks // hw.devices_per_node)
    skipped = [name for name, d in DISPATCHERS.items() if d.tensor_parallel]
    return {
        "inputs": {**vars(args), "hardware": hw.name},
        "ranking": ranking,
        "fastest": ranking[0]["dispatcher"],
        "fastest_without_drops": lossless[0]["dispatcher"] if lossless else None,
        "bandwidth_kinds": BANDWIDTH_KINDS,
        "uncertainty": uncertainty(ranking, hw, args.ranks, args.tokens),
        "assumptions": [
            "one MoE layer's dispatch then combine; exposed communication: every ranked dispatcher's "
            "exchange blocks the compute stream in a training step (the experts wait for the dispatch, the "
            "combine for the experts: moe_core.dispatch.base.Dispatcher.exchange_compute_exchange), so its whole "
            "time is exposed; not "
            "modelled here: hiding it behind other layers' compute (the step simulator prices a whole "
            "step's overlap for a model config, experiments/simulate.py)",
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


def uncertainty(ranking: list[dict], hw: DictConfig, ranks: int, tokens: int) -> list[str]:
    """What the ranking cannot tell apart: runners-up within :data:`MARGIN_WITHIN_ERROR` of the fastest,
    kernel dispatchers priced at borrowed link shares where the profile has no ``hardware.ep_kernels``,
    and kernel dispatchers asked about outside the sizes and batches their kernel-level validation
    covers (analysis/external_dispatch.yaml)."""
    from experiments.external_dispatch import load_entries

    notes = []
    close = [row["dispatcher"] for row in ranking[1:] if row["vs_fastest"] < MARGIN_WITHIN_ERROR]
    if close:
        notes.append(
            f"{', '.join(close)} within {MARGIN_WITHIN_ERROR:g}x of {ranking[0]['dispatcher']}: margins under "
            f"{MARGIN_WITHIN_ERROR:g}x are within the model's error on this kind of fabric (kernel model: worst "
            f"leave-one-out error {KERNEL_MODEL_ERROR:.0%} on DeepEP's H800 tables; collective model: up to "
            f"{COLLECTIVE_MODEL_ERROR:.0%} on published NCCL and DeepEP numbers): run an A/B"
        )
    kernels = [row["dispatcher"] for row in ranking if DISPATCHERS[row["dispatcher"]].kernel]
    if kernels and not kernels_stated(hw):
        notes.append(
            f"'{hw.name}' states no expert-parallel kernel shares (hardware.ep_kernels), so the kernel "
            f"dispatchers ({', '.join(kernels)}) are priced as the collective library's all-to-alls they run as "
            "without the kernel libraries, unchecked against any kernel measurement on this fabric"
        )
    entries = load_entries()
    for name in kernels if kernels_stated(hw) else []:  # else not the kernel model's prices
        checked = [e for e in entries if e["kernel"] == DISPATCHERS[name].kernel]
        batches = sorted({e["workload"]["tokens_per_rank"] for e in checked})
        largest = max(e["world_size"] for e in checked)
        if not batches[0] <= tokens <= batches[-1] or ranks > largest:
            notes.append(
                f"{name}: its kernel model was checked at {' to '.join(map(str, batches))} tokens per rank and up to "
                f"EP{largest} (analysis/external_dispatch.yaml); at {tokens} tokens and EP{ranks} its fixed costs "
                "and congestion are unchecked"
            )
    return notes


def exposed_ms(row: dict) -> float:
    """The part of a ranked dispatcher's exchange the compute stream waits for: all of it, since none
    of the dispatchers ranked alone overlaps its exchange with compute (the pipelined schedules that
    do, Lina's and MoNTA's, are priced in whole training steps)."""
    return row["exchange_ms"]


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
                    "exposed(ms)": row["exposed_ms"],
                    "vs fastest(x)": row["vs_fastest"],
                    "dropped": row["dropped_fraction"],
                    "logical(GB/s)": row.get("useful_GBps"),
                    "moved(MB)": row["bytes_moved"] / 1e6,
                    "wire/rank(GB/s)": row.get("busbw_GBps"),
                }
                for row in ranking
            ],
            floatfmt=("", ".3f", ".3f", ".2f", ".1%", ".1f", ".1f", ".1f"),
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
    lines += [
        "",
        "Uncertainty:",
        *(f"- {item}" for item in result["uncertainty"] or [f"no margin under {MARGIN_WITHIN_ERROR:g}x"]),
    ]
    lines += ["", "Bandwidths:", *(f"- {key}: {kind}" for key, kind in result["bandwidth_kinds"].items())]
    lines += ["", "Assumptions:", *(f"- {item}" for item in result["assumptions"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The advice for ``args`` (experiments.advise's command line, every option checked), as text or
    JSON; exit code 2, naming the option, for a profile that does not load, cannot be priced or
    grown to --ranks."""
    try:
        hw = priced_profile(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = advice(args, hw)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0
