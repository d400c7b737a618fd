"""Calibration recovers a known profile; the calibration/validation split holds points out."""

import pandas as pd
import pytest
from omegaconf import OmegaConf

from moe_core.config.load import HardwareConfig, load_config, to_container
from moe_core.sim.calibrate import (
    COLLECTIVES,
    alone_times,
    calibration_split,
    fit_compute,
    fit_in_step_wait,
    fit_network,
)
from moe_core.sim.collectives import simulate_collective
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology


def truth():
    return OmegaConf.merge(
        OmegaConf.structured(HardwareConfig),
        dict(
            name="truth",
            nodes=2,
            devices_per_node=2,
            intra_node_GBps=3.0,
            nic_GBps=0.125,
            collectives={
                "all_reduce": {"alpha_step_us": 200.0, "efficiency": 1.0},  # the reference
                "all_gather": {"alpha_step_us": 250.0, "efficiency": 0.6},
                "reduce_scatter": {"alpha_step_us": 400.0, "efficiency": 0.35},  # gloo's: slower than all-reduce
                "all_to_all": {"alpha_step_us": 150.0, "efficiency": 0.8},
                "all_to_all_v": {"alpha_step_us": 300.0, "efficiency": 0.9},
            },
        ),
    )


@pytest.mark.parametrize("emulation", [{"enabled": False}, {"enabled": True, "burst_kb": 256}])
def test_fit_recovers_the_profile_that_produced_the_measurements(emulation):
    """Also with tbf token buckets on the NIC links, which let the 64 KiB to 1 MiB points through
    faster than the rate."""
    hw = OmegaConf.merge(truth(), {"emulation": emulation})
    topo = build_topology(hw)
    rows = []
    for collective in COLLECTIVES:
        for size in (4096, 65536, 2**20, 2**24):
            params = dict(collective=collective, world_size=4, size_bytes=size, traffic_zipf=1.2)
            rows.append({**params, "measured": simulate_collective(hw, topo, {**params, "seed": 0})})
    start = OmegaConf.merge(hw, {"intra_node_GBps": 0.0, "nic_GBps": 0.0, "collectives": {}})
    fitted, stats = fit_network(start, pd.DataFrame(rows))
    assert stats["median_abs_rel_error"] < 1e-3
    assert fitted.nic_GBps == pytest.approx(0.125, rel=0.02)
    assert fitted.collectives.all_to_all.efficiency == pytest.approx(0.8, rel=0.02)
    assert fitted.collectives.all_reduce.alpha_step_us == pytest.approx(200.0, rel=0.05)
    assert fitted.collectives.all_gather.efficiency == pytest.approx(0.6, rel=0.02)
    assert fitted.collectives.reduce_scatter.efficiency == pytest.approx(0.35, rel=0.02)
    assert fitted.collectives.reduce_scatter.alpha_step_us == pytest.approx(400.0, rel=0.05)


def test_split_holds_out_pairs_and_other_layouts():
    def rec(experiment, **params):
        return {"mode": "measured", "experiment": experiment, "params": params}

    records = [
        rec("collectives", collective="all_to_all", concurrent=None),
        rec("collectives", collective="all_to_all", concurrent="all_reduce"),
        rec("train_step", world_size=2, num_experts=2),
        rec("train_step", world_size=4, num_experts=4),
        rec("train_step", world_size=2, num_experts=4),
        {"mode": "simulated", "experiment": "sim_train_step", "params": {"world_size": 2}},
        # smaller, but tensor-parallel or on a grid: its dense ops hold collectives, so it validates
        rec("train_step", world_size=2, num_experts=1, tensor_parallel=2),
        rec("train_step", world_size=2, num_experts=1, tensor_parallel=1, grid_row=2),
    ]
    calibrate, validate = calibration_split(records)
    assert calibrate == [records[0], records[2], records[4]]  # every expert count of the smallest world size
    assert validate == [records[1], records[3], records[6], records[7]]
    # one world size measured (an emulated 2 x 2 testbed): its fewest experts calibrate, the rest validate
    one_size = [rec("train_step", world_size=4, num_experts=e, policy=p) for e in (8, 4, 16) for p in ("a", "b")]
    calibrate, validate = calibration_split(one_size)
    assert calibrate == one_size[2:4]
    assert validate == one_size[:2] + one_size[4:]


def test_alone_times_take_the_alone_iterations_of_pairs_never_their_paired_times():
    def rec(concurrent, time_ms, alone_ms=None, hardware="emu"):
        metrics = {"time_ms": {"mean": time_ms}, **({"alone_ms": {"mean": alone_ms}} if alone_ms else {})}
        return {
            "mode": "measured",
            "experiment": "collectives",
            "hardware": hardware,
            "metrics": metrics,
            "params": {"collective": "all_to_all", "size_bytes": 1024, "concurrent": concurrent},
        }

    records = [rec(None, 1.0), rec("all_reduce", 4.0, alone_ms=2.0), rec(None, 9.0, hardware="other")]
    table = alone_times(records, "emu")
    assert table["measured"].tolist() == [1.0, 2.0] and table["concurrent"].isna().all()


