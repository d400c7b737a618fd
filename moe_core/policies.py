"""Communication policies: every collective of a training step goes through one of these.

A policy owns two decisions, which later mechanisms (Lina, MoNTA, Aurora) override:

* ``all_to_all``: how the MoE layers' token exchanges run (here: one ``all_to_all_single``);
* gradient synchronisation: when the data-parallel gradient all-reduces are launched
  (``attach`` registers per-parameter hooks, ``finish_gradient_sync`` completes them; ``detach``
  removes them, so Lina's expert packing can attach a policy on the groups of a new layout).

Baselines:

* ``sequential``: all gradient buckets are all-reduced after the backward pass; nothing overlaps.
* ``overlap``: DDP/DeepSpeed-like. A bucket is all-reduced asynchronously, on its own communicator,
  as soon as all its gradients are ready, so it runs concurrently with (and contends with) the
  backward all-to-alls. This is the contention baseline Lina and Aurora compare against.

Aurora (Li et al., arXiv 2410.17043): sequential gradient synchronisation, and every MoE all-to-all
runs in a transmission order computed from the exchange's real traffic matrix
(moe_core.a2a_schedule, executed by moe_core.ordered_a2a):

* ``aurora``: the paper's Algorithm 1 (bottleneck GPU first, conflict-free);
* ``aurora-sjf``: shortest flow first per sender; ``aurora-rcs``: random order per sender (the
  paper's baselines).

The matrix is all-gathered before each forward exchange; that collective is timed as part of the
all-to-all (``<name>.fwd``). All policies reduce exactly the same buckets in the same arithmetic and
move the same rows, so they produce the same loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from . import comm
from .a2a_schedule import make_schedule
from .lina import LINA_POLICIES, a2a_micro_ops, gradient_micro_ops
from .ordered_a2a import gather_traffic_matrix
from .parallel import ParallelGroups, is_expert_param
from .timing import PhaseTimer


class GradientBucket:
    """Parameters whose gradients are flattened into one buffer and all-reduced together."""

    def __init__(self, params: list[torch.nn.Parameter], group, world_size: int):
        self.params, self.group, self.world_size = params, group, world_size
        self.ready = 0
        self.work = None
        self.buffer: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)

    def launch(self, async_op: bool) -> None:
        """Flatten the gradients and start their sum over ``group``."""
        self.buffer = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                 for p in self.params])
        if dist.get_world_size(self.group) > 1:
            self.work = dist.all_reduce(self.buffer, group=self.group, async_op=async_op)

    def done(self) -> bool:
        return self.work is None or self.work.is_completed()

    def finish(self) -> None:
        """Wait for the sum, divide by the world size and write the averages back into ``.grad``."""
        if self.work is not None:
            self.work.wait()
        self.buffer /= self.world_size
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.buffer[offset:offset + n].view_as(p).clone()
            offset += n
        self.ready, self.work, self.buffer = 0, None, None


def assign_buckets(params: list[tuple[int, bool]], bucket_bytes: int) -> list[tuple[bool, list[int]]]:
    """Group parameters into gradient buckets: the decision both executors share.

    ``params`` are (bytes, is_expert) in the order backward produces their gradients (reverse
    model order, as DDP assumes). Dense and expert parameters never share a bucket, since they are
    reduced over different groups; a bucket closes once it holds ``bucket_bytes``. Returns
    (is_expert, indices into ``params``) per bucket, in launch order.
    """
    open_buckets: dict[bool, list[int]] = {False: [], True: []}
    size = {False: 0, True: 0}
    closed: list[tuple[bool, list[int]]] = []
    for i, (nbytes, expert) in enumerate(params):
        open_buckets[expert].append(i)
        size[expert] += nbytes
        if size[expert] >= bucket_bytes:
            closed.append((expert, open_buckets[expert]))
            open_buckets[expert], size[expert] = [], 0
    return closed + [(expert, b) for expert, b in open_buckets.items() if b]


def backward_ordered_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Named parameters in the order backward produces their gradients (reverse definition order)."""
    return list(reversed(list(model.named_parameters())))


