"""Named-axis process layout: the mesh a run's ranks form, one name per axis.

A layout is a mesh shape with a name per axis, outermost first. Ranks are numbered row-major (the
last axis varies fastest), as ``torch.distributed.device_mesh`` numbers them, so the layout alone
says which ranks form a group along any axis. Both executors read it: the measured one builds its
``DeviceMesh`` and process groups from it (moe_core.parallel), the simulator takes its groups of
ranks from it (moe_core.sim.step).

The axes in use:

* ``dp``: data parallel, replicas of the same experts, each on its own data;
* ``ep``: expert parallel, the ranks that hold all experts between them and exchange tokens by
  all-to-all;
* ``tp``: tensor parallel (present when ``parallel.tensor_parallel`` > 1), the innermost axis: ranks
  that hold the same tokens and split every weight matrix between them (moe_core.tensor_parallel),
  so rank r = (dp_index * expert_parallel + ep_index) * tensor_parallel + tp_index. Innermost
  means consecutive ranks, i.e. one node (NVLink) per tensor-parallel group, as Megatron and
  DeepSpeed place it; the expert all-to-all then crosses nodes with stride ``tensor_parallel``.

A parallelism that splits ranks further adds an axis; code that reads ``dp``, ``ep`` and ``tp`` is
unchanged, and an axis a layout lacks has size 1.
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
    def tensor_parallel(self) -> int:
        return self.size("tp")

    @property
    def data_replicas(self) -> int:
        """Ranks that train on different tokens (dp x ep): the tensor-parallel ranks of a group
        share theirs. Gradients are averaged over this many replicas."""
        return self.world_size // self.tensor_parallel

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.expert_parallel

    def groups(self, axis: str) -> np.ndarray:
        """(groups, size of ``axis``) ranks: each row the ranks that differ only along ``axis``."""
        ranks = np.arange(self.world_size).reshape(self.shape)
        if axis not in self.names:
            return ranks.reshape(-1, 1)
        return np.moveaxis(ranks, self.names.index(axis), -1).reshape(-1, self.size(axis))

    def groups_sharing(self, axis: str) -> np.ndarray:
        """(size of ``axis``, other ranks) ranks: each row the ranks with the same index along ``axis``
        (for "tp": the ranks that hold the same shard of every tensor-parallel weight)."""
        ranks = np.arange(self.world_size).reshape(self.shape)
        if axis not in self.names:
            return ranks.reshape(1, -1)
        return np.moveaxis(ranks, self.names.index(axis), 0).reshape(self.size(axis), -1)


def layout_error(world_size: int, num_experts: int, experts_per_rank: int, tensor_parallel: int = 1) -> str | None:
    """Why (world_size, num_experts, experts_per_rank, tensor_parallel) is no dp x ep x tp layout, or None."""
    if world_size < 1:
        return f"config key 'parallel.world_size': must be >= 1, got {world_size}"
    if tensor_parallel < 1 or world_size % tensor_parallel:
        return (
            f"config key 'parallel.tensor_parallel': must be >= 1 and divide parallel.world_size={world_size}, "
            f"got {tensor_parallel}"
        )
    if experts_per_rank < 1 or num_experts % experts_per_rank:
        return f"config key 'moe.experts_per_rank': must divide moe.num_experts={num_experts}, got {experts_per_rank}"
    ep = num_experts // experts_per_rank
    replicas = world_size // tensor_parallel
    if replicas % ep:
        return (
            f"config key 'parallel.world_size': the expert-parallel size num_experts/experts_per_rank = "
            f"{num_experts}/{experts_per_rank} = {ep} times parallel.tensor_parallel={tensor_parallel} must divide "
            f"world_size={world_size}; use experts_per_rank={max(1, num_experts // replicas)} or a world size "
            f"that is a multiple of {ep * tensor_parallel}"
        )
    return None


def expert_layout(world_size: int, num_experts: int, experts_per_rank: int, tensor_parallel: int = 1) -> Layout:
    """The ("dp", "ep"[, "tp"]) layout with ``experts_per_rank`` experts per expert-parallel rank;
    LayoutError if impossible. The "tp" axis exists only when ``tensor_parallel`` > 1."""
    error = layout_error(world_size, num_experts, experts_per_rank, tensor_parallel)
    if error:
        raise LayoutError(error)
    ep = num_experts // experts_per_rank
    axes = (("dp", world_size // (ep * tensor_parallel)), ("ep", ep))
    if tensor_parallel > 1:
        axes += (("tp", tensor_parallel),)
    return Layout(axes, num_experts)


def layout_of(cfg) -> Layout:
    """The layout a config asks for (``parallel.world_size``, ``parallel.tensor_parallel``,
    ``moe.num_experts``, ``moe.experts_per_rank``)."""
    return expert_layout(
        cfg.parallel.world_size, cfg.moe.num_experts, cfg.moe.experts_per_rank, cfg.parallel.tensor_parallel
    )
