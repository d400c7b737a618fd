"""MoNTA's performance model: link terms, the pipelined dispatch, the chunk count and the strategy ranking."""

import math
from itertools import product
from types import SimpleNamespace

import pytest

from moe_core.papers.monta.performance_model import (
    ExchangeLinks,
    a2a_seconds,
    admissible_chunk_counts,
    allgather_seconds,
    choose_chunk_count,
    dispatch_seconds,
    enumerate_strategies,
    ep_members_per_node,
    exchange_links,
    pipelined_seconds,
    rank_strategies,
)

# configs/hardware/monta-a800-2x8.yaml: 2 x 8 A800, NVLink 200 GB/s, 4 x 25 GB/s NICs per node
A800_2X8 = SimpleNamespace(
    nodes=2,
    devices_per_node=8,
    intra_node_GBps=200.0,
    intra_node_latency_us=1.0,
    nic_GBps=25.0,
    nics_per_node=4,
    inter_node_latency_us=3.0,
    oversubscription=1.0,
    intra_node_efficiency=1.0,  # the rates above are the achieved ones
    nic_efficiency=1.0,
)
LINKS = ExchangeLinks(a2a_Bps=1e9, a2a_latency_s=10e-6, ag_Bps=2e9, ag_latency_s=1e-6, chunk_overhead_s=20e-6)
# 16 experts of 2 * 8192 * 28672 parameters (a 70B-class FFN), 8K tokens per data shard, bf16
SIXTEEN_70B_EXPERTS = dict(
    world_size=16,
    devices_per_node=8,
    num_experts=16,
    tokens_per_rank=8192,
    d_model=8192,
    d_ff=28672,
    top_k=2,
    capacity_factor=1.0,
    element_bytes=2,
    bytes_per_param=2,
)


def test_ep_members_per_node_follow_the_tp_innermost_layout():
    assert ep_members_per_node(8, ep=2, tp=8) == [1, 1]  # ranks 0 and 8: one per node
    assert ep_members_per_node(8, ep=4, tp=2) == [4, 4, 4, 4]  # ranks 0, 2, 4, 6: all on node 0
    assert ep_members_per_node(8, ep=16, tp=1) == [8] * 16
    assert ep_members_per_node(4, ep=3, tp=2) == [2, 2, 1]  # ranks 0, 2 on node 0; rank 4 alone on node 1


def test_exchange_links_on_the_a800_profile():
    nic_share_Bps = 4 * 25e9 / 8  # each GPU's share of the node uplink: 12.5 GB/s
    links = exchange_links(A800_2X8, ep=2, tp=8, chunk_overhead_s=5e-6)
    # half of each rank's buffer crosses nodes at 12.5 GB/s: the whole buffer drains at 25 GB/s
    assert links.a2a_Bps == pytest.approx(2 * nic_share_Bps)
    assert links.a2a_latency_s == pytest.approx(3e-6)
    assert links.ag_Bps == pytest.approx(200e9) and links.ag_latency_s == pytest.approx(1e-6)
    assert links.chunk_overhead_s == 5e-6
    # 8 of 16 members per node: 8/16 of the bytes on the NIC share, 7/16 on NVLink; the NIC is the bottleneck
    assert exchange_links(A800_2X8, ep=16, tp=1, chunk_overhead_s=0).a2a_Bps == pytest.approx(2 * nic_share_Bps)
    # the whole EP group in one node: NVLink only, 3/4 of the bytes leave the rank
    in_node = exchange_links(A800_2X8, ep=4, tp=2, chunk_overhead_s=0)
    assert in_node.a2a_Bps == pytest.approx(200e9 * 4 / 3) and in_node.a2a_latency_s == pytest.approx(1e-6)
    # a TP group wider than a node rings over the NICs
    wide = exchange_links(A800_2X8, ep=1, tp=16, chunk_overhead_s=0)
    assert wide.ag_Bps == pytest.approx(nic_share_Bps) and wide.ag_latency_s == pytest.approx(3e-6)


def test_trivial_groups_cost_nothing():
    assert a2a_seconds(1e9, ep=1, links=LINKS) == 0.0
    assert allgather_seconds(1e9, tp=1, links=LINKS) == 0.0
    assert allgather_seconds(1e6, tp=4, links=LINKS) == pytest.approx(3 * (1e-6 + 1e6 / 2e9))