def make_buckets(model: torch.nn.Module, groups: ParallelGroups, bucket_bytes: int) -> list[GradientBucket]:
    """The model's gradient buckets (see :func:`assign_buckets`) on their process groups."""
    named = backward_ordered_params(model)
    plan = assign_buckets([(p.numel() * p.element_size(), is_expert_param(n)) for n, p in named], bucket_bytes)
    group = {True: groups.expert_grad_group, False: groups.dense_grad_group}
    return [GradientBucket([named[i][1] for i in idx], group[expert], groups.layout.world_size)
            for expert, idx in plan]


class CommPolicy:
    """Base policy: plain all-to-all on the expert-parallel group; subclasses decide the all-reduces."""

    name = "base"
    # The launch rule both executors follow: a gradient bucket's all-reduce starts as soon as its
    # gradients are ready (True) or after the whole backward pass (False); buckets go in order.
    launch_when_ready = False

    def __init__(self, groups: ParallelGroups, timer: PhaseTimer, bucket_bytes: int,
                 partition_bytes: int = 30 * 2**20):
        self.groups, self.timer = groups, timer
        self.bucket_bytes, self.partition_bytes = bucket_bytes, partition_bytes  # unit sizes of gradient sync
        self.buckets: list[GradientBucket] = []
        self.hooks: list[RemovableHandle] = []  # what attach registered on the model

    def attach(self, model: torch.nn.Module) -> None:
        """Route the model's MoE all-to-alls through this policy and build its gradient buckets."""
        for layer in model.moe_layers():
            layer.comm, layer.timer = self, self.timer
        self.buckets = make_buckets(model, self.groups, self.bucket_bytes)

    def detach(self, model: torch.nn.Module) -> None:
        """Undo :meth:`attach`: remove this policy's hooks and un-route the MoE layers, so another
        policy (e.g. on the process groups of a new expert layout) can attach. Call between steps."""
        for handle in self.hooks:
            handle.remove()
        for layer in model.moe_layers():
            layer.comm, layer.timer = None, PhaseTimer(enabled=False)
        self.hooks, self.buckets = [], []

    def all_to_all(self, x: torch.Tensor, output_splits, input_splits, name: str) -> torch.Tensor:
        return comm.all_to_all(x, output_splits, input_splits, self.groups.ep_group, self.timer, name)

    def exchange_compute_exchange(self, buf: torch.Tensor, rows_per_expert: int, compute, params) -> torch.Tensor:
        """An MoE layer's equal-split exchange: dispatch all-to-all, ``compute(received, rows)`` with the
        expert weights ``params``, combine all-to-all."""
        received = self.all_to_all(buf, None, None, "dispatch_a2a")
        return self.all_to_all(compute(received, rows_per_expert), None, None, "combine_a2a")

    def finish_gradient_sync(self) -> None:
        raise NotImplementedError


class Sequential(CommPolicy):
    name = "sequential"

    def finish_gradient_sync(self) -> None:
        for bucket in self.buckets:
            bucket.launch(async_op=False)
            bucket.finish()


class Overlap(CommPolicy):
    name = "overlap"
    launch_when_ready = True

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        for bucket in self.buckets:
            for p in bucket.params:
                self.hooks.append(p.register_post_accumulate_grad_hook(lambda _p, b=bucket: self._grad_ready(b)))

    def _grad_ready(self, bucket: GradientBucket) -> None:
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            bucket.launch(async_op=True)

    def finish_gradient_sync(self) -> None:
        for bucket in self.buckets:
            if bucket.buffer is None:  # some gradient never arrived this step: launch what we have
                bucket.launch(async_op=True)
        for bucket in self.buckets:
            bucket.finish()


