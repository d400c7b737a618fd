"""AxoNN's config section ``axonn`` (experiments/axonn_grids.py measured, experiments/axonn.py
simulated), registered with the schema (moe_core.sections)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.grid import Grid
from moe_core.sections import register_section, require, require_at_least, require_profile

# The overlap settings the measured and simulated ablations compare (moe_core.grid.GridOverlaps):
# none, each of AxoNN's three overlaps alone, all three, all three with weight caching.
OVERLAPS = ("all_reduce", "reduce_scatter", "all_gather")
OVERLAP_VARIANTS = {
    "none": (),
    "all_reduce": ("all_reduce",),
    "reduce_scatter": ("reduce_scatter",),
    "all_gather": ("all_gather",),
    "all": OVERLAPS,
    "all+cache": OVERLAPS,
}


def overlap_overrides(variant: str, cached_layers: int) -> list[str]:
    """The ``comm.grid_overlap`` overrides of an ablation variant (``cached_layers`` for "all+cache")."""
    on = OVERLAP_VARIANTS[variant]
    switches = [f"comm.grid_overlap.{name}={str(name in on).lower()}" for name in OVERLAPS]
    return [*switches, f"comm.grid_overlap.cached_layers={cached_layers if variant == 'all+cache' else 0}"]


@dataclass
class AxonnConfig:
    """AxoNN's experiments.

    * Measured grid sweep (experiments/axonn_grids.py, one torchrun job of ``world_size`` ranks):
      every 4D grid of ``world_size`` (data x depth x row x col) whose split the model allows, with
      no overlap, then every overlap variant on ``ablation_grid`` (depth, row, col); the model is
      the run's with ``measured_overrides`` (a dense GPT, AxoNN's workload) and ``global_sequences``
      sequences per step shared by the data replicas, so every grid computes as much per step.
    * Simulated at the paper's scale (experiments/axonn.py) on ``hardware`` with A100s of
      ``device_memory_GB``: the weak-scaling GPT models (moe_core/papers/axonn/models.py), each on
      the grid the communication model ranks first and under the Megatron-LM-style baseline; the
      overlap ablation of the ~2B model; the ranking of every grid for the largest model, of which
      the ``ranked_grids`` best are also simulated.
    """

    world_size: int = 4
    measured_overrides: list[str] = field(
        default_factory=lambda: [
            "model.moe_every=0",
            "moe.num_experts=1",
            "moe.top_k=1",
            "model.d_model=256",
            "model.n_heads=8",
            "model.d_ff=1024",
            "model.n_layers=4",
            "model.seq_len=64",
        ]
    )
    global_sequences: int = 8
    warmup_iters: int = 2
    iters: int = 8
    ablation_grid: list[int] = field(default_factory=lambda: [2, 2, 1])
    cached_layers: int = 2  # blocks whose weights the "all+cache" variant keeps from forward
    # The profile (name or YAML path) AxoNN's model prices the measured grids on: the testbed's
    # calibrated one (the workflow passes it); empty: the run's own, whose link rates must be stated.
    model_profile: str = ""
    hardware: str = "axonn-perlmutter"
    device_memory_GB: float = 40.0  # Perlmutter's A100 40 GB (papers.md §3.3; some nodes have 80 GB)
    bytes_per_param: int = 16  # mixed-precision Adam: bf16 weight + gradient, fp32 master, m, v
    ranked_grids: int = 8


def ablation_grid(a: DictConfig) -> Grid:
    """The grid of the measured overlap ablation."""
    depth, row, col = a.ablation_grid
    return Grid(a.world_size // (depth * row * col), depth, row, col)


def validate_axonn(cfg: DictConfig) -> None:
    """The axonn section's checks a type cannot express; ConfigError naming the key."""
    a = cfg.axonn
    require_profile(a.hardware, "axonn.hardware")
    require_at_least(a, "axonn", 1, ("world_size", "global_sequences", "iters", "ranked_grids"))
    require_at_least(a, "axonn", 0, ("warmup_iters", "cached_layers"))
    require(a.device_memory_GB > 0, "axonn.device_memory_GB", f"must be > 0, got {a.device_memory_GB}")
    require(a.bytes_per_param >= 1, "axonn.bytes_per_param", f"must be >= 1, got {a.bytes_per_param}")
    tensor = math.prod(a.ablation_grid)
    require(
        len(a.ablation_grid) == 3 and min(a.ablation_grid) >= 1 and a.world_size % tensor == 0,
        "axonn.ablation_grid",
        f"must be [depth, row, col] >= 1 whose product divides axonn.world_size={a.world_size}, "
        f"got {list(a.ablation_grid)}",
    )
    require(
        a.global_sequences % a.world_size == 0,
        "axonn.global_sequences",
        f"must be a multiple of axonn.world_size={a.world_size} (every grid's data replicas share it), "
        f"got {a.global_sequences}",
    )


register_section("axonn", AxonnConfig, validate_axonn)
