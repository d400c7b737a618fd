"""Aurora's config section ``aurora`` (experiments/aurora.py simulated, experiments/aurora_a2a.py
measured), registered with the schema (moe_core.schema.sections)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.schema.points import Unstated, register_unstated
from moe_core.schema.sections import register_section, require, require_at_least, require_choices, require_profile

# Parameters Aurora leaves unstated that its simulated inference numbers (Figs 11-14) depend on:
# config key -> the other ends of the plausible range, each run as a sensitivity run of the deployment
# experiment (moe_core.schema.points.unstated_variants; records carry the param ``unstated``). Every value is
# chosen from what the paper states about its setting, none from one of its results:
#
# * Per-kernel cost, ``hardware.kernel_launch_us`` (aurora-bigswitch-*.yaml): 5 us, a compiled
#   graph's kernel on a GPU. The paper's inputs are per-GPU gate / FFN / aggregation times (Table 1)
#   from Google's production statistics of LIMoE, a JAX model served compiled (XLA fuses the
#   routing; no per-op host dispatch), and its model (Eqs. 1, 3, 4) has no fixed cost: every term
#   grows with the traffic. Other end: 38 us, this suite's eager PyTorch on an H200 (its 43 routing
#   kernels make the gate about 1.6 ms per layer, more than twice a balanced all-to-all of 6272
#   tokens at 100 Gb/s). The most consequential: Fig 11a's best speedup 1.49 -> 1.31, Fig 12's
#   utilisation gain 0.95 -> 1.27 (homogeneous).
# * GPU compute, ``hardware.compute_efficiency`` with the profiles' A100 peak: 0.87 (the H200's
#   measured share of peak). The paper names no GPU; an A100 is assumed. Other end: 0.35, the compute
#   of a V100-class GPU (125 of the A100's 312 TFLOP/s at the same share of peak); a faster GPU only
#   makes the all-to-alls a larger share, which they already are (A100: 70-85% of a layer). It moves
#   the heterogeneous speedups most (Fig 11d's best 1.17 -> 1.33).
# * Tokens per GPU and MoE layer, ``aurora.tokens_per_gpu``: 6272 = 32 images x 196 patch tokens of
#   LIMoE B/16 at 224 x 224 (16 x 16 patches; B/32 has 49 per image). The batch is not stated. It
#   acts through the share of the fixed per-kernel costs, which the kernel-cost run spans (8 images
#   at 5 us: Fig 11a 1.39, Fig 12 1.20; 128 images: 1.53, 0.82), so it is not run.
# * Traffic skew: the production traffic matrices are not published. The workloads span it instead:
#   our router trained on data of Zipf skew 1 to 2 and parametric Zipf traffic of 0.8 and 1.6
#   (``gating_zipf``, ``traffic_zipf``); the reproducers take the paper's "from min to max" over them.
# * Served model: ViT-B's d_model 768 and d_ff 3072 (LIMoE B/16 and B/32 name it), bfloat16
#   activations (not stated; float32 would double the bytes per token).
# * Heterogeneous GPUs' speeds: "ordered by performance" only; peak proportional to the class's
#   bandwidth (aurora-bigswitch-hetero.yaml). Latency: none, as the paper's big switch (a few us per
#   message would cost the orders that split flows into more pieces, Aurora's exact one first).
AURORA_UNSTATED = register_unstated(
    "aurora",
    Unstated(
        "hardware.kernel_launch_us",
        chosen=5.0,
        low=5.0,
        high=38.0,
        evidence="5: a compiled graph's kernel (LIMoE served from JAX/XLA); 38: this suite's eager PyTorch "
        "(H200 record)",
    ),
    Unstated(
        "hardware.compute_efficiency",
        chosen=0.87,
        low=0.35,
        high=0.87,
        evidence="A100 assumed (no GPU named) at the H200's measured share of peak; 0.35 a V100-class GPU",
    ),
)


@dataclass
class AuroraConfig:
    """Aurora's experiments: experiments/aurora.py (simulated) and experiments/aurora_a2a.py (measured).

    Workloads are routing traces of our model (``aurora.moe_layers`` MoE layers of ``num_experts``
    top-1 experts, trained ``train_steps`` steps on data of each skew) and parametric Zipf matrices.
    """

    gating_zipf: list[float] = field(default_factory=lambda: [1.0, 1.5, 2.0])  # train.data_zipf per trace
    traffic_zipf: list[float] = field(default_factory=lambda: [0.8, 1.6])  # Zipf exponent per parametric workload
    num_experts: int = 8  # experts per model = GPUs per model (Aurora Section 8)
    moe_layers: int = 4  # MoE layers per model (Aurora Section 8)
    train_steps: int = 20  # router training before the trace
    trace_batch_size: int = 32  # sequences of the traced batch
    # The served model the simulator times (inference_sim.py): the traces say how tokens spread over
    # the experts, these give their number, bytes and FLOPs. Aurora serves LIMoE B/16 and B/32, ViT-B
    # sized; our traced model is far smaller than any served one. Values and reasons: AURORA_UNSTATED.
    d_model: int = 768
    d_ff: int = 3072
    tokens_per_gpu: int = 6272  # tokens each GPU's shard routes per MoE layer
    dtype: str = "bfloat16"  # activations on the wire and in the GEMMs
    homogeneous_hardware: str = "aurora-bigswitch-100g"
    heterogeneous_hardware: str = "aurora-bigswitch-hetero"
    random_draws: int = 5  # seeds of each random baseline (RCS, RGA, REC)
    imprecision: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75])  # Fig 14's levels
    gap_gpus: int = 4  # GPUs of the brute-force comparison (Fig 13; n! pairings)
    # Measured ordered all-to-all (gloo/NCCL): the traces on world_size ranks, scaled so every rank
    # sends bytes_per_rank per layer.
    world_size: int = 4
    bytes_per_rank: int = 4 * 2**20
    warmup_iters: int = 2
    iters: int = 10


def validate_aurora(cfg: DictConfig) -> None:
    """The aurora section's checks a type cannot express; ConfigError naming the key."""
    a = cfg.aurora
    for key in ("homogeneous_hardware", "heterogeneous_hardware"):
        require_profile(a[key], f"aurora.{key}")
    positive = ("num_experts", "moe_layers", "trace_batch_size", "random_draws", "world_size", "d_model", "d_ff")
    require_at_least(a, "aurora", 1, (*positive, "tokens_per_gpu", "bytes_per_rank", "iters"))
    require_at_least(a, "aurora", 0, ("train_steps", "warmup_iters"))
    require_choices([a.dtype], ("float32", "bfloat16"), "aurora.dtype")
    require(a.moe_layers >= 2, "aurora.moe_layers", f"the imprecision experiment needs >= 2 layers, got {a.moe_layers}")
    require(2 <= a.gap_gpus <= 7, "aurora.gap_gpus", f"brute force needs 2..7 GPUs, got {a.gap_gpus}")
    require(
        a.num_experts % 2 == 0 and a.num_experts % a.gap_gpus == 0,
        "aurora.num_experts",
        f"must be even (Lina packs experts in pairs) and a multiple of aurora.gap_gpus={a.gap_gpus}, "
        f"got {a.num_experts}",
    )
    require(
        a.world_size >= 2 and a.num_experts % a.world_size == 0,
        "aurora.world_size",
        f"must be >= 2 and divide aurora.num_experts={a.num_experts}, got {a.world_size}",
    )
    tokens = a.trace_batch_size * cfg.model.seq_len
    require(
        tokens % a.num_experts == 0,
        "aurora.trace_batch_size",
        f"the traced tokens (trace_batch_size * model.seq_len = {tokens}) must split evenly over "
        f"aurora.num_experts={a.num_experts} GPUs",
    )
    require(
        len(a.gating_zipf) + len(a.traffic_zipf) > 0,
        "aurora.gating_zipf",
        "give at least one workload (gating_zipf or traffic_zipf)",
    )
    for key in ("gating_zipf", "traffic_zipf"):
        require(
            all(math.isfinite(z) and z >= 0 for z in a[key]),
            f"aurora.{key}",
            f"Zipf exponents must be finite and >= 0, got {list(a[key])}",
        )
    require(
        len(a.imprecision) > 0 and all(0 <= level < 1 for level in a.imprecision),
        "aurora.imprecision",
        f"levels must be in [0, 1), got {list(a.imprecision)}",
    )


register_section("aurora", AuroraConfig, validate_aurora)
