"""Why does my cluster not reach it: a measured expert-parallel kernel against the links and the model.

    python -m experiments explain_dispatch --hardware h800-cx7-cluster --dispatcher node-forwarding \\
        --ranks 64 --tokens 4096 --hidden 7168 --format fp8 --gbps 51
    python -m experiments explain_dispatch --hardware my-cluster.yaml --dispatcher direct-sends \\
        --ranks 64 --tokens 128 --hidden 7168 --format fp8 --latency-us 173

Given a result you measured (DeepEP's normal kernels or our node-forwarding dispatcher, DeepEP's
low-latency kernels or our direct-sends; the expert-parallel size, tokens per rank, hidden size and
format; the bandwidth as the library counts it, ``--gbps``, or the kernel's time, ``--latency-us``) and
a hardware profile, it

1. converts the result to the kernel's time and to wire bandwidth: the bytes that actually cross the
   busiest NVLink and NIC link, from the exchange's footprint (experiments.external_dispatch.kernel_case:
   DeepEP's benchmark routing, uniform random scores, a token limited to ``--topk-groups`` nodes);
2. compares them with the link ceilings: the line rates and what the kernels reach on them
   (``hardware.ep_kernels``, moe_core.sim.ep_kernels);
3. compares the time with the kernel model's prediction, and says where a gap beyond the model's
   error (:data:`WITHIN_MODEL`) likely comes from, with the numbers: the NIC or NVLink share the
   measurement implies (the NIC share; NVLink forwarding for the node-forwarding kernel), the fixed
   cost per kernel it implies (per-message latency), how much of the library's count never crosses a
   link (local-traffic accounting), and whether the scale is beyond what the model was validated at
   (congestion at that scale).

No processes, seconds of CPU. Exit 2 on bad input, naming the option.
"""

from __future__ import annotations

import argparse
import json
import sys

from omegaconf import DictConfig, OmegaConf

from experiments.external_dispatch import KernelCase, kernel_case, kernel_seconds, load_entries
from experiments.simulate import sized_hardware
from moe_core.config.load import ERROR_KEY, ConfigError, hardware_profile
from moe_core.dispatch import dispatcher
from moe_core.sim.ep_kernels import kernel_shares, kernels_stated
from moe_core.sim.topology import build_topology
from moe_core.units import GB

# A measured/predicted ratio inside this is the model's error on DeepEP's own tables (worst leave-one-out
# about 10%, results/tables/external_dispatch.csv) plus the 3-5% two labs' runs of one kernel differ by.
WITHIN_MODEL = 0.15
# A decode-sized exchange: the model's fixed costs are at least this share of its predicted time.
LATENCY_BOUND_SHARE = 0.3


def explained_profile(args: argparse.Namespace) -> DictConfig:
    """``--hardware`` grown to ``--ranks``; ValueError whose message starts with the option at fault."""
    try:
        profile = hardware_profile(args.hardware)
    except ConfigError as err:
        raise ValueError(f"--hardware {args.hardware}: {err}") from None
    if profile.topology != "cluster":
        raise ValueError(f"--hardware {args.hardware}: a {profile.topology} profile; the kernels run on clusters")
    try:
        hw = sized_hardware(OmegaConf.create({"hardware": profile, "parallel": {"world_size": args.ranks}}))
        build_topology(hw)
    except ConfigError as err:
        raise ValueError(f"--ranks {args.ranks}: {ERROR_KEY.sub('', str(err))}") from None
    except ValueError as err:  # a rate the model needs that the profile leaves unknown
        raise ValueError(f"--hardware {args.hardware}: {err}") from None
    if args.ranks > hw.devices_per_node and args.ranks % hw.devices_per_node:
        raise ValueError(f"--ranks {args.ranks}: must fill whole nodes of {hw.devices_per_node} GPUs")
    return hw