def test_one_chunk_is_drop_gather_plus_one_overhead():
    for volume, ep, tp in product([1e3, 8e6, 3e9], [2, 4], [2, 8]):
        drop_gather = dispatch_seconds("drop-gather", volume, ep, tp, LINKS)
        assert pipelined_seconds(volume, 1, ep, tp, LINKS) == pytest.approx(drop_gather + LINKS.chunk_overhead_s)
        assert dispatch_seconds("monta", volume, ep, tp, LINKS, chunks=1) == pytest.approx(
            drop_gather + LINKS.chunk_overhead_s
        )


def test_pipeline_matches_a_hand_computed_case():
    # V = 8 MB, tp = 2 -> 4 MB per rank, 4 chunks of 1 MB
    # a = 10 us + 1 MB / 1 GB/s = 1.010 ms;  g = (2 - 1) * (1 us + 1 MB / 2 GB/s) = 0.501 ms
    # T = a + 3 * max(a, g) + g + 4 * 20 us = 1.010 + 3.030 + 0.501 + 0.080 = 4.621 ms
    assert pipelined_seconds(8e6, 4, ep=4, tp=2, links=LINKS) == pytest.approx(4.621e-3)


def test_pipeline_never_beats_either_stage_alone():
    for volume, chunks, tp, ag_Bps in product([1e4, 1e7, 1e9], [1, 2, 5, 16, 64], [2, 4, 8], [1e8, 2e9, 2e11]):
        links = ExchangeLinks(1e9, 10e-6, ag_Bps, 1e-6, chunk_overhead_s=0.0)
        chunk_bytes = volume / tp / chunks
        total_a2a = chunks * a2a_seconds(chunk_bytes, 4, links)
        total_ag = chunks * allgather_seconds(chunk_bytes, tp, links)
        assert pipelined_seconds(volume, chunks, 4, tp, links) >= max(total_a2a, total_ag) * (1 - 1e-12)


@pytest.mark.parametrize("n_star", [3, 7, 20])
def test_a2a_bound_choice_brackets_the_square_root_optimum(n_star):
    # a2a-bound at every chunk size (latency 20 us > 7 * 0.1 us, 1/10 GB/s > 7/200 GB/s), so
    # T(n) = n * (alpha_e + overhead) + const + V(TP-1) / (n * beta_intra), minimised at
    # n* = sqrt(V (TP-1) / (beta_intra * (alpha_e + overhead))); the best divisor brackets n*.
    links = ExchangeLinks(a2a_Bps=10e9, a2a_latency_s=20e-6, ag_Bps=200e9, ag_latency_s=1e-7, chunk_overhead_s=10e-6)
    tp, ep, alpha = 8, 2, 30e-6
    dropped = n_star**2 * links.ag_Bps * alpha / (tp - 1)
    capacity = tp * 360
    counts = admissible_chunk_counts(capacity, tp)
    assert n_star == pytest.approx(math.sqrt(dropped * (tp - 1) / (links.ag_Bps * alpha)))
    for n in counts:  # the regime holds: the closed form is exact
        closed = n * alpha + dropped / links.a2a_Bps + (tp - 1) * 1e-7 + dropped * (tp - 1) / (n * links.ag_Bps)
        assert pipelined_seconds(dropped * tp, n, ep, tp, links) == pytest.approx(closed)
    below = max(n for n in counts if n <= n_star)
    above = min(n for n in counts if n >= n_star)
    assert choose_chunk_count(dropped * tp, capacity, ep, tp, links) in {below, above}


def test_free_chunks_pick_the_largest_admissible_count():
    for ag_Bps in (1e8, 1e11):  # all-gather-bound and all-to-all-bound
        links = ExchangeLinks(a2a_Bps=1e9, a2a_latency_s=0.0, ag_Bps=ag_Bps, ag_latency_s=0.0, chunk_overhead_s=0.0)
        assert choose_chunk_count(1e8, capacity=4 * 12, ep=4, tp=4, links=links) == 12


def test_nothing_to_overlap_means_one_chunk():
    free = ExchangeLinks(a2a_Bps=1e9, a2a_latency_s=0.0, ag_Bps=1e9, ag_latency_s=0.0, chunk_overhead_s=0.0)
    assert choose_chunk_count(1e9, capacity=64, ep=8, tp=1, links=free) == 1
    assert choose_chunk_count(1e9, capacity=64, ep=1, tp=8, links=free) == 1