class Aurora(Sequential):
    """Sequential gradient sync; each all-to-all in an order planned from its gathered traffic matrix."""

    name = "aurora"
    schedule_kind = "aurora"  # a moe_core.a2a_schedule.SCHEDULE_KINDS entry

    def __init__(self, groups: ParallelGroups, timer: PhaseTimer, bucket_bytes: int, **sizes):
        super().__init__(groups, timer, bucket_bytes, **sizes)
        self.exchanges = 0  # seeds the random order of aurora-rcs; equal on all ranks (lockstep calls)

    def all_to_all(self, x: torch.Tensor, output_splits, input_splits, name: str) -> torch.Tensor:
        group = self.groups.ep_group
        with self.timer.region(f"{name}.fwd"):
            matrix = gather_traffic_matrix(x, input_splits, group)  # (ep, ep) rows
            schedule = make_schedule(self.schedule_kind, matrix, seed=self.exchanges)
        self.exchanges += 1
        return comm.all_to_all(x, output_splits, input_splits, group, self.timer, name, schedule=schedule)


class AuroraSJF(Aurora):
    name = "aurora-sjf"
    schedule_kind = "sjf"


class AuroraRCS(Aurora):
    name = "aurora-rcs"
    schedule_kind = "rcs"


# Aurora's orders by policy name; the measured inference offers the same choice (inference.a2a_policy).
AURORA_ORDERS = {cls.name: cls.schedule_kind for cls in (Aurora, AuroraSJF, AuroraRCS)}


class GradientMicroOp:
    """One all-reduce micro-op of Lina's partitioning: elements [start, stop) of one gradient, summed
    in place (the division by the world size happens once per tensor, after all its micro-ops)."""

    def __init__(self, param: torch.nn.Parameter, start: int, stop: int, group):
        self.param, self.start, self.stop, self.group = param, start, stop, group
        self.work = None

    def launch(self, async_op: bool) -> None:
        if self.param.grad is None:
            self.param.grad = torch.zeros_like(self.param)
        if dist.get_world_size(self.group) > 1:
            self.work = dist.all_reduce(self.param.grad.view(-1)[self.start:self.stop], group=self.group,
                                        async_op=async_op)

    def done(self) -> bool:
        return self.work is None or self.work.is_completed()

    def finish(self) -> None:
        if self.work is not None:
            self.work.wait()
        self.work = None


class _BackwardSignal(torch.autograd.Function):
    """Identity whose backward calls ``callback`` when the gradient passes through."""

    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None


