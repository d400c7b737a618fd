"""The token exchanges of a training step: :class:`StepExchange`, what a plan's ``exchange`` is
(moe_core.schedule.plan.CommPlan), and its mechanisms.

One frozen dataclass per mechanism, with its own parameters; each runs its exchange-compute-exchange
on torch.distributed (the measured executor, moe_core.schedule.executor.CommPolicy, calls it with the
buffer, the rows per expert, the experts' compute and weights, and itself for its groups, timer and
``blocking`` hook) and appends the same exchange's ops to a simulated step (moe_core.sim.dag calls
``simulate`` with the DAG it builds, once per MoE layer and pass):

* :class:`AllToAll`: the library's equal-split all-to-all, whole (the ``capacity`` dispatcher's
  exchange); ``hierarchical``, in two phases inside the nodes and between same-local-rank peers
  (the ``hierarchical`` dispatcher's, moe_core.comm.hierarchical_a2a); ``order``, in a transmission order
  planned from the exchange's traffic matrix and run as point-to-point rounds (Aurora's,
  moe_core.comm.ordered_a2a). Under tensor parallelism it sends every "tp" rank's copy of the tokens
  (the ``duplicate`` dispatcher's exchange).
* :class:`PipelinedAllToAll`: every all-to-all cut along its token rows into micro-ops of at most
  ``micro_op_bytes``, the experts computing each micro-op as it arrives and sending it back at once
  (Lina).
* :class:`DropAllGather`: under tensor parallelism, each "tp" rank sends 1/tp of the tokens the
  group holds in duplicate and an all-gather over "tp" restores the rest, in ``chunks`` pipelined
  chunks (the ``drop-gather`` dispatcher's in one chunk, MoNTA's in its chosen count); the chunk
  count is the tensor-parallel dispatcher's decision (moe_core.schedule.policies.step_exchange).

The torch.distributed autograd functions they run are in moe_core.comm.all_to_all (the dispatcher study runs
them too); the measured methods import torch inside, so that validating a config does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moe_core.parallel.layout import grid_config, one_dimensional_refusal


class StepExchange:
    """How a training step's MoE layers exchange their tokens with the experts' ranks: dispatch
    all-to-all, the experts, combine all-to-all. One frozen dataclass per mechanism, with its own
    parameters (moe_core.dispatch.step); both executors call these methods and never ask which
    mechanism it is.

    * ``hierarchical``: its all-to-alls run in two phases over the nodes (the measured run then
      creates the "ep" groups' node subgroups, moe_core.parallel.parallelize.build_groups);
    * ``refusal``: what it needs of the config's layout, its own compatibility check (config
      validation raises it, moe_core.schedule.policies.step_refusal).
    """

    hierarchical = False

    def refusal(self, cfg) -> str | None:
        """Why this exchange cannot run a step of ``cfg`` (None where it can)."""
        return None

    def micro_ops(self, rows_per_expert: int, row_bytes: int) -> list[tuple[int, int]]:
        """The (start, stop) row ranges of every expert's ``rows_per_expert`` rows that travel as one
        all-to-all each (``row_bytes``: one row for every expert); the whole exchange by default."""
        return [(0, rows_per_expert)]

    # -- measured (torch.distributed; ``policy`` is the moe_core.schedule.executor.CommPolicy running it) --
    def all_to_all(self, policy, x, output_splits, input_splits, name: str):
        """One all-to-all of ``x``'s rows over the policy's "ep" group (None splits: equal), its time in
        ``<name>.fwd`` / ``<name>.bwd``: the dropless layer's exchanges, whose splits vary."""
        raise NotImplementedError

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        """One MoE layer's equal-split exchange of ``buf`` (E*R, M), R = ``rows_per_expert`` rows per
        expert in expert order: dispatch, ``compute(received, rows)`` on the expert weights ``params``,
        combine; returns the experts' outputs in ``buf``'s layout. Every span in which its all-to-alls
        are in flight runs through ``policy.blocking`` (Lina's priority rule schedules around it)."""
        raise NotImplementedError

    # -- simulated (``dag``: the step's DAG under construction, moe_core.sim.dag.StepDag) ---------
    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        """Append MoE layer ``layer``'s exchange in ``pass_`` to ``dag`` after op(s) ``after``: the
        ``first`` exchange ("dispatch" forward, "combine" backward), the experts (``dag.experts``),
        the ``second``; returns the op the layer's next op waits for."""
        raise NotImplementedError