def test_duplicate_sends_tp_times_the_all_to_all_bytes():
    volume, ep = 2e9, 2
    for tp in (2, 4, 8):
        bandwidth_only = ExchangeLinks(1e9, 0.0, 2e9, 0.0, chunk_overhead_s=0.0)
        assert dispatch_seconds("duplicate", volume, ep, tp, bandwidth_only) == pytest.approx(
            tp * a2a_seconds(volume / tp, ep, bandwidth_only)
        )
        links = exchange_links(A800_2X8, ep, tp, chunk_overhead_s=0.0)
        ratio = dispatch_seconds("duplicate", volume, ep, tp, links) / a2a_seconds(volume / tp, ep, links)
        assert ratio == pytest.approx(tp, rel=1e-3)  # latencies are negligible at 2 GB
    kwargs = dict(SIXTEEN_70B_EXPERTS, memory_bytes_per_device=1e12, hw=A800_2X8)
    duplicated = enumerate_strategies(**kwargs, path="duplicate")
    dropped = enumerate_strategies(**kwargs, path="drop-gather")
    for d, g in zip(duplicated, dropped):
        assert (d.tp, d.ep) == (g.tp, g.ep) and d.allgather_s == 0.0
        assert d.inter_node_bytes == pytest.approx(d.tp * g.inter_node_bytes)


def test_unknown_path_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match="'broadcast'.*duplicate, drop-gather, monta"):
        dispatch_seconds("broadcast", 1e6, 2, 2, LINKS)


def test_admissible_counts_are_the_divisors_of_the_per_rank_capacity():
    assert admissible_chunk_counts(24, 2) == [1, 2, 3, 4, 6, 12]
    assert admissible_chunk_counts(7, 1) == [1, 7]
    for capacity, tp in ((10, 4), (0, 1)):
        with pytest.raises(ValueError, match=f"capacity C={capacity}"):
            admissible_chunk_counts(capacity, tp)


def test_every_layout_is_enumerated_once_and_fills_the_world():
    strategies = enumerate_strategies(**SIXTEEN_70B_EXPERTS, memory_bytes_per_device=80e9, hw=A800_2X8)
    layouts = [(s.tp, s.ep, s.dp) for s in strategies]
    expected = [(tp, ep, 16 // (tp * ep)) for tp in (1, 2, 4, 8) for ep in (1, 2, 4, 8, 16) if 16 % (tp * ep) == 0]
    assert sorted(layouts) == sorted(expected) and len(set(layouts)) == len(layouts)
    assert all(s.tp * s.ep * s.dp == 16 for s in strategies)
    # without both an all-to-all and an all-gather MoNTA does not pipeline: DeepSpeed's drop-gather
    dropped = enumerate_strategies(**SIXTEEN_70B_EXPERTS, memory_bytes_per_device=80e9, hw=A800_2X8, path="drop-gather")
    for monta, drop_gather in zip(strategies, dropped):
        if monta.tp == 1 or monta.ep == 1:
            assert monta.chunks == 1 and monta.exchange_s == drop_gather.exchange_s
        else:
            assert monta.exchange_s < drop_gather.exchange_s


def test_huge_experts_rank_the_largest_tp_in_a_node_first():
    expert_bytes = 2 * 8192 * 28672 * 2
    # all 16 experts only fit spread over all 16 GPUs: tp * ep == 16
    strategies = enumerate_strategies(**SIXTEEN_70B_EXPERTS, memory_bytes_per_device=1.01 * expert_bytes, hw=A800_2X8)
    ranked = rank_strategies(strategies)
    assert all(s.fits == (s.tp * s.ep == 16) for s in ranked)
    fitting = [s for s in ranked if s.fits]
    assert ranked[: len(fitting)] == fitting  # the ones that do not fit come last
    assert [s.tp for s in fitting] == [8, 4, 2, 1]  # fewer inter-node bytes with every doubling of tp
    assert [s.inter_node_bytes for s in fitting] == sorted(s.inter_node_bytes for s in fitting)
    best = ranked[0]
    assert (best.tp, best.ep, best.dp) == (8, 2, 1) and best.chunks > 1
    assert best.exchange_s < best.a2a_s + best.allgather_s  # the pipeline hides part of the all-gather
