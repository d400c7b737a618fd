"""Transmission orders (moe_core.comm.transmission, and Aurora's in papers/aurora/transmission_order):
the paper's example, the exact bound, validity."""

import numpy as np
import pytest

from moe_core.comm.transmission import (
    ORDERS,
    delivered,
    exact_schedule,
    lower_bound,
    make_schedule,
    order_schedule,
    rank_steps,
    rounds_time,
    transpose,
)
from moe_core.papers.aurora.transmission_order import algorithm1_schedule, rcs_orders, sjf_orders

# Fig. 4: GPU1 -> {2, 3}, GPU2 -> {1, 3}, one unit each (0-based here)
FIG4 = [[0, 1, 1], [1, 0, 1], [0, 0, 0]]


def _random_matrices(count=60, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(2, 9))
        density = rng.choice([0.3, 0.7, 1.0])
        yield rng.integers(0, 100, (n, n)) * (rng.random((n, n)) < density)


def _assert_valid(schedule, matrix):
    """Conflict-free rounds that deliver every off-diagonal byte exactly once."""
    for transfers in schedule:
        assert len({s for s, _, _ in transfers}) == len(transfers)
        assert len({d for _, d, _ in transfers}) == len(transfers)
        assert all(s != d and nbytes > 0 for s, d, nbytes in transfers)
    expected = np.array(matrix, dtype=float)
    np.fill_diagonal(expected, 0)
    np.testing.assert_array_equal(delivered(schedule, len(expected)), expected)


def test_paper_example_three_gpus():
    assert lower_bound(FIG4) == 2
    naive = make_schedule("naive", FIG4)
    assert rounds_time(naive) == 3
    for kind in ("aurora", "exact"):
        schedule = make_schedule(kind, FIG4)
        assert rounds_time(schedule) == 2
        steps = rank_steps(schedule, 2)  # GPU3 receives one unit per slot, from each sender once
        assert sorted(recv for _, recv in steps) == [(0, 1.0), (1, 1.0)] and all(send is None for send, _ in steps)
    # the paper's fix: GPU2 sends to GPU3 first, then to GPU1
    assert rounds_time(order_schedule(FIG4, [[1, 2], [2, 0], []])) == 2


@pytest.mark.parametrize("kind", sorted(ORDERS))
def test_every_schedule_is_conflict_free_and_complete(kind):
    for matrix in _random_matrices(40, seed=1):
        _assert_valid(make_schedule(kind, matrix, seed=3), matrix)


def test_exact_schedule_takes_the_lower_bound():
    for matrix in _random_matrices():
        schedule = exact_schedule(matrix)
        assert rounds_time(schedule) == lower_bound(matrix)  # integers stay exact
        assert rounds_time(exact_schedule(matrix, 12.5), 12.5) == pytest.approx(lower_bound(matrix, 12.5))


def test_exact_schedule_of_float_bytes():
    matrix = np.random.default_rng(5).random((6, 6)) * 1e6
    schedule = exact_schedule(matrix)
    np.fill_diagonal(matrix, 0)
    np.testing.assert_allclose(delivered(schedule, 6), matrix, rtol=1e-9)
    assert rounds_time(schedule) == pytest.approx(lower_bound(matrix), rel=1e-9)


def test_exact_schedule_heterogeneous_bandwidth():
    """Per-GPU caps: optimal for transfers at min(B_i, B_j), which the per-GPU bound T* may undercut."""
    bandwidth = [100, 80, 50, 40, 100, 80, 50, 40]
    for matrix in _random_matrices(20, seed=2):
        n = len(matrix)
        bw = bandwidth[:n]
        pair_time = np.array(matrix, dtype=float) / np.minimum.outer(bw, bw)
        np.fill_diagonal(pair_time, 0)
        schedule = exact_schedule(matrix, bw)
        expected = max(pair_time.sum(axis=0).max(), pair_time.sum(axis=1).max())
        assert rounds_time(schedule, bw) == pytest.approx(expected, rel=1e-9)
        assert rounds_time(schedule, bw) >= lower_bound(matrix, bw) * (1 - 1e-12)
        np.testing.assert_allclose(delivered(schedule, n), np.array(matrix) - np.diag(np.diag(matrix)), rtol=1e-9)


