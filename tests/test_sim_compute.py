"""The compute model (moe_core.sim.compute), its fit (experiments/op_sweep.py) and its use in the step."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from experiments.__main__ import main as run_entry_point
from experiments.entry_points import OP_SWEEP_SIZES
from experiments.op_sweep import SWEEPS, fit, gemm_shapes, model_of, predicted_ms, profile_fields
from moe_core.config.load import ConfigError, load_config
from moe_core.model.gating import gshard_gating
from moe_core.sim.compute import ADAM_FOREACH_OPS, ADAM_PASSES, ComputeModel, multi_tensor_launches
from moe_core.sim.kernels import gate_routing
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

H200_RECORD = Path(__file__).parents[1] / "results/reference/2026-11-30-h200/train_step_h200_sequential.json"
H200_STEPS = Path(__file__).parents[1] / "results/reference/2026-12-04-h200/train_step_h200_sequential.json"


def h200(**changes) -> ComputeModel:
    """The h200-single profile's compute model in bf16."""
    hw = load_config(overrides=["hardware_profile=h200-single"]).hardware
    return ComputeModel.from_profile(SimpleNamespace(**{**hw, **changes}), hw.peak_tflops, element_bytes=2)


def test_roofline_limits():
    model = h200()
    # a huge square GEMM is compute-bound at the curve's maximum
    assert model.gemm_efficiency(65536, 65536, 65536) == pytest.approx(model.max_efficiency, rel=0.01)
    # a tiny one costs its launch
    assert model.gemm(8, 8, 8) == pytest.approx(model.launch_s, rel=0.01)
    # a skinny one (the gate: tokens x d_model -> 8 experts) is bound by its bytes, far below peak
    m, n, k = 65536, 8, 4096
    assert model.gemm(m, n, k) - model.launch_s >= (m * k + k * n + m * n) * 2 / model.memory_Bps
    assert model.gemm_efficiency(m, n, k) < 0.05
    # memory-bound ops: launches plus bytes over the achieved bandwidth, linear in both
    assert model.memory_bound(0, kernels=3) == pytest.approx(3 * model.launch_s)
    one, two = (model.memory_bound(b * 1e9) - model.launch_s for b in (1, 2))
    assert two == pytest.approx(2 * one) and one == pytest.approx(1e9 / (4800e9 * 0.9))


def test_costs_grow_with_size_and_efficiency_with_intensity():
    model = h200()
    sizes = [2**p for p in range(4, 15)]
    square = [model.gemm_efficiency(n, n, n) for n in sizes]
    assert all(a <= b for a, b in zip(square, square[1:])) and square[-1] <= model.max_efficiency
    for shape in ((1024, 1024, 1024), (4096, 8, 1024)):
        for axis in range(3):
            bigger = list(shape)
            bigger[axis] *= 2
            assert model.gemm(*bigger) > model.gemm(*shape)
    assert model.copy(2e6) > model.copy(1e6) and model.optimizer([2e5] * 10, "foreach") > model.optimizer(
        [1e5] * 10, "foreach"
    )


def test_a_profile_without_the_new_fields_keeps_the_constant_efficiency_model():
    """Fallback: no memory bandwidth, no launch cost -> FLOPs / (peak x compute_efficiency), other ops free."""
    hw = load_config(overrides=["hardware_profile=h200-single"]).hardware
    old = SimpleNamespace(**{**hw, "memory_GBps": 0.0, "kernel_launch_us": 0.0, "compute_efficiency": 0.5})
    model = ComputeModel.from_profile(old, 989.0, element_bytes=2)
    assert model.gemm(4096, 8, 1024, count=3) == pytest.approx(3 * 2 * 4096 * 8 * 1024 / (989e12 * 0.5))
    assert model.memory_bound(1e9, kernels=10) == 0.0 and model.optimizer([1e7] * 100, "for-loop") == 0.0


