"""MoNTA's decisions as alpha-beta models (papers.md §4): how many chunks to pipeline the dispatch in,
and which (tp, ep, dp) layout to train with. Pure functions, no torch.

The setting. Under tensor parallelism the TP ranks hold the same tokens, so each rank's dispatched
buffer (E, C, M) is duplicated TP times. Three ways to move it:

* ``duplicate``: every TP rank sends its full copy through the EP all-to-all (TP times the bytes);
* ``drop-gather`` (DeepSpeed): each TP rank keeps C/tp capacity slots, sends them through the
  all-to-all (inter-node), then an all-gather over the TP group (intra-node) restores the duplicates;
* ``monta``: the dropped buffer is split along C into n chunks; all chunk all-to-alls are issued at
  once and chunk i is all-gathered as soon as its all-to-all is done: A1 | A2+I1 | A3+I2 | ... | In.

Rank layout: mesh axes (dp, ep, tp) with tp innermost, global rank = (dp_i*ep + ep_i)*tp + tp_i, and a
node holds ``devices_per_node`` consecutive ranks. So a TP group is consecutive ranks and an EP group
has stride tp.

Hardware profiles (``configs/hardware/*.yaml``, or any object with these attributes): nodes,
devices_per_node, intra_node_GBps (per device per direction), intra_node_latency_us, nic_GBps (per
NIC), nics_per_node, inter_node_latency_us, oversubscription, and the shares of the line rates
collectives reach, intra_node_efficiency and nic_efficiency (moe_core.sim.topology.achieved_GBps).
GB = 1e9 bytes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from moe_core.model.capacity import capacity as expert_capacity
from moe_core.sim.topology import achieved_GBps

PATHS = ("duplicate", "drop-gather", "monta")
DEFAULT_CHUNK_OVERHEAD_S = 10e-6  # assumption: a few µs each for a chunk's launches and its copy; calibrate


@dataclass(frozen=True)
class ExchangeLinks:
    """Per-GPU alpha-beta terms of the two links a dispatch uses, for one (ep, tp) layout.

    ``a2a_Bps`` is the rate at which one rank's whole all-to-all buffer (its own share included) drains
    through its bottleneck link, so an all-to-all of ``nbytes`` takes ``a2a_latency_s + nbytes / a2a_Bps``.
    ``chunk_overhead_s`` is the fixed cost MoNTA pays per chunk (kernel launches and the copy of the
    chunk into the output buffer).
    """

    a2a_Bps: float
    a2a_latency_s: float
    ag_Bps: float
    ag_latency_s: float
    chunk_overhead_s: float


def ep_members_per_node(devices_per_node: int, ep: int, tp: int) -> list[int]:
    """For each member of rank 0's EP group (ranks 0, tp, 2*tp, ...), how many members of that group,
    itself included, sit on its node.

    The all-to-all sends the fraction (ep - m)/ep of a rank's bytes across nodes and (m - 1)/ep over
    the intra-node links. Rank 0's group stands for all: with the power-of-two sizes of real clusters
    every EP group has the same node placement.
    """
    node_of_member = [e * tp // devices_per_node for e in range(ep)]
    members_on = Counter(node_of_member)
    return [members_on[node] for node in node_of_member]


def exchange_links(hw, ep: int, tp: int, chunk_overhead_s: float) -> ExchangeLinks:
    """The alpha-beta terms of the EP all-to-all and the TP all-gather for the (ep, tp) layout on ``hw``.

    Inter-node: all GPUs of a node run their exchanges at once, so each gets 1/devices_per_node of
    the node's uplink, nics_per_node * nic_GBps / oversubscription. Intra-node: intra_node_GBps per GPU.
    All-to-all: the bytes to off-node members and to on-node members move on different links at the
    same time, so the time is that of the busier link, max(inter bytes / inter Bps, intra bytes /
    intra Bps), for the slowest member of the group. All-gather: intra-node when the TP group fits in
    a node (tp divides devices_per_node), else the ring crosses nodes and runs at the NIC share.
    """
    intra_GBps, nic_GBps = achieved_GBps(hw)  # line rates x the shares a collective library reaches
    intra_Bps = intra_GBps * 1e9
    inter_Bps = hw.nics_per_node * nic_GBps * 1e9 / hw.oversubscription / hw.devices_per_node
    members = ep_members_per_node(hw.devices_per_node, ep, tp)
    a2a_s_per_byte = max(max(_per_byte((ep - m) / ep, inter_Bps), _per_byte((m - 1) / ep, intra_Bps)) for m in members)
    ep_spans_nodes = min(members) < ep
    tp_in_node = hw.devices_per_node % tp == 0
    return ExchangeLinks(
        a2a_Bps=1 / a2a_s_per_byte if a2a_s_per_byte > 0 else math.inf,
        a2a_latency_s=(hw.inter_node_latency_us if ep_spans_nodes else hw.intra_node_latency_us) * 1e-6,
        ag_Bps=intra_Bps if tp_in_node else inter_Bps,
        ag_latency_s=(hw.intra_node_latency_us if tp_in_node else hw.inter_node_latency_us) * 1e-6,
        chunk_overhead_s=chunk_overhead_s,
    )


def _per_byte(fraction: float, Bps: float) -> float:
    """Seconds per byte of a rank's buffer of which ``fraction`` crosses a link of ``Bps`` (none: 0)."""
    return fraction / Bps if fraction > 0 else 0.0


