"""Aurora's deployment decisions (moe_core.colocation) against brute force, and the inference-time model."""

import itertools

import numpy as np
import pytest

from moe_core.papers.aurora.colocation import (
    LayerStats,
    assign_exclusive,
    bottleneck_matching,
    brute_force_heterogeneous,
    brute_force_matching,
    colocate_heterogeneous,
    colocated_inference,
    exclusive_inference,
    gbps_to_bytes_per_s,
    gpu_traffic,
    heterogeneous_bandwidth,
    lina_pairing,
    lina_pairing_inference,
    pair_bottleneck,
    pair_cost_on_gpus,
    pair_sorted,
    pairing_weights,
    random_colocation,
)


def _layer(rng, n, scale=1e6):
    return LayerStats(
        rng.integers(0, 100, (n, n)) * scale, rng.random(n) * 1e-3, rng.random(n) * 4e-3, rng.random(n) * 1e-3
    )


def _cost(weight, partner):
    return weight[np.arange(len(partner)), partner].max()


def test_case1_sorted_pairing_is_optimal():
    """Every expert sends what it receives: a ascending against b descending is optimal (Theorem 6.2)."""
    rng = np.random.default_rng(0)
    for n in range(1, 7):
        for _ in range(10):
            a, b = rng.integers(0, 50, n), rng.integers(0, 50, n)
            weight = pairing_weights(a, a, b, b)
            assert _cost(weight, pair_sorted(a, b)) == brute_force_matching(weight)[1]


def test_case1_sorting_is_not_enough_in_general():
    """Case II exists for a reason: with send != receive the sorted pairing can lose to the matching."""
    rng = np.random.default_rng(1)
    gaps = []
    for _ in range(50):
        a_send, a_recv, b_send, b_recv = rng.integers(0, 50, (4, 5))
        weight = pairing_weights(a_send, a_recv, b_send, b_recv)
        gaps.append(_cost(weight, pair_sorted(a_send + a_recv, b_send + b_recv)) - brute_force_matching(weight)[1])
    assert min(gaps) >= 0 and max(gaps) > 0


def test_bottleneck_matching_is_optimal():
    rng = np.random.default_rng(2)
    for n in range(1, 7):
        for _ in range(15):
            weight = rng.integers(0, 6, (n, n)).astype(float)  # many ties
            partner = bottleneck_matching(weight)
            assert sorted(partner) == list(range(n))
            assert _cost(weight, partner) == brute_force_matching(weight)[1]


def test_case2_pairing_is_optimal():
    rng = np.random.default_rng(3)
    for _ in range(30):
        a_send, a_recv, b_send, b_recv = rng.integers(0, 100, (4, 6))
        weight = pairing_weights(a_send, a_recv, b_send, b_recv)
        assert _cost(weight, pair_bottleneck(a_send, a_recv, b_send, b_recv)) == brute_force_matching(weight)[1]


def test_exclusive_assignment_matches_brute_force():
    """Theorem 5.1: the busiest GPU's load / performance is minimized by sorting both."""
    rng = np.random.default_rng(4)
    for _ in range(20):
        load, perf = rng.integers(1, 100, 6), rng.choice([100, 80, 50, 40], 6)
        gpu_of = assign_exclusive(load, perf)
        assert sorted(gpu_of) == list(range(6)) and gpu_of[np.argmax(load)] == np.argmax(perf)
        best = min(max(load[e] / perf[g] for e, g in enumerate(p)) for p in itertools.permutations(range(6)))
        assert max(load / perf[gpu_of]) == best


def test_heterogeneous_heuristic_close_to_brute_force():
    """Never two experts of one model on a GPU; the gap to the optimum stays small (paper: 1.07x)."""
    rng = np.random.default_rng(5)
    bandwidth, speed = gbps_to_bytes_per_s([100, 80, 50, 40, 40]), np.array([2.0, 1.6, 1.0, 0.8, 0.8])
    gaps = []
    for _ in range(15):
        a, b = _layer(rng, 5), _layer(rng, 5)
        partner, gpu_of = colocate_heterogeneous(a, b, bandwidth, speed)
        assert sorted(partner) == sorted(gpu_of) == list(range(5))  # one a and one b expert per GPU
        cost = pair_cost_on_gpus(a, b, partner, bandwidth, speed)[np.arange(5), gpu_of].max()
        best = brute_force_heterogeneous(a, b, bandwidth, speed)[2]
        assert cost >= best * (1 - 1e-12)
        gaps.append(cost / best)
    assert np.mean(gaps) < 1.2