def test_algorithm1_between_bound_and_naive():
    ratios = []
    for matrix in _random_matrices(200, seed=4):
        bound = lower_bound(matrix)
        aurora = algorithm1_schedule(matrix)
        assert bound <= rounds_time(aurora) <= rounds_time(make_schedule("naive", matrix))
        ratios.append(rounds_time(aurora) / bound if bound else 1.0)
    assert np.mean(ratios) < 1.05  # close to optimal on average; exact on most matrices
    assert np.mean(np.isclose(ratios, 1.0)) > 0.5


def test_sjf_loses_to_aurora_on_skewed_traffic():
    """Receiver contention: every sender's shortest flow goes to the same GPU."""
    matrix = np.full((4, 4), 10)
    matrix[:, 0] = 1
    sjf = rounds_time(make_schedule("sjf", matrix))
    assert sjf > rounds_time(make_schedule("aurora", matrix)) >= rounds_time(make_schedule("exact", matrix))
    assert rounds_time(make_schedule("exact", matrix)) == lower_bound(matrix)


def test_baseline_orders():
    matrix = np.array([[0, 5, 1, 3], [2, 0, 2, 9], [0, 0, 0, 0], [4, 1, 7, 0]])
    assert sjf_orders(matrix) == [[2, 3, 1], [0, 2, 3], [], [1, 0, 2]]
    assert rcs_orders(matrix, seed=0) == rcs_orders(matrix, seed=0)
    assert any(rcs_orders(matrix, seed=s) != rcs_orders(matrix, seed=0) for s in range(1, 10))
    assert sorted(map(sorted, rcs_orders(matrix, seed=1))) == sorted(map(sorted, sjf_orders(matrix)))


def test_transpose_is_the_reverse_exchange():
    matrix = next(_random_matrices(seed=7))
    schedule = exact_schedule(matrix)
    _assert_valid(transpose(schedule), np.array(matrix).T)
    assert rounds_time(transpose(schedule)) == rounds_time(schedule)


def test_rank_steps_follow_rounds():
    schedule = [[(0, 1, 3.0), (1, 2, 2.0)], [(2, 0, 1.0)], [(0, 2, 4.0), (2, 1, 5.0)]]
    assert rank_steps(schedule, 0) == [((1, 3.0), None), (None, (2, 1.0)), ((2, 4.0), None)]
    assert rank_steps(schedule, 2) == [(None, (1, 2.0)), ((0, 1.0), None), ((1, 5.0), (0, 4.0))]


@pytest.mark.parametrize(
    "matrix,bandwidth,message",
    [
        ([[0, 1, 2], [3, 4, 5]], 1.0, "square"),
        ([[0, -1], [1, 0]], 1.0, "negative"),
        ([[0, np.nan], [1, 0]], 1.0, "non-finite"),
        ([[0, 1], [1, 0]], 0.0, "positive"),
        ([[0, 1], [1, 0]], [1.0, 2.0, 3.0], "one value per GPU"),
    ],
)
def test_bad_input_is_named(matrix, bandwidth, message):
    with pytest.raises(ValueError, match=message):
        lower_bound(matrix, bandwidth)
    with pytest.raises(ValueError, match=message):
        exact_schedule(matrix, bandwidth)


def test_bad_orders_and_kind():
    with pytest.raises(ValueError, match="every non-zero"):
        order_schedule(FIG4, [[1], [0, 2], []])
    with pytest.raises(ValueError, match="unknown transmission order"):
        make_schedule("fastest", FIG4)
    with pytest.raises(ValueError, match="sending or receiving twice"):
        delivered([[(0, 1, 1.0), (2, 1, 1.0)]], 3)