def a2a_seconds(nbytes: float, ep: int, links: ExchangeLinks) -> float:
    """Time of an EP all-to-all in which one rank sends ``nbytes`` in total (its own share included).

    One latency for the whole exchange, not one per peer: NCCL posts the sends and receives to all
    peers at once, so their start-up costs overlap. Zero when ep == 1 (nothing leaves the rank).
    """
    if ep == 1:
        return 0.0
    return links.a2a_latency_s + nbytes / links.a2a_Bps


def allgather_seconds(nbytes: float, tp: int, links: ExchangeLinks) -> float:
    """Time of a ring all-gather over the TP group where each rank contributes ``nbytes``: tp - 1 steps,
    each one latency plus one contribution over the link. Zero when tp == 1."""
    return (tp - 1) * (links.ag_latency_s + nbytes / links.ag_Bps)


def pipelined_seconds(volume_bytes: float, chunks: int, ep: int, tp: int, links: ExchangeLinks) -> float:
    """Time of MoNTA's dispatch: drop to V = volume_bytes / tp per rank, then a two-stage pipeline of
    ``chunks`` all-to-alls (a) and all-gathers (g) of V / chunks each:

        T(n) = a(V/n) + (n - 1) * max(a(V/n), g(V/n)) + g(V/n) + n * chunk_overhead_s

    The reconstruction in papers.md §4.3 stops before the last term: it ignores the per-chunk kernel
    launches and the copy of each chunk into the output buffer. This model charges them serially,
    chunk_overhead_s per chunk, which is what makes too many chunks lose. It assumes the two stages
    use different links (true when the EP group has one member per node, MoNTA's case); when EP peers
    share a node their NVLink traffic competes with the all-gather and this is optimistic.
    """
    if chunks < 1:
        raise ValueError(f"chunk count must be at least 1, got {chunks}")
    chunk_bytes = volume_bytes / tp / chunks
    a = a2a_seconds(chunk_bytes, ep, links)
    g = allgather_seconds(chunk_bytes, tp, links)
    return a + (chunks - 1) * max(a, g) + g + chunks * links.chunk_overhead_s


def dispatch_seconds(path: str, volume_bytes: float, ep: int, tp: int, links: ExchangeLinks, chunks: int = 1) -> float:
    """Time of one dispatch of a rank's full buffer (``volume_bytes`` = E*C*M*element bytes, before the
    drop) along ``path`` (one of PATHS); ``chunks`` is used by ``monta`` only."""
    if path == "duplicate":
        return a2a_seconds(volume_bytes, ep, links)
    if path == "drop-gather":
        dropped_bytes = volume_bytes / tp
        return a2a_seconds(dropped_bytes, ep, links) + allgather_seconds(dropped_bytes, tp, links)
    if path == "monta":
        return pipelined_seconds(volume_bytes, chunks, ep, tp, links)
    raise ValueError(f"unknown dispatch path {path!r}; valid paths: {', '.join(PATHS)}")


def admissible_chunk_counts(capacity: int, tp: int) -> list[int]:
    """The chunk counts that split a TP rank's C/tp capacity slots into equal chunks: the divisors of C/tp."""
    if tp < 1 or capacity < 1 or capacity % tp:
        raise ValueError(
            f"capacity C={capacity} is not divisible by tp={tp}: each TP rank keeps C/tp capacity slots, "
            "so the capacity must be a positive multiple of tp"
        )
    slots = capacity // tp
    return [n for n in range(1, slots + 1) if slots % n == 0]


def choose_chunk_count(volume_bytes: float, capacity: int, ep: int, tp: int, links: ExchangeLinks) -> int:
    """MoNTA's chunk count: the admissible count with the least pipelined time (ties go to fewer chunks).

    With tp == 1 there is no all-gather and with ep == 1 no all-to-all, so there is nothing to overlap
    and extra chunks only add overhead: 1.
    """
    if tp == 1 or ep == 1:
        return 1
    counts = admissible_chunk_counts(capacity, tp)
    return min(counts, key=lambda n: (pipelined_seconds(volume_bytes, n, ep, tp, links), n))


@dataclass(frozen=True)
class Strategy:
    """One (tp, ep, dp) layout and the cost of one dispatch along the chosen path.

    ``a2a_s`` and ``allgather_s`` are the summed times of the path's all-to-alls and all-gathers (over
    all chunks, not overlapped); ``exchange_s`` is the dispatch time (overlapped for ``monta``, in
    ``chunks`` chosen by choose_chunk_count; 1 on the other paths). ``inter_node_bytes``: what one rank
    sends across nodes per dispatch. ``memory_bytes``: expert parameters per GPU; ``fits`` when that
    is within the device.
    """

    tp: int
    ep: int
    dp: int
    chunks: int
    a2a_s: float
    allgather_s: float
    exchange_s: float
    inter_node_bytes: float
    memory_bytes: float
    fits: bool


