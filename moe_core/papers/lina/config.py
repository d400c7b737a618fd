"""Lina's config sections: ``lina`` (its training experiments) and ``inference`` (its measured
inference), registered with the schema (moe_core.schema.sections)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.schedule.policies import POLICIES
from moe_core.schema.points import Unstated, register_unstated
from moe_core.schema.sections import (
    register_section,
    require,
    require_at_least,
    require_choices,
    require_positive,
    require_profile,
)

# Lina's inference policies besides ``ideal`` (the normalisation, which always runs).
INFERENCE_POLICIES = ("static", "lina", "lina-no-estimation", "lina-no-finetune")

# Parameters the paper leaves unstated that its simulated studies depend on, each with the value chosen
# (the verdict's) and its plausible range; moe_core.schema.points.unstated_variants runs them one at a time
# and jointly (the corners of the ranges).
# * The intra-node link class, PCIe 4.0 x16 at 25 GB/s by P2P in a 2-socket PCIe tree:
#   configs/hardware/lina-a100-4x4.yaml's header has the reasoning. One end is NVLink3 as NCCL
#   reaches it, 240 GB/s per GPU into an NVSwitch-class node (no PCIe tree in the GPUs' way). The other
#   is the same tree on an Intel host without PCIe switches, where NCCL 2.10 uses no P2P (none beyond
#   a PXB path on Intel since 2.9.6) and stages every byte through host memory: 12.4 GB/s per GPU link
#   and 15.8 across the sockets, a public PCIe 3.0 host's staged rates (a100-pcie-gen3-2socket.yaml)
#   doubled for PCIe 4.0.
# * Sequences per GPU, 8 of 512 tokens (4096 tokens per GPU and step): the paper gives no batch.
#   Transformer-XL's own enwik8 script trains 22 segments of 512 per step on 4 GPUs (5.5 per GPU);
#   range 4 to 64 (2048 to 32768 tokens). The top is what a 40 GB A100 holds: with one expert per GPU
#   a GPU keeps 838M - 24 x 15 x 2.1M = 82M parameters (1.3 GB with Adam in float32), and a sequence's
#   activations are about 0.5 GB in 16-bit (24 layers of 16 d_model- and 2 d_ff-wide tensors and the
#   8 heads' 512 x 512 scores). Fig 15 asks for the top as well: a layer's all-to-all moves about
#   1.25 MB per sequence (512 tokens, top-2 at capacity 1.25, 1 KB a bfloat16 token), so its 10-100 MB
#   micro-ops cut it only from 8 to 80 sequences up (30 MB, the middle: 24).
# * The software stack's cost per kernel, 38 us: this suite's eager PyTorch (the H200 record); Lina ran
#   PyTorch 1.10 with DeepSpeed-MoE, also eager, whose per-op host overhead is about 10 us where the
#   host keeps ahead of the GPU: 10 is the other end. The model is small (d_model 512), so its hundreds
#   of kernels per layer make this the parameter that moves the step most.
# * The inference batches' popularity drift, 400, in routing.py (100 to 1600).
# * Not swept, though the fit to Table 1 would want it: the era's precision (PyTorch 1.10 matmuls in
#   TF32 by default, fp32 activations on the wire, against 16-bit mixed precision): the profile prices
#   GEMMs at the bf16 peak whatever train.dtype says, so a float32 run would double the bytes and not
#   the compute; a sweep needs the peak to follow the dtype first.
STAGED_SOCKET_GBPS = 15.8  # across the sockets when staged; the root complex's uplink takes the same rate
STAGED_SOCKET_LINK = tuple(
    f"hardware.pcie.{key}={STAGED_SOCKET_GBPS}" for key in ("socket_link_GBps", "switch_uplink_GBps")
)
INTRA_NODE_LINK = Unstated(
    "hardware.intra_node_GBps",
    chosen=25.0,
    low=12.4,
    high=240.0,
    implies={12.4: STAGED_SOCKET_LINK, 240.0: ("hardware.intra_node=switch",)},
    evidence="25: PCIe 4.0 x16 by P2P in a 2-socket tree (lina-a100-4x4.yaml); 12.4: staged through host "
    "memory (NCCL 2.10, no P2P on Intel); 240: NVLink3 into an NVSwitch-class node",
)
SEQUENCES_PER_GPU = Unstated(
    "train.batch_size",
    chosen=8,
    low=4,
    high=64,
    evidence="512-token sequences per GPU, no batch given: Transformer-XL's enwik8 script trains 5.5; 64 is "
    "what a 40 GB A100 holds",
)
TRAINING_UNSTATED = register_unstated(
    "lina",
    INTRA_NODE_LINK,
    SEQUENCES_PER_GPU,
    Unstated(
        "hardware.kernel_launch_us",
        chosen=38.0,
        low=10.0,
        high=38.0,
        evidence="host cost per kernel: 38 this suite's eager PyTorch (H200 record); 10 PyTorch 1.10 eager "
        "where the host keeps ahead of the GPU",
    ),
)
# Table 1 times training and inference "with the same batch": the inference passes sweep the training
# batch's range with it, so one fitted batch serves both kinds of baseline row (analysis.fit).
INFERENCE_UNSTATED = register_unstated(
    "lina",
    INTRA_NODE_LINK,
    SEQUENCES_PER_GPU,
    Unstated(
        "lina.inference_drift",
        chosen=400.0,
        low=100.0,
        high=1600.0,
        evidence="inference batches' expert-popularity drift (routing.py), not published: a factor 4 each way",
    ),
)


@dataclass
class LinaConfig:
    """Lina's training experiments (points: ``sweeps.py``; run by experiments/rules/train_step.smk and
    simulator.smk).

    Simulated on the paper's testbed (4 nodes x 4 A100, 100 Gb/s IB), experts = GPUs: every policy
    at every expert count (Figs 10-14) and, at the largest count, policy ``lina`` at each partition
    size (Fig 15). Measured on this testbed: ``measured_policy`` at the measured sweep's largest world
    size with experts = ranks, micro-ops scaled to the small model (``measured_partition_mb``).
    """

    hardware: str = "lina-a100-4x4"
    experts: list[int] = field(default_factory=lambda: [2, 4, 8, 16])
    policy: list[str] = field(
        default_factory=lambda: ["overlap", "lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]
    )
    partition_mb: list[float] = field(default_factory=lambda: [10.0, 30.0, 50.0, 100.0])
    overrides: list[str] = field(default_factory=list)  # the simulated model
    measured_policy: list[str] = field(default_factory=lambda: ["lina-priority", "lina-pipeline", "lina"])
    measured_partition_mb: float = 0.25
    # Inference simulated on ``hardware`` (experiments/lina_inference_sim.py): experts = GPUs, the
    # model above with top-1 routing and no capacity, synthetic routing (routing.py), the
    # ``inference`` section's policies, path length, profiled and timed batch counts.
    inference_experts: list[int] = field(default_factory=lambda: [4, 8, 16])
    inference_drift: float = 400.0  # batch-to-batch popularity drift (routing.py); not in the paper


@dataclass
class InferenceConfig:
    """Lina's measured inference (experiments/inference.py; the workflow runs one job per expert
    count and path length in ``experts`` x ``path_lengths``, on ``world_size`` ranks)."""

    policies: list[str] = field(default_factory=lambda: list(INFERENCE_POLICIES))  # besides ideal, always run
    train_steps: int = 100  # training on skewed data before inference (the gate's skew is learnt)
    profile_batches: int = 8  # batches whose expert paths are profiled
    warmup_batches: int = 3
    batches: int = 30  # timed inference batches
    top_k: int = 1  # Lina's inference gate
    keep: int = 0  # experts kept per path estimate; 0 = top_k, as Lina
    path_length: int = 3  # this run's l (Lina: 3; 1 and 6 studied)
    # The token all-to-alls: "library" (all_to_all_single), or the transmission order of a registered
    # training policy that has one (e.g. Aurora's), planned from the traffic matrix every rank has.
    a2a_policy: str = "library"
    world_size: int = 4
    experts: list[int] = field(default_factory=lambda: [4])
    path_lengths: list[int] = field(default_factory=lambda: [3])
    overrides: list[str] = field(default_factory=list)  # the inference model


def validate_lina(cfg: DictConfig) -> None:
    lina = cfg.lina
    require_profile(lina.hardware, "lina.hardware")
    require(len(lina.experts) > 0, "lina.experts", "must list at least one expert count")
    require(min(lina.experts, default=1) >= 1, "lina.experts", f"expert counts must be >= 1, got {list(lina.experts)}")
    require_choices(lina.policy, POLICIES, "lina.policy")
    require_choices(lina.measured_policy, POLICIES, "lina.measured_policy")
    require(
        min(lina.partition_mb, default=1) > 0, "lina.partition_mb", f"must be > 0 MB, got {list(lina.partition_mb)}"
    )
    require(
        min(lina.inference_experts, default=2) >= 2,
        "lina.inference_experts",
        f"expert counts must be >= 2, got {list(lina.inference_experts)}",
    )
    require_positive(lina, "lina", ("inference_drift", "measured_partition_mb"))
    require(all(math.isfinite(mb) for mb in lina.partition_mb), "lina.partition_mb", f"got {list(lina.partition_mb)}")


def validate_inference(cfg: DictConfig) -> None:
    inference = cfg.inference
    require_at_least(inference, "inference", 1, ("batches", "profile_batches", "top_k", "path_length", "world_size"))
    require_at_least(inference, "inference", 0, ("train_steps", "warmup_batches", "keep"))
    require(inference.top_k <= 2, "inference.top_k", f"GShard gating supports 1 or 2, got {inference.top_k}")
    require_choices(inference.policies, INFERENCE_POLICIES, "inference.policies")
    orders = ["library", *(name for name, spec in POLICIES.items() if spec.a2a_order)]
    require_choices([inference.a2a_policy], orders, "inference.a2a_policy")
    require(len(inference.experts) > 0, "inference.experts", "must list at least one expert count")
    require(min(inference.experts, default=1) >= 1, "inference.experts", f"must be >= 1, got {list(inference.experts)}")
    require(len(inference.path_lengths) > 0, "inference.path_lengths", "must list at least one path length")
    require(
        min(inference.path_lengths, default=1) >= 1,
        "inference.path_lengths",
        f"must be >= 1, got {list(inference.path_lengths)}",
    )


register_section("lina", LinaConfig, validate_lina)
register_section("inference", InferenceConfig, validate_inference)
