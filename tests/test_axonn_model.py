"""AxoNN's communication model, memory estimate, grid search, models and Megatron baseline (pure logic)."""

import math

import pytest

from moe_core.config.load import load_config
from moe_core.papers.axonn.baseline import megatron_layout, megatron_memory_bytes
from moe_core.papers.axonn.comm_model import (
    AXONN_ORDER,
    BREAKDOWN_KEYS,
    RING_STEPS,
    axis_strides,
    collective_seconds,
    enumerate_grids,
    grid_memory,
    group_bandwidth_GBps,
    memory_bytes,
    predicted_communication,
    rank_grids,
)
from moe_core.papers.axonn.models import TWO_B, WEAK_SCALING, parameters
from moe_core.parallel.grid import Grid, block_collectives, block_linears
from moe_core.sim.pipeline import pipeline_time_s

# A one-node CPU testbed as calibration leaves it: a loopback rate and an all-reduce fit, no NIC
CALIBRATED_CPU = [
    "hardware_profile=local-cpu",
    "hardware.intra_node_GBps=2.0",
    "hardware.collectives.all_reduce.alpha_step_us=664",
    "hardware.collectives.all_reduce.efficiency=0.9",
]
TINY = dict(d_model=64, d_ff=256, n_layers=2, n_heads=4, vocab_size=128, seq_len=16)


def calibrated_cpu():
    return load_config(overrides=CALIBRATED_CPU).hardware


def hardware(profile="axonn-perlmutter", **overrides):
    cfg = load_config(overrides=[f"hardware_profile={profile}", *(f"hardware.{k}={v}" for k, v in overrides.items())])
    return cfg.hardware


@pytest.fixture(scope="module")
def perlmutter():
    return hardware()


@pytest.fixture(scope="module")
def flat_node():
    """One node of 8 devices, 10 GB/s between any two, no latency, no fits: time is bytes moved."""
    return hardware("local-cpu", intra_node_GBps=10.0, intra_node_latency_us=0, inter_node_latency_us=0)


def test_plexus_placement_examples_on_four_gpu_nodes(perlmutter):
    # papers.md §3.2: ip=1 my<=4 intra; ip=1 my>=8 inter; ip=2 my>=4 inter/2; ip>=4 inter/4.
    assert group_bandwidth_GBps(perlmutter, 2, 1) == group_bandwidth_GBps(perlmutter, 4, 1) == 200.0
    assert group_bandwidth_GBps(perlmutter, 8, 1) == 100.0
    assert group_bandwidth_GBps(perlmutter, 2, 2) == 200.0
    assert group_bandwidth_GBps(perlmutter, 4, 2) == group_bandwidth_GBps(perlmutter, 16, 2) == 50.0
    assert group_bandwidth_GBps(perlmutter, 2, 4) == group_bandwidth_GBps(perlmutter, 64, 16) == 25.0


def test_one_node_profile_keeps_every_group_inside_and_zero_bandwidth_is_named():
    calibrated = calibrated_cpu()
    assert calibrated.nic_GBps == 0
    assert (
        group_bandwidth_GBps(calibrated, 8, 1) == group_bandwidth_GBps(calibrated, 2, 4) == calibrated.intra_node_GBps
    )
    with pytest.raises(ValueError, match="hardware.intra_node_GBps"):
        group_bandwidth_GBps(hardware(intra_node_GBps=0), 4, 1)
    with pytest.raises(ValueError, match="hardware.nic_GBps"):
        group_bandwidth_GBps(hardware(nic_GBps=0), 8, 1)
    with pytest.raises(ValueError, match="hardware.intra_node_GBps"):
        predicted_communication(hardware(intra_node_GBps=0), Grid(1, 1, 2, 2), d_model=64, d_ff=256, n_layers=1,
                                tokens_per_rank=16)  # fmt: skip


