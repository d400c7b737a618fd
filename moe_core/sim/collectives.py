"""Collectives as simulated operations: calibrated cost terms, ordered exchanges, and the simulated
microbenchmark.

:func:`collective_op` turns a footprint into engine arguments, applying a profile's calibrated terms
(``hardware.collectives[kind]``: per-step latency, fixed latency, bandwidth efficiency) when it has
them. :func:`add_ordered_exchange` issues an all-to-all's transfers one by one in a given order of
rounds (each priced by :class:`PointToPoint`) instead of as one fluid operation.
:func:`simulate_collective` is the simulated executor of experiments/collectives.py: it predicts the
time of one measured point (a collective alone, or an all-to-all next to an all-reduce), which
calibration fits and validation checks.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from omegaconf import DictConfig

from ..transmission import Schedule
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


class PointToPoint:
    """The op costs of point-to-point transfers between two devices (collective kind ``send_recv``:
    one algorithm step's latency, the profile's fit if it has one), priced once per device pair."""

    def __init__(self, hw: DictConfig, topo):
        self.hw, self.topo = hw, topo
        self._per_byte: dict[tuple[int, int], dict] = {}  # (src, dst) devices -> the costs of one byte

    def op(self, src: int, dst: int, nbytes: float) -> dict:
        """Op keyword arguments (transfer, latency_s) of ``nbytes`` from device ``src`` to ``dst``."""
        if (src, dst) not in self._per_byte:
            unit = self.topo.all_to_all(np.array([src, dst]), np.array([[0.0, 1.0], [0.0, 0.0]]))
            self._per_byte[src, dst] = collective_op(self.hw, self.topo, "send_recv", unit)
        cost = self._per_byte[src, dst]
        return {
            "transfer": replace(cost["transfer"], nbytes=cost["transfer"].nbytes * nbytes),
            "latency_s": cost["latency_s"],
        }


def add_ordered_exchange(
    ops: list[Op], links: PointToPoint, group: np.ndarray, rounds: Schedule, name: str, phase: str, after: list[int]
) -> int:
    """Append an all-to-all over the devices ``group`` issued as point-to-point transfers (priced by
    ``links``) in ``rounds``' order; returns the index of a zero-time op that ends when the last
    transfer has.

    ``rounds``: an ordered list of rounds, each a list of ``(src, dst, bytes)`` over group indices in
    which no member sends twice or receives twice (moe_core.transmission's schedules). Every member
    walks the rounds it takes part in, in order, as moe_core.ordered_a2a runs them: at each step it
    posts its send and its receive of that round together and waits for both before its next step.
    There is no barrier between rounds, so a transfer starts once its sender and its receiver have
    both finished their previous steps (and the ops ``after``), pays one message's latency and then
    crosses its two devices' links, shared with whatever else is in flight by the engine's max-min
    fairness.

    Why: the fluid all-to-all (one operation, every flow at once) is as fast as the busiest link
    allows whatever the order, which is the order-free bound. The order of the transfers matters
    only when they are separate operations: a member that waits for a busy peer idles its own links.
    Within one exchange no link carries two of its transfers at once; two exchanges in flight
    together (two models on the same devices) contend.
    """
    start = len(ops)
    ops.append(Op(f"{name}[start]", phase, list(after)))
    previous: dict[int, list[int]] = {}  # member -> its previous step's transfer ops
    for k, transfers in enumerate(rounds):
        step: dict[int, list[int]] = {}
        for src, dst, nbytes in transfers:
            deps = sorted({*previous.get(src, [start]), *previous.get(dst, [start])})
            ops.append(
                Op(f"{name}[{k}:{src}>{dst}]", phase, deps, **links.op(int(group[src]), int(group[dst]), nbytes))
            )
            step.setdefault(src, []).append(len(ops) - 1)
            step.setdefault(dst, []).append(len(ops) - 1)
        previous.update(step)
    ops.append(Op(f"{name}[end]", phase, sorted({i for last in previous.values() for i in last} or {start})))
    return len(ops) - 1


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
