"""Kernel-level external validation: the kernel model against expert-parallel libraries' published tables.

    python -m experiments external_dispatch --config configs/default.yaml

analysis/external_dispatch.yaml lists each published kernel number (DeepEP's normal and low-latency
kernels on H800) with its setting. Every entry is predicted on its hardware profile as the profile is:
the exchange's footprint on the topology (moe_core.sim.topology), priced by the kernel model
(moe_core.sim.ep_kernels.kernel_op, the one the dispatchers node-forwarding and direct-sends are priced
by), then stated as the library counts it:

* ``node_forwarding`` (DeepEP's normal kernels): a notify kernel (the counts), then the expected
  routing of DeepEP's benchmark, sampled (experiments.external_validation.deepep_routing:
  group-limited top-k), each token once over the network per remote destination node and forwarded
  there over NVLink (Cluster.forwarded_all_to_all); the combine is the same exchange reversed, in its
  own format.
* ``direct_sends`` (DeepEP's low-latency kernels): every (token, expert) selection its own message to
  the expert's rank, uniform over the ranks: the dispatcher direct-sends' own traffic.

Three bandwidths, never mixed: ``logical_GBps`` is the library's count (DeepEP: every token received,
own included, or every (token, destination node) pair, own node included, over the time);
``nvlink_wire_GBps`` and ``nic_wire_GBps`` are the bytes that cross the busiest NVLink and NIC link over
the time (nccl-tests' busbw is not defined for these kernels).

The profile's kernel shares and latency (``hardware.ep_kernels``) are the only parameters not from a
spec sheet; :func:`fit_kernel_parameters` states their one fit over the whole table (least squares of
log time), and the records carry each entry's leave-one-out error beside the in-sample one.

Records: ``results/raw/common/external_dispatch/<id>.json`` (mode simulated, backend sim) with metrics
``published``, ``predicted``, ``rel_error`` (predicted / published - 1), ``loo_rel_error`` (the same with
the parameters fitted without this entry), ``predicted_us``, ``logical_GBps``, and ``nvlink_wire_GBps`` and
``nic_wire_GBps`` where the exchange uses that link class.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig
from scipy.optimize import least_squares

from experiments.benchmark import predicted_record, predictions_main, published_entries
from experiments.external_validation import check_ep_workload, deepep_routing, entry_hardware, simulated_seconds
from moe_core.config.load import CONFIG_DIR, REPO_ROOT
from moe_core.dispatch import dispatcher
from moe_core.dispatch.node_forwarding import COUNT_BYTES
from moe_core.sim.ep_kernels import FORMATS, KERNELS, kernel_shares, token_bytes
from moe_core.sim.topology import Transfer, build_topology
from moe_core.units import GB

PAPER, EXPERIMENT = "common", "external_dispatch"
TABLE_FILE = REPO_ROOT / "analysis" / "external_dispatch.yaml"
REQUIRED_KEYS = ("id", "what", "source", "kernel", "profile", "nodes", "world_size", "workload", "metric", "published")
WORKLOAD_KEYS = ("phase", "format", "tokens_per_rank", "hidden", "num_experts", "top_k", "topk_groups")
METRICS = ("logical_GBps", "latency_us")


# ----------------------------------------------------------------------------------------------
# The entries


def load_entries(path: str | Path = TABLE_FILE) -> list[dict[str, Any]]:
    """The entries of ``path`` in file order, checked; a bad one raises ValueError naming its id."""
    return published_entries(path, REQUIRED_KEYS, _checked)


def _checked(entry: dict, where: str) -> dict:
    """``entry`` as it is, or ValueError saying what to fix."""
    if entry["kernel"] not in KERNELS:
        raise ValueError(f"{where}: unknown kernel {entry['kernel']!r}; use one of {list(KERNELS)}")
    if entry["metric"] not in METRICS:
        raise ValueError(f"{where}: unknown metric {entry['metric']!r}; use one of {list(METRICS)}")
    if not (CONFIG_DIR / "hardware" / f"{entry['profile']}.yaml").is_file():
        raise ValueError(f"{where}: unknown profile {entry['profile']!r}; add configs/hardware/<profile>.yaml")
    check_ep_workload(entry, where, WORKLOAD_KEYS, "format", FORMATS)
    if not isinstance(entry["published"], int | float) or entry["published"] <= 0:
        raise ValueError(f"{where}: published must be a positive number, got {entry['published']!r}")
    return entry


def record_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes: the entries' ids (pure; the workflow declares them)."""
    return [entry["id"] for entry in load_entries()]