def test_ring_formulas_match_hand_computation(perlmutter):
    V = 1e9
    # all-reduce inside a node: 2 * 3/4 * V / 200 GB/s + 6 steps of 1 µs
    assert collective_seconds(perlmutter, "all_reduce", 4, 1, V) == pytest.approx(1.5 * V / 200e9 + 6e-6)
    # all-gather of 8 ranks 4 apart: NIC share 100/4 GB/s, 7 steps of 3 µs
    assert collective_seconds(perlmutter, "all_gather", 8, 4, V) == pytest.approx(7 / 8 * V / 25e9 + 21e-6)
    assert collective_seconds(perlmutter, "reduce_scatter", 8, 4, V) == collective_seconds(
        perlmutter, "all_gather", 8, 4, V
    )
    assert collective_seconds(perlmutter, "all_reduce", 1, 1, V) == 0.0
    # a calibrated profile: no all_gather fit, so the all_reduce fit's per-step latency and efficiency
    calibrated = calibrated_cpu()
    fit = calibrated.collectives.all_reduce
    expected = (fit.alpha_us + 7 * fit.alpha_step_us) * 1e-6 + 7 / 8 * V / (
        calibrated.intra_node_GBps * 1e9 * fit.efficiency
    )
    assert collective_seconds(calibrated, "all_gather", 8, 1, V) == pytest.approx(expected)
    with pytest.raises(ValueError, match="unknown collective"):
        collective_seconds(perlmutter, "broadcast", 4, 1, V)


def test_axis_strides_follow_the_order():
    grid = Grid(2, 3, 4, 5)
    assert axis_strides(grid) == {"col": 1, "row": 5, "depth": 20, "data": 60}
    assert axis_strides(grid, ("depth", "col", "row")) == {"depth": 1, "col": 3, "row": 15, "data": 60}
    assert all(axis_strides(grid)[axis] == grid.stride(axis) for axis in ("data", *AXONN_ORDER))
    with pytest.raises(ValueError, match="permutation"):
        axis_strides(grid, ("col", "row", "data"))


def test_breakdown_sums_to_total_and_names_kind_and_axis(perlmutter):
    comm = predicted_communication(perlmutter, Grid(2, 2, 2, 2), d_model=64, d_ff=256, n_layers=3, tokens_per_rank=64)
    assert set(comm) == {"total_s", *BREAKDOWN_KEYS}
    assert comm["total_s"] == pytest.approx(sum(comm[k] for k in BREAKDOWN_KEYS))
    assert all(comm[k] > 0 for k in BREAKDOWN_KEYS)
    # pure data parallelism issues only the gradient all-reduce
    dp = predicted_communication(perlmutter, Grid(16), d_model=64, d_ff=256, n_layers=3, tokens_per_rank=64)
    assert dp["total_s"] == dp["all_reduce_data_s"] > 0


