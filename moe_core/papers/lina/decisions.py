"""Lina's training-time decisions (Li et al., USENIX ATC'23, §4), as pure functions.

They build Lina's communication plan (``lina_plan``, moe_core.schedule.plan), which both executors follow:
the measured one (the policy in ``policy.py``; expert packing in the training loop, ``packing.py``)
and the step simulator (moe_core.sim.step). What each executor adds is only how time passes.

* Tensor partitioning: every gradient tensor is cut into equal micro-ops of at most the partition
  size (default 30 MB), never fused with another tensor. With pipelining, every all-to-all is also
  cut along the token dimension into micro-ops of at most the partition size (whole otherwise: its
  micro-ops only matter to overlap them with the experts).
* Priority: an all-reduce micro-op is launched only when no all-to-all is waiting or running, at
  most one is in flight (NCCL ops cannot be preempted, so an all-to-all waits for at most one), and
  none is launched between the start of an MoE layer's backward pass and its all-to-all. On NCCL
  the all-to-alls also get high-priority CUDA streams (moe_core.parallel.parallelize.build_groups).
* Pipelining: the expert FFN runs on each all-to-all micro-op as it arrives (the plan's exchange
  is moe_core.dispatch.scheduled.Pipelined).
* Expert packing: experts per device double (powers of two) until the FFN time of a micro-op
  exceeds the all-to-all time of a micro-op; the expert-parallel group shrinks accordingly. A
  training run starts unpacked and decides after its warm-up steps, then again every few steps
  (``packing_due``; the paper: at step 10, then every 4 steps).

The ablations are cumulative, as in the paper's Fig 14: ``lina-priority`` -> ``lina-partition``
(+ partitioning) -> ``lina-pipeline`` (+ pipelining) -> ``lina`` (+ packing). ``lina-pack`` is
packing alone on top of the ``overlap`` baseline, to isolate its share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from moe_core.dispatch.scheduled import Pipelined
from moe_core.parallel.layout import Layout
from moe_core.schedule.plan import CommPlan, MicroOpCosts, Relayout, bucket_units, micro_op_units
from moe_core.schedule.policies import PlanInputs, PolicySpec, register_policy


@dataclass(frozen=True)
class LinaFeatures:
    priority: bool
    partition: bool
    pipeline: bool
    pack: bool


LINA_POLICIES: dict[str, LinaFeatures] = {
    "lina-priority": LinaFeatures(priority=True, partition=False, pipeline=False, pack=False),
    "lina-partition": LinaFeatures(priority=True, partition=True, pipeline=False, pack=False),
    "lina-pipeline": LinaFeatures(priority=True, partition=True, pipeline=True, pack=False),
    "lina": LinaFeatures(priority=True, partition=True, pipeline=True, pack=True),
    "lina-pack": LinaFeatures(priority=False, partition=False, pipeline=False, pack=True),
}


def max_packing_factor(expert_parallel: int) -> int:
    """The largest packing factor a layout allows: the largest power of two dividing its
    expert-parallel size (every expert local at most)."""
    return expert_parallel & -expert_parallel


def packed_layout(layout: Layout, factor: int) -> Layout:
    """``layout`` with ``factor`` times the experts per device: its expert-parallel groups shrink by
    ``factor`` and its data-parallel axis grows by as much."""
    sizes = {"dp": layout.data_parallel * factor, "ep": layout.expert_parallel // factor}
    return Layout(tuple((name, sizes.get(name, size)) for name, size in layout.axes), layout.num_experts)


def packing_factor(ffn_s: Callable[[int], float], a2a_s: Callable[[int], float], max_factor: int) -> int:
    """Experts per device relative to the unpacked layout: 1, 2, 4, ... until the FFN time of a
    micro-op (``ffn_s(k)``) exceeds its all-to-all time (``a2a_s(k)``), capped at ``max_factor``
    (every expert on one device: the expert-parallel group is gone)."""
    if max_factor < 1:
        raise ValueError(f"max packing factor must be >= 1, got {max_factor}")
    k = 1
    while k < max_factor and ffn_s(k) <= a2a_s(k):
        k *= 2
    return min(k, max_factor)


def packing_due(iteration: int, warmup_iters: int, interval_iters: int) -> bool:
    """Whether a run re-decides its packing factor before step ``iteration`` (0-based): first once
    the ``warmup_iters`` warm-up steps are done, then every ``interval_iters`` steps; never before
    a first step has been measured."""
    if interval_iters < 1:
        raise ValueError(f"packing interval must be >= 1 step, got {interval_iters}")
    return iteration > 0 and iteration >= warmup_iters and (iteration - warmup_iters) % interval_iters == 0


def choose_packed_layout(base: Layout, micro_op_costs: MicroOpCosts) -> Layout:
    """The layout Lina trains on: ``base`` packed by :func:`packing_factor`, from an executor's costs
    of one all-to-all micro-op (expert FFN seconds, all-to-all seconds) on each candidate layout."""
    costs = functools.cache(lambda k: micro_op_costs(packed_layout(base, k)))  # one measurement per candidate
    factor = packing_factor(lambda k: costs(k)[0], lambda k: costs(k)[1], max_packing_factor(base.expert_parallel))
    return packed_layout(base, factor)


# The re-layout hook of the policies that pack experts: its decision (above), and its measured driver
PACKING = Relayout(choose_packed_layout, "moe_core.papers.lina.packing:ExpertPacking")


def lina_plan(features: LinaFeatures, inputs: PlanInputs) -> CommPlan:
    """Lina's communication plan for one step: its features applied to the step's gradient tensors.

    Partitioning replaces DDP buckets by per-tensor micro-ops of ``comm.partition_mb``; pipelining
    also cuts every all-to-all into micro-ops of that size with the experts behind them; priority
    makes the gradient units yield to the all-to-alls; packing adapts the experts per device.
    Gradients launch as soon as they are ready, as in the ``overlap`` baseline Lina builds on.
    """
    if features.partition:
        units = micro_op_units(inputs.tensors, inputs.element_bytes, inputs.micro_op_bytes)
    else:
        units = bucket_units(inputs.tensors, inputs.element_bytes, inputs.bucket_bytes)
    return CommPlan(
        units,
        launch_when_ready=True,
        exchange=Pipelined(micro_op_bytes=inputs.micro_op_bytes) if features.pipeline else None,
        gradients_yield_to_a2a=features.priority,
        relayout=PACKING if features.pack else None,
    )


# The measured executor of the priority rule (torch; imported only when a measured run starts).
PRIORITY_EXECUTOR = "moe_core.papers.lina.policy:LinaPriority"

for _name, _features in LINA_POLICIES.items():
    register_policy(
        PolicySpec(
            _name,
            partial(lina_plan, _features),
            **({"executor": PRIORITY_EXECUTOR} if _features.priority else {}),
            micro_op_size_in_name=_features.partition,
        )
    )
