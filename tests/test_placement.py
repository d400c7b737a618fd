"""Lina's inference placement decisions (moe_core.placement): hand-made traces and known answers."""

import numpy as np
import pytest

from moe_core.papers.lina.placement import (
    Placement,
    code_counts,
    devices_per_expert,
    expected_tokens,
    first_fit_decreasing,
    merge_profiles,
    needs_replan,
    path_topk_share,
    phase1_placement,
    plan_layer,
    popularity_ratio,
    profile_paths,
    replica_token_counts,
    route_rows,
    schedule_rates,
    send_counts,
    static_placement,
    unique_codes,
)

# 4 MoE layers, 6 tokens, E = 3. Tokens 0-2 follow path (0, 1, 2), tokens 3-5 path (2, 2, 0).
TRACE = np.array([[0, 0, 0, 2, 2, 2], [1, 1, 1, 2, 2, 2], [2, 2, 2, 0, 0, 0], [1, 1, 0, 2, 2, 2]])


def test_path_counting_on_hand_made_trace():
    profile = profile_paths(TRACE, num_experts=3, path_length=3)
    np.testing.assert_array_equal(profile.marginal(0), [3, 0, 3])
    np.testing.assert_array_equal(profile.next_counts(0, ()), [3, 0, 3])  # layer 0: the empty path
    np.testing.assert_array_equal(profile.next_counts(1, (0,)), [0, 3, 0])  # path so far: one layer
    np.testing.assert_array_equal(profile.next_counts(3, (0, 1, 2)), [1, 2, 0])
    np.testing.assert_array_equal(profile.next_counts(3, (2, 2, 0)), [0, 0, 3])
    np.testing.assert_array_equal(profile.next_counts(3, (1, 1, 1)), [0, 0, 0])  # never seen
    short = profile_paths(TRACE, num_experts=3, path_length=1)
    np.testing.assert_array_equal(short.next_counts(3, (2,)), [1, 2, 0])  # only layer 2 forms the path
    np.testing.assert_array_equal(short.next_counts(3, (0,)), [0, 0, 3])


def test_merged_profiles_are_the_profile_of_all_their_tokens():
    choices = np.random.default_rng(0).integers(0, 5, size=(6, 3000))
    parts = [profile_paths(part, 5, 3) for part in np.array_split(choices, [700, 1900], axis=1)]
    merged, whole = merge_profiles(parts), profile_paths(choices, 5, 3)
    for got, want in zip((merged.codes, merged.counts), (whole.codes, whole.counts)):
        for layer_got, layer_want in zip(got, want, strict=True):
            np.testing.assert_array_equal(layer_got, layer_want)
    with pytest.raises(ValueError, match="share"):
        merge_profiles([parts[0], profile_paths(choices, 5, 1)])


def test_estimate_follows_the_paths():
    profile = profile_paths(TRACE, num_experts=3, path_length=3)
    # A batch of 2 tokens on path (0, 1, 2), 1 on (2, 2, 0) and 1 on an unseen path.
    prior = np.array([[0, 0, 2, 1], [1, 1, 2, 1], [2, 2, 0, 1]])
    np.testing.assert_allclose(expected_tokens(profile, 3, prior), [2 / 3, 4 / 3, 1.0])
    np.testing.assert_allclose(expected_tokens(profile, 3, prior, keep=1), [0, 4 / 3, 1.0])  # top-1 of each path


def test_devices_per_expert_sums_to_n():
    rng = np.random.default_rng(0)
    for n_devices in (1, 2, 4, 16):
        n = devices_per_expert(rng.random(16) * 100, n_devices)
        assert n.sum() == pytest.approx(n_devices)
    np.testing.assert_allclose(devices_per_expert([6, 2, 0, 0], 4), [3, 1, 0, 0])  # Eq. 1 by hand


@pytest.mark.parametrize("seed", range(20))
def test_every_expert_placed_at_most_four_per_device(seed):
    rng = np.random.default_rng(seed)
    n_devices = int(rng.integers(1, 9))
    n_experts = int(rng.integers(1, 4 * n_devices + 1))
    popularity = rng.zipf(1.5, n_experts).astype(float) * (rng.random(n_experts) < 0.8)  # some without estimate
    placement = phase1_placement(devices_per_expert(popularity, n_devices), n_devices)
    assert all(len(r) >= 1 for r in placement.replicas)
    assert all(len(placement.experts_on(d)) <= 4 for d in range(n_devices))


def test_popular_expert_is_replicated_unpopular_ones_packed():
    # n = [2.2, 1.0, 0.5, 0.3]: expert 0 on 2 devices (1.1 each), expert 1 alone, 2 and 3 share one device.
    placement = phase1_placement(devices_per_expert([2.2, 1.0, 0.5, 0.3], 4), 4)
    assert placement.replicas == ((0, 1), (2,), (3,), (3,))
    # Five experts of 0.8 devices-worth: one device takes two; the three experts without an
    # estimate then go to the devices with the fewest experts.
    placement = phase1_placement(devices_per_expert([1, 1, 1, 1, 1, 0, 0, 0], 4), 4)
    assert placement.replicas == ((0,), (1,), (2,), (3,), (0,), (1,), (2,), (3,))
    # One expert takes all the tokens: it is replicated on every device.
    assert phase1_placement(devices_per_expert([1, 0, 0, 0], 4), 4).replicas[0] == (0, 1, 2, 3)


