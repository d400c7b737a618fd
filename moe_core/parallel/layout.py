"""Named-axis process layout: the mesh a run's ranks form, one name per axis.

A layout is a mesh shape with a name per axis, outermost first. Ranks are numbered row-major (the
last axis varies fastest), as ``torch.distributed.device_mesh`` numbers them, so the layout alone
says which ranks form a group along any axis. Both executors read it: the measured one builds its
``DeviceMesh`` and process groups from it (moe_core.parallel.parallelize), the simulator takes its groups of
ranks from it (moe_core.sim.step).

The axes in use:

* ``dp``: data parallel, replicas of the same experts, each on its own data;
* ``ep``: expert parallel, the ranks that hold all experts between them and exchange tokens by
  all-to-all;
* ``tp``: tensor parallel (present when ``parallel.tensor_parallel`` > 1), the innermost axis: ranks
  that hold the same tokens and split every weight matrix between them (moe_core.parallel.tensor_parallel),
  so rank r = (dp_index * expert_parallel + ep_index) * tensor_parallel + tp_index. Innermost
  means consecutive ranks, i.e. one node (NVLink) per tensor-parallel group, as Megatron and
  DeepSpeed place it; the expert all-to-all then crosses nodes with stride ``tensor_parallel``.
* ``row``, ``col``: the tensor axes of a 3D tensor-parallel grid (moe_core.parallel.grid; present when
  ``parallel.grid.row`` or ``col`` > 1), innermost, in place of ``tp``. Their ranks hold the same
  tokens and split the dense linear layers; the grid's ``depth`` axis splits the data replicas
  (dp x ep, each its own tokens) further: rank r = (batch_index * row + row_index) * col +
  col_index with batch_index = dp_index * expert_parallel + ep_index = data_index * depth +
  depth_index. Experts stay whole: the expert all-to-all runs between the ranks of one (row, col)
  position, with stride row x col, and every position of a block exchanges its own copy.

A parallelism that splits ranks further adds an axis; code that reads ``dp``, ``ep`` and ``tp`` is
unchanged, and an axis a layout lacks has size 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moe_core.parallel.grid import Grid

NO_GRID = Grid()  # no tensor axes of a 3D grid


class LayoutError(ValueError):
    """A layout that cannot be built; the message names the config key to change."""


@dataclass(frozen=True)
class Layout:
    """Mesh axes ``(name, size)`` outermost first, and the experts the ``ep`` axis shares out."""

    axes: tuple[tuple[str, int], ...]
    num_experts: int
    depth: int = 1  # the grid's depth axis, which splits the data replicas (moe_core.parallel.grid)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    def size(self, axis: str) -> int:
        """The size of ``axis`` (1 for an axis this layout does not have)."""
        return dict(self.axes).get(axis, 1)

    @property
    def expert_parallel(self) -> int:
        return self.size("ep")

    @property
    def data_parallel(self) -> int:
        return self.size("dp")

    @property
    def tensor_parallel(self) -> int:
        return self.size("tp")

    @property
    def token_replicas(self) -> int:
        """Ranks that hold the same tokens: a "tp" group, or a grid's (row x col) block."""
        return self.tensor_parallel * self.size("row") * self.size("col")

    @property
    def data_replicas(self) -> int:
        """Ranks that train on different tokens (dp x ep): the tensor-parallel ranks of a group
        share theirs. Gradients are averaged over this many replicas."""
        return self.world_size // self.token_replicas

    @property
    def grid(self) -> Grid:
        """The 3D tensor-parallel grid (data x depth x row x col; all of it data when there is none)."""
        row, col = self.size("row"), self.size("col")
        return Grid(self.world_size // (self.depth * row * col), self.depth, row, col)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.expert_parallel

    def groups(self, axis: str) -> np.ndarray:
        """(groups, size of ``axis``) ranks: each row the ranks that differ only along ``axis``
        (a mesh axis, or the grid's "data" and "depth")."""
        if axis in ("data", "depth"):
            return self.grid.groups(axis)
        ranks = np.arange(self.world_size).reshape(self.shape)
        if axis not in self.names:
            return ranks.reshape(-1, 1)
        return np.moveaxis(ranks, self.names.index(axis), -1).reshape(-1, self.size(axis))

    def replica_groups(self) -> np.ndarray:
        """(token replicas, data replicas) ranks: each row the ranks with the same position in their
        token-sharing block ("tp" group or grid block), which hold the same shard of every
        tensor-parallel weight and each their own tokens: what dense gradients are summed over."""
        return np.arange(self.world_size).reshape(-1, self.token_replicas).T

    def gradient_groups(self, group: str) -> np.ndarray:
        """The rank groups a gradient of ``group`` (moe_core.schedule.plan.GRADIENT_GROUPS) is summed over."""
        if group == "dense":
            return self.replica_groups()
        if group == "expert":
            return self.groups("dp")
        if group == "data":
            return self.groups("data")
        raise ValueError(f"unknown gradient group {group!r}")


def layout_error(
    world_size: int, num_experts: int, experts_per_rank: int, tensor_parallel: int = 1, grid: Grid = NO_GRID
) -> str | None:
    """Why (world_size, num_experts, experts_per_rank, tensor_parallel, grid's depth x row x col) is no
    layout, or None. ``grid.data`` is ignored: the data axis is what is left."""
    if world_size < 1:
        return f"config key 'parallel.world_size': must be >= 1, got {world_size}"
    if tensor_parallel < 1 or world_size % tensor_parallel:
        return (
            f"config key 'parallel.tensor_parallel': must be >= 1 and divide parallel.world_size={world_size}, "
            f"got {tensor_parallel}"
        )
    tensor = grid.depth * grid.row * grid.col
    if min(grid.depth, grid.row, grid.col) < 1 or world_size % tensor:
        return (
            f"config key 'parallel.grid': depth x row x col = {grid.depth} x {grid.row} x {grid.col} must divide "
            f"parallel.world_size={world_size} (the data axis is the rest)"
        )
    if tensor_parallel > 1 and tensor > 1:
        return (
            "config key 'parallel.tensor_parallel': Megatron tensor parallelism and the 3D grid exclude each "
            "other; set parallel.tensor_parallel=1 or parallel.grid to 1 x 1 x 1 (the grid with row=t is "
            "Megatron's split)"
        )
    if experts_per_rank < 1 or num_experts % experts_per_rank:
        return f"config key 'moe.experts_per_rank': must divide moe.num_experts={num_experts}, got {experts_per_rank}"
    ep = num_experts // experts_per_rank
    replicas = world_size // (tensor_parallel * grid.row * grid.col)
    if replicas % ep:
        return (
            f"config key 'parallel.world_size': the expert-parallel size num_experts/experts_per_rank = "
            f"{num_experts}/{experts_per_rank} = {ep} times parallel.tensor_parallel={tensor_parallel} "
            f"(or the grid's row x col = {grid.row * grid.col}) must divide world_size={world_size}; use "
            f"experts_per_rank={num_experts // math.gcd(num_experts, replicas)} (the most expert parallelism "
            f"that fits) or a world size that is a multiple of "
            f"{ep * tensor_parallel * grid.row * grid.col}"
        )
    return None


def expert_layout(
    world_size: int, num_experts: int, experts_per_rank: int, tensor_parallel: int = 1, grid: Grid = NO_GRID
) -> Layout:
    """The ("dp", "ep"[, "tp" | "row", "col"]) layout with ``experts_per_rank`` experts per
    expert-parallel rank and ``grid``'s tensor axes; LayoutError if impossible. The "tp", "row" and
    "col" axes exist only when larger than 1."""
    error = layout_error(world_size, num_experts, experts_per_rank, tensor_parallel, grid)
    if error:
        raise LayoutError(error)
    ep = num_experts // experts_per_rank
    inner = tuple((name, size) for name, size in (("tp", tensor_parallel), ("row", grid.row), ("col", grid.col)))
    inner = tuple(axis for axis in inner if axis[1] > 1)
    replicas = world_size // math.prod(size for _, size in inner)
    return Layout((("dp", replicas // ep), ("ep", ep), *inner), num_experts, depth=grid.depth)


def grid_config(cfg) -> Grid:
    """The grid's tensor axes a config asks for (``parallel.grid``; data is the rest)."""
    g = cfg.parallel.grid
    return Grid(1, g.depth, g.row, g.col)


def layout_of(cfg) -> Layout:
    """The layout a config asks for (``parallel.world_size``, ``parallel.tensor_parallel``,
    ``parallel.grid``, ``moe.num_experts``, ``moe.experts_per_rank``)."""
    return expert_layout(
        cfg.parallel.world_size,
        cfg.moe.num_experts,
        cfg.moe.experts_per_rank,
        cfg.parallel.tensor_parallel,
        grid_config(cfg),
    )


def one_dimensional_refusal(cfg, mechanism: str) -> str | None:
    """Why ``mechanism``, built for whole experts on a one-dimensional expert-parallel layout, cannot
    run on ``cfg``'s (tensor parallelism or a 3D grid); None where it can."""
    if cfg.parallel.tensor_parallel > 1:
        return f"{mechanism} is not supported with tensor parallelism; use parallel.tensor_parallel=1"
    if not grid_config(cfg).is_trivial:
        return f"{mechanism} is not supported on the 3D grid yet; use parallel.grid's default 1 x 1 x 1"
    return None
