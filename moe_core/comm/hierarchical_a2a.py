"""Hierarchical (2D) all-to-all with equal splits, as Tutel's 2DH and DeepSpeed's hierarchical all-to-all.

A flat all-to-all over a group of p ranks on N nodes sends p - 1 blocks from every rank, most of
them small messages over the inter-node network. The hierarchical exchange trades that for two
phases (the algorithm moe_core.sim.topology ``Cluster.hierarchical_all_to_all`` models):

1. inside each node, among the group's m members there: the member with local index l collects
   everything bound for local index l on any node (m - 1 intra-node messages per rank);
2. across nodes, among the members with the same local index: one message per node pair carries
   all of a node's data for that destination (N - 1 inter-node messages per rank, each m times
   larger than a flat block).

The result is bitwise what ``dist.all_to_all_single`` over the whole group returns: data is only
moved, never combined.

Layout assumption: group members are ordered by global rank (``dist.new_group`` sorts its ranks,
and every row of ``Layout.groups`` is increasing), and a node is ``devices_per_node`` consecutive
global ranks. Sorting by global rank therefore lists the group's members node by node, so with m
members on each node, group index i is (node i // m, local i % m), where "node" counts the group's
nodes in order and "local" counts its members on that node. This holds for strided groups too:
ranks [0, 2, 4, 6] with devices_per_node=4 are nodes {0, 2} and {4, 6}, group index 3 = rank 6 is
(node 1, local 1). Unlike the simulator, the group need not fill its nodes, only hold equally many
members on each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class HierarchicalGroups:
    """This rank's two subgroups of one group spanning several nodes, and its place in them."""

    intra: dist.ProcessGroup  # the group's members on this rank's node; group rank = local index
    inter: dist.ProcessGroup  # the group's members with this rank's local index; group rank = node index
    nodes: int  # nodes the group spans
    members_per_node: int  # the group's members on each of those nodes
    node_index: int  # this rank's node among the group's nodes (0 .. nodes - 1)
    local_index: int  # this rank's index among the group's members on its node

    @property
    def size(self) -> int:
        """Ranks in the whole group: the flat all-to-all's group size."""
        return self.nodes * self.members_per_node


def node_grid(ranks: list[int], devices_per_node: int) -> list[list[int]]:
    """The group's global ranks as a (nodes, members_per_node) grid: row = node, column = local index.

    Rows are the intra-node subgroups, columns the inter-node ones, and reading the grid row by row
    gives the ranks sorted, i.e. in group-rank order. ValueError when the group's nodes hold
    different numbers of its members, which the 2D exchange cannot split evenly.
    """
    ranks = sorted(int(r) for r in ranks)
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(r // devices_per_node, []).append(r)
    counts = {node: len(members) for node, members in by_node.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"hierarchical all-to-all needs equally many members of a group on each of its nodes; group "
            f"{ranks} has {counts} members per node (node: members) with devices_per_node={devices_per_node}"
        )
    return list(by_node.values())  # dicts keep insertion order: nodes ascending


def hierarchical_groups(
    group_ranks: list[list[int]], devices_per_node: int, timeout: timedelta
) -> HierarchicalGroups | None:
    """Create the intra- and inter-node subgroups of every group along one mesh axis (collective).

    Args:
        group_ranks: all groups of the axis as lists of global ranks, e.g. ``Layout.groups("ep")``;
            together they must hold every rank of the world once. Every rank passes the same list,
            since ``dist.new_group`` is collective: every rank creates every subgroup, in one order.
        devices_per_node: consecutive global ranks per node.
        timeout: the collective timeout of the new subgroups (they otherwise default to 30 minutes).

    Returns:
        The calling rank's subgroups, or None when its group lies on one node (the flat
        all-to-all is then already intra-node). Raises ValueError on every rank, before creating
        any group, when ``group_ranks`` is not a partition of the world or a group holds unequal
        numbers of members on its nodes.
    """
    grids = [node_grid(ranks, devices_per_node) for ranks in group_ranks]
    members = sorted(r for grid in grids for row in grid for r in row)
    if members != list(range(dist.get_world_size())):
        raise ValueError(
            f"group_ranks must hold every rank of the world ({dist.get_world_size()} ranks) exactly once, "
            f"got {[list(ranks) for ranks in group_ranks]}"
        )
    rank = dist.get_rank()
    mine = None
    for grid in grids:
        if len(grid) == 1:  # one node: no subgroups, the flat exchange is used
            continue
        intra = [dist.new_group(row, timeout=timeout) for row in grid]
        inter = [dist.new_group(list(column), timeout=timeout) for column in zip(*grid)]
        for node, row in enumerate(grid):
            if rank in row:
                local = row.index(rank)
                mine = HierarchicalGroups(intra[node], inter[local], len(grid), len(row), node, local)
    return mine


def hierarchical_all_to_all_single(output: torch.Tensor, input: torch.Tensor, groups: HierarchicalGroups) -> None:
    """Equal-split all-to-all over the group ``groups`` was made for, in two phases; writes ``output``.

    Same contract as ``dist.all_to_all_single(output, input, group=...)`` without splits: ``input``
    is ``groups.size`` equal blocks along dim 0, block j for group rank j; ``output`` (same shape)
    receives block i from group rank i. Group rank i = (node i // m, local i % m), see the module
    docstring. The re-layout that makes the result flat-ordered is done before phase 2, so phase 2
    receives straight into ``output``.
    """
    nodes, local = groups.nodes, groups.members_per_node
    if input.shape != output.shape or input.shape[0] % groups.size:
        raise ValueError(
            f"input and output must have the same shape with dim 0 divisible by the group size {groups.size}, "
            f"got {tuple(input.shape)} and {tuple(output.shape)}"
        )
    blocks = input.reshape(nodes, local, -1, *input.shape[1:])  # (nodes, local, rows, ...): [dst node, dst local]

    # Phase 1, intra-node: send local l' everything bound for local l' on any node.
    send = blocks.transpose(0, 1).contiguous()  # (local, nodes, rows, ...): [dst local, dst node]
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=groups.intra)  # (local, nodes, rows, ...): [src local, dst node]

    # Phase 2, inter-node: send node n2 all this node's blocks for (n2, my local index), ordered by
    # source local index, so that the blocks arrive as (src node, src local) = group-rank order.
    send = received.transpose(0, 1).contiguous()  # (nodes, local, rows, ...): [dst node, src local]
    dist.all_to_all_single(output, send.view(output.shape), group=groups.inter)  # [src node, src local]