# ----------------------------------------------------------------------------------------------
# The exchange of each entry, and its time


@dataclass(frozen=True)
class KernelCase:
    """One entry's exchange: its footprint on the topology, the bytes the library counts for a rank
    (``logical_bytes``), the most bytes one NVLink and one NIC link carry (the wire bytes), and the
    footprint of the notify kernel that runs before it, if any."""

    transfer: Transfer
    logical_bytes: float
    nvlink_bytes: float
    nic_bytes: float
    notify: Transfer | None = None  # the notify kernel before it (node forwarding), None without one


def kernel_case(entry: dict, topo) -> KernelCase:
    """The exchange ``entry`` times, on ``topo`` (ranks 0..world_size-1)."""
    w, n = entry["workload"], entry["world_size"]
    row = token_bytes(w["hidden"], w["format"])
    tokens, group = w["tokens_per_rank"], np.arange(n)
    if entry["kernel"] == "node_forwarding":
        routing = deepep_routing(w, n, entry["nodes"])
        transfer = topo.forwarded_all_to_all(
            group, tokens * routing.remote_nodes * row, tokens * routing.forwarded * row
        )
        # DeepEP's "NVL" count on one node, its "RDMA" count on several
        copies = n * routing.rank_hit if entry["nodes"] == 1 else routing.nodes
        notify = topo.uniform_all_to_all(group, n * COUNT_BYTES)
        return KernelCase(transfer, tokens * copies * row, *link_bytes(topo, transfer), notify)
    selections = np.full((n, n), tokens * w["top_k"] / n)  # (src, dst): uniform over the ranks
    collectives = dispatcher("direct-sends").traffic(selections, 0, row, top_k=w["top_k"])
    (_, transfer), *_ = collectives[0 if w["phase"] == "dispatch" else 1].transfers(topo)
    return KernelCase(transfer, tokens * w["top_k"] * row, *link_bytes(topo, transfer))


def link_bytes(topo, transfer: Transfer) -> tuple[float, float]:
    """The most bytes ``transfer`` puts on one NVLink (intra-node) link and on one NIC link."""
    loads = np.zeros(topo.num_links)
    loads[transfer.links] = transfer.nbytes
    return float(loads[np.r_[topo.intra_out, topo.intra_in]].max()), float(
        loads[np.r_[topo.nic_out, topo.nic_in]].max()
    )


def lone_seconds(case: KernelCase, hw: DictConfig, nvlink: float, nic: float, latency_us: float) -> float:
    """The time of ``case`` alone at kernel shares ``nvlink`` and ``nic`` of the line rates and kernel
    latency ``latency_us``: what the engine computes for transfers alone one after the other (each its
    latency + its busiest link's bytes / that link's rate), in closed form for the fit."""
    rates = (hw.intra_node_GBps * nvlink * GB, hw.nic_GBps * nic * GB)
    kernels = 1 + (case.notify is not None)  # a notify's bytes (4 a rank pair) take ~1e-6 of the time: left out
    return kernels * latency_us * 1e-6 + max(case.nvlink_bytes / rates[0], case.nic_bytes / rates[1])


def kernel_seconds(entry: dict, hw: DictConfig, case: KernelCase) -> float:
    """The simulated time of ``case`` on ``hw``: its notify kernel, if any, then the exchange, each
    priced by the kernel model (moe_core.sim.ep_kernels) through the simulator."""
    topo = build_topology(hw)
    kernels = [case.transfer] if case.notify is None else [case.notify, case.transfer]
    return sum(simulated_seconds(hw, topo, entry["kernel"], transfer) for transfer in kernels)


