"""Collectives as simulated operations: calibrated cost terms, and the simulated microbenchmark.

:func:`collective_op` turns a footprint into engine arguments, applying a profile's calibrated terms
(``hardware.collectives[kind]``: per-step latency, fixed latency, bandwidth efficiency) when it has
them. :func:`simulate_collective` is the simulated executor of experiments/collectives.py: it
predicts the time of one measured point (a collective alone, or an all-to-all next to an
all-reduce), which calibration fits and validation checks.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from omegaconf import DictConfig

from ..workloads import ELEMENT_BYTES, zipf_traffic_matrix
from .engine import Op, Timeline, simulate
from .topology import Transfer


def collective_op(hw: DictConfig, topo, kind: str, transfer: Transfer) -> dict:
    """Op keyword arguments (transfer, latency_s) of collective ``kind`` with footprint ``transfer``."""
    fit = hw.collectives.get(kind)
    if fit is None:
        return {"transfer": transfer, "latency_s": topo.latency_s(transfer)}
    return {
        "transfer": replace(transfer, efficiency=fit.efficiency),
        "latency_s": topo.latency_s(transfer, fit.alpha_us * 1e-6, fit.alpha_step_us * 1e-6),
    }


def simulate_on(hw: DictConfig, topo, ops: list[Op]) -> Timeline:
    """Simulate ``ops`` on ``topo`` as hardware ``hw`` runs them: on a CPU testbed (``host_cores``)
    concurrent latency phases share the host's cores; an emulated testbed's NIC links are token
    buckets. Every executor of the simulator runs its operations through here."""
    return simulate(ops, topo.capacity, shared_latency=bool(hw.host_cores), burst_bytes=topo.burst_bytes)


def footprint(
    topo, collective: str, world_size: int, size_bytes: int, traffic_zipf: float = 0.0, seed: int = 0
) -> Transfer:
    """The footprint of one microbenchmark collective over ranks 0..world_size-1."""
    group = np.arange(world_size)
    if collective == "all_reduce":
        return topo.ring(group, size_bytes, "all_reduce")
    if collective == "all_to_all":
        return topo.uniform_all_to_all(group, size_bytes)
    if collective == "all_to_all_v":
        return topo.all_to_all(group, zipf_traffic_matrix(world_size, size_bytes, traffic_zipf, seed, ELEMENT_BYTES))
    raise ValueError(f"unknown collective {collective!r}")


def simulate_collective(hw: DictConfig, topo, params: dict) -> float:
    """Predicted milliseconds of a microbenchmark point (its ``time_ms``), from the record's params.

    With ``concurrent == "all_reduce"`` an all-reduce of the same size starts together with the
    collective and shares the links; the collective's own time is returned.
    """
    ws, size = int(params["world_size"]), int(params["size_bytes"])
    zipf, seed = float(params.get("traffic_zipf") or 0.0), int(params.get("seed") or 0)
    ops = [
        Op(
            "op",
            "comm",
            **collective_op(
                hw, topo, params["collective"], footprint(topo, params["collective"], ws, size, zipf, seed)
            ),
        )
    ]
    if params.get("concurrent") == "all_reduce":
        ops.append(Op("side", "comm", **collective_op(hw, topo, "all_reduce", footprint(topo, "all_reduce", ws, size))))
    timeline = simulate_on(hw, topo, ops)
    return float(timeline.end_s[0] - timeline.start_s[0]) * 1e3
