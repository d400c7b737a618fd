"""Lina's inference simulated at the paper's scale: the synthetic routing, the forward pass, the policies."""

import math

import numpy as np
import pytest

import analysis.papers  # noqa: F401  (registers the reproducers)
from analysis.collect import collect
from analysis.registry import REPRODUCERS
from experiments import lina_inference_sim as sim
from moe_core.config.load import load_config, to_container
from moe_core.papers.lina.config import INFERENCE_UNSTATED
from moe_core.papers.lina.inference import Scheduler
from moe_core.papers.lina.inference_sim import (
    GatedBatch,
    balanced_counts,
    placed_batch,
    simulate_policies,
    source_counts,
)
from moe_core.papers.lina.placement import path_topk_share, profile_paths, static_placement
from moe_core.papers.lina.routing import (
    NEXT_LAYER_TOP1_SHARE,
    POPULARITY_RATIO,
    SyntheticRouting,
    categorical,
    lina_routing,
    popularity_exponent,
    zipf_popularity,
)
from moe_core.records.results import record_path, write_record
from moe_core.schema.points import sensitivity_settings, setting_text
from moe_core.sim.forward import ForwardModel
from moe_core.sim.topology import build_topology

SMALL = ["inference.batches=2", "inference.profile_batches=2", "lina.inference_experts=[4]"]


@pytest.mark.parametrize("experts", sorted(POPULARITY_RATIO))
def test_the_base_popularity_has_fig6s_most_over_least_ratio(experts):
    shares = zipf_popularity(experts, popularity_exponent(experts))
    assert shares.max() / shares.min() == pytest.approx(POPULARITY_RATIO[experts])


def test_tokens_follow_their_path_as_often_as_fig9_says():
    """Without batch drift, the share of tokens that take their group's most frequent next expert
    is the stickiness's target (Fig 9's 41.94%) at 16 experts, where the successor is the group's top."""
    routing = lina_routing(16, 4, drift=1e9)
    choices = routing.batch(200_000, 0)
    assert path_topk_share(profile_paths(choices, 16, 1), 1) == pytest.approx(NEXT_LAYER_TOP1_SHARE, abs=0.01)


def test_batches_are_seeded_and_drift_from_each_other():
    routing = lina_routing(8, 3, drift=400)
    a, b = routing.batch(50_000, 0), routing.batch(50_000, 1)
    assert np.array_equal(a, routing.batch(50_000, 0))
    shares = [np.bincount(x[0], minlength=8) / x.shape[1] for x in (a, b)]
    assert not np.allclose(shares[0], shares[1], atol=0.005)  # drift: batches differ beyond sampling noise


@pytest.mark.parametrize("experts", [2, 16, 300])
def test_categorical_draws_what_numpys_choice_draws(experts):
    """The table lookup is numpy's inverse-CDF draw, uniform for uniform: skewed shares, a share of
    zero, and uniforms exactly on a cumulative share (where a bin's category changes)."""
    shares = np.random.default_rng(experts).dirichlet(np.full(experts, 0.3))
    shares[1] = 0.0
    shares /= shares.sum()
    ours = categorical(np.random.default_rng(7), shares, 100_000)
    assert np.array_equal(ours, np.random.default_rng(7).choice(experts, size=100_000, p=shares))
    cdf = np.cumsum(shares)
    cdf /= cdf[-1]  # as numpy normalises it
    inside = cdf[cdf < 1]  # a uniform is below 1
    on_edges = np.concatenate([inside, np.nextafter(inside, 0)])

    class Fixed:  # a generator whose uniforms are the cumulative shares themselves
        def random(self, size):
            return on_edges[:size]

    assert np.array_equal(categorical(Fixed(), shares, on_edges.size), cdf.searchsorted(on_edges, side="right"))


@pytest.mark.parametrize(
    "kwargs", [dict(num_experts=1), dict(stickiness=1.0), dict(drift=0.0), dict(zipf=-1.0), dict(num_layers=0)]
)
def test_bad_routing_parameters_are_rejected(kwargs):
    base = dict(num_experts=4, num_layers=2, zipf=1.0, stickiness=0.5, drift=100.0)
    with pytest.raises(ValueError):
        SyntheticRouting(**{**base, **kwargs})


