"""Differentiable all-to-all over a process group, timed per direction.

The backward of an all-to-all is the all-to-all with the split sizes swapped, so both MoE
all-to-alls (dispatch and combine) appear twice per step: once in the forward pass and once in
the backward pass, as Lina's problem model says. With a ``schedule`` (Aurora's transmission order,
moe_core.transmission) the exchange runs as ordered point-to-point rounds (moe_core.ordered_a2a)
and the backward runs the transposed schedule.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .ordered_a2a import ordered_all_to_all_single
from .timing import PhaseTimer
from .transmission import Schedule, transpose


def all_to_all(
    x: torch.Tensor,
    output_splits: list[int] | None,
    input_splits: list[int] | None,
    group,
    timer: PhaseTimer,
    name: str,
    schedule: Schedule | None = None,
) -> torch.Tensor:
    """Exchange rows of ``x`` (dim 0) with the ranks of ``group``; autograd flows back the same way.

    ``None`` splits mean equal chunks. Time goes to ``<name>.fwd`` and ``<name>.bwd`` in ``timer``.
    ``schedule`` (rows between group ranks, matching the splits) orders the exchange.
    """
    return _AllToAll.apply(x, output_splits, input_splits, group, timer, name, schedule)


def exchange(x: torch.Tensor, output_splits, input_splits, group, schedule: Schedule | None) -> torch.Tensor:
    """One all-to-all of ``x``'s rows, no autograd: ``all_to_all_single``, or in ``schedule``'s order."""
    rows = sum(output_splits) if output_splits is not None else x.shape[0]
    out = x.new_empty((rows, *x.shape[1:]))
    if schedule is None:
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
    else:
        ordered_all_to_all_single(out, x.contiguous(), output_splits, input_splits, schedule, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group, timer, name, schedule):
        ctx.output_splits, ctx.input_splits, ctx.group, ctx.timer, ctx.name, ctx.schedule = (
            output_splits,
            input_splits,
            group,
            timer,
            name,
            schedule,
        )
        timer.count(f"{name}.bytes", x.numel() * x.element_size())
        with timer.region(f"{name}.fwd"):
            return exchange(x, output_splits, input_splits, group, schedule)

    @staticmethod
    def backward(ctx, grad):
        ctx.timer.count(f"{ctx.name}.bytes", grad.numel() * grad.element_size())
        with ctx.timer.region(f"{ctx.name}.bwd"):
            back = None if ctx.schedule is None else transpose(ctx.schedule)
            grad_in = exchange(grad, ctx.input_splits, ctx.output_splits, ctx.group, back)
        return grad_in, None, None, None, None, None, None


def pipelined_exchange(
    buf: torch.Tensor,
    rows_per_expert: int,
    chunks: list[tuple[int, int]],
    compute,
    params: tuple[torch.nn.Parameter, ...],
    group,
    timer: PhaseTimer,
) -> torch.Tensor:
    """Dispatch all-to-all -> ``compute`` -> combine all-to-all, pipelined over token chunks (Lina).

    ``buf`` is (E*R, M) in expert order; chunk (a, b) takes rows a..b of every expert, so each chunk
    is an equal-split all-to-all of its own. All dispatch chunks are launched asynchronously; the
    experts work on chunk k as soon as it has arrived, while later chunks are in flight, and send
    its outputs back at once. The backward pass pipelines the same way in reverse. The result
    equals the unpipelined exchange exactly (every row meets the same expert weights).

    ``params`` are the expert weights ``compute`` uses: their gradients are summed over the chunks
    and handed to autograd once, so each accumulates (and fires its gradient hooks) once per step.
    """
    return _PipelinedExchange.apply(buf, rows_per_expert, chunks, compute, group, timer, *params)


def _exchange_chunks(chunks: list[torch.Tensor], group, timer: PhaseTimer, name: str) -> list:
    """Launch an equal-split all-to-all per chunk; (received buffer, work) per chunk."""
    launched = []
    for chunk in chunks:
        timer.count(f"{name}.bytes", chunk.numel() * chunk.element_size())
        received = torch.empty_like(chunk)
        launched.append((received, dist.all_to_all_single(received, chunk, group=group, async_op=True)))
    return launched


def _gather_chunks(parts: list[torch.Tensor], chunks: list[tuple[int, int]], shape) -> torch.Tensor:
    """Inverse of splitting (E, R, M) into row chunks: put each (E*(b-a), M) part back at rows a..b."""
    experts, rows, width = shape
    out = parts[0].new_empty(experts, rows, width)
    for part, (a, b) in zip(parts, chunks):
        out[:, a:b] = part.view(experts, b - a, width)
    return out.view(experts * rows, width)


class _PipelinedExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buf, rows_per_expert, chunks, compute, group, timer, *params):
        shape = (buf.shape[0] // rows_per_expert, rows_per_expert, buf.shape[1])
        split = buf.view(shape)
        with timer.region("dispatch_a2a.fwd"):
            arriving = _exchange_chunks(
                [split[:, a:b].reshape(-1, shape[2]) for a, b in chunks], group, timer, "dispatch_a2a"
            )
        ctx.graphs, leaving = [], []
        for (received, work), (a, b) in zip(arriving, chunks):
            with timer.region("dispatch_a2a.fwd"):
                work.wait()
            with torch.set_grad_enabled(buf.requires_grad):  # a graph per chunk, for the pipelined backward
                x = received.requires_grad_(buf.requires_grad)
                y = compute(x, b - a)
            ctx.graphs.append((x, y))
            leaving += _exchange_chunks([y.detach().contiguous()], group, timer, "combine_a2a")
        with timer.region("combine_a2a.fwd"):
            for _, work in leaving:
                work.wait()
        ctx.chunks, ctx.shape, ctx.group, ctx.timer, ctx.params = chunks, shape, group, timer, params
        return _gather_chunks([received for received, _ in leaving], chunks, shape)

    @staticmethod
    def backward(ctx, grad):
        shape, timer = ctx.shape, ctx.timer
        split = grad.contiguous().view(shape)
        with timer.region("combine_a2a.bwd"):
            arriving = _exchange_chunks(
                [split[:, a:b].reshape(-1, shape[2]).contiguous() for a, b in ctx.chunks],
                ctx.group,
                timer,
                "combine_a2a",
            )
        leaving, param_grads = [], [torch.zeros_like(p) for p in ctx.params]
        for (received, work), (x, y) in zip(arriving, ctx.graphs):
            with timer.region("combine_a2a.bwd"):
                work.wait()
            grad_x, *grads = torch.autograd.grad(y, (x, *ctx.params), received)  # this chunk's expert backward
            leaving += _exchange_chunks([grad_x.contiguous()], ctx.group, timer, "dispatch_a2a")
            for total, g in zip(param_grads, grads):
                total += g
        with timer.region("dispatch_a2a.bwd"):
            for _, work in leaving:
                work.wait()
        ctx.graphs = None
        grad_buf = _gather_chunks([received for received, _ in leaving], ctx.chunks, shape)
        return (grad_buf, None, None, None, None, None, *param_grads)