def test_compute_and_in_step_wait_fits_recover_the_profile_that_produced_the_steps():
    """The truth: a compute model (an op sweep's fields) with per-class multipliers. Calibrating a
    profile with the same model recovers the multipliers; one with another peak and no memory or
    launch terms gets multipliers under which it reproduces every measured class time."""
    model = {"peak_tflops": 2.0, "compute_efficiency": 0.9, "memory_GBps": 10.0, "kernel_launch_us": 20.0}
    hw = OmegaConf.merge(truth(), {**model, "phase_efficiency": {"dense": 0.5, "gate": 0.01, "expert": 0.8}})
    hw.collectives.all_to_all.in_step_us = 3000.0
    train = []
    for experts, per_rank in ((4, 1), (8, 2)):
        cfg = OmegaConf.merge(
            load_config(
                overrides=["parallel.world_size=4", f"moe.num_experts={experts}", f"moe.experts_per_rank={per_rank}"]
            ),
            {"hardware": hw},
        )
        train.append((to_container(cfg), StepModel(cfg, build_topology(hw)).run().metrics()))
    start = OmegaConf.merge(hw, {"phase_efficiency": {"dense": 0.3}})
    start.collectives.all_to_all.in_step_us = 0.0
    OmegaConf.set_readonly(start, True)  # as load_config returns it
    fitted, stats = fit_compute(start, train)
    assert fitted.peak_tflops == 2.0 and stats["points"] == 2
    assert dict(fitted.phase_efficiency) == pytest.approx({"dense": 0.5, "gate": 0.01, "expert": 0.8}, rel=1e-6)
    fitted, stats = fit_in_step_wait(fitted, train)
    assert fitted.collectives.all_to_all.in_step_us == pytest.approx(3000.0, rel=1e-6) and stats["points"] == 2
    # another model: one experts' step pins each multiplier, and the fitted profile reproduces it
    flops_only = OmegaConf.merge(start, {"peak_tflops": 0.5, "memory_GBps": 0.0, "kernel_launch_us": 0.0})
    refitted, _ = fit_compute(flops_only, train[:1])
    cfg = OmegaConf.merge(load_config(data=train[0][0]), {"hardware": refitted})
    ops, _ = StepModel(cfg, build_topology(refitted)).build()
    for phase in ("gate", "expert"):
        modelled = sum(op.duration_s for op in ops if op.phase == phase) * 1e3
        assert modelled == pytest.approx(train[0][1][f"{phase}_ms"], rel=1e-6)


def _compute_ms(hw, phase: str, **overrides) -> float:
    cfg = OmegaConf.merge(load_config(overrides=[f"{k}={v}" for k, v in overrides.items()]), {"hardware": hw})
    ops, _ = StepModel(cfg, build_topology(hw)).build()
    return sum(op.duration_s for op in ops if op.transfer is None and op.phase == phase) * 1e3


def test_the_dense_multiplier_prices_the_layers_not_the_copies_and_optimizer():
    """The op sweep prices the streaming ops between the layers; a dense multiplier (what the layers'
    GEMMs miss) slows the dense ops only, so the optimizer does not grow by it with a rank's experts."""
    model = {"peak_tflops": 2.0, "compute_efficiency": 0.9, "memory_GBps": 10.0, "kernel_launch_us": 20.0}
    full, slow = (
        OmegaConf.merge(truth(), {**model, "phase_efficiency": {"dense": d, "gate": 1.0, "expert": 1.0}})
        for d in (1.0, 0.25)
    )
    layout = {"parallel.world_size": 4, "moe.num_experts": 16, "moe.experts_per_rank": 4}
    assert _compute_ms(slow, "dense", **layout) == pytest.approx(4 * _compute_ms(full, "dense", **layout))
    for phase in ("optimizer", "copy"):
        assert _compute_ms(slow, phase, **layout) == _compute_ms(full, phase, **layout) > 0


def test_compute_fit_names_a_dense_time_the_streaming_ops_alone_exceed():
    hw = OmegaConf.merge(truth(), {"peak_tflops": 2.0, "memory_GBps": 0.001, "kernel_launch_us": 20.0})
    cfg = load_config(overrides=["parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=1"])
    metrics = {"dense_ms": 1.0, "gate_ms": 1.0, "expert_ms": 1.0}
    with pytest.raises(ValueError, match="dense_ms .* is not longer than the copies and optimizer"):
        fit_compute(hw, [(to_container(cfg), metrics)])