def test_first_fit_decreasing_known_optimal_case():
    # Sizes sum to 3.7, so 4 bins is optimal; FFD finds it and leaves the other bins empty.
    sizes = [0.5, 0.7, 0.5, 0.2, 0.4, 0.2, 0.5, 0.1, 0.6]
    bins = first_fit_decreasing(sizes, num_bins=9, capacity=1.0, max_items=4)
    assert len(set(bins.tolist())) == 4
    assert all(np.bincount(bins, weights=sizes)[b] <= 1.0 + 1e-9 for b in set(bins.tolist()))
    # The item limit opens more bins: ten tiny items, at most 4 per bin.
    assert np.bincount(first_fit_decreasing([0.01] * 10, num_bins=9, max_items=4)).tolist() == [4, 4, 2]


def test_replicas_are_balanced_across_sources():
    placement = Placement(((0, 1, 2), (3,), (0,)), num_devices=4)
    counts = np.array([[5, 1, 2], [4, 0, 3], [7, 2, 0]])  # (sources, experts)
    routed = replica_token_counts(counts, placement)
    per_replica = routed[:, [0, 1, 2], 0].sum(axis=0)
    assert per_replica.sum() == 16 and per_replica.max() - per_replica.min() <= 1
    np.testing.assert_array_equal(routed.sum(axis=1), counts)  # every row goes somewhere
    rng = np.random.default_rng(0)
    for s in range(3):  # the per-row routing agrees with the closed form, whatever the row order
        ids = rng.permutation(np.repeat(np.arange(3), counts[s]))
        dest = route_rows(ids, placement, counts[:s].sum(axis=0))
        for e in range(3):
            np.testing.assert_array_equal(np.bincount(dest[ids == e], minlength=4), routed[s, :, e])
        np.testing.assert_array_equal(send_counts(ids, placement, counts[:s].sum(axis=0)), routed[s].sum(axis=1))


def test_static_placement():
    assert static_placement(4, 4).replicas == ((0,), (1,), (2,), (3,))
    assert static_placement(8, 4).replicas == ((0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,))  # e // 2
    assert static_placement(2, 4).replicas == ((0,), (1,))


def test_phase2_fires_exactly_when_top_2k_sets_differ():
    estimated = np.array([10, 8, 1, 1, 0])
    assert not needs_replan(estimated, [7, 9, 0, 3, 1], top_k=1)  # top-2 {0, 1} both, order differs
    assert needs_replan(estimated, [7, 1, 0, 9, 1], top_k=1)  # {0, 3} != {0, 1}
    assert not needs_replan(estimated, [5, 5, 4, 2, 0], top_k=2)  # top-4 {0, 1, 2, 3}
    assert needs_replan(estimated, [5, 5, 4, 0, 2], top_k=2)
    placement, replanned = plan_layer(estimated, [7, 1, 0, 9, 1], num_devices=2, top_k=1)
    assert replanned and placement == phase1_placement(devices_per_expert([7, 1, 0, 9, 1], 2), 2)
    placement, replanned = plan_layer(estimated, [7, 1, 0, 9, 1], num_devices=2, top_k=1, finetune=False)
    assert not replanned and placement == phase1_placement(devices_per_expert(estimated, 2), 2)
    assert schedule_rates([True, False, True, True], [False, True, False, False]) == {
        "estimation_accuracy": 0.75,
        "replan_rate": 0.25,
    }


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: devices_per_expert([1, -2, 3], 4), "popularity"),
        (lambda: devices_per_expert([1, 2, 3], 0), "num_devices"),
        (lambda: phase1_placement([1.0, 1.0], 0), "num_devices"),
        (lambda: static_placement(4, 0), "num_devices"),
        (lambda: needs_replan([1, 2], [1, -1], 1), "actual"),
        (lambda: replica_token_counts([[1, -1]], static_placement(2, 2)), "counts"),
        (lambda: profile_paths([[0, 5]], 3), "choices"),
        (lambda: profile_paths(TRACE, 3, path_length=0), "path_length"),
        (lambda: phase1_placement(np.zeros(9), 2), "max_per_device"),
        (lambda: Placement(((0,), (2,)), num_devices=2), "replicas"),
    ],
)
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_popularity_ratio_skips_layers_with_an_idle_expert():
    # layers 0-2 leave an expert without tokens; layer 3 counts [1, 2, 3]: most / least = 3
    assert popularity_ratio(TRACE, num_experts=3) == pytest.approx(3.0)
    assert np.isnan(popularity_ratio(TRACE[:3], num_experts=3))
    with pytest.raises(ValueError, match="expert ids"):
        popularity_ratio(TRACE, num_experts=2)


def test_path_topk_share_counts_tokens_following_their_groups_top_experts():
    one_back = profile_paths(TRACE, num_experts=3, path_length=1)
    # layers 1 and 2: every group of 3 tokens moves together (6/6 each); layer 3: the group that
    # picked expert 2 splits [1, 2, 0] over experts 0, 1, so its top-1 holds 2 of 3 tokens
    assert path_topk_share(one_back, 1) == pytest.approx(17 / 18)
    assert path_topk_share(one_back, 2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        path_topk_share(one_back, 0)


@pytest.mark.parametrize("space", [7**3, 1 << 30])  # counted with a bincount, and by np.unique past the limit
def test_unique_codes_and_code_counts_are_np_unique(space):
    codes = np.random.default_rng(0).integers(0, min(space, 7**3), size=5000) * (space // 7**3)
    expected = np.unique(codes, return_inverse=True, return_counts=True)
    for got, want in zip(unique_codes(codes, space), expected):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(code_counts(codes, space), (expected[0], expected[2]), strict=True):
        np.testing.assert_array_equal(got, want)