@pytest.fixture(scope="module")
def model():
    cfg = load_config(["configs/default.yaml"], SMALL)
    run = sim.inference_config(cfg, 4)
    return ForwardModel(run, build_topology(run.hardware))


def _uniform(devices: int, experts: int, rows: int) -> np.ndarray:
    routed = np.zeros((devices, devices, experts), dtype=np.int64)
    for e in range(experts):
        routed[:, e % devices, e] = rows
    return routed


def test_forward_pass_is_a_chain_and_its_metrics_add_up(model):
    layers = model.cfg.model.n_layers
    result = model.run([_uniform(4, 4, 512)] * layers)
    durations = result.timeline.end_s - result.timeline.start_s
    metrics = result.metrics()
    assert metrics["forward_ms"] == pytest.approx(durations.sum() * 1e3)  # one stream: nothing overlaps
    assert metrics["moe_layer_ms"] == pytest.approx(
        sum(metrics[f"{p}_ms"] for p in ("gate", "dispatch_a2a", "expert", "combine_a2a"))
    )
    a2a = [metrics[f"a2a_layer{i}_ms"] for i in range(layers)]
    assert sum(a2a) == pytest.approx(metrics["dispatch_a2a_ms"] + metrics["combine_a2a_ms"]) == metrics["a2a_ms"]
    assert metrics["a2a_share"] == pytest.approx(metrics["a2a_ms"] / metrics["forward_ms"])
    assert 0 < metrics["a2a_share"] < 1


def test_a_hot_device_slows_the_pass_and_local_traffic_costs_no_bandwidth(model):
    layers = model.cfg.model.n_layers
    balanced = model.run([_uniform(4, 4, 512)] * layers).metrics()
    hot = np.zeros((4, 4, 4), dtype=np.int64)
    hot[:, 0, 0] = 4 * 512  # every source sends all its rows to device 0's expert
    skewed = model.run([hot] * layers).metrics()
    assert skewed["expert_ms"] > 2 * balanced["expert_ms"] and skewed["dispatch_a2a_ms"] > balanced["dispatch_a2a_ms"]
    local = np.zeros((4, 4, 4), dtype=np.int64)
    for d in range(4):
        local[d, d, d] = 2048  # every device keeps its tokens: the exchange pays its latency only
    nothing = np.zeros((4, 4, 4), dtype=np.int64)
    # the idle device waits the hot expert's compute, less its own, in every layer
    hot_run = model.run([hot] * layers)
    experts = np.array([model.experts_seconds(hot[:, d, :].sum(axis=0)) for d in range(4)])
    idle = layers * (experts.max() - experts.min()) / hot_run.timeline.makespan_s
    assert hot_run.metrics()["least_busy_idle_share"] == pytest.approx(idle)
    assert balanced["least_busy_idle_share"] == pytest.approx(0, abs=1e-12)
    kept = model.run([local] * layers).metrics()["dispatch_a2a_ms"]
    assert kept == pytest.approx(model.run([nothing] * layers).metrics()["dispatch_a2a_ms"])
    assert kept < balanced["dispatch_a2a_ms"]


def test_the_forward_pass_needs_top1_dropless_routing_and_one_exchange_per_moe_layer(model):
    top2 = load_config(data=to_container(model.cfg), overrides=["moe.top_k=2"])
    with pytest.raises(ValueError, match="top-1"):
        ForwardModel(top2, model.topo)
    with pytest.raises(ValueError, match="MoE layers"):
        model.run([_uniform(4, 4, 8)])