def test_the_fit_recovers_the_parameters_that_made_the_measurements():
    truth = np.array([7.0, np.log10(0.15), 0.4, np.log10(12.0)])  # launch us, log TFLOP/s, h, log GB/s
    gemm = [{"m": m, "n": n, "k": k} for m, n, k in gemm_shapes(SWEEPS["default"])]
    memory = [{"bytes": b} for b in (1e3, 1e5, 1e7, 1e8)]
    sweep = {"element_bytes": 4, "gemm": gemm, "memory_bound": memory}
    times = predicted_ms(model_of(truth, 4), sweep)
    for row, ms in zip(gemm + memory, times):
        row["ms"] = ms
    for g in gemm:
        g["tflops"] = 2 * g["m"] * g["n"] * g["k"] / (g["ms"] * 1e-3) / 1e12
    for o in memory:
        o["GBps"] = o["bytes"] / (o["ms"] * 1e-3) / 1e9
    sweep["launch_us"] = times[-1] * 1e3
    fitted = fit(sweep)
    assert fitted["launch_us"] == pytest.approx(7.0, rel=1e-3)
    assert fitted["gemm_tflops"] == pytest.approx(0.15, rel=1e-3)
    assert fitted["gemm_exposed_memory"] == pytest.approx(0.4, rel=1e-2)
    assert fitted["memory_GBps"] == pytest.approx(12.0, rel=1e-3)
    assert fitted["max_abs_rel_error"] < 1e-3


def test_profile_fields_are_fractions_of_the_spec_sheet():
    fitted = {"launch_us": 5.0, "gemm_tflops": 800.0, "gemm_exposed_memory": 0.5, "memory_GBps": 4000.0}
    fields = profile_fields(fitted, peak_tflops=1000.0, memory_GBps=5000.0)
    assert fields["compute_efficiency"] == pytest.approx(0.8) and fields["memory_efficiency"] == pytest.approx(0.8)
    assert profile_fields(fitted, None, None)["peak_tflops"] == 800.0  # no spec sheet: the fitted rate, efficiency 1
    with pytest.raises(ValueError, match="exceeds the spec"):
        profile_fields(fitted, peak_tflops=500.0, memory_GBps=None)


@pytest.mark.parametrize(
    "override, key",
    [
        ("hardware.memory_GBps=-1", "hardware.memory_GBps"),
        ("hardware.kernel_launch_us=nan", "hardware.kernel_launch_us"),
        ("hardware.memory_efficiency=0", "hardware.memory_efficiency"),
        ("hardware.memory_efficiency=1.5", "hardware.memory_efficiency"),
        ("hardware.compute_efficiency=0", "hardware.compute_efficiency"),
        ("hardware.gemm_exposed_memory=2", "hardware.gemm_exposed_memory"),
        ("hardware.phase_efficiency={gate: -1}", "hardware.phase_efficiency.gate"),
    ],
)
def test_bad_profile_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=["hardware_profile=h200-single", override])


def test_the_h200_records_gate_costs_more_than_its_experts_in_the_simulator():
    """The H200 record measured the gate above the expert GEMMs; the constant-efficiency model could
    not say so, the compute model does (its launch cost is the record's, its GEMM curve predicts)."""
    record = json.loads(H200_RECORD.read_text())
    measured = {k: record["metrics"][f"{k}_ms"]["median"] for k in ("gate", "expert")}
    assert measured["gate"] > measured["expert"]
    config = {k: record["config"][k] for k in ("model", "moe", "parallel", "comm", "train")}

    def simulated(*overrides: str) -> dict:
        cfg = load_config(data=config, overrides=["hardware_profile=h200-single", *overrides])
        return StepModel(cfg, build_topology(cfg.hardware)).run().metrics()

    new = simulated()
    assert new["gate_ms"] > new["expert_ms"]
    assert new["expert_ms"] == pytest.approx(measured["expert"], rel=0.2)  # predicted, not fitted
    constant = simulated("hardware.memory_GBps=0", "hardware.kernel_launch_us=0", "hardware.compute_efficiency=0.5")
    assert constant["gate_ms"] < 0.01 * constant["expert_ms"]


