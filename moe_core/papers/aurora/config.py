"""Aurora's config section ``aurora`` (experiments/aurora.py simulated, experiments/aurora_a2a.py
measured), registered with the schema (moe_core.sections)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.sections import register_section, require, require_at_least, require_profile


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
    # Per-token size of the served model in the system model: the traces say who sends how many
    # tokens to whom, these give each token's bytes and FLOPs. Aurora serves LIMoE B/16 and B/32,
    # ViT-B sized (768 / 3072); our traced model is far smaller than any served one.
    d_model: int = 768
    d_ff: int = 3072
    element_bytes: int = 2  # bytes per activation element on the wire (bf16 inference)
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
    require_at_least(a, "aurora", 1, (*positive, "bytes_per_rank", "iters", "element_bytes"))
    require_at_least(a, "aurora", 0, ("train_steps", "warmup_iters"))
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
        require(all(z >= 0 for z in a[key]), f"aurora.{key}", f"Zipf exponents must be >= 0, got {list(a[key])}")
    require(
        len(a.imprecision) > 0 and all(0 <= level < 1 for level in a.imprecision),
        "aurora.imprecision",
        f"levels must be in [0, 1), got {list(a.imprecision)}",
    )


register_section("aurora", AuroraConfig, validate_aurora)
