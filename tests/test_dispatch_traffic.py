"""The bytes each dispatcher's round trip moves (moe_core.dispatch.base.Dispatcher.traffic): by hand on
tiny cases, the one description the network model prices, and the rates the cells report."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from moe_core.config.load import load_config
from moe_core.dispatch import dispatcher
from moe_core.dispatch_study import bandwidths, cell_metrics, token_counts, useful_bytes
from moe_core.sim.topology import build_topology

COUNTS = np.array([[3, 1], [2, 4]])  # rank 0 routes 3 tokens to expert 0 (its own), 1 to expert 1
STUDY = OmegaConf.create({"tensor_parallel": 2, "chunks": 4})


def matrices(path: str, counts=COUNTS, capacity: int = 3, row_bytes: int = 10, study=None, top_k: int = 1):
    collectives = dispatcher(path).traffic(counts, capacity, row_bytes, study, top_k=top_k)
    return [(c.kind, c.traffic.tolist()) for c in collectives]


def moved(
    path: str, counts=COUNTS, capacity: int = 3, row_bytes: int = 10, devices_per_node: int = 8, study=None, top_k=1
):
    collectives = dispatcher(path).traffic(counts, capacity, row_bytes, study, top_k=top_k)
    return sum(c.bytes_moved(devices_per_node) for c in collectives)


def test_capacity_sends_every_slot_whatever_the_routing():
    a2a = ("all_to_all", [[0, 30], [30, 0]])  # 3 slots of 10 bytes to the other rank, full or not
    assert matrices("capacity") == [a2a, a2a]
    # what the equal-split all-to-all sends: p (p - 1) slots of C rows, each way
    assert moved("capacity") == 2 * 2 * 1 * 3 * 10


def test_dropless_moves_exactly_the_routed_rows():
    assert matrices("dropless") == [("all_to_all", [[0, 10], [20, 0]]), ("all_to_all", [[0, 20], [10, 0]])]
    assert moved("dropless") == useful_bytes(COUNTS, 10) == 60


def test_allgather_moves_world_times_the_useful_bytes():
    # every rank's tokens padded to the largest rank's 6 rows, to the other rank, and back
    chunk = ("all_gather", [[0, 60], [60, 0]]), ("reduce_scatter", [[0, 60], [60, 0]])
    assert matrices("allgather") == list(chunk)
    balanced = token_counts("balanced", 4, 64, seed=0)  # no padding: every rank routes 64 tokens
    assert moved("allgather", balanced, row_bytes=2) == 4 * useful_bytes(balanced, 2)


def test_allgather_gathers_each_token_once_whatever_its_top_k():
    """Each of 2 ranks has one token that chose both experts: 1 row to the other rank and 1 output
    row back, 4 bytes (a row per choice was 8). Where both choices are the other rank's two experts,
    dropless sends that rank a row per choice (8 bytes), the all-gather still one per token (4)."""
    both = np.array([[1, 1], [1, 1]])
    assert moved("allgather", both, capacity=1, row_bytes=1, top_k=2) == 4
    other_rank = np.array([[0, 2], [2, 0]])  # 2 experts a rank: rank 0's token chose experts 2 and 3
    assert moved("allgather", other_rank, capacity=1, row_bytes=1, top_k=2) == 4
    assert moved("dropless", other_rank, capacity=1, row_bytes=1, top_k=2) == 8
    for top_k in (1, 2, 8):  # 64 tokens a rank over 16 experts on 4 ranks: the gathered bytes do not grow
        counts = token_counts("zipf:1.0", 4, 64, seed=0, experts=16, top_k=top_k).reshape(4, 4, 4).sum(axis=2)
        assert moved("allgather", counts, row_bytes=1, top_k=top_k) == 2 * 4 * 3 * 64
    with pytest.raises(ValueError, match="not whole tokens of top_k=2"):
        moved("allgather", COUNTS + np.eye(2, dtype=int), top_k=2)


def test_the_two_phase_exchange_moves_twice_the_tokens_for_another_nodes_other_local_rank():
    """Four ranks on two nodes of two, 2 bytes to every peer: 24 bytes each way flat; in two phases
    each rank hands its node peer 4 (for it and its twin on the other node), then each sends the
    other node 4: 32, the 8 bytes bound for the other node's other rank crossing twice."""
    uniform = np.ones((4, 4), dtype=int)
    assert moved("capacity", uniform, capacity=2, row_bytes=1, devices_per_node=2) == 2 * 24
    assert moved("hierarchical", uniform, capacity=2, row_bytes=1, devices_per_node=2) == 2 * 32


def test_the_tensor_parallel_dispatchers_send_duplicates_or_gather_them():
    """Two sources of two "tp" ranks (ranks 0, 1 hold source 0's tokens): expert-parallel peers
    0-2 and 1-3 exchange, "tp" peers 0-1 and 2-3 gather. Capacity 4 rows of 1 byte."""
    duplicates = [[0, 0, 4, 0], [0, 0, 0, 4], [4, 0, 0, 0], [0, 4, 0, 0]]
    assert matrices("duplicate", capacity=4, row_bytes=1, study=STUDY) == [("all_to_all", duplicates)] * 2
    shares = [[v / 2 for v in row] for row in duplicates]  # each "tp" rank sends its half of the slots
    gathered = [[0, 4, 0, 0], [4, 0, 0, 0], [0, 0, 0, 4], [0, 0, 4, 0]]  # 2 experts' halves, to its "tp" peer
    expected = [("all_to_all", shares), ("all_gather", gathered)] * 2
    assert matrices("drop-gather", capacity=4, row_bytes=1, study=STUDY) == expected
    assert matrices("monta", capacity=4, row_bytes=1, study=STUDY) == expected  # chunks pipeline, same bytes


@pytest.mark.parametrize("path", ["capacity", "dropless", "allgather"])
def test_the_network_model_prices_the_description_the_cells_count(path):
    """Inside one node, the bytes the simulator puts on the devices' outgoing links are the bytes
    the dispatcher's traffic counts: one description, not two."""
    hw = load_config(overrides=["hardware_profile=monta-a800-2x8"]).hardware
    topo = build_topology(hw)
    counts = token_counts("zipf:1.2", 8, 512, seed=0)
    transfers = dispatcher(path).study_transfers(topo, counts, 80, 64)
    on_links = sum(t.nbytes[np.isin(t.links, topo.intra_out)].sum() for _, t in transfers)
    assert on_links == pytest.approx(moved(path, counts, 80, 64, hw.devices_per_node))


def test_busbw_is_the_bytes_moved_per_rank_and_algbw_the_useful_ones():
    rates = bandwidths(useful=4e9, moved=8e9, ranks=4, exchange_ms=1000.0)
    assert rates == pytest.approx({"useful_GBps": 4.0, "algbw_GBps": 1.0, "busbw_GBps": 2.0})
    assert bandwidths(useful=0.0, moved=8e9, ranks=4, exchange_ms=1000.0) == {"busbw_GBps": 2.0}
    steps = [token_counts("uniform", 4, 256, seed=0)]
    m = cell_metrics("capacity", steps, 80, 16, devices_per_node=8, exchange_ms=2.0)
    assert m["bytes_moved"] == 2 * 4 * 3 * 80 * 16  # the equal-split all-to-all, each way
    assert m["busbw_GBps"] == pytest.approx(m["bytes_moved"] / 4 / 2e-3 / 1e9)
