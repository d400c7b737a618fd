"""experiments/aurora.py (Aurora's decisions on the simulator) on a tiny setting, and its bad-config path."""

import numpy as np
import pytest

from analysis.collect import read_valid_record
from experiments.__main__ import main as run_entry_point
from experiments.aurora_a2a import measured_points, scaled
from moe_core.comm.workloads import ELEMENT_BYTES
from moe_core.config.load import load_config
from moe_core.papers.aurora.config import AURORA_UNSTATED
from moe_core.papers.aurora.study import GAP_SETTINGS, SENSITIVITY_POLICIES, aurora_points

TINY = [
    "aurora.gating_zipf=[2.0]",
    "aurora.traffic_zipf=[1.0]",
    "aurora.num_experts=4",
    "aurora.moe_layers=2",
    "aurora.train_steps=2",
    "aurora.trace_batch_size=4",
    "aurora.random_draws=2",
    "aurora.imprecision=[0.0,0.5]",
    "aurora.tokens_per_gpu=512",
]
CONFIGS = ["--config", "configs/default.yaml", "--config", "configs/ci.yaml"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Every record of one tiny run, by (experiment, point)."""
    out = tmp_path_factory.mktemp("aurora")
    assert run_entry_point(["aurora", *CONFIGS, *TINY, f"results_dir={out}"]) == 0
    found = {(p.parent.name, p.stem): read_valid_record(p) for p in (out / "raw" / "aurora").glob("*/*.json")}
    cfg = load_config(CONFIGS[1::2], [*TINY, f"results_dir={out}"])
    expected = {(e, name) for e, names in aurora_points(cfg).items() for name in names}
    assert set(found) == expected  # exactly the points the workflow declares
    return found


def _of(records, experiment, **params):
    return [
        r
        for (e, _), r in records.items()
        if e == experiment and all(r["params"].get(k) == v for k, v in params.items())
    ]


def test_records_are_simulated_aurora_points_with_their_workload(records):
    for r in records.values():
        assert (r["paper"], r["mode"], r["backend"]) == ("aurora", "simulated", "sim")
        assert r["params"]["workload"] and r["params"]["policy"]
        assert r["hardware"] in ("aurora-bigswitch-100g", "aurora-bigswitch-hetero")
    workloads = {r["params"]["workload"] for r in _of(records, "aurora_order")}
    assert workloads == {"fig4-toy", "gating-z2", "zipf-1"}


def test_algorithm1_never_beats_the_lower_bound_and_exact_meets_it(records):
    for r in _of(records, "aurora_order", network="homogeneous"):
        m = {k: v["median"] for k, v in r["metrics"].items() if "median" in v}
        assert m["a2a_over_lower_bound"] >= 1 - 1e-9 and m["rounds_over_lower_bound"] >= 1 - 1e-9
        if r["params"]["policy"] == "exact":  # through the network engine too
            assert m["rounds_over_lower_bound"] == pytest.approx(1.0, abs=1e-9)
            assert m["a2a_over_lower_bound"] == pytest.approx(1.0, abs=1e-9)
    toy = {
        r["params"]["policy"]: r["metrics"]["rounds"]["value"]
        for r in _of(records, "aurora_order", workload="fig4-toy")
    }
    assert toy["naive"] == 3 and toy["aurora"] == 2  # Aurora's Fig. 4


def test_speedups_and_gaps_are_consistent_with_optimality(records):
    # On a homogeneous switch Aurora's order reaches T*, so no order baseline is faster.
    for r in _of(records, "aurora_deployment", setting="exclusive-homogeneous"):
        if r["params"]["policy"] != "aurora":
            assert min(r["samples"]["aurora_speedup"]) >= 1 - 1e-9
    rga = _of(records, "aurora_deployment", setting="exclusive-heterogeneous", policy="rga")[0]
    assert len(rga["samples"]["inference_ms"]) == 2  # one sample per random draw
    for r in _of(records, "aurora_gap"):
        gap = r["metrics"]["gap_to_optimum"]["median"]
        assert gap >= 1 - 1e-9  # brute force is the optimum
        if r["params"]["setting"] == "colocated-heterogeneous":  # the heuristic, also simulated
            assert r["metrics"]["simulated_gap"]["median"] > 0
        else:  # Theorem 5.1 and Case II are exact
            assert gap == pytest.approx(1.0, abs=1e-9)
    assert {r["params"]["setting"] for r in _of(records, "aurora_gap")} == set(GAP_SETTINGS)
    for r in _of(records, "aurora_deployment"):
        assert 0 < r["metrics"]["gpu_utilisation"]["median"] < 1
        assert 0 < r["metrics"]["a2a_ms"]["median"] < r["metrics"]["inference_ms"]["median"] * 2


def test_sensitivity_runs_repeat_figs_11_12_at_each_unstated_end(records):
    """One deployment record per other end of an unstated parameter and Fig 11's policies, marked."""
    varied = [r for r in records.values() if "unstated" in r["params"]]
    assert {r["experiment"] for r in varied} == {"aurora_deployment"}
    assert {r["params"]["policy"] for r in varied} <= set(SENSITIVITY_POLICIES)
    settings = {r["params"]["unstated"] for r in varied}
    assert settings == {
        "hardware.kernel_launch_us=38",
        "hardware.compute_efficiency=0.35",
        "hardware.kernel_launch_us=38,hardware.compute_efficiency=0.35",  # the joint corner
    }
    assert {p.key for p in AURORA_UNSTATED} == {"hardware.kernel_launch_us", "hardware.compute_efficiency"}
    launch = {r["config"]["hardware"]["kernel_launch_us"] for r in varied if "kernel_launch" in r["params"]["unstated"]}
    assert launch == {38.0}
    chosen = _of(records, "aurora_deployment", setting="exclusive-homogeneous", policy="aurora")
    assert {r["config"]["hardware"]["kernel_launch_us"] for r in chosen if "unstated" not in r["params"]} == {5.0}


@pytest.mark.parametrize(
    "override,key",
    [
        ("aurora.imprecision=[1.5]", "aurora.imprecision"),
        ("aurora.gap_gpus=9", "aurora.gap_gpus"),
        ("aurora.heterogeneous_hardware=nowhere", "aurora.heterogeneous_hardware"),
        ("aurora.layers=4", "aurora.layers"),
    ],
)
def test_bad_config_exits_2_naming_the_key_and_writes_nothing(tmp_path, capsys, override, key):
    assert run_entry_point(["aurora", *CONFIGS, override, f"results_dir={tmp_path}"]) == 2
    assert key in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_measured_traces_are_scaled_to_the_bytes_per_rank():
    tokens = np.array([[[10, 20, 10], [0, 40, 0], [5, 5, 30]]])  # (1 layer, 3, 3), 40 tokens per shard
    elements = scaled(tokens, 3 * 2**20)
    assert elements.dtype == np.int64
    assert np.allclose(elements.sum(axis=2) * ELEMENT_BYTES, 3 * 2**20, rtol=1e-5)
    cfg = load_config(CONFIGS[1::2])
    assert len(measured_points(cfg)) == len(cfg.aurora.gating_zipf) * 5
