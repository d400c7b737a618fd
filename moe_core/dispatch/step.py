"""The token exchanges of a training step: what a plan's ``exchange`` (moe_core.schedule.plan.StepExchange) is.

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

from dataclasses import dataclass

from moe_core.parallel.layout import grid_config
from moe_core.schedule.plan import StepExchange, a2a_micro_ops, even_ranges, one_dimensional_refusal


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
