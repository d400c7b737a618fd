"""GShard's config section ``gshard``: the scaling study simulated on the TPU v3 torus
(experiments/gshard.py), registered with the schema (moe_core.schema.sections).

Every parameter GShard leaves unstated is a field here, with the value chosen from the paper's own
numbers (reference/papers.md §2) and the reasoning beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.papers.gshard.models import MODELS, tokens_per_core, tokens_per_side
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
from moe_core.units import MiB

# The study's paper and experiments (its records' folders), here rather than in study.py so that the
# analysis reads them without importing the simulator (and torch).
PAPER = "gshard"
SCALING = "gshard_scaling"  # Table 1's models simulated: step, rooflines, memory as trained (Table 3, Fig 8)
MEMORY = "gshard_memory"  # memory per core of Fig 7's models
COLLECTIVES = "gshard_collectives"  # the collectives vs partitions on torus slices (Fig 9)

# Unstated hardware parameters of the TPU v3 profiles (configs/hardware/gshard-tpuv3-*.yaml headers):
# config key -> the other ends of the plausible range, each run as a sensitivity run of the scaling
# study (moe_core.schema.points.unstated_variants). ICI per link per direction: chosen 70 GB/s, 50 (the Cloud
# page's pod bisection over the torus's bisection links) to 82 (656 Gb/s per link). GEMMs' share of
# the bf16 peak: chosen 0.5; 0.17 if XLA ran GShard's float32 matmuls in three bf16 passes at that
# efficiency, 0.87 the largest share measured here (the H200's GEMM curve). Groups of tokens per core
# (gshard.max_groups_per_core, a count): chosen 4, Table 3's batches as the paper states them (4
# groups a core at 128 experts, 1 at 512 and 2048); 1, one group a core at every size, GShard's
# N/D = O(1) scaling assumption, which the paper states but does not say Table 3's 128-expert run
# followed; 2 and 3 a batch between. The step moves in whole groups, so the design runs every one.
SCALING_UNSTATED = register_unstated(
    "gshard",
    Unstated(
        "hardware.intra_node_GBps",
        chosen=70.0,
        low=50.0,
        high=82.0,
        evidence="ICI per link per direction: 50 the Cloud TPU v3 pod's bisection over the torus's bisection "
        "links, 82 a 656 Gb/s link; 70 between",
    ),
    Unstated(
        "hardware.compute_efficiency",
        chosen=0.5,
        low=0.17,
        high=0.87,
        evidence="GEMMs' share of the bf16 peak: 0.17 if float32 matmuls ran as three bf16 passes, 0.87 the "
        "H200's measured GEMM curve; 0.5 assumed",
    ),
    Unstated(
        "gshard.max_groups_per_core",
        chosen=4,
        low=1,
        high=4,
        evidence="4: Table 3's batches as stated (4 groups a core at 128 experts, 1 at 512 and 2048); 1: one "
        "group a core, GShard's N/D = O(1) scaling assumption",
    ),
)


@dataclass
class GshardConfig:
    """GShard's scaling study (experiments/gshard.py): the MoE Transformers of Table 1 on the TPU v3
    torus at 128, 512 and 2048 experts, one expert per core.

    * ``models``: Table 1's models to simulate (moe_core/papers/gshard/models.py), each on the profile
      of ``profiles`` with as many cores (chips x ``cores_per_chip``) as it has experts.
    * Per-core memory (Fig 7) of ``memory_layers`` x the profiles' expert counts at the tokens per
      core of the 512- and 2048-core runs (GShard's scaling: N/D constant).
    * The all-to-all and all-reduce of ``collective_bytes_per_partition`` on tori of
      ``collective_partitions`` cores (Fig 9), slices of the largest profile.
    """

    profiles: list[str] = field(
        default_factory=lambda: ["gshard-tpuv3-64chip", "gshard-tpuv3-256chip", "gshard-tpuv3-torus"]
    )
    models: list[int] = field(default_factory=lambda: sorted(MODELS))
    cores_per_chip: int = 2  # TPU v3: two TensorCores per chip; the profiles model one device per chip
    # GShard's S. Unstated; its scaling assumptions make S constant (S = O(1), G = O(D); papers.md
    # §2.1). Value: the tokens a core holds per MoE layer in the 512- and 2048-core runs of Table 3,
    # 4e6 tokens / 2 sides / 2048 cores = 1e6 / 2 / 512 = 976.6, to a whole token: one group per core
    # there, four on 128 cores (1e6 / 2 / 128 = 3906). With capacity 2S/E the dispatched buffer is then
    # 2 x 976 x 1024 x 4 B = 8 MB per core at 512 and 2048 experts and 32 MB at 128, the two sizes of
    # Fig 9: consistent with S about 1K.
    group_size: int = 976
    # At most how many of their Table 3 groups the cores hold (moe_core/papers/gshard/models.py
    # tokens_per_core): 4, Table 3's batches (no model gives a core more); 1, one group per core at every
    # size (N/D constant). Unstated: see above.
    max_groups_per_core: int = 4
    # Unstated. Attention spans one sentence per side (source or target). 1T tokens over the 13B
    # examples of the 100->English data is 77 tokens per pair, 38 per side, if the 1T tokens are about
    # one pass over them; 32 is the power of two nearest that which divides a chip's tokens
    # (2 x 976 = 2^5 x 61). It only sets attention's score FLOPs (4 s d per token against 8 d^2 for its
    # projections): 32 or 128 moves a step by about 1%.
    seq_len: int = 32
    # GShard's capacity is 2N/(G E) = 2S/E [FT, §2.1]: top-2 with capacity factor 1 in the suite's
    # C = ceil(capacity_factor * top_k * S / E). lingvo rounds C up to a multiple of 4 (a TPU tiling
    # choice of the code, not the paper's formula); at 2048 experts that would double the buffer.
    capacity_factor: float = 1.0
    # Unstated: XLA's SPMD program all-reduces the replicated weights' gradients after the backward
    # pass; the simulated step does the same with the "sequential" policy.
    policy: str = "sequential"
    # HBM per core, which GShard does not give: TPU v3 has 32 GiB per chip [UNC: Cloud TPU v3 page].
    # Fig 7's per-device memory is read against it (fits without rematerialization or not).
    device_memory_GB: float = 16.0
    memory_layers: list[int] = field(default_factory=lambda: [12, 24, 36, 60])  # Fig 7's models
    collective_partitions: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256, 512, 1024, 2048])
    collective_bytes_per_partition: list[int] = field(default_factory=lambda: [8 * MiB, 32 * MiB])  # Fig 9


def validate_gshard(cfg: DictConfig) -> None:
    """The gshard section's checks a type cannot express; ConfigError naming the key."""
    g = cfg.gshard
    for i, name in enumerate(g.profiles):
        require_profile(name, f"gshard.profiles[{i}]")
    require(len(g.profiles) > 0, "gshard.profiles", "must name at least one TPU v3 torus profile")
    require(
        len(g.models) > 0 and set(g.models) <= set(MODELS) and len(set(g.models)) == len(g.models),
        "gshard.models",
        f"must be distinct models of Table 1, some of {sorted(MODELS)}, got {list(g.models)}",
    )
    require_at_least(g, "gshard", 1, ("cores_per_chip", "group_size", "seq_len", "max_groups_per_core"))
    require_choices([g.policy], POLICIES, "gshard.policy")
    require_positive(g, "gshard", ("capacity_factor", "device_memory_GB"))
    for model_id in g.models:
        _validate_batch(g, MODELS[model_id])
    for i, layers in enumerate(g.memory_layers):
        require(
            layers >= 4 and layers % 4 == 0,
            f"gshard.memory_layers[{i}]",
            f"must be a multiple of 4 (half encoder, half decoder, every other FFN MoE), got {layers}",
        )
    for i, partitions in enumerate(g.collective_partitions):
        require(
            partitions >= 2 * g.cores_per_chip and partitions % g.cores_per_chip == 0,
            f"gshard.collective_partitions[{i}]",
            f"must be a multiple of gshard.cores_per_chip={g.cores_per_chip} spanning at least 2 chips, "
            f"got {partitions}",
        )
    for i, size in enumerate(g.collective_bytes_per_partition):
        require(size >= 1, f"gshard.collective_bytes_per_partition[{i}]", f"must be >= 1 byte, got {size}")


def _validate_batch(g: DictConfig, model) -> None:
    """A model's batch fills at least one group of every core, and whole sequences of every chip."""
    share = tokens_per_side(model)
    require(
        g.group_size <= share,
        "gshard.group_size",
        f"exceeds the {share} tokens per core and side of model ({model.id}); use at most {share}, got {g.group_size}",
    )
    chip = tokens_per_core(model, g.group_size, g.max_groups_per_core) * g.cores_per_chip
    require(
        chip % g.seq_len == 0,
        "gshard.seq_len",
        f"must divide the {chip} tokens a chip holds in model ({model.id}), got {g.seq_len}",
    )


register_section("gshard", GshardConfig, validate_gshard)
