"""The dispatchers of an expert-parallel group whose ranks each hold their own tokens.

* :class:`Capacity`: equal-split all-to-all of (E, C, M) buffers (GShard, DeepSpeed, Tutel): fixed
  bytes whatever the skew; tokens beyond an expert's capacity C are dropped;
* :class:`Hierarchical`: the same buffers through the two-phase all-to-all
  (moe_core.comm.hierarchical_a2a), inside the nodes and then between same-local-rank peers;
* :class:`Dropless`: all-to-all(v) of exactly the routed tokens, after an all-to-all of the
  per-expert counts (MegaBlocks, Megatron's alltoall dispatcher): nothing dropped, but a hot
  expert's rank receives more than its share;
* :class:`AllGather`: every rank all-gathers the group's tokens, each token once whatever its top-k,
  and keeps those routed to its experts; the combine reduce-scatters one row per token (Megatron's
  allgather dispatcher).
"""

from __future__ import annotations

import numpy as np

from moe_core.dispatch.base import Collective, Dispatcher, StudyGroups, capacity_rows, run_expert
from moe_core.parallel.layout import grid_config


class Capacity(Dispatcher):
    """Its training step is the base class's: the library's all-to-all of the capacity buffers."""

    name = "capacity"

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        return _there_and_back(workload["buffer"], groups[self.study_groups[0]], groups.timer, expert)

    def routed(self, groups, workload):
        return capacity_rows(workload["buffer"], workload["capacity"])

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Every expert's ``capacity`` slots to its rank and back, full or not: the same bytes
        whatever the routing."""
        world = counts.shape[0]
        slots = np.full((world, world), float(capacity * row_bytes))  # a full buffer block to every rank
        return [Collective("all_to_all", slots, self.route)] * 2


class Hierarchical(Capacity):
    name = "hierarchical"
    route = "two_phase"
    study_groups = ("two_phase",)

    def runs_on(self, world: int, hw) -> bool:
        """Across nodes of a cluster: within one node it is the flat all-to-all, and a torus has no
        nodes to go between."""
        return hw.topology != "torus2d" and world > hw.devices_per_node

    def refusal(self, cfg) -> str | None:
        """Two phases need equal splits and the flat layout's nodes."""
        if not grid_config(cfg).is_trivial:
            return "the 3D grid runs the flat all-to-all only; use moe.dispatcher=capacity"
        return None


class _RoutedRows(Dispatcher):
    """A dispatcher that moves exactly the routed tokens: nothing dropped, and a rank's experts get
    every row routed to them (its tokens are sorted by expert, ``counts[rank, e]`` for expert e)."""

    drops = False

    def routed(self, groups, workload):
        import torch

        tokens, counts = workload["tokens"], workload["counts"][groups.rank]
        experts = np.repeat(np.arange(len(counts)), counts)
        return tokens, torch.from_numpy(experts).to(tokens.device)


class Dropless(_RoutedRows):
    """Its training step routes without capacity, through the base class's flat all-to-all(v)."""

    name = "dropless"

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """All-to-all of the per-expert counts, then all-to-all(v) of the tokens and back."""
        import torch
        import torch.distributed as dist

        from moe_core.comm.all_to_all import all_to_all

        tokens, counts = workload["tokens"], workload["counts"]
        send_counts = torch.tensor(counts[groups.rank], dtype=torch.int64, device=tokens.device)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=groups["flat"])
        # NOTE: host sync, as every dropless dispatch has
        send_splits, recv_splits = counts[groups.rank].tolist(), recv_counts.tolist()
        received = all_to_all(tokens, recv_splits, send_splits, groups["flat"], groups.timer, "dispatch")
        return all_to_all(
            run_expert(expert, received), send_splits, recv_splits, groups["flat"], groups.timer, "combine"
        )

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Exactly the routed rows there and back (the per-expert counts' all-to-all, 8 bytes an
        expert, is left out)."""
        routed = counts * float(row_bytes)  # (src, dst) bytes: expert e on rank e
        return [Collective("all_to_all", routed), Collective("all_to_all", routed.T)]


class AllGather(_RoutedRows):
    name = "allgather"

    def refusal(self, cfg) -> str | None:
        return "it is timed by the dispatcher study (experiments/dispatchers.py), not run in a training step"

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """All-gather every rank's tokens (equal rows: padded to the largest rank), keep this rank's
        expert's, reduce-scatter the outputs back. The study routes top-1, so a rank's rows are its
        tokens and each crosses once; a top-k round trip would gather the same rows with each token's
        routing map, and combine the weighted sum of its k expert outputs in the reduce-scatter."""
        import torch

        from moe_core.comm.all_to_all import gather_rows, scatter_rows

        tokens, counts = workload["tokens"], workload["counts"]
        rows = int(counts.sum(axis=1).max())
        padded = torch.cat([tokens, tokens.new_zeros(rows - tokens.shape[0], tokens.shape[1])])
        gathered = gather_rows(padded, groups["flat"])
        mine = _rows_for_expert(counts, groups.rank, rows, tokens.device)
        received = gathered[mine]  # the tokens routed to this rank's expert
        outputs = torch.zeros_like(gathered).index_copy(0, mine, run_expert(expert, received))
        return scatter_rows(outputs, groups["flat"])[: tokens.shape[0]]

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Every rank's tokens, padded to the largest rank's, to every other rank, and one output row
        per token back the same way: world times the tokens, whatever the routing and the top-k (a
        token is gathered once, not once per choice, as Megatron-Core's MoEAllGatherTokenDispatcher
        does; its routing map and probabilities, E x 5 bytes a token, are left out as the dropless
        path's counts are)."""
        world, choices = counts.shape[0], counts.sum(axis=1)
        if (choices % top_k).any():
            raise ValueError(f"a source's choices {choices.tolist()} are not whole tokens of top_k={top_k} choices")
        chunk = np.full((world, world), float((choices // top_k).max() * row_bytes))
        return [Collective("all_gather", chunk), Collective("reduce_scatter", chunk)]


def _there_and_back(buffer, group, timer, expert=None):
    """An equal-split all-to-all of ``buffer`` over ``group``, ``expert`` on what arrived, and the same
    all-to-all back; what came back."""
    from moe_core.comm.all_to_all import all_to_all

    received = all_to_all(buffer, None, None, group, timer, "dispatch")
    return all_to_all(run_expert(expert, received), None, None, group, timer, "combine")


def _rows_for_expert(counts: np.ndarray, expert: int, rows: int, device):
    """Rows of the gathered (world * rows) buffer routed to ``expert``: each rank's tokens are sorted
    by expert, so rank r's block for e starts at r * rows + counts[r, :e].sum()."""
    import torch

    starts = np.arange(counts.shape[0]) * rows + counts[:, :expert].sum(axis=1)
    index = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, counts[:, expert])])
    return torch.from_numpy(index).to(device)
