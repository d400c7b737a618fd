"""The measured executor of a communication plan (moe_core.schedule.plan) on one rank, on torch.distributed.

:class:`CommPolicy` executes every plan feature that needs no scheduling of its own: gradient
buckets or in-place micro-ops, launched after the backward pass or as soon as ready; the MoE
layers' token exchanges, which it hands to the plan's dispatcher (moe_core.dispatch.base.Dispatcher:
whole or two-phase all-to-alls, the tensor-parallel drop-and-all-gather, or a policy's schedule of
them, moe_core.dispatch.scheduled: ordered all-to-alls, Lina's pipelined micro-ops) without asking
which mechanism it is. Every span in which an
exchange's all-to-alls are in flight runs through :meth:`CommPolicy.blocking`, the hook a policy
that schedules around them overrides. A policy whose decisions need their own scheduling
subclasses it (Lina's priority rule, moe_core/papers/lina/policy.py) and names the subclass in its
registry entry (moe_core.schedule.policies). The same class is the rule's simulated twin: the
simulator builds a step's gradient sync by calling :meth:`CommPolicy.simulate_gradient_sync` of the
policy's executor class (moe_core.sim.dag), so a new scheduling rule is one class both executors
call. Every policy reduces the same gradients over the same groups;
buckets and micro-ops sum in different groupings, so losses agree to float rounding (tests use
1e-6), and the baselines agree bitwise.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from moe_core.host.timing import PhaseTimer
from moe_core.model.transformer import backward_ordered_params
from moe_core.parallel.grid import GridOverlaps
from moe_core.parallel.grid_parallel import GridLinear, attach_grid_plan, finish_reduce_scatters
from moe_core.parallel.parallelize import ParallelGroups, is_expert_param
from moe_core.parallel.tensor_parallel import copy_to_tensor_parallel, reduce_from_tensor_parallel
from moe_core.schedule.plan import CommPlan, GradientUnit
from moe_core.schedule.policies import PolicySpec, policy_spec


# -- measured gradient units ---------------------------------------------------------------------
class GradientBucket:
    """Whole gradient tensors flattened into one buffer and all-reduced together (a fused unit)."""

    def __init__(self, params: list[torch.nn.Parameter], group, replicas: int):
        self.params, self.group, self.replicas = params, group, replicas
        self.work = None
        self.buffer: torch.Tensor | None = None

    @property
    def launched(self) -> bool:
        return self.buffer is not None

    def launch(self, async_op: bool) -> None:
        """Flatten the gradients and start their sum over ``group``."""
        self.buffer = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        )
        if dist.get_world_size(self.group) > 1:
            self.work = dist.all_reduce(self.buffer, group=self.group, async_op=async_op)

    def done(self) -> bool:
        return self.work is None or self.work.is_completed()

    def finish(self) -> None:
        """Wait for the sum, divide by the data replicas and make each ``.grad`` a view of its part of
        the buffer (DDP's ``gradient_as_bucket_view``: copying them out again would add a kernel per
        gradient and a pass over all of them, which the H200 record counted: 52 copies a step)."""
        if self.work is not None:
            self.work.wait()
        if self.replicas > 1:
            self.buffer /= self.replicas
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.buffer[offset : offset + n].view_as(p)
            offset += n
        self.work, self.buffer = None, None


class GradientMicroOp:
    """Elements [start, stop) of one gradient, summed in place (a micro-op; the division by the
    data replicas happens once per tensor, after all its micro-ops: CommPolicy.finish_gradient_sync)."""

    def __init__(self, param: torch.nn.Parameter, start: int, stop: int, group):
        self.param, self.start, self.stop, self.group = param, start, stop, group
        self.params = [param]
        self.work = None
        self.launched = False

    def launch(self, async_op: bool) -> None:
        if self.param.grad is None:
            self.param.grad = torch.zeros_like(self.param)
        self.launched = True
        if dist.get_world_size(self.group) > 1:
            self.work = dist.all_reduce(
                self.param.grad.view(-1)[self.start : self.stop], group=self.group, async_op=async_op
            )

    def done(self) -> bool:
        return self.work is None or self.work.is_completed()

    def finish(self) -> None:
        if self.work is not None:
            self.work.wait()
        self.work, self.launched = None, False


# -- the measured executor -----------------------------------------------------------------------
class CommPolicy:
    """Executes a :class:`CommPlan` on one rank: the MoE layers' all-to-alls and the gradient sync.

    ``attach`` routes the model's MoE layers through this policy and builds the plan's gradient
    units on the model's real parameters (their names and sizes must be the plan's); with
    ``launch_when_ready`` it registers per-parameter hooks that launch a unit once all its
    gradients have accumulated. ``finish_gradient_sync`` launches what is left and completes
    everything; ``detach`` removes the hooks, so a policy on the process groups of another layout
    (expert packing) can attach.
    """

    def __init__(self, plan: CommPlan, groups: ParallelGroups, timer: PhaseTimer):
        self.plan, self.groups, self.timer = plan, groups, timer
        self.gradient_units: list[GradientBucket | GradientMicroOp] = []
        self.grid_layers: list[GridLinear] = []  # the model's 3D tensor-parallel layers
        self.hooks: list[RemovableHandle] = []  # what attach registered on the model
        self.exchanges = 0  # ordered all-to-alls so far: seeds a random order, equal on all ranks (lockstep calls)

    @classmethod
    def simulate_gradient_sync(cls, dag, grads_ready: dict, after_backward: list[int]) -> list[int]:
        """This rule's gradient sync in a simulated step (``dag``: moe_core.sim.dag.StepDag, which
        calls it): the plan's units in order on one communicator, launched as the measured rule
        launches them, in a lower strict-priority class where they yield to the all-to-alls. Units
        launched as their gradients are ready are queued without waiting, so as many run at once as
        the backend runs queued collectives; units launched after the backward pass (``after_backward``),
        and a grid's depth-sharded units whose reduce-scatter is deferred, run one at a time, each
        waited for. A scheduling rule that launches otherwise overrides this beside its measured
        methods. Returns the collectives still in flight at the end."""
        plan = dag.step.plan
        priority = 1 if plan.gradients_yield_to_a2a else 0
        deferred = plan.grid_overlaps is not None and plan.grid_overlaps.defers_gradients(dag.step.layout.grid)
        in_flight = dag.queued_in_flight() if plan.launch_when_ready else 1
        issued: list[int] = []
        for k, unit in enumerate(plan.gradient_units):
            cost = dag.gradient_cost(unit)
            if cost is None:
                continue
            if plan.launch_when_ready and not (deferred and unit.group == "data"):
                launch_after = dag.gradients_ready(grads_ready, unit)
            else:
                launch_after = after_backward
            freed = issued[-in_flight] if len(issued) >= in_flight else None  # the worker it waits for
            phase = dag.gradient_phase
            issued.append(dag.add(f"{phase}{k}", phase, [*launch_after, freed], priority=priority, **cost))
        return issued[-in_flight:]

    def attach(self, model: torch.nn.Module) -> None:
        for layer in model.moe_layers():
            layer.comm, layer.timer = self, self.timer
        self.grid_layers = attach_grid_plan(model, self.plan.grid_overlaps or GridOverlaps(), self.timer)
        named = backward_ordered_params(model)
        self.gradient_units = [self._unit(unit, named) for unit in self.plan.gradient_units]
        if self.plan.launch_when_ready:
            self._hook_units(named)

    def _unit(self, unit: GradientUnit, named: list[tuple[str, torch.nn.Parameter]]):
        group = self.groups.gradient_group(unit.group)
        for i, start, stop in unit.pieces:
            name, p = named[i]
            if is_expert_param(name) != (unit.group == "expert") or (unit.fused and (start, stop) != (0, p.numel())):
                raise RuntimeError(f"the plan's gradient unit {unit} does not fit parameter '{name}' {tuple(p.shape)}")
        if unit.fused:
            return GradientBucket([named[i][1] for i, _, _ in unit.pieces], group, self.groups.layout.data_replicas)
        ((i, start, stop),) = unit.pieces
        return GradientMicroOp(named[i][1], start, stop, group)

    def _hook_units(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """Per-parameter hooks that hand every unit whose gradients are all ready to ``units_ready``.
        A grid weight whose reduce-scatter completes after the backward pass gets no hook: its unit
        launches in ``finish_gradient_sync``, once the gradient is there."""
        deferred = {id(layer.weight) for layer in self.grid_layers if layer.defers_gradient}
        of_param: dict[int, list] = {}
        for unit in self.gradient_units:
            for p in unit.params:
                if id(p) not in deferred:
                    of_param.setdefault(id(p), []).append(unit)
        self.pending = {id(u): len(u.params) for u in self.gradient_units}

        def grad_ready(p: torch.nn.Parameter) -> None:
            ready = []
            for unit in of_param.get(id(p), []):
                self.pending[id(unit)] -= 1
                if self.pending[id(unit)] == 0:
                    ready.append(unit)
            if ready:
                self.units_ready(ready)

        for _, p in named:
            if id(p) in of_param:
                self.hooks.append(p.register_post_accumulate_grad_hook(grad_ready))

    def units_ready(self, units: list) -> None:
        """Launch-when-ready: start the units' all-reduces at once."""
        for unit in units:
            unit.launch(async_op=True)

    def detach(self, model: torch.nn.Module) -> None:
        """Undo :meth:`attach`. Call between steps."""
        for handle in self.hooks:
            handle.remove()
        for layer in model.moe_layers():
            layer.comm, layer.timer = None, PhaseTimer(enabled=False)
        attach_grid_plan(model, GridOverlaps(), PhaseTimer(enabled=False))
        self.hooks, self.gradient_units, self.grid_layers = [], [], []

    def all_to_all(self, x: torch.Tensor, output_splits, input_splits, name: str) -> torch.Tensor:
        """One MoE all-to-all of ``x``'s rows on the expert-parallel group, as the plan's exchange runs
        it (a dropless layer's exchanges, whose splits vary; None splits: equal), one blocking span."""
        return self.blocking(lambda t: self.plan.exchange.all_to_all(self, t, output_splits, input_splits, name), x)

    def exchange_compute_exchange(self, buf: torch.Tensor, rows_per_expert: int, compute, params) -> torch.Tensor:
        """An MoE layer's equal-split exchange, as the plan's exchange runs it: dispatch all-to-all,
        ``compute(received, rows)`` with the expert weights ``params``, combine all-to-all.

        Under tensor parallelism the experts hold a share of their hidden units, so their input is
        Megatron's f and their output its g (moe_core.parallel.tensor_parallel), whatever the exchange.
        """
        if self.groups.tp_group is not None:
            compute = _tensor_parallel_experts(compute, self.groups.tp_group)
        return self.plan.exchange.exchange_compute_exchange(self, buf, rows_per_expert, compute, params)

    def blocking(self, exchange: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``exchange(x)``: a span in which MoE all-to-alls are in flight (one all-to-all, a pipelined
        exchange with its experts, one drop-and-all-gather). Every exchange runs its spans through
        here, so a policy that schedules around them overrides this alone (Lina's priority rule)."""
        return exchange(x)

    def finish_gradient_sync(self) -> None:
        """Complete the step's gradient sync: launch every unit not launched yet (all of them when
        units launch after the backward pass), wait for all, and average the in-place micro-ops.
        A grid's overlapped reduce-scatters complete first: their shards are what "data" units sum."""
        finish_reduce_scatters(self.grid_layers)
        if not self.plan.launch_when_ready:
            for unit in self.gradient_units:
                unit.launch(async_op=False)
                unit.finish()
        else:
            for unit in self.gradient_units:
                if not unit.launched:  # some gradient never arrived this step: launch what we have
                    unit.launch(async_op=True)
            for unit in self.gradient_units:
                unit.finish()
            self.pending = {id(u): len(u.params) for u in self.gradient_units}
        self._average_micro_ops()

    def _average_micro_ops(self) -> None:
        sliced = {id(u.param): u.param for u in self.gradient_units if isinstance(u, GradientMicroOp)}
        for p in sliced.values():
            p.grad /= self.groups.layout.data_replicas


def _tensor_parallel_experts(compute, tp_group):
    """``compute`` on experts that hold 1/tp of their hidden units: replicated input, partial outputs summed."""

    def sharded(x: torch.Tensor, rows: int) -> torch.Tensor:
        return reduce_from_tensor_parallel(compute(copy_to_tensor_parallel(x, tp_group), rows), tp_group)

    return sharded


def _named_class(path: str) -> type:
    """The class ``module:Class`` names (imported on first use: only the measured run needs it)."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def executor_class(spec: PolicySpec) -> type[CommPolicy]:
    """The measured executor a registered policy names (``module:Class``)."""
    return _named_class(spec.executor)


class FixedLayout:
    """The measured driver of a plan without a re-layout hook: the configured layout, every step."""

    def before_step(self, iteration: int, model, optimizer, policy: CommPolicy) -> CommPolicy:
        return policy

    def after_step(self, metrics: dict[str, float]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """The record's re-layout metrics (collective in a real driver): experts per rank relative to
        the configured layout, layout changes, and the time the moves took."""
        return {"packing_factor": 1, "repacks": 0, "exchange_ms": 0.0}


def make_relayout(plan: CommPlan, cfg, env, groups: ParallelGroups, moe_layers: int, element_bytes: int):
    """The measured driver of ``plan``'s re-layout hook (moe_core.schedule.plan.Relayout.runner), which the
    training loop calls between steps (``before_step``, ``after_step``) and asks for its record
    metrics; :class:`FixedLayout` when the plan has none."""
    if plan.relayout is None:
        return FixedLayout()
    return _named_class(plan.relayout.runner)(cfg, env, groups, moe_layers, element_bytes)


def make_policy(cfg, plan: CommPlan, groups: ParallelGroups, timer: PhaseTimer) -> CommPolicy:
    """The measured executor of ``plan`` (``cfg.comm.policy``'s, for ``groups``' layout)."""
    return executor_class(policy_spec(cfg.comm.policy))(plan, groups, timer)
