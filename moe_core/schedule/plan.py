"""The communication plan of a training step: what a policy decided, which both executors follow.

A policy's decision functions (moe_core.schedule.policies for the baselines, moe_core/papers/<paper> for
the papers' policies) turn the step's shapes into a :class:`CommPlan`: the gradient all-reduce
units and their launch rule, their priority against the token all-to-alls, the MoE layers' token
exchange (a moe_core.dispatch dispatcher, as the policy schedules it), the 3D grid's overlaps, and
what re-lays out the experts between steps. The measured policy executes the plan on torch.distributed; the step
simulator (moe_core.sim.step) reads the same plan and only models how time passes. A new mechanism
adds a plan builder (and, where it needs one, a measured executor or a dispatcher), not flags in
either executor.

:class:`moe_core.dispatch.base.Dispatcher` is the interface of the token exchange, as
Megatron-Core's ``MoETokenDispatcher`` and torchtitan's token dispatchers are: each mechanism is one
class that runs its exchange on torch.distributed and emits its simulated ops, so neither executor
branches on which mechanism a plan holds.

The cutting functions here are the shared vocabulary of gradient plans: buckets (DDP's fusion of
whole tensors) and micro-ops (equal slices of one tensor); an all-to-all's row ranges are cut in
moe_core.dispatch.chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from moe_core.dispatch.base import Dispatcher
from moe_core.dispatch.chunks import chunk_count
from moe_core.dispatch.scheduled import Scheduled
from moe_core.parallel.grid import GridOverlaps
from moe_core.parallel.layout import Layout, one_dimensional_refusal

# (candidate layout) -> (expert FFN seconds, all-to-all seconds) of one all-to-all micro-op on it
MicroOpCosts = Callable[[Layout], tuple[float, float]]


@dataclass(frozen=True)
class Relayout:
    """A plan's re-layout hook: what runs between steps and may move experts to another layout.

    ``decide`` is the decision both executors take: given the configured layout and the executor's
    costs of one all-to-all micro-op on a candidate layout, the layout to train on (the measured run
    calls it with measured times, between steps; the simulator with simulated ones, once).
    ``runner`` names the measured driver (``module:Class``, imported by the measured run only, as a
    policy's executor is): it decides when, measures the costs and moves the experts (for Lina's
    packing, moe_core/papers/lina/packing.py); moe_core.schedule.executor.make_relayout builds it.
    """

    decide: Callable[[Layout, MicroOpCosts], Layout]
    runner: str

    def refusal(self, cfg, exchange: Dispatcher) -> str | None:
        """Why this re-layout cannot run beside ``exchange`` on ``cfg``'s layout (None where it can):
        it moves whole experts between the ranks of a flat, one-dimensional expert-parallel layout."""
        if exchange.route != "direct":
            return f"moving experts between steps keeps no node groups; moe.dispatcher={exchange.name} needs them"
        return one_dimensional_refusal(cfg, "moving experts between steps")


# The groups a gradient is summed over (moe_core.parallel.layout.Layout.gradient_groups):
# "dense": every data replica (a whole weight, or its tensor-parallel shard);
# "expert": an expert's "dp" column (the all-to-all's backward already summed over "ep");
# "data": a grid's depth-sharded weight, which the layer's reduce-scatter summed over "depth"
# (moe_core.parallel.grid), over the grid's "data" axis.
GRADIENT_GROUPS = ("dense", "expert", "data")


@dataclass(frozen=True)
class GradientTensor:
    """One gradient tensor as a rank holds it, in the order backward produces it."""

    name: str
    numel: int
    group: str  # one of GRADIENT_GROUPS


@dataclass(frozen=True)
class GradientUnit:
    """One gradient all-reduce: element ranges of gradient tensors, summed together.

    ``fused``: the pieces (whole tensors) are flattened into one buffer, as a DDP bucket; else the
    unit is one slice of one tensor, reduced in place (a micro-op). A unit never mixes tensors that
    are reduced over different groups.
    """

    pieces: tuple[tuple[int, int, int], ...]  # (tensor index, start, stop) elements
    group: str  # one of GRADIENT_GROUPS
    fused: bool

    @property
    def numel(self) -> int:
        return sum(stop - start for _, start, stop in self.pieces)

    @property
    def last_tensor(self) -> int:
        """The tensor whose gradient completes the unit (the last one backward produces)."""
        return self.pieces[-1][0]


@dataclass(frozen=True)
class CommPlan:
    """A training step's communication as decided by its policy.

    * ``gradient_units``: the gradient all-reduces, in launch order.
    * ``launch_when_ready``: a unit starts as soon as its gradients are ready (else after the whole
      backward pass); units start one after another in order either way.
    * ``exchange``: how every MoE layer exchanges its tokens: a policy's schedule of the configured
      dispatcher (moe_core.dispatch.scheduled: in a transmission order, or cut into micro-ops with
      the experts pipelined behind them, Lina), or None, the dispatcher as it is; a built plan
      (moe_core.schedule.policies.build_plan) holds the dispatcher the step runs.
    * ``gradients_yield_to_a2a``: gradient all-reduces give way to the token all-to-alls (at most
      one in flight, none while an all-to-all runs or is imminent; NCCL high-priority streams for
      the all-to-alls; a lower strict-priority class in the simulator).
    * ``grid_overlaps``: under a 3D tensor-parallel grid, which of its collectives overlap compute
      (moe_core.parallel.grid: its layers' collectives, and what each overlap hides); None without a grid.
    * ``relayout``: the re-layout hook (:class:`Relayout`: e.g. Lina's expert packing), or None
      for a fixed layout.
    * ``tensors``: the gradient tensors the units cover, in the order backward produces them.
    """

    gradient_units: tuple[GradientUnit, ...]
    launch_when_ready: bool
    exchange: Dispatcher | Scheduled | None = None
    gradients_yield_to_a2a: bool = False
    grid_overlaps: GridOverlaps | None = None
    relayout: Relayout | None = None
    tensors: tuple[GradientTensor, ...] = ()


def assign_buckets(params: list[tuple[int, str]], bucket_bytes: int) -> list[tuple[str, list[int]]]:
    """Group parameters into gradient buckets (DDP's rule).

    ``params`` are (bytes, gradient group) in the order backward produces their gradients (reverse
    model order, as DDP assumes). Parameters of different groups (GRADIENT_GROUPS) never share a
    bucket, since they are reduced over different ranks; a bucket closes once it holds
    ``bucket_bytes``. Returns (group, indices into ``params``) per bucket, in launch order.
    """
    open_buckets: dict[str, list[int]] = {group: [] for group in GRADIENT_GROUPS}
    size = dict.fromkeys(GRADIENT_GROUPS, 0)
    closed: list[tuple[str, list[int]]] = []
    for i, (nbytes, group) in enumerate(params):
        open_buckets[group].append(i)
        size[group] += nbytes
        if size[group] >= bucket_bytes:
            closed.append((group, open_buckets[group]))
            open_buckets[group], size[group] = [], 0
    return closed + [(group, b) for group, b in open_buckets.items() if b]


def bucket_units(tensors: list[GradientTensor], element_bytes: int, bucket_bytes: int) -> tuple[GradientUnit, ...]:
    """Gradient units as DDP buckets of whole tensors (:func:`assign_buckets`)."""
    buckets = assign_buckets([(t.numel * element_bytes, t.group) for t in tensors], bucket_bytes)
    return tuple(
        GradientUnit(tuple((i, 0, tensors[i].numel) for i in idx), group, fused=True) for group, idx in buckets
    )


def gradient_micro_ops(numels: list[int], element_bytes: int, micro_op_bytes: float) -> list[tuple[int, int, int]]:
    """All-reduce micro-ops of gradient tensors: (tensor index, start, stop) element ranges.

    Tensor i of ``numels[i]`` elements becomes ``chunk_count`` slices of equal length (the last one
    shorter when it does not divide); slices never span two tensors. Order: tensor by tensor, in
    the order given (the order backward produces the gradients).
    """
    ops = []
    for i, n in enumerate(numels):
        if n < 0:
            raise ValueError(f"tensor {i} has a negative element count {n}")
        if n == 0:
            continue
        length = math.ceil(n / chunk_count(n * element_bytes, micro_op_bytes))
        ops += [(i, start, min(start + length, n)) for start in range(0, n, length)]
    return ops


def micro_op_units(
    tensors: list[GradientTensor], element_bytes: int, micro_op_bytes: float
) -> tuple[GradientUnit, ...]:
    """Gradient units as per-tensor micro-ops (:func:`gradient_micro_ops`), reduced in place."""
    ops = gradient_micro_ops([t.numel for t in tensors], element_bytes, micro_op_bytes)
    return tuple(GradientUnit(((i, start, stop),), tensors[i].group, fused=False) for i, start, stop in ops)
