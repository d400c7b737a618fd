"""Differentiable all-to-all over a process group, timed per direction.

The backward of an all-to-all is the all-to-all with the split sizes swapped, so both MoE
all-to-alls (dispatch and combine) appear twice per step: once in the forward pass and once in
the backward pass, as Lina's problem model says.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .timing import PhaseTimer


def all_to_all(x: torch.Tensor, output_splits: list[int] | None, input_splits: list[int] | None, group,
               timer: PhaseTimer, name: str) -> torch.Tensor:
    """Exchange rows of ``x`` (dim 0) with the ranks of ``group``; autograd flows back the same way.

    ``None`` splits mean equal chunks. Time goes to ``<name>.fwd`` and ``<name>.bwd`` in ``timer``.
    """
    return _AllToAll.apply(x, output_splits, input_splits, group, timer, name)


def _exchange(x: torch.Tensor, output_splits, input_splits, group) -> torch.Tensor:
    rows = sum(output_splits) if output_splits is not None else x.shape[0]
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group, timer, name):
        ctx.output_splits, ctx.input_splits, ctx.group, ctx.timer, ctx.name = (
            output_splits, input_splits, group, timer, name)
        timer.count(f"{name}.bytes", x.numel() * x.element_size())
        with timer.region(f"{name}.fwd"):
            return _exchange(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        ctx.timer.count(f"{ctx.name}.bytes", grad.numel() * grad.element_size())
        with ctx.timer.region(f"{ctx.name}.bwd"):
            grad_in = _exchange(grad, ctx.input_splits, ctx.output_splits, ctx.group)
        return grad_in, None, None, None, None, None