def test_equal_bandwidth_without_latency_prices_bytes_moved(flat_node):
    """On one node with one bandwidth and no latency, time x bandwidth is the ring bytes each rank sends."""
    for grid, _ in enumerate_grids(8):
        tokens, elem = 32, 2
        ring_bytes = sum(
            RING_STEPS[c.kind] * (grid.size(c.axis) - 1) / grid.size(c.axis) * c.elements * elem
            for c in block_collectives(grid, 64, 256, True, tokens, cached=False)
        )
        shards = sum(s.block_elements(grid) // grid.depth for s in block_linears(64, 256, True))
        ring_bytes += 2 * (grid.data - 1) / grid.data * shards * elem
        replicas = grid.data * grid.depth
        ring_bytes += 2 * (replicas - 1) / replicas * 4 * 64 * elem
        comm = predicted_communication(flat_node, grid, d_model=64, d_ff=256, n_layers=1, tokens_per_rank=tokens)
        assert comm["total_s"] * 10e9 == pytest.approx(ring_bytes), grid


def test_fewest_bytes_ranks_first_and_placement_is_moot_on_one_node(flat_node):
    ranked = rank_grids(flat_node, 8, global_sequences=8, memory_GB=1e3, orders=True, **TINY)
    assert ranked["predicted_comm_s"].is_monotonic_increasing
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    # every placement of a grid costs the same when every group has the same bandwidth
    spread = ranked.groupby(["data", "depth", "row", "col"])["predicted_comm_s"].agg(lambda s: s.max() - s.min())
    assert spread.max() == pytest.approx(0, abs=1e-15)


def test_pure_data_parallelism_wins_for_a_tiny_model(perlmutter):
    """When a rank's activations (8192 tokens x 64 features) dwarf the weights (2 x 12 x 64^2), only the
    gradient all-reduce is cheap enough, though it crosses nodes with the most ring steps."""
    ranked = rank_grids(perlmutter, 8, global_sequences=64, memory_GB=80, **{**TINY, "seq_len": 1024})
    best = ranked.iloc[0]
    assert (best.data, best.depth, best.row, best.col, best["rank"]) == (8, 1, 1, 1, 1)


def test_placement_matters_across_nodes(perlmutter):
    """Two nodes: a col group of 4 placed innermost stays on NVLink; placed outside row it crosses nodes."""
    grid = Grid(1, 1, 2, 4)
    axonn = predicted_communication(perlmutter, grid, d_model=64, d_ff=256, n_layers=1, tokens_per_rank=1024)
    swapped = predicted_communication(
        perlmutter, grid, ("row", "col", "depth"), d_model=64, d_ff=256, n_layers=1, tokens_per_rank=1024
    )
    assert swapped["all_reduce_col_s"] > axonn["all_reduce_col_s"]
    assert swapped["all_reduce_row_s"] < axonn["all_reduce_row_s"]


def test_moe_blocks_and_cached_weights(perlmutter):
    kw = dict(d_model=64, d_ff=256, n_layers=4, tokens_per_rank=64)
    grid = Grid(2, 2, 2, 2)
    dense = predicted_communication(perlmutter, grid, **kw)
    all_moe = predicted_communication(perlmutter, grid, moe_every=1, **kw)
    half = predicted_communication(perlmutter, grid, moe_every=2, **kw)
    assert all_moe["total_s"] < dense["total_s"]
    assert half["total_s"] == pytest.approx((dense["total_s"] + all_moe["total_s"]) / 2)
    # caching every layer drops the backward all-gather, which moves what the forward one does
    cached = predicted_communication(perlmutter, grid, cached_layers=4, **kw)
    assert cached["all_gather_depth_s"] == pytest.approx(dense["all_gather_depth_s"] / 2)
    assert cached["reduce_scatter_depth_s"] == dense["reduce_scatter_depth_s"]


def test_enumerate_grids_counts():
    assert len(enumerate_grids(8)) == 20  # ordered factorisations of 2^3 into 4 factors: C(6, 3)
    assert len(enumerate_grids(12)) == 40  # 2^2: C(5, 3) = 10 times 3^1: 4
    assert all(grid.world_size == 12 and order == AXONN_ORDER for grid, order in enumerate_grids(12))
    # with placements: k! per grid for its k tensor axes larger than 1 (1 + 3 + 9 + 21 over data = 8..1)
    with_orders = enumerate_grids(8, orders=True)
    assert len(with_orders) == 34
    assert len(set(with_orders)) == 34
    assert [order for grid, order in with_orders if grid == Grid(8)] == [AXONN_ORDER]
    assert len([order for grid, order in with_orders if grid == Grid(1, 2, 2, 2)]) == 6
    with pytest.raises(ValueError, match="world_size"):
        enumerate_grids(0)


def test_memory_weights_divide_over_the_tensor_ranks():
    m = WEAK_SCALING[0]
    args = (m.d_model, m.d_ff, m.n_layers, m.vocab_size, m.seq_len)
    whole = memory_bytes(Grid(1), *args, sequences_per_rank=0)
    split = 12 * m.n_layers * m.d_model**2 * 16  # the blocks' linears, 16 B per parameter
    for grid in (Grid(1, 2, 1, 1), Grid(1, 2, 2, 1), Grid(1, 2, 2, 2), Grid(1, 8, 2, 2)):
        tensor = grid.depth * grid.row * grid.col
        assert memory_bytes(grid, *args, sequences_per_rank=0) == pytest.approx(whole - split * (1 - 1 / tensor))
    # activations grow with the sequences, shrink with row, and recomputation keeps fewer
    one = memory_bytes(Grid(1), *args, sequences_per_rank=1)
    assert memory_bytes(Grid(1), *args, sequences_per_rank=2) - whole == pytest.approx(2 * (one - whole))
    assert memory_bytes(Grid(1, 1, 4, 1), *args, sequences_per_rank=1) < memory_bytes(
        Grid(1, 1, 1, 4), *args, sequences_per_rank=1
    )
    assert memory_bytes(Grid(1), *args, sequences_per_rank=1, recompute=False) > one


def test_weak_scaling_models_land_on_their_sizes():
    for model, billions in zip(WEAK_SCALING, (5, 10, 20, 40, 80)):
        assert parameters(model) == pytest.approx(billions * 1e9, rel=0.1), model.name
        assert model.n_heads * 128 == model.d_model and model.d_ff == 4 * model.d_model
        assert model.global_sequences == model.gpus
    assert [m.gpus for m in WEAK_SCALING] == [64, 128, 256, 512, 1024]
    assert parameters(TWO_B) == pytest.approx(2e9, rel=0.1)


def test_megatron_layout_of_80b_on_1024_perlmutter_gpus(perlmutter):
    model = WEAK_SCALING[-1]
    layout = megatron_layout(model, 1024, perlmutter, memory_GB=40)
    tp, pp, dp = layout["tp"], layout["pp"], layout["dp"]
    assert tp == perlmutter.devices_per_node and tp * pp * dp == 1024
    assert model.n_layers % pp == 0
    assert layout["microbatches"] * dp * layout["micro_batch_sequences"] == model.global_sequences
    assert layout["memory_GB"] <= 40
    # minimal: every shallower even pipeline runs out of memory
    for shallower in (p for p in range(1, pp) if model.n_layers % p == 0 and 1024 % (tp * p) == 0):
        microbatches = model.global_sequences // (1024 // (tp * shallower))
        assert megatron_memory_bytes(model, tp, shallower, microbatches) > 40e9, shallower
    with pytest.raises(ValueError, match="memory_GB"):
        megatron_layout(model, 1024, perlmutter, memory_GB=1)


def test_pipeline_time_is_the_1f1b_bubble_formula():
    t, m, pp = 0.1, 32, 8
    assert pipeline_time_s(t, m, pp, p2p_s=0.0) == pytest.approx((m + pp - 1) * t)
    bubble = pipeline_time_s(t, m, pp, 0.0) / (m * t) - 1
    assert bubble == pytest.approx((pp - 1) / m)
    assert pipeline_time_s(t, m, 1, 0.01) == pytest.approx(m * 0.11)
    with pytest.raises(ValueError, match="microbatches"):
        pipeline_time_s(t, 0, pp, 0.0)


def test_rank_grids_of_80b_keeps_non_fitting_grids_unranked_at_the_end(perlmutter):
    m = WEAK_SCALING[-1]
    ranked = rank_grids(
        perlmutter, m.gpus, d_model=m.d_model, d_ff=m.d_ff, n_layers=m.n_layers, n_heads=m.n_heads,
        vocab_size=m.vocab_size, seq_len=m.seq_len, global_sequences=m.global_sequences, memory_GB=40,
    )  # fmt: skip
    fits = ranked[ranked["fits"]]
    assert len(fits) > 0 and (fits["memory_GB"] <= 40).all()
    assert list(fits["rank"]) == list(range(1, len(fits) + 1)) and fits["predicted_comm_s"].is_monotonic_increasing
    rest = ranked[~ranked["fits"]]
    assert rest["rank"].isna().all() and (rest["memory_GB"] > 40).all()
    assert list(ranked["fits"]) == [True] * len(fits) + [False] * len(rest)
    assert (ranked["data"] * ranked["depth"] * ranked["row"] * ranked["col"] == 1024).all()
    assert (m.n_heads % ranked["row"] == 0).all()
    assert not ((ranked["depth"] == 1) & (ranked["row"] == 1) & (ranked["col"] == 1) & ranked["fits"]).any()
    assert math.isclose(fits.iloc[0]["predicted_comm_s"], fits.iloc[0][list(BREAKDOWN_KEYS)].sum(), rel_tol=1e-12)


@pytest.mark.parametrize("orders", [False, True])
def test_rank_grids_ranks_the_grids_grid_memory_considers_with_its_fits(perlmutter, orders):
    """One decision: the grids that fit are grid_memory's (which the workflow names the ranking's
    records by, without pricing), and rank_grids ranks exactly its grids, with its memory."""
    search = dict(TINY, global_sequences=8, memory_GB=7e-4, orders=orders)  # some grids fit, some do not
    ranked = rank_grids(perlmutter, 8, **search)
    ranked_rows = {(Grid(r.data, r.depth, r.row, r.col), r.order, r.memory_GB, r.fits) for r in ranked.itertuples()}
    considered = grid_memory(8, **search)
    assert ranked_rows == {(c.grid, "<".join(c.order), c.memory_GB, c.fits) for c in considered}
    assert len(considered) == len(ranked) and 0 < sum(c.fits for c in considered) < len(considered)


def test_bad_world_sizes_are_named(perlmutter):
    with pytest.raises(ValueError, match="devices_per_node"):
        rank_grids(perlmutter, 6, global_sequences=6, memory_GB=40, **TINY)
    with pytest.raises(ValueError, match="hardware.nodes"):
        rank_grids(calibrated_cpu(), 16, global_sequences=16, memory_GB=40, **TINY)
    with pytest.raises(ValueError, match="global_sequences"):
        rank_grids(perlmutter, 8, global_sequences=0, memory_GB=40, **TINY)
