"""MoNTA's config section ``monta`` (experiments/monta_a2a.py measured, experiments/monta.py
simulated), registered with the schema (moe_core.sections)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.sections import register_section, require, require_at_least, require_profile

from .performance_model import DEFAULT_CHUNK_OVERHEAD_S


@dataclass
class MontaConfig:
    """MoNTA's performance model and its experiments.

    The measured exchange (experiments/monta_a2a.py): on ``world_size`` ranks, for every
    ``tensor_parallel`` value t (ep = world_size / t, one expert per expert-parallel rank), a rank's
    dispatched buffer of ``bytes_per_rank`` bytes (float32, ``d_model`` wide) moves along every
    dispatch path, and MoNTA's along every chunk count of ``chunks`` that divides its slots.
    """

    # Per-chunk fixed cost of the pipelined dispatch (kernel launches and the copy of a chunk into the
    # output): the term papers.md §4.3's reconstruction leaves out. Assumption, microseconds.
    chunk_overhead_us: float = DEFAULT_CHUNK_OVERHEAD_S * 1e6
    world_size: int = 4
    tensor_parallel: list[int] = field(default_factory=lambda: [1, 2, 4])
    bytes_per_rank: int = 8 * 2**20
    d_model: int = 256
    chunks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    warmup_iters: int = 2
    iters: int = 10
    # Simulated at MoNTA's scale (experiments/monta.py): its testbed, with the unstated NIC count
    # bracketed by these values.
    hardware: str = "monta-a800-2x8"
    nics_per_node: list[int] = field(default_factory=lambda: [4, 8])


def validate_monta(cfg: DictConfig) -> None:
    """The monta section's checks a type cannot express; ConfigError naming the key."""
    m = cfg.monta
    require_profile(m.hardware, "monta.hardware")
    require(m.chunk_overhead_us >= 0, "monta.chunk_overhead_us", f"must be >= 0, got {m.chunk_overhead_us}")
    require_at_least(m, "monta", 1, ("world_size", "bytes_per_rank", "d_model", "iters"))
    require_at_least(m, "monta", 0, ("warmup_iters",))
    for key in ("tensor_parallel", "chunks", "nics_per_node"):
        require(len(m[key]) > 0 and min(m[key]) >= 1, f"monta.{key}", f"must list values >= 1, got {list(m[key])}")
    bad = [t for t in m.tensor_parallel if m.world_size % t]
    require(not bad, "monta.tensor_parallel", f"values must divide monta.world_size={m.world_size}, got {bad}")


register_section("monta", MontaConfig, validate_monta)
