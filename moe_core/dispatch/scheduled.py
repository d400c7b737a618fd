"""A policy's schedule of a dispatcher's all-to-alls: the dispatcher still decides what moves, the
policy when and in what pieces (the plan's exchange, moe_core.schedule.policies.build_plan).

* :class:`Ordered`: every all-to-all in a transmission order planned from its traffic matrix and
  run as point-to-point rounds (Aurora's, moe_core.comm.ordered_a2a);
* :class:`Pipelined`: every all-to-all cut along its token rows into micro-ops of at most
  ``micro_op_bytes``, the experts computing each micro-op as it arrives and sending it back at once
  (Lina's).

Both schedule the flat all-to-all of whole experts on a one-dimensional layout: the ``capacity``
and ``dropless`` dispatchers'. A policy decides its schedule with no dispatcher yet (``base``
None); the plan sets the step's dispatcher (:meth:`Scheduled.over`), whose name and drops it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moe_core.dispatch.base import Dispatcher
from moe_core.dispatch.chunks import a2a_micro_ops
from moe_core.parallel.layout import one_dimensional_refusal


@dataclass(frozen=True)
class Scheduled(Dispatcher):
    """A dispatcher's all-to-alls as a policy schedules them (``base``: that dispatcher)."""

    base: Dispatcher | None = None
    mechanism = "a scheduled all-to-all"

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.base.name if self.base is not None else ""

    @property
    def drops(self) -> bool:  # type: ignore[override]
        return self.base.drops if self.base is not None else True

    def over(self, base: Dispatcher) -> Scheduled:
        """This schedule of ``base``'s all-to-alls."""
        return replace(self, base=base)

    def refusal(self, cfg) -> str | None:
        """The flat all-to-all of whole experts, on a one-dimensional layout."""
        if self.base is not None and (self.base.tensor_parallel or self.base.route != "direct"):
            return f"{self.mechanism} schedules the flat all-to-all; moe.dispatcher={self.base.name} runs another"
        return one_dimensional_refusal(cfg, self.mechanism)


@dataclass(frozen=True)
class Ordered(Scheduled):
    """In the transmission ``order`` (a moe_core.comm.transmission.ORDERS name)."""

    order: str = ""
    mechanism = "an ordered all-to-all"

    def all_to_all(self, policy, x, output_splits, input_splits, name: str):
        """In the order planned from the traffic matrix (all-gathered first, timed as part of
        ``<name>.fwd``; the policy's ``exchanges`` count seeds a random order, equal on all ranks)."""
        from moe_core.comm.all_to_all import all_to_all
        from moe_core.comm.ordered_a2a import gather_traffic_matrix
        from moe_core.comm.transmission import make_schedule

        group = policy.groups.ep_group
        with policy.timer.region(f"{name}.fwd"):
            matrix = gather_traffic_matrix(x, input_splits, group)  # (ep, ep) rows
            schedule = make_schedule(self.order, matrix, seed=policy.exchanges)
        policy.exchanges += 1
        return all_to_all(x, output_splits, input_splits, group, policy.timer, name, schedule=schedule)

    # simulated: the base class's one all-to-all each way; a transmission order does not change a
    # uniform all-to-all's time in the flow model, so it is not modelled


@dataclass(frozen=True)
class Pipelined(Scheduled):
    """In micro-ops of at most ``micro_op_bytes``, the experts behind each."""

    micro_op_bytes: float = 0.0
    mechanism = "pipelining the experts behind all-to-all micro-ops"

    def micro_ops(self, rows_per_expert: int, row_bytes: int) -> list[tuple[int, int]]:
        return a2a_micro_ops(rows_per_expert, row_bytes, self.micro_op_bytes)

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        """moe_core.comm.all_to_all.pipelined_exchange over the micro-ops of ``buf``'s rows, as one
        blocking span (a dropless layer's exchanges wait for their split sizes: the base class's
        whole all-to-all, nothing to pipeline)."""
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
