"""The layout's ``DeviceMesh`` and process groups, and expert sharding applied to a model from outside.

The mesh has the layout's named axes (moe_core.parallel.layout): ("dp", "ep"), plus an innermost "tp" under
tensor parallelism, in row-major order: rank r = (dp_index * expert_parallel + ep_index) *
tensor_parallel + tp_index. Ranks of one "ep" row hold all experts between them
(``experts_per_rank`` each) and exchange tokens by all-to-all; ranks of one "dp" column hold
replicas of the same experts; ranks of one "tp" group hold the same tokens and split the weights
(moe_core.parallel.tensor_parallel). Under a 3D grid (moe_core.parallel.grid) the innermost axes are "row" and "col"
instead of "tp", and the grid's "depth" and "data" groups are made from the layout's ranks
(moe_core.parallel.grid_parallel). Every data replica (dp x ep) trains on its own tokens.

Gradient synchronisation (see moe_core.schedule.policies): dense gradients are summed over the ranks with
the same position in their token-sharing block (all ranks without tensor parallelism), expert
gradients over their "dp" column (the all-to-all backward already summed over the "ep" row), a
grid's depth-sharded weights over its "data" axis (their reduce-scatter already summed over
"depth"), and all are divided by the number of data replicas, which makes the update equal to the
single-process update on the concatenated batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from moe_core.comm.hierarchical_a2a import HierarchicalGroups, hierarchical_groups
from moe_core.model.layer import MoELayer
from moe_core.parallel.grid_parallel import GridGroups, shard_grid
from moe_core.parallel.layout import Layout
from moe_core.parallel.tensor_parallel import shard_tensor_parallel


@dataclass
class ParallelGroups:
    layout: Layout
    mesh: DeviceMesh
    rank: int
    ep_rank: int
    ep_group: object  # all-to-all of tokens
    expert_grad_group: object  # all-reduce of expert gradients ("dp" column)
    dense_grad_group: object  # all-reduce of dense gradients (same "tp" index, its own communicator)
    tp_group: object | None = None  # tensor-parallel activations and dispatch all-gathers; None without "tp"
    tp_rank: int = 0
    grid: GridGroups | None = None  # the 3D grid's groups; None without one
    data_grad_group: object | None = None  # all-reduce of a grid's depth-sharded gradients ("data" axis)
    high_priority_ep: bool = False  # the "ep" groups run on high-priority NCCL streams
    # the "ep" group's two-phase subgroups (moe_core.comm.hierarchical_a2a); None: flat all-to-alls
    ep_hierarchical: HierarchicalGroups | None = None

    @property
    def data_rank(self) -> int:
        """This rank's data replica (dp x ep index): which tokens it trains on."""
        return self.rank // self.layout.token_replicas

    def gradient_group(self, group: str):
        """The process group a gradient of ``group`` (moe_core.schedule.plan.GRADIENT_GROUPS) is summed over."""
        return {"dense": self.dense_grad_group, "expert": self.expert_grad_group, "data": self.data_grad_group}[group]


