"""The dispatcher study's routing workloads: popularity skews and Megatron-LM's W0-W7."""

import numpy as np
import pytest

from moe_core.dispatch.workloads import (
    BURST_PERIOD,
    HOT_IMBALANCE,
    IMBALANCE_WORKLOADS,
    period,
    popularity,
    routing,
    routing_counts,
)

SHAPE = dict(tokens_per_rank=4096, experts=16, ranks=4, top_k=1)
EVERY = ["uniform", "zipf:1.0", "lognormal:1.0", *IMBALANCE_WORKLOADS]


def per_expert(workload: str, step: int = 0, **shape) -> np.ndarray:
    shape = {**SHAPE, **shape}
    return routing_counts(routing(workload, seed=0, step=step, **shape), shape["experts"]).sum(axis=0)


def share(counts: np.ndarray, experts) -> float:
    return counts[list(experts)].sum() / counts.sum()


@pytest.mark.parametrize("workload", EVERY)
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_every_row_routes_to_top_k_distinct_experts_and_is_reproducible(workload, top_k):
    shape = {**SHAPE, "top_k": top_k}
    for step in range(period(workload, shape["ranks"])):
        routes = routing(workload, seed=3, step=step, **shape)
        assert len(routes) == shape["ranks"]
        for rows in routes:
            assert rows.dtype == np.int64 and rows.shape[1] == top_k
            assert ((rows >= 0) & (rows < shape["experts"])).all()
            assert all(len(set(row)) == top_k for row in rows.tolist())
        again = routing(workload, seed=3, step=step, **shape)
        assert all(np.array_equal(a, b) for a, b in zip(routes, again))


def test_balanced_is_exact_and_popularity_skews_grow_with_their_parameter():
    assert (per_expert("balanced") == 4 * 4096 // 16).all()
    assert (per_expert("balanced", top_k=4) == 4 * 4096 * 4 // 16).all()
    tops = [popularity(16, f"zipf:{s}", seed=0).max() for s in (0.0, 0.5, 1.0, 2.0)]
    assert tops[0] == pytest.approx(1 / 16) and tops == sorted(tops)
    with pytest.raises(ValueError, match="not a popularity skew"):
        popularity(16, "hot_rank", seed=0)


def test_hot_workloads_put_the_stated_heat_where_they_say():
    hot_share = HOT_IMBALANCE / 16  # each hot expert: twice the mean load of 1/16
    hot_set = range(16 // 8)
    assert share(per_expert("hot_expert_set"), hot_set) == pytest.approx(2 * hot_share, abs=0.02)
    last_rank = range(12, 16)
    assert share(per_expert("hot_rank"), last_rank) == pytest.approx(4 * hot_share, abs=0.02)
    spread = per_expert("spread_hot_experts")
    assert share(spread, [0, 8]) == pytest.approx(2 * hot_share, abs=0.02)  # 2 hot experts, on ranks 0 and 2
    uniform = per_expert("uniform")
    assert share(uniform, hot_set) == pytest.approx(2 / 16, abs=0.02)


HEAT = ("hot_expert_set", "hot_rank", "spread_hot_experts", "rotating_hotspot", "burst")


@pytest.mark.parametrize("workload", HEAT)
@pytest.mark.parametrize("ranks, experts", [(2, 2), (2, 4), (4, 4), (4, 16), (64, 64), (64, 256)])
def test_every_hot_step_has_the_stated_imbalance_at_every_size(workload, ranks, experts):
    """One hot rank of two is as hot as one of 64 (a fixed share of the choices made the hot half of
    two ranks uniform routing); burst is uniform off its hot step (its max then: sampling noise)."""
    shape = dict(tokens_per_rank=2048, experts=experts, ranks=ranks, top_k=1)
    steps = range(min(period(workload, ranks), 2 * BURST_PERIOD))
    for step in steps:
        counts = per_expert(workload, step, **shape)
        imbalance = counts.max() / counts.mean()
        if workload != "burst" or step % BURST_PERIOD == BURST_PERIOD - 1:
            assert imbalance == pytest.approx(HOT_IMBALANCE, rel=0.08), step
        else:
            assert imbalance < 1.3, step


@pytest.mark.parametrize("workload", HEAT)
def test_heat_with_top_k_stays_hot_and_never_repeats_an_expert(workload):
    for ranks, experts in [(2, 4), (4, 16), (64, 256)]:
        step = BURST_PERIOD - 1  # burst's hot step
        counts = per_expert(workload, step, tokens_per_rank=512, experts=experts, ranks=ranks, top_k=2)
        assert 1.3 < counts.max() / counts.mean() < 1.3 * HOT_IMBALANCE  # top-k without replacement: near it


def test_source_ragged_keeps_the_total_and_zero_expert_rank_silences_a_rank_both_ways():
    routes = routing("source_ragged", seed=0, step=0, **SHAPE)
    sizes = [len(r) for r in routes]
    assert sum(sizes) == 4 * 4096 and sizes == sorted(sizes) and sizes[-1] > 3 * sizes[0]
    routes = routing("zero_expert_rank", seed=0, step=0, **SHAPE)
    assert len(routes[-1]) == 0 and all(len(r) == 4096 for r in routes[:-1])
    assert (per_expert("zero_expert_rank")[12:] == 0).all()
    (alone,) = routing("zero_expert_rank", seed=0, step=0, **{**SHAPE, "experts": 4, "ranks": 1})
    assert alone.shape == (0, 1)  # on one rank: an empty step


def test_rotating_hotspot_moves_every_step_and_burst_comes_once_a_period():
    ranks = SHAPE["ranks"]
    assert period("rotating_hotspot", ranks) == ranks and period("burst", ranks) == BURST_PERIOD
    assert period("hot_rank", ranks) == 1
    for step in range(2 * ranks):
        hot = range(4 * (step % ranks), 4 * (step % ranks) + 4)
        assert share(per_expert("rotating_hotspot", step), hot) == pytest.approx(0.5, abs=0.02)
    for step in range(2 * BURST_PERIOD):
        expected = 0.5 if step % BURST_PERIOD == BURST_PERIOD - 1 else 0.25
        assert share(per_expert("burst", step), range(12, 16)) == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize(
    "workload, shape, message",
    [
        ("pareto:1", {}, "unknown workload"),
        ("zipf", {}, "unknown workload"),
        ("hot_rank:2", {}, "unknown workload"),
        ("zipf:-1", {}, "finite parameter"),
        ("uniform", {"experts": 6}, "spread evenly"),
        ("uniform", {"top_k": 17}, "top_k=17"),
        ("zero_expert_rank", {"top_k": 13}, "top_k=13"),
        ("hot_rank", {"ranks": 1}, "needs at least 2 ranks"),
        ("rotating_hotspot", {"ranks": 1}, "needs at least 2 ranks"),
        ("burst", {"ranks": 1}, "needs at least 2 ranks"),
        ("hot_expert_set", {"experts": 1, "ranks": 1}, "needs at least 2 experts"),
        ("hot_rank", {"ranks": 2, "experts": 4, "top_k": 3}, "top_k=3 needs 1..2 experts"),
    ],
)
def test_bad_workloads_are_refused_saying_why(workload, shape, message):
    with pytest.raises(ValueError, match=message):
        routing(workload, seed=0, step=0, **{**SHAPE, **shape})
