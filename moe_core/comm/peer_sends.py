"""Rows to every peer by point-to-point sends, no collective: the exchange of low-latency kernels
(moe_core.dispatch.direct_sends), as a differentiable function timed per direction.

Each rank posts a send to every peer it has rows for and a receive from every peer that has rows
for it, all at once (``torch.distributed.batch_isend_irecv``), and keeps its own rows without a
message. The backward sends the gradients back the same way, the splits swapped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from moe_core.host.timing import PhaseTimer


def peer_sends(
    x: torch.Tensor, send_rows, recv_rows, group, timer: PhaseTimer, name: str, slot_rows: int = 0
) -> torch.Tensor:
    """``x``'s rows (dim 0, in rank order: ``send_rows[j]`` for group rank j) to the ranks of ``group``;
    returns the ``recv_rows[j]`` rows from each rank j, in rank order. ``slot_rows`` > 0: receive into
    a buffer of that many rows for every peer (a kernel's worst case), peer j's rows at j x slot_rows,
    then compact them. Time goes to ``<name>.fwd`` and ``<name>.bwd``."""
    return _PeerSends.apply(x, list(send_rows), list(recv_rows), group, timer, name, slot_rows)


def _exchange(x: torch.Tensor, send_rows, recv_rows, group, slot_rows: int) -> torch.Tensor:
    """One exchange of ``x``'s rows (see :func:`peer_sends`), no autograd."""
    me, slot = dist.get_rank(group), slot_rows or max(recv_rows, default=0)
    buffer = x.new_empty((len(recv_rows) * slot, *x.shape[1:]))  # (peers * slot, ...)
    sent = torch.split(x.contiguous(), send_rows)
    ops = []
    for peer, (rows, count) in enumerate(zip(sent, recv_rows)):
        into = buffer[peer * slot : peer * slot + count]
        if peer == me:
            into.copy_(rows)
            continue
        to = dist.get_global_rank(group, peer)
        if rows.shape[0]:
            ops.append(dist.P2POp(dist.isend, rows, to, group))
        if count:
            ops.append(dist.P2POp(dist.irecv, into, to, group))
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()
    return torch.cat([buffer[peer * slot : peer * slot + count] for peer, count in enumerate(recv_rows)])


class _PeerSends(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_rows, recv_rows, group, timer, name, slot_rows):
        ctx.saved = (send_rows, recv_rows, group, timer, name)
        timer.count(f"{name}.bytes", x.numel() * x.element_size())
        with timer.region(f"{name}.fwd"):
            return _exchange(x, send_rows, recv_rows, group, slot_rows)

    @staticmethod
    def backward(ctx, grad):
        send_rows, recv_rows, group, timer, name = ctx.saved
        with timer.region(f"{name}.bwd"):
            return _exchange(grad, recv_rows, send_rows, group, 0), None, None, None, None, None, None
