"""What every token dispatcher is: one exchange of an MoE layer's tokens with their experts' ranks.

A dispatcher is one class (as Megatron-Core's ``MoETokenDispatcher`` family and torchtitan's token
dispatchers are): it says which ranks it needs, moves the tokens on torch.distributed (measured),
states the bytes its round trip moves between ranks for a routing (:meth:`Dispatcher.traffic`, a
list of :class:`Collective`: the one description both the network model prices, simulated, and the
measured cells count as their bytes moved and bus bandwidth), and, for the tensor-parallel ones, how
many pipelined chunks a training step's plan runs it in (the plan's exchange object,
moe_core.dispatch.step). Both executors and the dispatcher study (moe_core.dispatch_study) read the
same class, so a new exchange is one class and one registry line (moe_core.dispatch).

The measured methods import torch inside: the registry is read when a config is validated, which
must not pay for importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class StudyGroups:
    """One rank's process groups for the dispatcher study (experiments/dispatchers.py): ``flat``, one
    expert per rank over all ranks; ``hierarchical``, its two-phase groups (None within one node);
    ``ep`` and ``tp``, the tensor-parallel layout's groups (``tp`` ranks share their tokens)."""

    rank: int
    world: int
    tp: int
    flat: Any
    hierarchical: Any
    ep: Any
    tp_group: Any
    timer: Any


class Dispatcher:
    """A token exchange: dispatch to the experts' ranks, then combine back.

    * ``name``: its registry key (a config value, a point name, a figure's legend);
    * ``tensor_parallel``: the exchange of a tensor-parallel layout, whose "tp" ranks hold the same
      tokens (it needs the "tp" group, and only exists where experts are split over "tp");
    * ``drops``: capacity-bound, so tokens beyond an expert's capacity are dropped;
    * ``step_keys``: the config keys a training step runs it by (``moe.dispatcher`` sets them,
      moe_core.schema.aliases); None for an exchange only the dispatcher study runs;
    * ``runs_on``: whether it applies to a group of ``world`` ranks of the hardware section ``hw``.
    """

    name: str = ""
    tensor_parallel: bool = False
    drops: bool = True
    step_keys: dict[str, Any] | None = None

    def runs_on(self, world: int, hw) -> bool:
        return True

    # -- measured (torch.distributed) -----------------------------------------------------------
    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """Dispatch the study's ``workload`` (experiments.dispatchers.Paths.workload) to the experts,
        run ``expert`` (a function of the rows an expert received; None: leave them as they are) and
        combine the results back; returns this rank's rows as they came back, in :meth:`routed` order.
        Differentiable, as in a training step: autograd carries the gradient of what came back to the
        rows sent (the study's gate checks both, experiments.dispatchers.Paths.wrong_rows)."""
        raise NotImplementedError

    def routed(self, groups: StudyGroups, workload: dict) -> tuple[Any, Any]:
        """The rows this rank sends and the expert each one goes to, as tensors (rows, experts): what a
        correct round trip brings back, each row as its expert left it."""
        raise NotImplementedError

    def expert_index(self, groups: StudyGroups) -> int:
        """The expert this rank holds in the dispatcher's layout (one expert per expert-parallel rank)."""
        return groups.rank

    # -- the bytes it moves (both executors) -------------------------------------------------------
    def traffic(
        self, counts: np.ndarray, capacity: int, row_bytes: int, study=None, top_k: int = 1
    ) -> list[Collective]:
        """The round trip's collectives in order (dispatch, then combine), each with the bytes every
        rank sends every other: ``counts`` (R, E) choices each of R sources routes to each expert,
        expert e on source e (E = R), each of a source's tokens making ``top_k`` of them (so a source
        holds ``counts[r].sum() / top_k`` tokens), ``capacity`` slots per expert and source, rows of
        ``row_bytes``. A source is a rank; for a tensor-parallel dispatcher, a "tp" group of
        contiguous ranks holding the same tokens, whose size and chunk decision it reads from
        ``study`` (the dispatch_study section)."""
        raise NotImplementedError

    # -- simulated (moe_core.sim) ----------------------------------------------------------------
    def study_transfers(
        self, topo, counts: np.ndarray, capacity: int, row_bytes: int, top_k: int = 1
    ) -> list[tuple[str, Any]]:
        """The round trip's collectives (:meth:`traffic`) on ``topo`` in order, as (kind,
        moe_core.sim.topology.Transfer)."""
        collectives = self.traffic(counts, capacity, row_bytes, top_k=top_k)
        return [t for collective in collectives for t in collective.transfers(topo)]


