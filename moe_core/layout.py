"""Named-axis process layout: the mesh a run's ranks form, one name per axis.

A layout is a mesh shape with a name per axis, outermost first. Ranks are numbered row-major (the
last axis varies fastest), as ``torch.distributed.device_mesh`` numbers them, so the layout alone
says which ranks form a group along any axis. Both executors read it: the measured one builds its
``DeviceMesh`` and process groups from it (moe_core.parallel), the simulator takes its groups of
ranks from it (moe_core.sim.step).

The axes in use:

* ``dp``: data parallel, replicas of the same experts, each on its own data;
* ``ep``: expert parallel, the ranks that hold all experts between them and exchange tokens by
  all-to-all: rank r = dp_index * expert_parallel + ep_index.

A parallelism that splits ranks further adds an axis (e.g. a tensor-parallel ``tp``); code that
reads ``dp`` and ``ep`` is unchanged, and an axis a layout lacks has size 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class LayoutError(ValueError):
    """A layout that cannot be built; the message names the config key to change."""


@dataclass(frozen=True)
class Layout:
    """Mesh axes ``(name, size)`` outermost first, and the experts the ``ep`` axis shares out."""

    axes: tuple[tuple[str, int], ...]
    num_experts: int

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
    def experts_per_rank(self) -> int:
        return self.num_experts // self.expert_parallel

    def groups(self, axis: str) -> np.ndarray:
        """(groups, size of ``axis``) ranks: each row the ranks that differ only along ``axis``."""
        ranks = np.arange(self.world_size).reshape(self.shape)
        if axis not in self.names:
            return ranks.reshape(-1, 1)
        return np.moveaxis(ranks, self.names.index(axis), -1).reshape(-1, self.size(axis))


def layout_error(world_size: int, num_experts: int, experts_per_rank: int) -> str | None:
    """Why (world_size, num_experts, experts_per_rank) is no data x expert layout, or None."""
    if world_size < 1:
        return f"config key 'parallel.world_size': must be >= 1, got {world_size}"
    if experts_per_rank < 1 or num_experts % experts_per_rank:
        return f"config key 'moe.experts_per_rank': must divide moe.num_experts={num_experts}, got {experts_per_rank}"
    ep = num_experts // experts_per_rank
    if world_size % ep:
        return (
            f"config key 'parallel.world_size': the expert-parallel size num_experts/experts_per_rank = "
            f"{num_experts}/{experts_per_rank} = {ep} must divide world_size={world_size}; use "
            f"experts_per_rank={max(1, num_experts // world_size)} or a world size that is a multiple of {ep}"
        )
    return None


def expert_layout(world_size: int, num_experts: int, experts_per_rank: int) -> Layout:
    """The ("dp", "ep") layout with ``experts_per_rank`` experts per rank; LayoutError if impossible."""
    error = layout_error(world_size, num_experts, experts_per_rank)
    if error:
        raise LayoutError(error)
    ep = num_experts // experts_per_rank
    return Layout((("dp", world_size // ep), ("ep", ep)), num_experts)


def layout_of(cfg) -> Layout:
    """The layout a config asks for (``parallel.world_size``, ``moe.num_experts``, ``moe.experts_per_rank``)."""
    return expert_layout(cfg.parallel.world_size, cfg.moe.num_experts, cfg.moe.experts_per_rank)