def test_lina_pairs_popular_with_unpopular_of_one_model():
    assert lina_pairing([5, 1, 9, 3]) == [(2, 1), (0, 3)]
    with pytest.raises(ValueError, match="odd"):
        lina_pairing([1, 2, 3])


def test_gpu_traffic_keeps_same_gpu_traffic_local():
    traffic = np.arange(16).reshape(4, 4)
    d = gpu_traffic(traffic, [0, 0, 1, 1], 2)
    assert d.tolist() == [[0, 2 + 3 + 6 + 7], [8 + 9 + 12 + 13, 0]]


def test_inference_model_by_hand():
    """Two GPUs, 100 B/s: communication-bound and compute-bound layers give the closed forms."""
    comm_bound = LayerStats([[0, 100], [50, 0]], [0.1, 0.1], [0.2, 0.2], [0.1, 0.1])
    t, util = exclusive_inference([comm_bound], [0, 1], 100.0)
    assert t == pytest.approx(0.1 + 1.0 + 0.2 + 1.0 + 0.1) and util == pytest.approx(0.4 / t)
    # colocated: a dispatch of 100 + 50 B and b's 100 + 50 B the other way round share both NICs
    t, util = colocated_inference([comm_bound], [comm_bound], [1, 0], [0, 1], 100.0)
    assert t == pytest.approx(0.1 + 1.5 + 1.5 + 0.1) and util == pytest.approx(0.8 / t)
    compute_bound = LayerStats([[0, 1], [1, 0]], [0.1, 0.1], [0.2, 0.2], [0.1, 0.1])
    t, util = colocated_inference([compute_bound], [compute_bound], [0, 1], [0, 1], 100.0)
    assert t == pytest.approx(0.8) and util == pytest.approx(1.0)


def test_colocation_beats_lina_and_random_on_skewed_loads():
    """Two models with popular and unpopular experts on 8 GPUs, homogeneous and heterogeneous."""
    rng = np.random.default_rng(6)
    popularity = np.array([8, 6, 4, 3, 2, 1, 1, 1])

    def layers(order):
        return [
            LayerStats(
                np.outer(np.ones(8), popularity[order]) * 1e6 * rng.uniform(0.8, 1.2, (8, 8)),
                np.full(8, 1e-3),
                popularity[order] * 1e-3,
                np.full(8, 1e-3),
            )
            for _ in range(4)
        ]

    a, b = layers(np.arange(8)), layers(rng.permutation(8))
    for bandwidth in (gbps_to_bytes_per_s(100), heterogeneous_bandwidth(8)):
        partner, gpu_of = colocate_heterogeneous(a[0], b[0], bandwidth, 1.0)
        aurora, aurora_util = colocated_inference(a, b, partner, gpu_of, bandwidth)
        lina, lina_util = lina_pairing_inference(a, b, bandwidth)
        random = colocated_inference(a, b, random_colocation(8, 0), np.arange(8), bandwidth)[0]
        assert aurora < lina and aurora < random and aurora_util > lina_util


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: pair_sorted([1, 2], [1, 2, 3]), "equal lengths"),
        (lambda: bottleneck_matching(np.ones((2, 3))), "square"),
        (lambda: LayerStats(np.ones((2, 2)), [0, 0], [0, -1], [0, 0]), "ffn_s"),
        (lambda: colocated_inference([], [], [0, 0], [0, 1], 1.0), "partner must be a permutation"),
        (lambda: heterogeneous_bandwidth(6), "multiple"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_exclusive_inference_by_schedule_kind():
    """Fig. 11a's comparison: Aurora's order is never slower than SJF or RCS and beats them on contention."""
    rng = np.random.default_rng(7)
    popular = np.array([30, 1, 1, 1, 1, 1, 1, 1])
    layers = [
        LayerStats(np.outer(rng.integers(1, 5, 8), popular) * 1e6, np.full(8, 1e-4), np.full(8, 1e-4), np.full(8, 1e-4))
        for _ in range(4)
    ]
    bandwidth = gbps_to_bytes_per_s(100)
    aurora = exclusive_inference(layers, np.arange(8), bandwidth)[0]
    for kind in ("sjf", "rcs", "naive"):
        assert aurora <= exclusive_inference(layers, np.arange(8), bandwidth, kind=kind)[0]
    assert aurora < exclusive_inference(layers, np.arange(8), bandwidth, kind="sjf")[0]
