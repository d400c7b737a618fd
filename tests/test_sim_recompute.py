"""Activation recomputation in the simulated step: what it adds, exactly, and where it is refused."""

import numpy as np
import pytest

from moe_core.config.load import ConfigError, load_config, validate_measured
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

BASE = [
    "hardware_profile=h100-ndr-cluster",
    "parallel.world_size=8",
    "moe.num_experts=8",
    "model.n_layers=4",
    "train.dtype=bfloat16",
    "hardware.kernel_launch_us=0",  # the sums below are the device's work; host-issued launches: test_sim_step
]


def _step(recompute: str, *extra: str):
    overrides = [*BASE, f"train.recompute={recompute}", *extra]
    cfg = load_config(["configs/default.yaml"], overrides=overrides, whole_run=False)
    model = StepModel(cfg, build_topology(cfg.hardware))
    return model, model.run()


def _compute_s(sim, keep) -> float:
    durations = sim.timeline.end_s - sim.timeline.start_s
    return float(sum(d for op, d in zip(sim.ops, durations) if op.is_compute and keep(op.name)))


@pytest.mark.parametrize("extra", [(), ("parallel.tensor_parallel=2", "moe.experts_per_rank=2")])
def test_full_recompute_adds_every_block_forward_once(extra):
    _, plain = _step("none", *extra)
    _, full = _step("full", *extra)
    block_forward = _compute_s(plain, lambda name: name.startswith("L") and name.endswith(".fwd"))
    added = _compute_s(full, lambda name: True) - _compute_s(plain, lambda name: True)
    assert added == pytest.approx(block_forward, rel=1e-9)
    assert _compute_s(full, lambda name: name.startswith("recompute/")) == pytest.approx(block_forward, rel=1e-9)
    # the MoE layers' exchanges are re-run too: twice the forward all-to-alls
    names = [op.name for op in full.ops if op.phase.endswith("a2a")]
    assert sum(n.startswith("recompute/") for n in names) == len(names) // 3
    assert full.metrics()["step_ms"] > plain.metrics()["step_ms"] + 1e3 * block_forward * 0.9


def test_selective_recompute_adds_the_attention_cores_only():
    model, plain = _step("none")
    _, selective = _step("selective")
    n_layers = model.cfg.model.n_layers
    added = _compute_s(selective, lambda name: True) - _compute_s(plain, lambda name: True)
    assert added == pytest.approx(n_layers * model.kernels.attention_core_seconds("fwd", 1), rel=1e-9)
    assert [op.name for op in selective.ops if op.name.startswith("recompute/")] == [
        f"recompute/L{i}.attn_core.fwd" for i in reversed(range(n_layers))
    ]


def test_recompute_keeps_the_metrics_additive():
    _, full = _step("full")
    m = full.metrics()
    assert m["dense_ms"] + m["moe_layer_ms"] + m["allreduce_exposed_ms"] == pytest.approx(m["step_ms"])
    assert np.isfinite(list(m.values())).all()


def test_recompute_is_refused_where_it_is_not_modelled():
    cfg = load_config(["configs/default.yaml"], overrides=[*BASE, "train.recompute=full"], whole_run=False)
    with pytest.raises(ConfigError, match="train.recompute"):
        validate_measured(cfg)
    with pytest.raises(ConfigError, match="train.recompute"):
        load_config(["configs/default.yaml"], overrides=[*BASE, "train.recompute=sometimes"], whole_run=False)
    with pytest.raises(ConfigError, match="train.recompute"):
        load_config(
            ["configs/default.yaml"],
            overrides=[*BASE, "train.recompute=full", "parallel.grid.depth=2", "comm.policy=sequential"],
            whole_run=False,
        )


def test_partial_recompute_repeats_the_first_blocks_only():
    _, plain = _step("none")
    _, first_two = _step("full", "train.recompute_layers=2")
    block_forward = _compute_s(plain, lambda name: name.split(".")[0] in ("L0", "L1") and name.endswith(".fwd"))
    added = _compute_s(first_two, lambda name: True) - _compute_s(plain, lambda name: True)
    assert added == pytest.approx(block_forward, rel=1e-9)
    assert {op.name.split(".")[0] for op in first_two.ops if op.name.startswith("recompute/")} == {
        "recompute/L0",
        "recompute/L1",
    }
    _, every = _step("full", "train.recompute_layers=4")
    assert every.metrics()["step_ms"] == pytest.approx(_step("full")[1].metrics()["step_ms"], rel=1e-12)


@pytest.mark.parametrize(
    "extra", [("train.recompute=selective", "train.recompute_layers=2"), ("train.recompute_layers=5",)]
)
def test_partial_recompute_counts_blocks_of_full_recompute(extra):
    overrides = [*BASE, "train.recompute=full", *extra]
    with pytest.raises(ConfigError, match="train.recompute_layers"):
        load_config(["configs/default.yaml"], overrides=overrides, whole_run=False)
