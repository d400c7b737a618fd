"""What every token dispatcher is: one exchange of an MoE layer's tokens with their experts' ranks.

A dispatcher is one class (as Megatron-Core's ``MoETokenDispatcher`` family and torchtitan's token
dispatchers are): it says which ranks it needs, moves the tokens on torch.distributed (measured),
states the transfers the network model prices (simulated), and, for the tensor-parallel ones, how
many pipelined chunks a training step's plan runs it in (the plan's exchange object,
moe_core.dispatch.step). Both executors and the dispatcher study (moe_core.dispatch.study) read the
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
      moe_core.config.aliases); None for an exchange only the dispatcher study runs;
    * ``runs_on``: whether it applies to a group of ``world`` ranks, ``devices_per_node`` a node.
    """

    name: str = ""
    tensor_parallel: bool = False
    drops: bool = True
    step_keys: dict[str, Any] | None = None

    def runs_on(self, world: int, devices_per_node: int) -> bool:
        return True

    # -- measured (torch.distributed) -----------------------------------------------------------
    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """Dispatch the study's ``workload`` (experiments.impl.dispatchers.Paths.workload) to the experts,
        run ``expert`` (a function of the rows an expert received; None: leave them as they are) and
        combine the results back; returns this rank's rows as they came back, in :meth:`routed` order.
        Differentiable, as in a training step: autograd carries the gradient of what came back to the
        rows sent (the study's gate checks both, experiments.impl.dispatchers.Paths.wrong_rows)."""
        raise NotImplementedError

    def routed(self, groups: StudyGroups, workload: dict) -> tuple[Any, Any]:
        """The rows this rank sends and the expert each one goes to, as tensors (rows, experts): what a
        correct round trip brings back, each row as its expert left it."""
        raise NotImplementedError

    def expert_index(self, groups: StudyGroups) -> int:
        """The expert this rank holds in the dispatcher's layout (one expert per expert-parallel rank)."""
        return groups.rank

    # -- simulated (moe_core.sim) ----------------------------------------------------------------
    def study_transfers(self, topo, counts: np.ndarray, capacity: int, row_bytes: int) -> list[tuple[str, Any]]:
        """The round trip's collectives on ``topo`` in order, as (kind, moe_core.sim.topology.Transfer):
        ranks 0..world-1, expert e on rank e, ``counts`` (world, E) tokens each rank routes to each
        expert, ``capacity`` slots per expert and rank, rows of ``row_bytes``."""
        raise NotImplementedError(f"dispatcher '{self.name}' is not simulated on its own")


def run_expert(expert, rows):
    """``expert`` on the rows an expert received, or the rows themselves without one."""
    return rows if expert is None else expert(rows)


def capacity_rows(buffer, capacity: int):
    """A capacity buffer's rows and their experts: block e of ``capacity`` rows goes to expert e."""
    import torch

    experts = torch.arange(buffer.shape[0] // capacity, device=buffer.device).repeat_interleave(capacity)
    return buffer, experts
