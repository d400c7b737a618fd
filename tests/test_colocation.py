"""Aurora's deployment decisions (moe_core/papers/aurora/colocation.py) against brute force."""

import itertools

import numpy as np
import pytest

from moe_core.papers.aurora.colocation import (
    LayerStats,
    assign_exclusive,
    bottleneck_matching,
    brute_force_exclusive,
    brute_force_heterogeneous,
    brute_force_matching,
    colocate_heterogeneous,
    exclusive_cost,
    lina_pairing,
    pair_bottleneck,
    pair_cost_on_gpus,
    pair_sorted,
    pairing_weights,
)


def _layer(rng, n, scale=1e6):
    return LayerStats(rng.integers(0, 100, (n, n)) * scale, rng.random(n) * 4e-3)


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
        assert exclusive_cost(load, perf, gpu_of) == brute_force_exclusive(load, perf)[1] == best


def test_heterogeneous_heuristic_close_to_brute_force():
    """Never two experts of one model on a GPU; the gap to the optimum stays small (paper: 1.07x)."""
    rng = np.random.default_rng(5)
    bandwidth, speed = np.array([100, 80, 50, 40, 40]) * 1e9 / 8, np.array([2.0, 1.6, 1.0, 0.8, 0.8])
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


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: pair_sorted([1, 2], [1, 2, 3]), "equal lengths"),
        (lambda: bottleneck_matching(np.ones((2, 3))), "square"),
        (lambda: LayerStats(np.ones((2, 2)), [0, -1]), "ffn_s"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