def test_the_optimizer_steps_after_the_gradient_all_reduces_and_lengthens_the_step():
    overrides = [
        "hardware_profile=lina-a100-4x4",
        "parallel.world_size=2",
        "moe.num_experts=4",
        "moe.experts_per_rank=4",
    ]
    cfg = load_config(overrides=overrides)
    sim = StepModel(cfg, build_topology(cfg.hardware)).run()
    (opt,) = [i for i, op in enumerate(sim.ops) if op.phase == "optimizer"]
    reduces = [i for i, op in enumerate(sim.ops) if op.phase == "allreduce"]
    assert reduces and sim.timeline.start_s[opt] >= sim.timeline.end_s[reduces].max()
    assert sim.timeline.makespan_s == pytest.approx(sim.timeline.end_s[opt])
    duration = sim.timeline.end_s[opt] - sim.timeline.start_s[opt]
    assert duration > 0
    free = load_config(overrides=[*overrides, "hardware.kernel_launch_us=0", "hardware.memory_GBps=0"])
    without = StepModel(free, build_topology(free.hardware)).run()
    assert without.metrics()["allreduce_exposed_ms"] == pytest.approx(sim.metrics()["allreduce_exposed_ms"])


def test_a_calibrated_multiplier_scales_its_class_alone():
    base = ["hardware_profile=lina-a100-4x4", "parallel.world_size=1", "moe.num_experts=4", "moe.experts_per_rank=4"]
    metrics = []
    for extra in ([], ["hardware.phase_efficiency={gate: 0.5}"]):
        cfg = load_config(overrides=[*base, *extra])
        metrics.append(StepModel(cfg, build_topology(cfg.hardware)).run().metrics())
    assert metrics[1]["gate_ms"] == pytest.approx(2 * metrics[0]["gate_ms"])
    assert metrics[1]["expert_ms"] == pytest.approx(metrics[0]["expert_ms"])