@dataclass(frozen=True)
class Collective:
    """One collective of a round trip, as the bytes it moves: ``traffic[i, j]``, the bytes rank i
    sends rank j (the diagonal, a rank's rows to itself, moves nothing).

    * ``kind``: ``all_to_all``, or the ring collectives ``all_gather`` and ``reduce_scatter``,
      whose ranks each send every other rank one equal chunk (a ring forwards it in p - 1 steps:
      the same bytes in all);
    * ``two_phase``: an all-to-all run in two phases, inside the nodes and then between
      same-local-rank peers (:func:`two_phase_traffic`): a token for another node's
      other local rank crosses twice, so it moves more bytes than ``traffic`` sums to.
    """

    kind: str
    traffic: np.ndarray
    two_phase: bool = False

    def __post_init__(self):
        object.__setattr__(self, "traffic", np.asarray(self.traffic, dtype=float) * (1 - np.eye(len(self.traffic))))

    def bytes_moved(self, devices_per_node: int) -> float:
        """Bytes sent between ranks, with ranks on nodes of ``devices_per_node``."""
        if not self.two_phase:
            return float(self.traffic.sum())
        group = np.arange(len(self.traffic))
        _, phase1, phase2 = two_phase_traffic(group, group // devices_per_node, self.traffic)
        return float(phase1.sum() + phase2.sum())

    def transfers(self, topo) -> list[tuple[str, Any]]:
        """Its footprint on ``topo`` (ranks 0..p-1 its devices), as (kind, Transfer): one transfer, or
        the two phases'. An equal split (every off-diagonal entry alike) is priced in O(p)."""
        group, p = np.arange(len(self.traffic)), len(self.traffic)
        if self.kind != "all_to_all":
            return [(self.kind, topo.ring(group, p * self.traffic.max(initial=0.0), self.kind))]
        if self.two_phase:
            return [("all_to_all", t) for t in topo.hierarchical_all_to_all(group, self.traffic)]
        off_diagonal = self.traffic[~np.eye(p, dtype=bool)]
        if off_diagonal.size and (off_diagonal == off_diagonal[0]).all():
            return [("all_to_all", topo.uniform_all_to_all(group, p * off_diagonal[0]))]
        return [("all_to_all", topo.all_to_all(group, self.traffic))]


def run_expert(expert, rows):
    """``expert`` on the rows an expert received, or the rows themselves without one."""
    return rows if expert is None else expert(rows)


def capacity_rows(buffer, capacity: int):
    """A capacity buffer's rows and their experts: block e of ``capacity`` rows goes to expert e."""
    import torch

    experts = torch.arange(buffer.shape[0] // capacity, device=buffer.device).repeat_interleave(capacity)
    return buffer, experts


def two_phase_traffic(group: np.ndarray, node: np.ndarray, traffic: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two phases of Tutel's 2DH all-to-all of ``traffic`` (bytes group[i] sends group[j]) over
    members on ``node``: (ordered, phase1, phase2). ``ordered`` is the group as (nodes, m) by (node,
    local index); ``phase1[n, l, l']``, the bytes (n, l) hands (n, l') inside its node; ``phase2[n,
    n2, l']``, the bytes (n, l') sends (n2, l'). ValueError when the nodes hold unequal numbers of
    members. The one statement of what the two phases move: the network model prices it
    (moe_core.sim.topology.Cluster.hierarchical_all_to_all) and the dispatchers count it (here)."""
    traffic = np.asarray(traffic, dtype=float)
    counts = np.bincount(node)
    counts = counts[counts > 0]
    if counts.min() != counts.max():
        raise ValueError(f"hierarchical all-to-all needs equally many group members per node, got {counts}")
    m, n_nodes = int(counts[0]), len(counts)
    order = np.lexsort((group, node))  # group index by (node, rank): row-major (node, local)
    t = traffic[np.ix_(order, order)].reshape(n_nodes, m, n_nodes, m)  # (src node, l, dst node, l')
    phase1 = t.sum(axis=2) * (1 - np.eye(m))[None]  # (n, l, l'): bytes (n, l) hands (n, l')
    phase2 = t.sum(axis=1) * (1 - np.eye(n_nodes))[:, :, None]  # (n, n2, l'): bytes (n, l') sends (n2, l')
    return group[order].reshape(n_nodes, m), phase1, phase2
