"""What every token dispatcher is: one exchange of an MoE layer's tokens with their experts' ranks.

A dispatcher is one class (as Megatron-Core's ``MoETokenDispatcher`` family and torchtitan's token
dispatchers are), and the one object every part that moves tokens takes:

* the dispatcher study (moe_core.dispatch_study, experiments/dispatchers.py) runs its round trip on
  the process groups it declares (:attr:`Dispatcher.study_groups`, built once from the study's
  layout by moe_core.dispatch.groups) and checks it row by row;
* both executors of a training step run it: the measured one calls :meth:`Dispatcher.all_to_all`
  and :meth:`Dispatcher.exchange_compute_exchange` with the step's policy
  (moe_core.schedule.executor.CommPolicy: its groups, timer and ``blocking`` hook), the simulated one
  :meth:`Dispatcher.simulate` with the step's DAG (moe_core.sim.dag.StepDag);
* the network model prices its bytes (:meth:`Dispatcher.traffic`, a list of :class:`Collective`:
  the one description the simulator prices, ``advise`` ranks and the measured cells count).

``moe.dispatcher`` names the registered one a training step runs (moe_core.dispatch.configured); a
policy that schedules the all-to-all its own way (Lina's micro-ops, Aurora's transmission order)
wraps it (moe_core.dispatch.scheduled). Each dispatcher states what it needs of a step's layout
(:meth:`Dispatcher.refusal`), so config validation refuses what it cannot run. A new exchange is one
class and one registry line (moe_core.dispatch).

The measured methods import torch inside: the registry is read when a config is validated, which
must not pay for importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

Route = Literal["direct", "two_phase", "forwarded"]


@dataclass
class StudyGroups:
    """One rank of the dispatcher study (experiments/dispatchers.py): its rank, the study's world and
    "tp" size, its timer, and the process groups the studied dispatchers declared
    (:attr:`Dispatcher.study_groups`), by name: ``groups["flat"]``."""

    rank: int
    world: int
    tp: int
    timer: Any
    named: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.named[name]


class Dispatcher:
    """A token exchange: dispatch to the experts' ranks, then combine back.

    * ``name``: its registry key (``moe.dispatcher``, a point name, a figure's legend);
    * ``tensor_parallel``: the exchange of a tensor-parallel layout, whose "tp" ranks hold the same
      tokens (it needs the "tp" group, and only exists where experts are split over "tp");
    * ``drops``: capacity-bound, so tokens beyond an expert's capacity are dropped (a training step
      of a dispatcher that does not drop routes without capacity: uneven all-to-all splits);
    * ``route``: how its all-to-alls reach other nodes (:class:`Collective`'s ``route``): a measured
      step of a two-leg route creates the "ep" groups' node subgroups
      (moe_core.parallel.parallelize.build_groups) and the simulated step prices its legs;
    * ``study_groups``: the process groups its study round trip runs on, by the names of
      moe_core.dispatch.groups.STUDY_GROUPS;
    * ``runs_on``: whether the study applies it to a group of ``world`` ranks of the hardware ``hw``.

    The base class's step is the library's all-to-all, whole, each way (flat, or in two phases when
    ``route`` is ``two_phase``): the exchange of every dispatcher that does not say otherwise.
    """

    name: ClassVar[str] = ""
    tensor_parallel: ClassVar[bool] = False
    drops: ClassVar[bool] = True
    route: ClassVar[Route] = "direct"
    # the expert-parallel kernel library's exchange it is (moe_core.sim.ep_kernels.KERNELS), whose model
    # prices its collectives; "" for a collective library's
    kernel: ClassVar[str] = ""
    study_groups: ClassVar[tuple[str, ...]] = ("flat",)

    def runs_on(self, world: int, hw) -> bool:
        return True

    # -- a training step: which instance runs it, and what it needs ----------------------------------
    def for_step(self, cfg) -> Dispatcher:
        """This dispatcher as a training step of ``cfg`` runs it (one that decides a parameter from
        the config, e.g. its chunk count, returns a copy with it set)."""
        return self

    def refusal(self, cfg) -> str | None:
        """Why this dispatcher cannot run a training step of ``cfg`` (None where it can)."""
        return None

    def measured_refusal(self) -> str | None:
        """Why a measured training step cannot run this dispatcher (None where it can): a forwarded
        route's kernels are GPU libraries' (DeepEP), so the simulator alone prices it."""
        if self.route == "forwarded":
            return "a forwarded all-to-all is simulated only (its kernels are DeepEP's, for GPUs)"
        return None

    def micro_ops(self, rows_per_expert: int, row_bytes: int) -> list[tuple[int, int]]:
        """The (start, stop) row ranges of every expert's ``rows_per_expert`` rows that travel as one
        all-to-all each (``row_bytes``: one row for every expert); the whole exchange by default."""
        return [(0, rows_per_expert)]

    # -- a training step, measured (``policy``: the moe_core.schedule.executor.CommPolicy running it) --
    def all_to_all(self, policy, x, output_splits, input_splits, name: str):
        """One all-to-all of ``x``'s rows over the policy's "ep" group (None splits: equal), its time
        in ``<name>.fwd`` / ``<name>.bwd``: flat, or in two phases where the route is ``two_phase``
        and the "ep" group spans nodes (``policy.groups.ep_hierarchical``); never forwarded
        (:meth:`measured_refusal`, which a measured run's config check raises first)."""
        from moe_core.comm.all_to_all import all_to_all

        if reason := self.measured_refusal():
            raise ValueError(f"dispatcher '{self.name}': {reason}")
        groups = policy.groups
        two_phase = self.route == "two_phase" and groups.ep_hierarchical is not None
        group = groups.ep_hierarchical if two_phase else groups.ep_group
        return all_to_all(x, output_splits, input_splits, group, policy.timer, name)

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        """One MoE layer's equal-split exchange of ``buf`` (E*R, M), R = ``rows_per_expert`` rows per
        expert in expert order: dispatch, ``compute(received, rows)`` on the expert weights ``params``,
        combine; returns the experts' outputs in ``buf``'s layout. Every span in which its all-to-alls
        are in flight runs through ``policy.blocking`` (Lina's priority rule schedules around it)."""
        received = policy.all_to_all(buf, None, None, "dispatch_a2a")
        return policy.all_to_all(compute(received, rows_per_expert), None, None, "combine_a2a")

    # -- a training step, simulated (``dag``: the step's DAG under construction) ----------------------
    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        """Append MoE layer ``layer``'s exchange in ``pass_`` to ``dag`` after op(s) ``after``: the
        ``first`` exchange ("dispatch" forward, "combine" backward), the experts (``dag.experts``),
        the ``second``; returns the op the layer's next op waits for. Here one all-to-all each way,
        along the dispatcher's route."""
        sent = dag.all_to_all(f"L{layer}.{first}0.{pass_}", f"{first}_a2a", after, 1, self.route)
        computed = dag.experts(layer, pass_, sent)
        return dag.all_to_all(f"L{layer}.{second}0.{pass_}", f"{second}_a2a", computed, 1, self.route)

    # -- the dispatcher study, measured (torch.distributed) ------------------------------------------
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
    * ``route``: how an all-to-all's bytes reach another node (:data:`ROUTES`): ``direct``, each
      pair's own; ``two_phase``, inside the nodes first and then between same-local-rank peers
      (Tutel's 2DH, :func:`two_phase_traffic`); ``forwarded``, over the network to the sender's
      local-index peer on the destination node, which forwards it inside the node, both legs at
      once (DeepEP's normal kernels, :func:`forwarded_traffic`). The last two move a token for
      another node's other local rank twice, so more bytes than ``traffic`` sums to.
    """

    kind: str
    traffic: np.ndarray
    route: Route = "direct"
    # The expert-parallel kernel that runs an all-to-all (moe_core.sim.ep_kernels.KERNELS), priced by
    # its own model; "" for the collective library's.
    kernel: str = ""
    # A forwarded route that sends a token once per destination node: each source's tokens' bytes (R,)
    # and its choices per token, whence the tokens that reach a node (:func:`forwarded_traffic`).
    token_bytes: np.ndarray | None = None
    top_k: int = 1

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ValueError(f"unknown route {self.route!r}; known: {sorted(ROUTES)}")
        object.__setattr__(self, "traffic", np.asarray(self.traffic, dtype=float) * (1 - np.eye(len(self.traffic))))

    def legs(self, group: np.ndarray, node: np.ndarray) -> tuple[np.ndarray, ...]:
        """The legs (ordered members, first leg, second leg) of its two-leg route over ``group`` on ``node``."""
        if self.route == "forwarded":
            return forwarded_traffic(group, node, self.traffic, self.token_bytes, self.top_k)
        return two_phase_traffic(group, node, self.traffic)

    def bytes_moved(self, devices_per_node: int) -> float:
        """Bytes sent between ranks, with ranks on nodes of ``devices_per_node``."""
        if self.route == "direct":
            return float(self.traffic.sum())
        group = np.arange(len(self.traffic))
        _, first, second = self.legs(group, group // devices_per_node)
        return float(first.sum() + second.sum())

    def transfers(self, topo) -> list[tuple[str, Any]]:
        """Its footprint on ``topo`` (ranks 0..p-1 its devices), as (kind, Transfer): one transfer, or
        the two phases'. An equal split (every off-diagonal entry alike) is priced in O(p)."""
        group, p = np.arange(len(self.traffic)), len(self.traffic)
        if self.kind != "all_to_all":
            return [(self.kind, topo.ring(group, p * self.traffic.max(initial=0.0), self.kind))]
        kind = self.kernel or "all_to_all"  # a kernel's footprint is priced by its model
        if self.route == "two_phase":
            return [(kind, t) for t in topo.hierarchical_all_to_all(group, self.traffic)]
        if self.route == "forwarded":
            return [(kind, topo.relayed_all_to_all(group, self.traffic, self.token_bytes, self.top_k))]
        off_diagonal = self.traffic[~np.eye(p, dtype=bool)]
        if off_diagonal.size and (off_diagonal == off_diagonal[0]).all():
            return [(kind, topo.uniform_all_to_all(group, p * off_diagonal[0]))]
        return [(kind, topo.all_to_all(group, self.traffic))]


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
    ordered, t = _by_node(group, node, traffic)
    n_nodes, m = ordered.shape
    phase1 = t.sum(axis=2) * (1 - np.eye(m))[None]  # (n, l, l'): bytes (n, l) hands (n, l')
    phase2 = t.sum(axis=1) * (1 - np.eye(n_nodes))[:, :, None]  # (n, n2, l'): bytes (n, l') sends (n2, l')
    return ordered, phase1, phase2


def forwarded_traffic(
    group: np.ndarray, node: np.ndarray, traffic: np.ndarray, token_bytes: np.ndarray | None = None, top_k: int = 1
) -> tuple[np.ndarray, ...]:
    """The two legs of a forwarded all-to-all of ``traffic`` over members on ``node``: (ordered,
    network, inside). ``ordered`` as in :func:`two_phase_traffic`; ``network[n, l, n2]``, the bytes
    (n, l) sends its local-index peer (n2, l) on another node; ``inside[n, l, l']``, the bytes (n, l)
    hands (n, l') over the node's fabric: its own rows for that member and the rows it received
    from the network for it. ValueError as :func:`two_phase_traffic`. The network model
    (moe_core.sim.topology.Cluster.relayed_all_to_all) and the byte counts (here) both read it.

    With ``token_bytes`` (each member's tokens' bytes, in group order), ``traffic`` is the bytes of
    the sources' choices, ``top_k`` a token, and a token crosses the network once per destination
    node and the fabric once per destination member, whatever its choices there (DeepEP's normal
    kernels): :func:`distinct_tokens`."""
    ordered, t = _by_node(group, node, traffic)
    n_nodes, m = ordered.shape
    network = t.sum(axis=3) * (1 - np.eye(n_nodes))[:, None, :]  # (n, l, n2): to the peer (n2, l)
    if token_bytes is not None:  # once per node, and once per rank inside it
        tokens = np.asarray(token_bytes, dtype=float)[np.lexsort((group, node))].reshape(n_nodes, m, 1)
        network, t = distinct_tokens(network, tokens, top_k), distinct_tokens(t, tokens[..., None], top_k)
    inside = t.sum(axis=0).transpose(1, 0, 2) * (1 - np.eye(m))[None]  # (n2, l, l'): received and own
    return ordered, network, inside


def distinct_tokens(choices: np.ndarray, tokens: np.ndarray, top_k: int) -> np.ndarray:
    """The expected tokens (or their bytes) a destination receives when a token goes to it once however
    many of its ``top_k`` choices it holds: of ``tokens`` (broadcast against ``choices``), making a
    share p = choices / (tokens x top_k) of their choices there, 1 - (1 - p)^top_k of them (choices
    drawn independently; exact for top-1)."""
    share = np.divide(choices, tokens * top_k, out=np.zeros_like(choices, dtype=float), where=tokens > 0)
    return tokens * (1 - (1 - np.minimum(share, 1)) ** top_k)


def _by_node(group: np.ndarray, node: np.ndarray, traffic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The group as (nodes, m) by (node, local index), and ``traffic`` in that order as (src node,
    l, dst node, l'); ValueError when the nodes hold unequal numbers of members."""
    traffic = np.asarray(traffic, dtype=float)
    counts = np.bincount(node)
    counts = counts[counts > 0]
    if counts.min() != counts.max():
        raise ValueError(f"a two-leg all-to-all needs equally many group members per node, got {counts}")
    m, n_nodes = int(counts[0]), len(counts)
    order = np.lexsort((group, node))  # group index by (node, rank): row-major (node, local)
    t = traffic[np.ix_(order, order)].reshape(n_nodes, m, n_nodes, m)
    return group[order].reshape(n_nodes, m), t


# the routes an all-to-all takes; the two-leg ones' bytes: Collective.legs
ROUTES = ("direct", "two_phase", "forwarded")
