"""Communication policies: every collective of a training step goes through one of these.

A policy owns two decisions, which later mechanisms (Lina, MoNTA, Aurora) override:

* ``all_to_all``: how the MoE layers' token exchanges run (here: one ``all_to_all_single``);
* gradient synchronisation: when the data-parallel gradient all-reduces are launched
  (``attach`` registers per-parameter hooks, ``finish_gradient_sync`` completes them).

Baselines:

* ``sequential``: all gradient buckets are all-reduced after the backward pass; nothing overlaps.
* ``overlap``: DDP/DeepSpeed-like. A bucket is all-reduced asynchronously, on its own communicator,
  as soon as all its gradients are ready, so it runs concurrently with (and contends with) the
  backward all-to-alls. This is the contention baseline Lina and Aurora compare against.

Both policies reduce exactly the same buckets in the same arithmetic, so they produce the same loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import comm
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

    def __init__(self, groups: ParallelGroups, timer: PhaseTimer, bucket_bytes: int):
        self.groups, self.timer, self.bucket_bytes = groups, timer, bucket_bytes
        self.buckets: list[GradientBucket] = []

    def attach(self, model: torch.nn.Module) -> None:
        """Route the model's MoE all-to-alls through this policy and build its gradient buckets."""
        for layer in model.moe_layers():
            layer.comm, layer.timer = self, self.timer
        self.buckets = make_buckets(model, self.groups, self.bucket_bytes)

    def all_to_all(self, x: torch.Tensor, output_splits, input_splits, name: str) -> torch.Tensor:
        return comm.all_to_all(x, output_splits, input_splits, self.groups.ep_group, self.timer, name)

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
                p.register_post_accumulate_grad_hook(lambda _p, b=bucket: self._grad_ready(b))

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


POLICIES: dict[str, type[CommPolicy]] = {p.name: p for p in (Sequential, Overlap)}


def make_policy(name: str, groups: ParallelGroups, timer: PhaseTimer, bucket_bytes: int) -> CommPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown communication policy '{name}'; allowed: {sorted(POLICIES)}")
    return POLICIES[name](groups, timer, bucket_bytes)