def enumerate_strategies(
    world_size: int,
    devices_per_node: int,
    num_experts: int,
    tokens_per_rank: int,
    d_model: int,
    d_ff: int,
    top_k: int,
    capacity_factor: float,
    element_bytes: int,
    memory_bytes_per_device: float,
    bytes_per_param: float,
    hw,
    path: str = "monta",
    chunk_overhead_s: float = DEFAULT_CHUNK_OVERHEAD_S,
    moe_layers: int = 1,
) -> list[Strategy]:
    """Every layout tp * ep * dp == world_size with tp dividing devices_per_node (TP stays inside a
    node, as Megatron and DeepSpeed place it) and ep dividing num_experts, with its dispatch cost.

    ``tokens_per_rank``: the tokens of one data shard (micro-batch x sequence), held by every rank of
    its TP group and taken as fixed across layouts. Capacity C = ceil(capacity_factor * top_k *
    tokens_per_rank / E), rounded up to a multiple of tp because each TP rank keeps C/tp slots
    (DeepSpeed's drop_tokens asserts the divisibility); the dispatched buffer is E*C*d_model*element_bytes.

    Memory counts expert parameters only, num_experts/ep experts of 2*d_model*d_ff parameters in each
    of ``moe_layers`` layers, sharded tp ways: they are what the layout trades for communication.
    Dense weights, activations and optimizer state beyond ``bytes_per_param`` are left out, so
    ``fits`` is necessary, not sufficient.
    """
    if devices_per_node != hw.devices_per_node:
        raise ValueError(f"devices_per_node={devices_per_node} differs from the profile's {hw.devices_per_node}")
    if world_size > hw.nodes * hw.devices_per_node:
        raise ValueError(f"world_size={world_size} exceeds the profile's {hw.nodes * hw.devices_per_node} devices")
    strategies = []
    for tp in (t for t in range(1, devices_per_node + 1) if devices_per_node % t == 0 and world_size % t == 0):
        capacity = expert_capacity(tokens_per_rank, num_experts, top_k, capacity_factor, min_capacity=0, multiple=tp)
        volume_bytes = num_experts * capacity * d_model * element_bytes
        for ep in (e for e in range(1, num_experts + 1) if num_experts % e == 0 and world_size % (tp * e) == 0):
            links = exchange_links(hw, ep, tp, chunk_overhead_s)
            memory_bytes = moe_layers * num_experts / ep * 2 * d_model * d_ff / tp * bytes_per_param
            strategies.append(
                Strategy(
                    tp=tp,
                    ep=ep,
                    dp=world_size // (tp * ep),
                    **_dispatch_costs(path, volume_bytes, capacity, ep, tp, links, devices_per_node),
                    memory_bytes=memory_bytes,
                    fits=memory_bytes <= memory_bytes_per_device,
                )
            )
    return strategies


def _dispatch_costs(
    path: str, volume_bytes: float, capacity: int, ep: int, tp: int, links: ExchangeLinks, devices_per_node: int
) -> dict[str, float]:
    """The :class:`Strategy` fields of one dispatch of ``volume_bytes`` along ``path`` on the (ep, tp)
    layout: chunks, a2a_s, allgather_s, exchange_s and inter_node_bytes."""
    # MoNTA pipelines only when there is an all-to-all and an all-gather to overlap (tp > 1 and
    # ep > 1, the fork's condition); other layouts take DeepSpeed's drop-gather.
    layout_path = "drop-gather" if path == "monta" and (tp == 1 or ep == 1) else path
    chunks = choose_chunk_count(volume_bytes, capacity, ep, tp, links) if layout_path == "monta" else 1
    exchange_s = dispatch_seconds(layout_path, volume_bytes, ep, tp, links, chunks)
    a2a_bytes = volume_bytes if path == "duplicate" else volume_bytes / tp
    gathers = 0 if path == "duplicate" else chunks
    # TP groups stay inside a node, so only the all-to-all crosses nodes.
    off_node_fraction = (ep - min(ep_members_per_node(devices_per_node, ep, tp))) / ep
    return {
        "chunks": chunks,
        "a2a_s": chunks * a2a_seconds(a2a_bytes / chunks, ep, links),
        "allgather_s": gathers * allgather_seconds(a2a_bytes / chunks, tp, links),
        "exchange_s": exchange_s,
        "inter_node_bytes": a2a_bytes * off_node_fraction,
    }


def rank_strategies(strategies: Iterable[Strategy]) -> list[Strategy]:
    """MoNTA's network-traffic-aware choice, best first: layouts that fit before those that do not,
    then by dispatch time, then by inter-node bytes."""
    return sorted(strategies, key=lambda s: (not s.fits, s.exchange_s, s.inter_node_bytes))
