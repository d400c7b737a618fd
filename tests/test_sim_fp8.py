"""FP8 linear layers in the simulated step (train.fp8): the GEMM curve against published FP8 GEMM
microbenchmarks, what FP8 changes in a step and what it leaves alone, and where it is refused."""

import pytest

from moe_core.config.load import ConfigError, hardware_profile, load_config, validate_measured
from moe_core.sim.compute import ComputeModel
from moe_core.sim.kernels import FP8_AMAX_BYTES, FP8_CAST_BYTES
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

BASE = [
    "hardware_profile=h100-ndr-cluster",
    "parallel.world_size=8",
    "moe.num_experts=8",
    "model.n_layers=2",
    "model.d_model=4096",
    "model.d_ff=16384",
    "model.n_heads=32",
    "model.seq_len=2048",
    "train.dtype=bfloat16",
]


def _model(*extra: str) -> StepModel:
    cfg = load_config(["configs/default.yaml"], overrides=[*BASE, *extra], whole_run=False)
    return StepModel(cfg, build_topology(cfg.hardware))


def _durations(model: StepModel) -> dict[str, float]:
    sim = model.run()
    return {op.name: float(end - start) for op, start, end in zip(sim.ops, sim.timeline.start_s, sim.timeline.end_s)}


# Published FP8 (e4m3) GEMM throughputs, TFLOP/s, held out from the profile (which has only the spec
# sheet's 1,979 peak and the bf16 curve measured on the H200):
# cuBLASLt 8192^3 on H100 SXM, 16 GPUs of two nodes: 1,599-1,630 (a public GPU acceptance report, 2026-05);
# tilelang's autotuned FP8 matmul, 8192 x 8192 x K on H800 SXM (benchmark/matmul_fp8/README.md), its two tables.
PUBLISHED_FP8 = [
    ((8192, 8192, 8192), (1599, 1630)),
    ((8192, 8192, 1024), (927, 1129)),
    ((8192, 8192, 2048), (1174, 1343)),
    ((8192, 8192, 4096), (1378, 1467)),
    ((8192, 8192, 8192), (1461, 1507)),
    ((8192, 8192, 16384), (1523, 1541)),
]


@pytest.mark.parametrize(("shape", "published"), PUBLISHED_FP8)
def test_the_fp8_gemm_curve_lands_on_published_microbenchmarks(shape, published):
    hw = hardware_profile("h100-ndr-cluster")
    fp8 = ComputeModel.from_profile(hw, hw.fp8_peak_tflops, element_bytes=1)
    m, n, k = shape
    tflops = 2 * m * n * k / (fp8.gemm(m, n, k) - fp8.launch_s) / 1e12
    low, high = published
    assert 0.85 * low <= tflops <= 1.15 * high


def test_fp8_prices_the_linear_layers_and_leaves_every_other_op_alone():
    plain, fp8 = _durations(_model()), _durations(_model("train.fp8=delayed"))
    assert plain.keys() == fp8.keys()
    untouched = [name for name in plain if any(part in name for part in ("attn_core", "gate", "head", "a2a"))]
    assert untouched and all(fp8[name] == pytest.approx(plain[name], rel=1e-12) for name in untouched)
    for layer_part in ("L0.attn.fwd", "L0.attn.bwd", "L0.ffn.fwd", "L0.ffn.bwd", "L1.expert.fwd", "L1.expert.bwd"):
        assert fp8[layer_part] < plain[layer_part]  # twice the peak outweighs the casts at these shapes


def test_an_fp8_gemm_costs_the_fp8_curve_plus_its_casts():
    delayed, current = _model("train.fp8=delayed"), _model("train.fp8=current")
    m, n, k = 4096.0, 3072.0, 1024.0
    fp8_fwd = delayed.kernels.fp8.gemm(m, n, k)
    casts_fwd = delayed.kernels.compute.memory_bound(FP8_CAST_BYTES * m * k) + delayed.kernels.compute.memory_bound(
        FP8_CAST_BYTES * k * n
    )
    assert delayed.kernels.weight_gemm("fwd", m, n, k) == pytest.approx(fp8_fwd + casts_fwd, rel=1e-12)
    casts_bwd = delayed.kernels.compute.memory_bound(FP8_CAST_BYTES * m * n)
    assert delayed.kernels.weight_gemm("bwd", m, n, k) == pytest.approx(
        delayed.kernels.fp8.gemm_backward(m, n, k) + casts_bwd
    )
    # current scaling: one more kernel and one more read of each operand
    extra = current.kernels.weight_gemm("bwd", m, n, k) - delayed.kernels.weight_gemm("bwd", m, n, k)
    assert extra == pytest.approx(current.kernels.compute.memory_bound(FP8_AMAX_BYTES * m * n, kernels=1), rel=1e-9)


def test_the_weights_are_cast_once_a_step():
    one, four = _model("train.fp8=delayed"), _model("train.fp8=delayed", "train.micro_batches=4")
    m, n, k = 1024.0, 3072.0, 1024.0
    weight_cast = one.kernels.compute.memory_bound(FP8_CAST_BYTES * k * n)
    assert one.kernels.fp8_casts("fwd", m, n, k, 1) - four.kernels.fp8_casts("fwd", m, n, k, 1) == pytest.approx(
        weight_cast * 3 / 4, rel=1e-9
    )


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (("hardware_profile=dgx-a100-80gb-hdr", "train.fp8=delayed"), "fp8_peak_tflops"),
        (("train.fp8=delayed", "train.dtype=float32"), "train.dtype=bfloat16"),
        (("train.fp8=sometimes",), "train.fp8"),
        (("train.fp8=current", "parallel.grid.depth=2", "comm.policy=sequential"), "3D grid"),
    ],
)
def test_fp8_is_refused_where_it_cannot_run(extra, match):
    with pytest.raises(ConfigError, match=match):
        load_config(["configs/default.yaml"], overrides=[*BASE, *extra], whole_run=False)


def test_fp8_is_simulated_only():
    cfg = load_config(["configs/default.yaml"], overrides=[*BASE, "train.fp8=delayed"], whole_run=False)
    with pytest.raises(ConfigError, match="train.fp8"):
        validate_measured(cfg)
