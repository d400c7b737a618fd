"""MoNTA's config section ``monta`` (experiments/monta_a2a.py measured, experiments/monta.py
simulated), registered with the schema (moe_core.schema.sections)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from moe_core.comm.workloads import ELEMENT_BYTES
from moe_core.dispatch import tensor_parallel_dispatchers
from moe_core.papers.monta.performance_model import DEFAULT_CHUNK_OVERHEAD_S, admissible_chunk_counts
from moe_core.schema.points import Unstated, register_unstated
from moe_core.schema.sections import register_section, require, require_at_least, require_positive, require_profile

EXPERTS = 2  # "2x70B" [ABS]: the experts of every MoNTA point

# Parameters the paper leaves unstated that its simulated studies depend on: config key -> the other
# ends of the plausible range (moe_core.schema.points.unstated_variants runs each). The NIC count per node:
# chosen 4 x 200 Gb/s, from the abstract's 8x all-to-all gain at tp 8 and 13% iteration gain, which
# both need the pipelined exchange to be all-to-all bound (configs/hardware/monta-a800-2x8.yaml's
# header has the arithmetic); 8 x 200 Gb/s, the top of what A800 nodes ship with, is the other end.
MONTA_UNSTATED = register_unstated(
    "monta",
    Unstated(
        "hardware.nics_per_node",
        chosen=4,
        low=4,
        high=8,
        evidence="4 x 200 Gb/s from the abstract's 8x all-to-all and 13% iteration gains (monta-a800-2x8.yaml); "
        "8, the most A800 nodes ship with",
    ),
)


@dataclass
class MontaConfig:
    """MoNTA's performance model and its experiments.

    * Measured exchange (experiments/monta_a2a.py): on ``world_size`` ranks, for every
      ``tensor_parallel`` value t (ep = world_size / t, one expert per expert-parallel rank), a rank's
      dispatched buffer of ``bytes_per_rank`` bytes (float32, ``d_model`` wide) moves along every
      dispatch path, and MoNTA's along every count of ``chunks`` that divides its slots.
    * Measured training steps (experiments/train_step.py): the measured sweep's largest world size at
      ``measured_tensor_parallel``, two experts, one run per ``measured_dispatch``.
    * Simulated at MoNTA's scale (moe_core/papers/monta/sweeps.py): the paper's model
      (``overrides``) on ``hardware``, every dispatch at every ``sim_tensor_parallel`` (those at the
      largest again at the other end of the unstated NIC count, ``MONTA_UNSTATED``), MoNTA at every
      ``sim_chunks``, every (tp, ep, dp) layout of the strategy ranking whose tp is simulated, and the
      flat vs hierarchical all-to-all on clusters of ``hierarchical_nodes`` nodes.
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
    measured_tensor_parallel: int = 2
    measured_dispatch: list[str] = field(default_factory=lambda: ["duplicate", "drop-gather", "monta"])
    hardware: str = "monta-a800-2x8"
    sim_tensor_parallel: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    sim_chunks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    hierarchical_nodes: list[int] = field(default_factory=lambda: [2, 4, 8, 16])
    device_memory_GB: float = 80.0  # A800 80 GB [spec]: what the strategy ranking's layouts must fit in
    bytes_per_param: int = 16  # mixed-precision Adam: bf16 weight + bf16 gradient + fp32 master, m, v
    overrides: list[str] = field(default_factory=list)  # the simulated model


def exchange_buffer_shape(m: DictConfig, tp: int) -> tuple[int, int]:
    """(blocks, rows per block) of a rank's buffer in the measured exchange at tensor-parallel size
    ``tp``: one block per expert-parallel rank, ``bytes_per_rank`` in float32 rows of ``d_model``."""
    blocks = m.world_size // tp
    return blocks, m.bytes_per_rank // (ELEMENT_BYTES * m.d_model * blocks)


def validate_monta(cfg: DictConfig) -> None:
    """The monta section's checks a type cannot express; ConfigError naming the key."""
    m = cfg.monta
    require_profile(m.hardware, "monta.hardware")
    require_at_least(m, "monta", 0, ("chunk_overhead_us", "warmup_iters"))
    require_at_least(m, "monta", 1, ("world_size", "bytes_per_rank", "d_model", "iters"))
    for key in ("tensor_parallel", "chunks"):
        require(len(m[key]) > 0 and min(m[key]) >= 1, f"monta.{key}", f"must list values >= 1, got {list(m[key])}")
    for key in ("sim_tensor_parallel", "sim_chunks", "hierarchical_nodes"):  # empty: not simulated
        require(min(m[key], default=1) >= 1, f"monta.{key}", f"values must be >= 1, got {list(m[key])}")
    allowed = tensor_parallel_dispatchers()
    unknown = [d for d in m.measured_dispatch if d not in allowed]
    require(not unknown, "monta.measured_dispatch", f"unknown dispatches {unknown}; expected {sorted(allowed)}")
    require_positive(m, "monta", ("device_memory_GB",))
    require(m.bytes_per_param >= 1, "monta.bytes_per_param", f"must be >= 1, got {m.bytes_per_param}")
    bad = [t for t in m.tensor_parallel if m.world_size % t]
    require(not bad, "monta.tensor_parallel", f"values must divide monta.world_size={m.world_size}, got {bad}")
    for tp in m.tensor_parallel:
        rows = exchange_buffer_shape(m, tp)[1]
        require(
            rows >= tp and rows % tp == 0,
            "monta.bytes_per_rank",
            f"{m.bytes_per_rank} bytes give {rows} rows of d_model={m.d_model} per block at tp {tp}, "
            "which tp must divide",
        )
        _validate_chunks(m, tp, rows)
    _validate_measured_layout(cfg)


def _validate_chunks(m: DictConfig, tp: int, rows: int) -> None:
    """Every chunk count splits a tensor-parallel rank's rows evenly (one that does not would be left out)."""
    if tp == 1:
        return
    admissible = admissible_chunk_counts(rows, tp)
    bad = [n for n in m.chunks if n not in admissible]
    require(
        not bad,
        "monta.chunks",
        f"{bad} do not divide the {rows // tp} rows a rank sends at monta.tensor_parallel={tp}; use divisors of it",
    )


def _validate_measured_layout(cfg: DictConfig) -> None:
    """The measured training steps: EXPERTS expert-parallel ranks x measured_tensor_parallel fill the
    measured sweep's largest world size (a layout that does not would leave the points out)."""
    m, ws = cfg.monta, max(cfg.sweep.world_size, default=1)
    tp = m.measured_tensor_parallel
    if not m.measured_dispatch:  # no measured training steps
        return
    require(
        tp >= 2 and ws % (tp * EXPERTS) == 0,
        "monta.measured_tensor_parallel",
        f"must be >= 2 with {EXPERTS} experts x {tp} dividing the measured sweep's largest world size {ws}; "
        f"got {tp} (or set monta.measured_dispatch=[] to measure no MoNTA steps)",
    )


register_section("monta", MontaConfig, validate_monta)