def the_entry(args: argparse.Namespace, hw: DictConfig) -> dict:
    """The measurement as an entry of analysis/external_dispatch.yaml (its setting; no source)."""
    nodes = max(1, args.ranks // hw.devices_per_node)
    workload = {"phase": args.phase, "format": args.format, "tokens_per_rank": args.tokens, "hidden": args.hidden}
    workload.update(num_experts=args.experts, top_k=args.top_k, topk_groups=min(args.topk_groups or nodes, nodes))
    metric = "latency_us" if args.latency_us is not None else "logical_GBps"
    published = args.latency_us if args.latency_us is not None else args.gbps
    kernel = dispatcher(args.dispatcher).kernel
    return {
        "kernel": kernel,
        "nodes": nodes,
        "world_size": args.ranks,
        "workload": workload,
        "metric": metric,
        "published": published,
    }


def explanation(args: argparse.Namespace, hw: DictConfig) -> dict:
    """The measurement converted, against the ceilings and the model, and the likely causes of a gap."""
    entry = the_entry(args, hw)
    case = kernel_case(entry, build_topology(hw))
    measured_s = (
        entry["published"] * 1e-6 if entry["metric"] == "latency_us" else case.logical_bytes / (entry["published"] * GB)
    )
    predicted_s = kernel_seconds(entry, hw, case)
    nvlink, nic = kernel_shares(hw)
    kernels = 1 + (case.notify is not None)
    fixed_s = kernels * kernel_latency_s(hw, case)
    links = {
        "nvlink": link_view(case.nvlink_bytes, hw.intra_node_GBps, nvlink, measured_s, predicted_s - fixed_s),
        "nic": link_view(case.nic_bytes, hw.nic_GBps, nic, measured_s, predicted_s - fixed_s),
    }
    bottleneck = max(links, key=lambda name: links[name]["model_s"])
    ratio = measured_s / predicted_s
    return {
        "inputs": {**vars(args), "hardware": hw.name, "nodes": entry["nodes"]},
        "measured_us": measured_s * 1e6,
        "predicted_us": predicted_s * 1e6,
        "measured_over_predicted": ratio,
        "logical_GBps": case.logical_bytes / measured_s / GB,
        "wire": links,
        "bottleneck": bottleneck,
        "fixed_us": fixed_s * 1e6,
        "causes": causes(hw, entry, case, links, bottleneck, ratio, measured_s, predicted_s, fixed_s, kernels),
    }


def kernel_latency_s(hw: DictConfig, case: KernelCase) -> float:
    """One kernel's fixed cost on ``hw`` (the profile's, else the link class's step latency)."""
    if kernels_stated(hw):
        return hw.ep_kernels.latency_us * 1e-6
    return (hw.inter_node_latency_us if case.transfer.crosses_nodes else hw.intra_node_latency_us) * 1e-6


def link_view(nbytes: float, line_GBps: float, share: float, measured_s: float, model_bandwidth_s: float) -> dict:
    """One link class: the bytes on its busiest link, the wire rate they imply at the measured time, its
    line rate and the kernel's ceiling on it, and the model's time for those bytes."""
    ceiling = line_GBps * share
    return {
        "bytes": nbytes,
        "wire_GBps": nbytes / measured_s / GB,
        "line_GBps": line_GBps,
        "kernel_ceiling_GBps": ceiling,
        "model_s": nbytes / (ceiling * GB) if nbytes else 0.0,
    }


def causes(hw, entry, case, links, bottleneck, ratio, measured_s, predicted_s, fixed_s, kernels) -> list[str]:
    """Where the gap between the measurement and the model likely comes from, each with its numbers."""
    logical = case.logical_bytes / measured_s / GB
    wire = links[bottleneck]["wire_GBps"]
    notes = [
        f"local-traffic accounting: the library counts {logical:.1f} GB/s (its own tokens and node included); the "
        f"busiest {bottleneck.upper()} link carries {wire:.1f} GB/s of it"
        + (f", so {1 - wire / logical:.0%} of the count never crosses that link" if wire < logical else "")
    ]
    if not kernels_stated(hw):
        notes.append(
            f"'{hw.name}' states no kernel shares (hardware.ep_kernels): the model prices this exchange as the "
            "collective library's all-to-all, and the ceilings above are that library's shares"
        )
    if abs(ratio - 1) <= WITHIN_MODEL:
        notes.append(
            f"no gap to explain: measured / predicted = {ratio:.2f}, within the model's error "
            f"(±{WITHIN_MODEL:.0%}) on DeepEP's published tables"
        )
        return notes
    if ratio < 1:
        notes.append(
            f"faster than the model ({ratio:.2f}x its time): the profile's rates or kernel shares are below this "
            "cluster's (check hardware.nic_GBps, intra_node_GBps and ep_kernels), or the result counts bytes "
            "differently (the library's logical count, not wire)"
        )
        return notes
    view = links[bottleneck]
    bandwidth_s = measured_s - fixed_s
    if bandwidth_s > 0 and view["bytes"]:
        implied = view["bytes"] / bandwidth_s / GB / view["line_GBps"]
        cause = "NIC share" if bottleneck == "nic" else "NVLink forwarding"
        if bottleneck == "nvlink" and entry["kernel"] == "node_forwarding" and entry["nodes"] > 1:
            cause += " (the tokens each forwarding GPU fans out to its node)"
        notes.append(
            f"{cause}: if the links explain it, the kernel reaches {implied:.0%} of the {bottleneck.upper()} line "
            f"rate ({view['bytes'] / bandwidth_s / GB:.1f} of {view['line_GBps']:g} GB/s), not the "
            f"{view['kernel_ceiling_GBps'] / view['line_GBps']:.0%} the profile states"
        )
    implied_fixed_us = (measured_s - (predicted_s - fixed_s)) / kernels * 1e6
    latency_bound = fixed_s >= LATENCY_BOUND_SHARE * predicted_s
    notes.append(
        f"per-message latency{' (likely: a decode-sized exchange)' if latency_bound else ''}: if fixed costs explain "
        f"it, each of the {kernels} kernel(s) costs {implied_fixed_us:.0f} us, not the {fixed_s / kernels * 1e6:.0f} "
        "us the profile states"
    )
    validated = max(e["world_size"] for e in load_entries() if e["kernel"] == entry["kernel"])
    if entry["world_size"] > validated:
        notes.append(
            f"congestion at that scale: EP{entry['world_size']} is beyond the largest size the model was checked at "
            f"for this kernel (EP{validated}); adaptive routing, the fat tree's oversubscription and incast are "
            "not in it"
        )
    return notes


def report(result: dict) -> str:
    """The explanation as text."""
    a = result["inputs"]
    amount = f"{a['gbps']:g} GB/s (logical)" if a["gbps"] is not None else f"{a['latency_us']:g} us"
    lines = [
        f"Your {a['dispatcher']} {a['phase']}: EP{a['ranks']} on {a['nodes']} node(s) of {a['hardware']}, "
        f"{a['tokens']} tokens per rank of {a['hidden']} ({a['format']}), top-{a['top_k']}: {amount}",
        f"- kernel time: measured {result['measured_us']:.0f} us, model {result['predicted_us']:.0f} us "
        f"(measured / model {result['measured_over_predicted']:.2f}; model's fixed costs {result['fixed_us']:.0f} us)",
        f"- logical bandwidth (as the library counts it): {result['logical_GBps']:.1f} GB/s",
    ]
    for name, view in result["wire"].items():
        if view["bytes"]:
            lines.append(
                f"- wire, busiest {name.upper()} link: {view['bytes'] / 1e6:.1f} MB at {view['wire_GBps']:.1f} GB/s; "
                f"line rate {view['line_GBps']:g}, the kernels' ceiling {view['kernel_ceiling_GBps']:.1f} GB/s"
            )
    lines += ["", f"Bottleneck in the model: {result['bottleneck'].upper()}. Where a gap comes from:"]
    lines += [f"- {note}" for note in result["causes"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The explanation for ``args`` (experiments.explain_dispatch's command line), as text or JSON; exit
    2, naming the option, for a profile that does not load or cannot hold the ranks."""
    try:
        hw = explained_profile(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = explanation(args, hw)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0