def build_groups(
    layout: Layout,
    device_type: str,
    timeout_s: float,
    high_priority_ep: bool = False,
    hierarchical_devices_per_node: int | None = None,
) -> ParallelGroups:
    """Create the mesh and process groups; every rank must call this (collective).

    Every group gets the run's collective timeout ``timeout_s``: new groups otherwise default to 30
    minutes whatever the default group has, and a hung peer would stall the run that long.
    ``high_priority_ep``: on NCCL, the "ep" groups (the token all-to-alls) run on high-priority CUDA
    streams, so the GPU schedules their kernels ahead of the gradient all-reduces' (Lina's priority
    rule; moe_core/papers/lina). It has no effect on gloo, whose collectives run on host threads.
    ``hierarchical_devices_per_node``: also create the "ep" groups' intra- and inter-node subgroups
    for the hierarchical all-to-all, on nodes of that many consecutive ranks (none when the
    group lies on one node).
    """
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(f"process group has {dist.get_world_size()} ranks, layout expects {layout.world_size}")
    timeout = timedelta(seconds=timeout_s)
    backend = dist.get_backend()
    options = {name: _group_options(backend, timeout, high_priority_ep and name == "ep") for name in layout.names}
    mesh = init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.names, backend_override=options)
    # A separate communicator for dense gradients, so their asynchronous all-reduces run beside (and
    # contend with) the token all-to-alls instead of queueing behind them on one communicator. Every
    # rank creates every group (new_group is collective) and keeps its own.
    rank = dist.get_rank()
    dense_grad_group = own_group(layout.replica_groups(), rank, timeout)
    has_tp = "tp" in layout.names
    grid, data_grad_group = None, None
    if not layout.grid.is_trivial:
        grid = grid_groups(layout, rank, timeout)
        data_grad_group = own_group(layout.groups("data"), rank, timeout)
    ep_hierarchical = None
    if hierarchical_devices_per_node is not None:
        ep_hierarchical = hierarchical_groups(layout.groups("ep").tolist(), hierarchical_devices_per_node, timeout)
    return ParallelGroups(
        layout,
        mesh,
        rank,
        mesh.get_local_rank("ep"),
        mesh.get_group("ep"),
        mesh.get_group("dp"),
        dense_grad_group,
        tp_group=mesh.get_group("tp") if has_tp else None,
        tp_rank=mesh.get_local_rank("tp") if has_tp else 0,
        grid=grid,
        data_grad_group=data_grad_group,
        high_priority_ep=high_priority_ep,
        ep_hierarchical=ep_hierarchical,
    )


def grid_groups(layout: Layout, rank: int, timeout: timedelta) -> GridGroups:
    """The grid's "depth", "row" and "col" process groups holding ``rank`` (collective), and its
    index along each."""
    index, group = {}, {}
    for axis in ("depth", "row", "col"):
        rows = layout.groups(axis)
        index[axis] = int(np.argwhere(rows == rank)[0, 1])
        group[axis] = own_group(rows, rank, timeout) if layout.grid.size(axis) > 1 else None
    return GridGroups(layout.grid, index, group)


def own_group(groups, rank: int, timeout: timedelta):
    """Create a process group for every row of ``groups`` (rank lists; collective: every rank creates
    every group, in one order) and return the one holding ``rank``."""
    mine = None
    for ranks in groups:
        group = dist.new_group([int(r) for r in ranks], timeout=timeout)
        if rank in ranks:
            mine = group
    return mine


def _group_options(backend: str, timeout: timedelta, high_priority: bool = False):
    """Backend options that carry ``timeout`` (and, on NCCL, the stream priority) into the groups
    DeviceMesh creates."""
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = high_priority
        options._timeout = timeout
        return options
    return torch._C._distributed_c10d.Backend.Options(backend, timeout=timeout)


def local_experts(groups: ParallelGroups) -> tuple[int, int]:
    """(first, count): the experts this rank holds in ``groups``' layout, [first, first + count)."""
    epr = groups.layout.experts_per_rank
    return groups.ep_rank * epr, epr


def parallelize_model(model: torch.nn.Module, groups: ParallelGroups) -> None:
    """Keep only this rank's experts in every MoE layer, split its blocks over "tp"
    (moe_core.parallel.tensor_parallel) or the grid (moe_core.parallel.grid_parallel), and point the layers at their
    data replica."""
    first, count = local_experts(groups)
    for layer in model.modules():
        if isinstance(layer, MoELayer):
            layer.experts.keep(first, count)
            layer.rank = groups.data_rank
    shard_tensor_parallel(model, groups.tp_rank, groups.layout.tensor_parallel, groups.tp_group)
    if groups.grid is not None:
        shard_grid(model, groups.grid)


def is_expert_param(name: str) -> bool:
    return ".experts." in name