def published_seconds(entry: dict, case: KernelCase) -> float:
    """The kernel time the published number implies."""
    if entry["metric"] == "latency_us":
        return entry["published"] * 1e-6
    return case.logical_bytes / (entry["published"] * GB)


def as_published(entry: dict, case: KernelCase, seconds: float) -> float:
    """A time of ``case`` as the entry's metric."""
    return seconds * 1e6 if entry["metric"] == "latency_us" else case.logical_bytes / seconds / GB


# ----------------------------------------------------------------------------------------------
# The one fit, and its leave-one-out error


@dataclass(frozen=True)
class KernelFit:
    """The kernel parameters fitted on a set of entries: shares of the NVLink and NIC line rates, and
    the fixed latency in us."""

    nvlink_efficiency: float
    nic_efficiency: float
    latency_us: float


def fit_kernel_parameters(cases: list[tuple[dict, DictConfig, KernelCase]]) -> KernelFit:
    """Least squares of log(predicted / published time) over ``cases`` (entry, profile, case), the
    shares in [0.05, 1] and the latency in [0, 500] us; every entry weighs the same."""

    def residuals(x):
        return [np.log(lone_seconds(case, hw, *x) / published_seconds(e, case)) for e, hw, case in cases]

    result = least_squares(residuals, x0=[0.8, 0.9, 10.0], bounds=([0.05, 0.05, 0.0], [1.0, 1.0, 500.0]))
    return KernelFit(*(float(v) for v in result.x))


def leave_one_out(cases: list[tuple[dict, DictConfig, KernelCase]]) -> list[float]:
    """Each entry's relative error (predicted / published - 1) at the parameters fitted on the others."""
    errors = []
    for i, (entry, hw, case) in enumerate(cases):
        fit = fit_kernel_parameters(cases[:i] + cases[i + 1 :])
        seconds = lone_seconds(case, hw, fit.nvlink_efficiency, fit.nic_efficiency, fit.latency_us)
        errors.append(as_published(entry, case, seconds) / entry["published"] - 1)
    return errors


def entry_cases(path: str | Path = TABLE_FILE) -> list[tuple[dict, DictConfig, KernelCase]]:
    """Every entry of ``path`` with its profile and its exchange."""
    cases = []
    for entry in load_entries(path):
        hw = entry_hardware(entry)
        cases.append((entry, hw, kernel_case(entry, build_topology(hw))))
    return cases


# ----------------------------------------------------------------------------------------------
# Records


def external_dispatch_records(cfg: DictConfig, path: str | Path = TABLE_FILE) -> list[dict]:
    """One predicted record per entry of ``path``: the simulated kernel on the profile as it is."""
    cases = entry_cases(path)
    records = []
    for (entry, hw, case), loo in zip(cases, leave_one_out(cases)):
        seconds = kernel_seconds(entry, hw, case)
        predicted = as_published(entry, case, seconds)
        nvlink, nic = kernel_shares(hw)
        metrics = {
            "published": entry["published"],
            "predicted": predicted,
            "rel_error": predicted / entry["published"] - 1,
            "loo_rel_error": loo,
            "predicted_us": seconds * 1e6,
            "logical_GBps": case.logical_bytes / seconds / GB,
        }
        wire = {"nvlink_wire_GBps": case.nvlink_bytes, "nic_wire_GBps": case.nic_bytes}
        metrics.update({key: nbytes / seconds / GB for key, nbytes in wire.items() if nbytes > 0})  # links it uses
        params = {"what": entry["what"], "kernel": entry["kernel"], "measure": entry["metric"]}
        params.update(world_size=entry["world_size"], nodes=entry["nodes"], **entry["workload"])
        params.update(kernel_nvlink_efficiency=nvlink, kernel_nic_efficiency=nic)
        records.append(
            predicted_record(
                cfg,
                paper=PAPER,
                experiment=EXPERIMENT,
                point=entry["id"],
                hardware=hw.name,
                params=params,
                metrics=metrics,
                backend="sim",
            )
        )
    return records


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.external_dispatch's command line)."""
    return predictions_main(args, external_dispatch_records)