class Lina(CommPolicy):
    """Lina's training scheduler on one rank (moe_core.lina; Li et al., ATC'23 §4).

    Gradient units (DDP buckets, or per-tensor micro-ops with partitioning) become ready in backward
    order and wait in a FIFO queue, so every rank launches them in the same order. Without priority
    they launch at once (as ``overlap``). With priority one launches only while no all-to-all is
    running or imminent (an MoE layer's backward start, its combine computation, blocks launching
    until the layer's next all-to-all is over) and only once the previous one has completed, so an
    all-to-all waits behind at most one. The queue is served on every gradient hook and at the end
    of every backward all-to-all; ``finish_gradient_sync`` launches the rest. Same sums in the same
    arithmetic as the baselines, so the same loss.
    """

    launch_when_ready = True
    features = LINA_POLICIES["lina"]

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        self.a2a_busy = False
        self.queue: list = []  # ready, not launched
        self.launched: list = []
        if self.features.partition:
            named = backward_ordered_params(model)
            group = {True: self.groups.expert_grad_group, False: self.groups.dense_grad_group}
            ops = gradient_micro_ops([p.numel() for _, p in named], named[0][1].element_size(), self.partition_bytes)
            self.units = [GradientMicroOp(named[i][1], start, stop, group[is_expert_param(named[i][0])])
                          for i, start, stop in ops]
            of_param: dict[int, list[GradientMicroOp]] = {}
            for unit in self.units:
                of_param.setdefault(id(unit.param), []).append(unit)
            for _, p in named:
                self.hooks.append(p.register_post_accumulate_grad_hook(lambda q: self._ready(of_param[id(q)])))
        else:
            self.units = self.buckets
            for bucket in self.buckets:
                for p in bucket.params:
                    self.hooks.append(p.register_post_accumulate_grad_hook(
                        lambda _p, b=bucket: self._bucket_grad_ready(b)))
        if self.features.priority:
            for layer in model.moe_layers():
                self.hooks.append(layer.register_forward_hook(self._block_at_backward_start))

    def _block_at_backward_start(self, _layer, _inputs, outputs) -> None:
        if outputs[0].requires_grad:
            outputs[0].register_hook(lambda _grad: setattr(self, "a2a_busy", True))

    def all_to_all(self, x: torch.Tensor, output_splits, input_splits, name: str) -> torch.Tensor:
        x = _BackwardSignal.apply(x, self._a2a_over)  # its gradient exists once the backward exchange is over
        y = super().all_to_all(x, output_splits, input_splits, name)
        return _BackwardSignal.apply(y, lambda: setattr(self, "a2a_busy", True))  # the exchange is next

    def exchange_compute_exchange(self, buf: torch.Tensor, rows_per_expert: int, compute, params) -> torch.Tensor:
        if not self.features.pipeline:
            return super().exchange_compute_exchange(buf, rows_per_expert, compute, params)
        experts, row_bytes = buf.shape[0] // rows_per_expert, buf[0].numel() * buf.element_size()
        chunks = a2a_micro_ops(rows_per_expert, experts * row_bytes, self.partition_bytes)
        buf = _BackwardSignal.apply(buf, self._a2a_over)
        out = comm.pipelined_exchange(buf, rows_per_expert, chunks, compute, params, self.groups.ep_group, self.timer)
        return _BackwardSignal.apply(out, lambda: setattr(self, "a2a_busy", True))

    def _a2a_over(self) -> None:
        self.a2a_busy = False
        self._serve()

    def _bucket_grad_ready(self, bucket: GradientBucket) -> None:
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._ready([bucket])

    def _ready(self, units: list) -> None:
        self.queue += units
        self._serve()

    def _launch_next(self) -> None:
        unit = self.queue.pop(0)
        unit.launch(async_op=True)
        self.launched.append(unit)

    def _serve(self) -> None:
        if not self.features.priority:
            while self.queue:
                self._launch_next()
        elif self.queue and not self.a2a_busy and (not self.launched or self.launched[-1].done()):
            self._launch_next()

    def finish_gradient_sync(self) -> None:
        launched = {id(u) for u in self.launched}
        self.queue += [u for u in self.units if id(u) not in launched and u not in self.queue]  # never ready
        while self.queue:
            self._launch_next()
        for unit in self.launched:
            unit.finish()
        if self.features.partition:
            for p in {id(u.param): u.param for u in self.units}.values():
                p.grad /= self.groups.layout.world_size
        self.launched, self.a2a_busy = [], False


def _lina_variant(name: str) -> type[Lina]:
    return type(f"Lina_{name.replace('-', '_')}", (Lina,), {"name": name, "features": LINA_POLICIES[name]})


POLICIES: dict[str, type[CommPolicy]] = {p.name: p for p in (Sequential, Overlap, Aurora, AuroraSJF, AuroraRCS,
                                                             *map(_lina_variant, LINA_POLICIES))}


def make_policy(name: str, groups: ParallelGroups, timer: PhaseTimer, bucket_bytes: int,
                partition_bytes: int = 30 * 2**20) -> CommPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown communication policy '{name}'; allowed: {sorted(POLICIES)}")
    return POLICIES[name](groups, timer, bucket_bytes, partition_bytes=partition_bytes)