def test_placements_deal_every_token_and_balance_where_static_cannot():
    routing = lina_routing(4, 4, drift=400)
    tokens = 4 * 4096
    choices = routing.batch(tokens, 5)
    profile = profile_paths(np.concatenate([routing.batch(tokens, b) for b in range(3)], axis=1), 4, 3)
    imbalance = {}
    batch = GatedBatch(choices, 4, profile)
    for policy in ("static", "lina", "ideal"):
        routed, imbalance[policy] = placed_batch(Scheduler(policy, profile, 4, 1, 1), batch)
        for layer, rows in zip(choices, routed):
            counts = balanced_counts(4096, 4, 4) if policy == "ideal" else source_counts(layer, 4, 4)
            assert np.array_equal(rows.sum(axis=1), counts)  # each source's rows per expert, all dealt
    assert imbalance["ideal"] == pytest.approx(1.0) and imbalance["lina"] < imbalance["static"]
    assert static_placement(4, 4).replicas == tuple((e,) for e in range(4))


def test_a_batchs_shared_estimate_is_each_schedulers_own():
    """GatedBatch computes once per batch what every estimating scheduler would from its own paths."""
    routing = lina_routing(4, 5, drift=400)
    choices = routing.batch(4 * 1024, 3)
    profile = profile_paths(np.concatenate([routing.batch(4 * 1024, b) for b in range(2)], axis=1), 4, 3)
    batch = GatedBatch(choices, 4, profile)
    scheduler = Scheduler("lina", profile, 4, 1, 1)
    scheduler.begin_batch()
    for layer, ids in enumerate(choices):
        assert np.array_equal(batch.estimate(layer, 1), scheduler.local_estimate(layer, choices.shape[1]))
        assert np.array_equal(batch.counts[layer], source_counts(ids, 4, 4))
        scheduler.decide(layer, ids, batch.estimate(layer, 1), batch.counts[layer].sum(axis=0))


def test_models_that_share_the_batches_price_them_as_if_alone():
    """simulate_policies prices one set of decisions on several models; ideal's repeated pass is priced once."""
    cfg = load_config(["configs/default.yaml"], SMALL)
    runs = [sim.inference_config(cfg, 4, variant) for variant in ([], ["hardware.intra_node_GBps=240"])]
    models = [ForwardModel(run, build_topology(run.hardware)) for run in runs]
    routing = lina_routing(4, models[0].cfg.model.n_layers, drift=400)
    profile = profile_paths(routing.batch(4 * 4096, 0), 4, 3)
    policies = ["ideal", "static", "lina"]
    together, _ = simulate_policies(models, routing, profile, policies, 2, 1, 1)
    alone = [simulate_policies([model], routing, profile, policies, 2, 1, 1)[0][0] for model in models]
    assert together == alone and together[0] != together[1]
    assert together[0]["ideal"]["forward_ms"][0] == together[0]["ideal"]["forward_ms"][1]


def test_records_feed_the_measured_inference_reproducers(tmp_path):
    cfg = load_config(["configs/default.yaml"], SMALL)
    paths = []
    for record in sim.make_records(cfg):
        path = record_path(tmp_path, record["paper"], record["experiment"], record["point"])
        write_record(record, path)
        paths.append(path)
    assert sorted(p.stem for p in paths) == sorted(sim.record_points(cfg))
    records, samples = collect(paths)
    chosen = records[records["unstated"].isna()]
    value, setting = REPRODUCERS["lina_fig16_median_reduction_4e"](chosen, samples[samples["unstated"].isna()])
    assert math.isfinite(value) and value > 1 and "lina-a100-4x4" in setting  # static slower than lina
    # a sensitivity run per other end of each unstated parameter's range and per joint corner, every
    # policy in each
    variants = records.dropna(subset=["unstated"]).drop_duplicates("point")
    runs = variants.groupby("unstated")["policy"].nunique().to_dict()
    assert runs == {setting_text(s): 5 for s in sensitivity_settings(INFERENCE_UNSTATED)}
    assert len(runs) == 6 + 8  # link, batch (Table 1's "same batch") and drift at each end, and 2^3 corners
    assert "hardware.intra_node_GBps=12.4,train.batch_size=64,lina.inference_drift=100" in runs
    assert set(variants["routing_drift"]) == {400.0, 100.0, 1600.0}
