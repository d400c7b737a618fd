"""The token exchanges on torch.distributed, as differentiable functions timed per direction.

The token dispatchers (moe_core.dispatch), in a training step (the plan's ``exchange``) and in the
dispatcher study, run these; they hold no decision of their own.

* :func:`all_to_all`: the backward of an all-to-all is the all-to-all with the split sizes swapped,
  so both MoE all-to-alls (dispatch and combine) appear twice per step: once in the forward pass
  and once in the backward pass, as Lina's problem model says. With a ``schedule`` (Aurora's
  transmission order, moe_core.comm.transmission) the exchange runs as ordered point-to-point rounds
  (moe_core.comm.ordered_a2a) and the backward runs the transposed schedule; over a group's
  HierarchicalGroups it runs in two phases (moe_core.comm.hierarchical_a2a).
* :func:`pipelined_exchange`: dispatch -> experts -> combine over token micro-ops, the experts
  working on one while the next arrives (Lina).
* :func:`gather_rows` and :func:`scatter_rows`: the all-gather of every rank's rows and the
  reduce-scatter back, each the other's backward (Megatron's allgather dispatcher).
* :func:`tp_exchange`: under tensor parallelism the ranks of a "tp" group hold the same tokens; it
  sends each rank's 1/tp of them through the all-to-all and all-gathers the rest over "tp"
  (DeepSpeed's drop-gather), optionally in pipelined chunks so that the all-gathers overlap the
  all-to-alls (MoNTA).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_core.comm.hierarchical_a2a import HierarchicalGroups, hierarchical_all_to_all_single
from moe_core.comm.ordered_a2a import ordered_all_to_all_single
from moe_core.comm.transmission import Schedule, transpose
from moe_core.host.timing import PhaseTimer


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
    """One all-to-all of ``x``'s rows, no autograd: ``all_to_all_single``, in ``schedule``'s order, or
    in two phases when ``group`` is a group's HierarchicalGroups (equal splits only)."""
    rows = sum(output_splits) if output_splits is not None else x.shape[0]
    out = x.new_empty((rows, *x.shape[1:]))
    if isinstance(group, HierarchicalGroups):
        if output_splits is not None or input_splits is not None or schedule is not None:
            raise ValueError("the hierarchical all-to-all exchanges equal splits in the library's order only")
        hierarchical_all_to_all_single(out, x.contiguous(), group)
    elif schedule is None:
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


def gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``x`` (equal rows) stacked in rank order; the gradient of each rank's rows is
    summed over the ranks (a reduce-scatter)."""
    return _GatherRows.apply(x, group)


def scatter_rows(x: torch.Tensor, group) -> torch.Tensor:
    """``x`` summed over the ranks, each keeping its 1/world of the rows (a reduce-scatter); the
    gradient is the all-gather of the ranks' gradients."""
    return _ScatterRows.apply(x, group)


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    out = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
    dist.all_gather_single(out, x.contiguous(), group=group)
    return out


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
    dist.reduce_scatter_single(out, x.contiguous(), group=group)
    return out


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group), None


class _ScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.group), None


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


def tp_exchange(
    x: torch.Tensor,
    rows_per_block: int,
    chunks: list[tuple[int, int]],
    ep_group,
    tp_group,
    timer: PhaseTimer,
    name: str,
) -> torch.Tensor:
    """The equal-split all-to-all of ``x`` over ``ep_group``, for ``x`` replicated over ``tp_group``:
    drop, all-to-all, all-gather, in pipelined chunks.

    ``x`` is (B * R, M): B blocks (one per expert, in destination order) of R = ``rows_per_block``
    rows. Rank t of the "tp" group keeps rows [t*R/tp, (t+1)*R/tp) of every block (drop), so the
    all-to-all carries 1/tp of the bytes; an all-gather over "tp" restores the other ranks' rows.
    ``chunks`` cut the kept rows into ranges (a, b): every chunk's all-to-all is launched at once,
    and chunk i is all-gathered as soon as its all-to-all has arrived, while later ones are still
    in flight (A1 | A2+I1 | A3+I2 | ...). One chunk is DeepSpeed's drop-gather. The result equals
    the all-to-all of the whole ``x`` exactly.

    The backward pass is the same exchange of the gradient: the gradient of an all-gather is this
    rank's slice (its gradient is replicated over "tp" too), the all-to-all's is the all-to-all,
    and a drop's is the all-gather.
    """
    return _TensorParallelExchange.apply(x, rows_per_block, chunks, ep_group, tp_group, timer, name)


def _drop_exchange_gather(x, rows_per_block, chunks, ep_group, tp_group, timer: PhaseTimer, name: str):
    tp, me = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    width = x.shape[-1]
    blocks, kept = x.shape[0] // rows_per_block, rows_per_block // tp
    mine = x.view(blocks, rows_per_block, width)[:, me * kept : (me + 1) * kept]  # (B, R/tp, M): drop
    out = x.new_empty(blocks, rows_per_block, width)
    arriving = _exchange_chunks(
        [mine[:, a:b].reshape(-1, width).contiguous() for a, b in chunks], ep_group, timer, name
    )
    for (received, work), (a, b) in zip(arriving, chunks):
        work.wait()
        pieces = [torch.empty_like(received) for _ in range(tp)]
        timer.count(f"{name}.allgather_bytes", received.numel() * received.element_size() * (tp - 1))
        dist.all_gather(pieces, received, group=tp_group)  # (B * (b-a), M) from every "tp" rank
        for t, piece in enumerate(pieces):
            out[:, t * kept + a : t * kept + b] = piece.view(blocks, b - a, width)
    return out.view(blocks * rows_per_block, width)


class _TensorParallelExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows_per_block, chunks, ep_group, tp_group, timer, name):
        ctx.args = (rows_per_block, chunks, ep_group, tp_group, timer, name)
        with timer.region(f"{name}.fwd"):
            return _drop_exchange_gather(x, *ctx.args)

    @staticmethod
    def backward(ctx, grad):
        timer, name = ctx.args[-2:]
        with timer.region(f"{name}.bwd"):
            return (_drop_exchange_gather(grad.contiguous(), *ctx.args), None, None, None, None, None, None)
