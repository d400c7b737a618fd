"""Collectives as simulated operations: calibrated cost terms, size curves, ordered exchanges, and
the simulated microbenchmark.

:func:`collective_op` turns a footprint into engine arguments, applying a profile's calibrated terms
(``hardware.collectives[kind]``: per-step latency, fixed latency, bandwidth efficiency) when it has
them, else, for an all-to-all, its measured size curve (``hardware.all_to_all_curve``,
:class:`SizeCurve`). :func:`add_ordered_exchange` issues an all-to-all's transfers one by one in a
given order of rounds (each priced by :class:`PointToPoint`) instead of as one fluid operation.
:func:`simulate_collective` is the simulated executor of experiments/collectives.py: it predicts the
time of one measured point (a collective alone, or an all-to-all next to an all-reduce), which
calibration fits and validation checks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import yaml
from omegaconf import DictConfig

from moe_core.comm.transmission import Schedule
from moe_core.comm.workloads import ELEMENT_BYTES, zipf_traffic_matrix
from moe_core.schema.sections import COLLECTIVE_CURVES_DIR
from moe_core.sim.engine import Op, Timeline, simulate
from moe_core.sim.ep_kernels import KERNELS, kernel_op, kernels_stated
from moe_core.sim.topology import Transfer

EXCHANGES = ("all_to_all", "all_to_all_v")  # the collective kinds a size curve prices
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")  # priced by the topology's ring
# Collectives one communicator runs at once when they are queued without waiting for each other
# (``async_op=True``): gloo's ProcessGroupGloo hands queued work to a pool of worker threads, two by
# default (ProcessGroupGloo.Options: threads=2); NCCL runs a communicator's collectives in order on
# its stream.
IN_FLIGHT = {"gloo": 2, "nccl": 1}


def queued_in_flight(hw: DictConfig) -> int:
    """How many queued collectives of one communicator run at once on ``hw``'s backend."""
    return IN_FLIGHT[hw.backend]


@dataclass(frozen=True)
class SizeCurve:
    """An all-to-all's measured share of its bottleneck link's bandwidth by size and by the nodes its
    group spans: configs/collective_curves/<name>.yaml, which cites its source.

    Why: a collective library's all-to-all pays per-peer and protocol overheads that leave it well
    below the link rate at mid sizes (NCCL over one NVLink node: 0.44 of it at 16 MiB, 0.78 from
    8 GiB), which a latency per step does not capture: the measured gap grows with size.
    """

    size_bytes: np.ndarray  # (k,) nccl-tests' all-to-all size: the per-rank buffer, own chunk included
    share: dict[int, np.ndarray]  # nodes spanned -> (k,) share of the bottleneck's bandwidth

    @staticmethod
    @functools.cache
    def load(name: str) -> SizeCurve:
        with open(COLLECTIVE_CURVES_DIR / f"{name}.yaml") as f:
            data = yaml.safe_load(f)
        sizes = np.array(data["size_bytes"], dtype=float)
        share = {int(nodes): np.array(values, dtype=float) for nodes, values in data["share"].items()}
        if np.any(np.diff(sizes) <= 0) or any(len(v) != len(sizes) or np.any(v <= 0) for v in share.values()):
            raise ValueError(f"collective curve {name!r}: need increasing sizes and a positive share per size")
        return SizeCurve(sizes, share)

    def relative_share(self, buffer_bytes: float, nodes: int) -> float:
        """The share at ``buffer_bytes`` over that at the largest size, as SimAI reads its tables:
        linear in size, held at the ends; the column of the largest node count <= ``nodes``."""
        column = self.share[max((n for n in self.share if n <= nodes), default=min(self.share))]
        return float(np.interp(buffer_bytes, self.size_bytes, column) / column[-1])


def curve_efficiency(hw: DictConfig, topo, transfer: Transfer) -> float:
    """The efficiency with which an all-to-all alone takes what ``hw.all_to_all_curve`` measured at
    its size.

    The profile's link rates are the large-size shares, so at those rates the exchange's bandwidth
    time is t_bw and the curve's time is T = t_bw / relative share. The model adds its own latency
    term, so the bandwidth term gets what remains: efficiency = t_bw / (T - latency), at most 1 (where
    the latency alone explains the gap).
    """
    if transfer.sent_bytes <= 0 or transfer.steps == 0:  # nothing sent, or a group of one
        return 1.0
    members = transfer.steps + 1
    buffer_bytes = transfer.sent_bytes * members / (members - 1)  # nccl-tests' size: own chunk included
    bandwidth_s = float(np.max(transfer.nbytes / topo.capacity[transfer.links]))
    curve_s = bandwidth_s / SizeCurve.load(hw.all_to_all_curve).relative_share(buffer_bytes, transfer.nodes)
    return bandwidth_s / max(curve_s - topo.latency_s(transfer), bandwidth_s)


def collective_op(hw: DictConfig, topo, kind: str, transfer: Transfer) -> dict:
    """Op keyword arguments (transfer, latency_s) of collective ``kind`` with footprint ``transfer``; an
    expert-parallel kernel (moe_core.sim.ep_kernels.KERNELS) is priced by its own model where the
    profile states its kernels, else as the collective library's all-to-all it then runs as."""
    if kind in KERNELS:
        return kernel_op(hw, topo, transfer) if kernels_stated(hw) else collective_op(hw, topo, "all_to_all", transfer)
    fit = hw.collectives.get(kind)
    if fit is None:
        if hw.all_to_all_curve and kind in EXCHANGES:
            transfer = replace(transfer, efficiency=curve_efficiency(hw, topo, transfer))
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
    which no member sends twice or receives twice (moe_core.comm.transmission's schedules). Every member
    walks the rounds it takes part in, in order, as moe_core.comm.ordered_a2a runs them: at each step it
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
    return simulate(
        ops,
        topo.capacity,
        shared_latency=bool(hw.host_cores),
        burst_bytes=topo.burst_bytes,
        host_link=topo.host,
    )


def footprint(
    topo, collective: str, world_size: int, size_bytes: int, traffic_zipf: float = 0.0, seed: int = 0
) -> Transfer:
    """The footprint of one microbenchmark collective over ranks 0..world_size-1, of nccl-tests' size:
    the whole buffer of a ring collective (an all-gather's output, a reduce-scatter's input), the
    per-rank send buffer of an all-to-all."""
    group = np.arange(world_size)
    if collective in RING_COLLECTIVES:
        return topo.ring(group, size_bytes, collective)
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
