"""Aurora's inference on the simulator (moe_core/papers/aurora/deployment.py, inference_sim.py): the
deployments each policy decides, the paper's closed form where it is exact, and Table 2's timeline."""

import numpy as np
import pytest

from moe_core.comm.transmission import lower_bound
from moe_core.config.load import ConfigError, load_config
from moe_core.papers.aurora import deployment
from moe_core.papers.aurora.inference_sim import ServedModel, big_switch, routed, scaled
from moe_core.sim.forward import Compute, simulate_served

N = 4
SMALL = ["aurora.num_experts=4", "aurora.tokens_per_gpu=1024"]


def _served(profile: str) -> ServedModel:
    cfg = load_config(["configs/default.yaml", "configs/ci.yaml"], SMALL)
    hw = load_config(["configs/default.yaml"], [f"hardware_profile={profile}"]).hardware
    return ServedModel(cfg, big_switch(hw, N))


@pytest.fixture(scope="module")
def homogeneous():
    return _served("aurora-bigswitch-100g")


@pytest.fixture(scope="module")
def heterogeneous():
    return _served("aurora-bigswitch-hetero")


def _skewed(seed: int, layers: int = 2) -> np.ndarray:
    """(layers, N, N) token counts with popular experts that differ per layer."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(1, 50, (N, N)) * (1 + 9 * (np.arange(N) == rng.integers(N))) for _ in range(layers)])


def test_the_big_switch_keeps_the_profiles_rates_in_equal_proportion(heterogeneous):
    cluster = heterogeneous.cluster
    assert cluster.bandwidth.tolist() == [12.5e9, 10e9, 6.25e9, 5e9]  # 100/80/50/40 Gb/s, one GPU each
    assert cluster.speed.tolist() == pytest.approx([1.0, 0.8, 0.5, 0.4])
    hw = load_config(["configs/default.yaml"], ["hardware_profile=aurora-bigswitch-hetero"]).hardware
    with pytest.raises(ConfigError, match="aurora.num_experts"):
        big_switch(hw, 6)


def test_exclusive_aurora_on_a_homogeneous_switch_is_the_papers_closed_form(homogeneous):
    """Eq. 3 with Aurora's order: per layer the slowest gate and copy, T* of the dispatch, the slowest
    experts, T* of the combine and the copy back; the simulator's ordered exchanges meet T* exactly."""
    tokens = _skewed(0)
    stats = [homogeneous.stats(t) for t in tokens]
    plan = deployment.exclusive(stats, homogeneous.cluster.speed, "aurora", seed=0)
    model, bandwidth = homogeneous.forward(tuple(range(N))), homogeneous.cluster.bandwidth
    expected = 0.0
    for t, layer, gpu_of in zip(tokens, stats, plan.groups[0][0].gpu_of):
        stages = model.moe_layer("L", routed(scaled(t, 1024), gpu_of, N))
        compute = sum(s.seconds.max() for s in stages if isinstance(s, Compute))
        expected += compute + lower_bound(layer.traffic, bandwidth) + lower_bound(layer.traffic.T, bandwidth)
    result = homogeneous.simulate([tokens], plan, seed=0)
    assert result["inference_ms"] == pytest.approx(1e3 * expected, rel=1e-9)
    assert 0 < result["gpu_utilisation"] < 1 and 0 < result["a2a_ms"] < result["inference_ms"]
    for baseline in deployment.ORDER_BASELINES:  # the same compute, slower exchanges
        slower = homogeneous.simulate([tokens], deployment.exclusive(stats, homogeneous.cluster.speed, baseline, 0), 0)
        assert slower["inference_ms"] >= result["inference_ms"] * (1 - 1e-9)


def test_each_policy_deploys_one_expert_of_each_model_per_gpu_or_packs_lina_on_halves(heterogeneous):
    stats = [[heterogeneous.stats(t) for t in _skewed(seed)] for seed in (1, 2)]
    cluster = heterogeneous.cluster
    for policy in ("aurora", "rec", "rga+rec"):
        (group,) = deployment.colocated(stats, cluster.bandwidth, cluster.speed, policy, seed=3).groups
        assert [h.model for h in group] == [0, 1]
        assert all(sorted(g.tolist()) == list(range(N)) for h in group for g in h.gpu_of)
    lina = deployment.colocated(stats, cluster.bandwidth, cluster.speed, "lina", seed=3)
    assert [h.devices for (h,) in lina.groups] == [(0, 1), (2, 3)]
    for (h,) in lina.groups:  # two experts of one model per GPU, the same packing in every layer
        assert all(np.bincount(g, minlength=2).tolist() == [2, 2] for g in h.gpu_of)
    alone = deployment.colocated(stats, cluster.bandwidth, cluster.speed, "aurora-exclusive", seed=3)
    assert [h.devices for (h,) in alone.groups] == [tuple(range(N))] * 2  # GPUs of their own, of the same kind


def test_colocated_models_follow_table_2s_timeline(homogeneous):
    """One compute stream: G^a, G^b, F^a, F^b, A^a, A^b; a's tokens travel while b computes its gate."""
    tokens = _skewed(4, layers=1)
    model = homogeneous.forward(tuple(range(N)))
    order = homogeneous.order("exact", tuple(range(N)), seed=0)
    rows = [routed(scaled(t, 1024), np.arange(N), N) for t in tokens]
    sim = simulate_served([(model, rows, order), (model, rows, order)])
    span = {name: (a, b) for name, a, b in zip((op.name for op in sim.ops), sim.timeline.start_s, sim.timeline.end_s)}
    stream = [
        "m0.gate",
        "m0.copy_before",
        "m1.gate",
        "m1.copy_before",
        "m0.expert",
        "m1.expert",
        "m0.copy_after",
        "m1.copy_after",
    ]
    starts = [span[f"L0.{name}.fwd"][0] for name in stream]
    assert starts == sorted(starts)
    assert all(span[f"L0.{a}.fwd"][1] <= span[f"L0.{b}.fwd"][0] + 1e-15 for a, b in zip(stream, stream[1:]))
    dispatch_a = span["L0.m0.dispatch.fwd[start]"][0]
    assert (
        dispatch_a == pytest.approx(span["L0.m0.copy_before.fwd"][1]) and dispatch_a < span["L0.m1.copy_before.fwd"][1]
    )
    assert sim.busy_s.sum() > 0 and 0 < sim.metrics()["gpu_utilisation"] < 1


def test_aurora_colocation_beats_random_pairing_on_a_heterogeneous_switch(heterogeneous):
    tokens = [_skewed(5), _skewed(6)]
    stats = [[heterogeneous.stats(t) for t in model] for model in tokens]
    cluster = heterogeneous.cluster
    times = {
        policy: heterogeneous.simulate(
            tokens, deployment.colocated(stats, cluster.bandwidth, cluster.speed, policy, 7), 7
        )
        for policy in ("aurora", "rga+rec")
    }
    assert times["aurora"]["inference_ms"] < times["rga+rec"]["inference_ms"]