class _KernelCounter(TorchDispatchMode):
    """The reference path of GATE_ROUTING: every kernel the code dispatches (views and allocations
    excluded) and the bytes of its tensors, on the meta device, nothing computed."""

    NO_KERNEL = {torch.ops.aten.empty_like, torch.ops.aten._unsafe_view, torch.ops.aten.detach}

    def __init__(self):
        super().__init__()
        self.kernels, self.nbytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func.overloadpacket not in self.NO_KERNEL:
            self.kernels += 1
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            self.nbytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tokens, experts", [(8192, 8), (4096, 64)])
def test_the_gate_table_counts_what_the_gating_code_runs(top_k, tokens, experts):
    logits = torch.empty(1, tokens, experts, device="meta", requires_grad=True)  # (G, S, E)
    noise = torch.empty(1, tokens, device="meta") if top_k == 2 else None
    with _KernelCounter() as forward:
        plan = gshard_gating(logits, top_k, tokens // experts * 2, noise)
    with _KernelCounter() as backward:
        torch.autograd.backward(
            [plan.combine_weight, plan.aux_loss], [torch.empty_like(plan.combine_weight), torch.ones((), device="meta")]
        )
    for pass_, traced in (("fwd", forward), ("bwd", backward)):
        kernels, per_token_expert, per_token = gate_routing(top_k, pass_)
        assert traced.kernels == kernels, pass_
        assert traced.nbytes == pytest.approx(tokens * (per_token_expert * experts + per_token), rel=0.05), pass_


def test_the_sweep_option_offers_every_sweep():
    assert tuple(sorted(SWEEPS)) == OP_SWEEP_SIZES


def test_op_sweep_writes_a_record_and_a_profile_snippet(tmp_path):
    assert run_entry_point(["op_sweep", "--sweep", "quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "op_sweep.json").read_text())
    assert (
        record["fit"]["converged"]
        and len(record["fit"]["predicted_ms"])
        == len(record["sweep"]["gemm"]) + len(record["sweep"]["memory_bound"]) + 1
    )
    fields = dict(line.split(": ") for line in (tmp_path / "profile.yaml").read_text().splitlines()[1:])
    hw = load_config(overrides=[f"hardware.{key}={value}" for key, value in fields.items()]).hardware  # valid
    assert hw.peak_tflops == float(fields["peak_tflops"]) > 0
    refit = tmp_path / "refit"
    assert run_entry_point(["op_sweep", "--fit", str(tmp_path / "op_sweep.json"), "--out", str(refit)]) == 0
    assert json.loads((refit / "op_sweep.json").read_text())["fit"]["gemm_tflops"] == pytest.approx(
        record["fit"]["gemm_tflops"], rel=1e-6
    )


@pytest.mark.parametrize("argv", [["--peak-tflops", "-1"], ["--threads", "0"], ["--dtype", "int8"]])
def test_op_sweep_refuses_bad_arguments_without_writing(tmp_path, argv):
    with pytest.raises(SystemExit) as exit_:
        run_entry_point(["op_sweep", *argv, "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2 and not (tmp_path / "out").exists()


def test_op_sweep_refuses_a_record_without_a_sweep(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"checks": {}}))
    for missing in (tmp_path / "other.json", tmp_path / "missing.json"):
        assert run_entry_point(["op_sweep", "--fit", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "numels, depth, launches",
    [
        ([65536 * 320], 1, 1),  # 320 blocks fill one launch exactly
        ([65536 * 320 + 1], 1, 2),  # one element more: a second launch for the last block
        ([1.0] * 110, 1, 1),  # 110 tensors fill a depth-1 launch's tensor slots
        ([1.0] * 111, 1, 2),
        ([1.0] * 49, 3, 2),  # a depth-3 launch takes 48 tensors
        ([65536 * 200, 65536 * 200], 1, 2),  # the second tensor is cut between two launches
        ([65536 * 200, 65536 * 200, 65536 * 240], 1, 2),  # ... and the cut piece fills the second
    ],
)
def test_multi_tensor_launches_follow_torchs_chunking(numels, depth, launches):
    assert multi_tensor_launches(numels, depth) == launches


def test_adamw_on_the_h200_records_model_launches_what_the_trace_counted():
    """results/reference/2026-12-04-h200: the batch-8 step's AdamW ran 8 foreach ops of 9 launches
    each (72 multi_tensor_apply kernels) over 21 float32 passes, 3.7 ms on the device."""
    record = json.loads(H200_STEPS.read_text())
    config = {k: record["config"][k] for k in ("model", "moe", "parallel", "comm", "train")}
    cfg = load_config(data=config, overrides=["hardware_profile=h200-single"])
    numels = [t.numel for t in StepModel(cfg, build_topology(cfg.hardware)).plan.tensors]
    assert [multi_tensor_launches(numels, depth) for _, depth, _ in ADAM_FOREACH_OPS] == [9] * 8
    assert ADAM_PASSES == 21
    device_s = h200(kernel_launch_us=0.0).optimizer(numels, "foreach")
    assert device_s * 1e3 == pytest.approx(3.7, rel=0.15)  # predicted from the spec sheet's bandwidth


def test_a_fused_optimizer_makes_a_third_of_the_passes_in_fewer_launches():
    numels = [4096.0 * 4096] * 12 + [4096.0] * 24
    model, free = h200(), h200(kernel_launch_us=0.0)
    foreach, fused = (free.optimizer(numels, kind) for kind in ("foreach", "fused"))
    assert fused == pytest.approx(foreach * 7 / 21)
    launches = {
        kind: (model.optimizer(numels, kind) - free.optimizer(numels, kind)) / model.launch_s
        for kind in ("foreach", "fused", "for-loop")
    }
    assert launches["fused"] == pytest.approx(multi_tensor_launches(numels, 4))
    assert launches["fused"] < launches["foreach"] < launches["for-loop"] == pytest.approx(8 * len(numels))
