"""The simulated full sharding of a training step's parameters (``parallel.data_sharding=full``).

ZeRO-3 as FSDP2 applies it with ``fully_shard`` per transformer block and once on the root (the
embeddings, the final norm and the LM head): every unit's parameters are sharded over the ranks
holding replicas of them (moe_core.parallel.layout.Layout.gradient_groups: dense weights over the replicas
of their tensor-parallel shard, experts over their "dp" replicas), one collective per group.

* forward: a block's parameters are all-gathered before it computes and freed after it (reshard
  after forward); a unit's all-gather is issued once the previous unit's is done and that unit
  has started computing (FSDP2's forward prefetch of one), so it overlaps that unit's compute.
  The root is gathered at the start of each pass and, as FSDP2 does for the root, kept through
  the backward pass.
* backward: every block is gathered again before its backward, prefetched the same way (the last
  block's gather overlaps the head); its gradients are reduce-scattered as soon as its backward
  is done, the root's after the embedding's backward.
* all-gathers run one after another on one stream, reduce-scatters on another (FSDP2's separate
  streams); the compute stream waits only for the gather of the unit it computes next.
* gradient accumulation: all of this in every pass (FSDP2's default: gradients reduce-scattered
  per micro-batch, no ``no_sync``), so k passes gather and reduce k times.
* these units replace the plan's gradient buckets and launch rule (config validation refuses
  plans that schedule gradients otherwise, moe_core.schedule.policies.gradient_features); the plan's
  all-to-all decisions apply as they are.

Per-rank bytes of a collective over a group of p ranks holding S bytes in all: all-gather and
reduce-scatter each send (p - 1)/p S (moe_core.sim.topology ring), half of an all-reduce's.
"""

from __future__ import annotations

from collections.abc import Callable

from moe_core.sim.engine import as_deps

ROOT = "root"  # the FSDP unit of the embeddings, the final norm and the LM head


def unit_of(param_name: str) -> int | str:
    """The FSDP unit holding a parameter: its block's index, or the root."""
    if param_name.startswith("blocks."):
        return int(param_name.split(".")[1])
    return ROOT


class FullShardOps:
    """Adds full sharding's parameter all-gathers and gradient reduce-scatters to a step DAG
    (moe_core.sim.dag); ``add`` appends an op and returns its index."""

    def __init__(self, step, add: Callable[..., int]):
        self.step, self.add = step, add
        self.numel: dict[int | str, dict[str, int]] = {}  # unit -> gradient group -> its elements
        for t in step.plan.tensors:
            group = self.numel.setdefault(unit_of(t.name), {})
            group[t.group] = group.get(t.group, 0) + t.numel
        self.gathered: int | None = None  # the all-gather stream's last op
        self.reduced: int | None = None  # the reduce-scatter stream's last op
        self.computing: list[int] = []  # what the compute stream had done when the last unit began

    def before(self, unit: int | str, pass_: str, last) -> list[int]:
        """What ``unit``'s first op in ``pass_`` waits for: ``last`` and, where the unit is sharded
        at that point, its parameters' all-gathers (issued by the prefetch rule)."""
        issued, self.computing = self.computing, as_deps(last)
        if unit == ROOT and pass_ != "fwd":  # kept from the forward pass
            return self.computing
        # the root's gather waits for the previous pass, which freed it after its backward
        deps = [*issued, *(self.computing if unit == ROOT else [])]
        gathers = []
        for group, numel in self.numel[unit].items():
            cost = self.step.ring("all_gather", self.step.gradient_groups(group), numel * self.step.elem)
            if cost is not None:
                name = f"{_label(unit)}.param_gather_{group}.{pass_}"
                self.gathered = self.add(name, "param_all_gather", [*deps, self.gathered], **cost)
                gathers.append(self.gathered)
        return [*self.computing, *gathers[-1:]]  # the stream's last gather ends after the others

    def reduce(self, unit: int | str, ready: int) -> None:
        """Reduce-scatter ``unit``'s gradients once ``ready`` (its backward) is done."""
        for group, numel in self.numel[unit].items():
            cost = self.step.ring("reduce_scatter", self.step.gradient_groups(group), numel * self.step.elem)
            if cost is not None:
                name = f"{_label(unit)}.grad_scatter_{group}.bwd"
                self.reduced = self.add(name, "reduce_scatter", [ready, self.reduced], **cost)

    def last_reduced(self) -> list[int]:
        """The optimizer's wait: the last reduce-scatter (none when no gradient is reduced)."""
        return as_deps(self.reduced)


def _label(unit: int | str) -> str:
    """A unit's op-name prefix: ``L<block>`` as the block's compute ops, or ``root``."""
    return ROOT if unit == ROOT else f"L{unit}"