def chunk_count(nbytes: float, micro_op_bytes: float) -> int:
    """Equal micro-ops of at most ``micro_op_bytes`` that ``nbytes`` is cut into (at least one)."""
    if micro_op_bytes <= 0:
        raise ValueError(f"micro-op size must be > 0 bytes, got {micro_op_bytes}")
    return max(1, math.ceil(nbytes / micro_op_bytes))


def a2a_micro_ops(rows: int, row_bytes: int, micro_op_bytes: float) -> list[tuple[int, int]]:
    """An all-to-all of ``rows`` token rows (per destination) cut along the token dimension into
    micro-ops of at most ``micro_op_bytes``: (start, stop) row ranges, at most one per row."""
    if rows <= 0:
        return [(0, 0)]
    return even_ranges(rows, min(rows, chunk_count(rows * row_bytes, micro_op_bytes)))


def even_ranges(rows: int, count: int) -> list[tuple[int, int]]:
    """``rows`` cut into ``count`` consecutive (start, stop) ranges whose lengths differ by at most one."""
    bounds = [round(k * rows / count) for k in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass(frozen=True)
class AllToAll(StepExchange):
    """The library's all-to-all, whole: flat, ``hierarchical`` (two phases where the "ep" group spans
    nodes) or in the transmission ``order`` (a moe_core.comm.transmission.ORDERS name)."""

    hierarchical: bool = False
    order: str | None = None

    def __post_init__(self):
        if self.hierarchical and self.order is not None:
            raise ValueError("the hierarchical all-to-all exchanges in the library's order only")

    def refusal(self, cfg) -> str | None:
        """An order plans whole experts' point-to-point rounds; two phases need equal splits and
        the flat layout's nodes."""
        if self.order is not None:
            return one_dimensional_refusal(cfg, "an ordered all-to-all")
        if self.hierarchical and cfg.moe.dropless:
            return "the hierarchical all-to-all needs equal splits; set moe.dropless=false"
        if self.hierarchical and not grid_config(cfg).is_trivial:
            return "the 3D grid runs the flat all-to-all only; use comm.a2a_algorithm=flat"
        return None

    def all_to_all(self, policy, x, output_splits, input_splits, name: str):
        """Flat, or two-phase when the "ep" group spans nodes (``policy.groups.ep_hierarchical``), or in
        the order planned from the traffic matrix (all-gathered first, timed as part of ``<name>.fwd``;
        the policy's ``exchanges`` count seeds a random order, equal on all ranks)."""
        from moe_core.comm.all_to_all import all_to_all
        from moe_core.comm.ordered_a2a import gather_traffic_matrix
        from moe_core.comm.transmission import make_schedule

        groups = policy.groups
        if self.order is None:
            two_phase = self.hierarchical and groups.ep_hierarchical is not None
            group = groups.ep_hierarchical if two_phase else groups.ep_group
            return all_to_all(x, output_splits, input_splits, group, policy.timer, name)
        with policy.timer.region(f"{name}.fwd"):
            matrix = gather_traffic_matrix(x, input_splits, groups.ep_group)  # (ep, ep) rows
            schedule = make_schedule(self.order, matrix, seed=policy.exchanges)
        policy.exchanges += 1
        return all_to_all(x, output_splits, input_splits, groups.ep_group, policy.timer, name, schedule=schedule)

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        received = policy.all_to_all(buf, None, None, "dispatch_a2a")
        return policy.all_to_all(compute(received, rows_per_expert), None, None, "combine_a2a")

    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        """One all-to-all op each way (two, the phases, when hierarchical); a transmission order does
        not change a uniform all-to-all's time in the flow model, so it is not modelled."""
        sent = dag.all_to_all(f"L{layer}.{first}0.{pass_}", f"{first}_a2a", after, 1, self.hierarchical)
        computed = dag.experts(layer, pass_, sent)
        return dag.all_to_all(f"L{layer}.{second}0.{pass_}", f"{second}_a2a", computed, 1, self.hierarchical)


@dataclass(frozen=True)
class PipelinedAllToAll(StepExchange):
    """Lina's pipelined exchange: micro-ops of at most ``micro_op_bytes``, the experts behind each."""

    micro_op_bytes: float

    def refusal(self, cfg) -> str | None:
        return one_dimensional_refusal(cfg, "pipelining the experts behind all-to-all micro-ops")

    def micro_ops(self, rows_per_expert: int, row_bytes: int) -> list[tuple[int, int]]:
        return a2a_micro_ops(rows_per_expert, row_bytes, self.micro_op_bytes)

    def all_to_all(self, policy, x, output_splits, input_splits, name: str):
        """Whole, flat: a dropless layer's exchanges wait for their split sizes, nothing to pipeline."""
        from moe_core.comm.all_to_all import all_to_all

        return all_to_all(x, output_splits, input_splits, policy.groups.ep_group, policy.timer, name)

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        """moe_core.comm.all_to_all.pipelined_exchange over the micro-ops of ``buf``'s rows, as one blocking span."""
        from moe_core.comm.all_to_all import pipelined_exchange

        experts, row_bytes = buf.shape[0] // rows_per_expert, buf[0].numel() * buf.element_size()
        chunks = self.micro_ops(rows_per_expert, experts * row_bytes)
        ep_group, timer = policy.groups.ep_group, policy.timer
        return policy.blocking(
            lambda x: pipelined_exchange(x, rows_per_expert, chunks, compute, params, ep_group, timer), buf
        )

    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        """The experts work on micro-op k while k+1 arrives and k-1 leaves; cutting the buffer into
        micro-ops and joining the results are copies of their own (``partition``)."""
        count, last = dag.micro_ops, after
        if count > 1:
            last = dag.add(f"L{layer}.partition.{pass_}", "partition", last, duration_s=dag.partition_s)
        arrived = computed = left = None
        for k in range(count):
            arrived = dag.all_to_all(
                f"L{layer}.{first}{k}.{pass_}", f"{first}_a2a", [last if arrived is None else arrived], count
            )
            computed = dag.experts(layer, pass_, [arrived, computed], micro_op=k)
            left = dag.all_to_all(f"L{layer}.{second}{k}.{pass_}", f"{second}_a2a", [computed, left], count)
        if count > 1:
            return dag.add(f"L{layer}.concat.{pass_}", "partition", left, duration_s=dag.partition_s)
        return left


@dataclass(frozen=True)
class DropAllGather(StepExchange):
    """Under tensor parallelism: drop the "tp" duplicates, all-to-all, all-gather over "tp", in
    ``chunks`` pipelined chunks (chunk i's all-gather overlaps chunk i+1's all-to-all). A
    tensor-parallel layout dispatches capacity buffers only, so it has no ragged ``all_to_all``."""

    chunks: int

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        received = policy.blocking(lambda x: self._exchange(policy, x, rows_per_expert, "dispatch_a2a"), buf)
        outputs = compute(received, rows_per_expert)
        return policy.blocking(lambda y: self._exchange(policy, y, rows_per_expert, "combine_a2a"), outputs)

    def _exchange(self, policy, x, rows_per_expert: int, name: str):
        """moe_core.comm.all_to_all.tp_exchange of ``x``: every rank keeps 1/tp of each expert's rows, in chunks."""
        from moe_core.comm.all_to_all import tp_exchange

        groups = policy.groups
        ranges = even_ranges(rows_per_expert // groups.layout.tensor_parallel, self.chunks)
        return tp_exchange(x, rows_per_expert, ranges, groups.ep_group, groups.tp_group, policy.timer, name)

    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        sent = self._simulated_exchange(dag, f"L{layer}.{first}0", f"{first}_a2a", pass_, after)
        computed = dag.experts(layer, pass_, sent)
        return self._simulated_exchange(dag, f"L{layer}.{second}0", f"{second}_a2a", pass_, computed)

    def _simulated_exchange(self, dag, stem: str, phase: str, pass_: str, after) -> int:
        """The chunks' all-to-alls one after another on the "ep" communicator, each chunk all-gathered
        over "tp" once it has arrived (as moe_core.comm.all_to_all.tp_exchange)."""
        sent = gathered = None
        for j in range(self.chunks):
            sent = dag.all_to_all(f"{stem}c{j}.{pass_}", phase, after if sent is None else sent, dag.tp * self.chunks)
            gathered = dag.tp_all_gather(f"{stem}ag{j}.{pass_}", phase, [sent, gathered], self.chunks)
        return gathered
