"""Ordered all-to-all: an Aurora transmission order (moe_core.comm.transmission) run as point-to-point rounds.

Aurora (Li et al., arXiv 2410.17043, Section 4.2) issues the all-to-all's sends and receives in a
chosen order instead of letting every sender start everywhere at once. This is the measured executor
of those orders: the same contract as ``torch.distributed.all_to_all_single`` with uneven splits, on
any backend with point-to-point operations (gloo, NCCL). Each rank walks its own steps of the
schedule (``transmission.rank_steps``): one ``batch_isend_irecv`` of at most one send and one receive
per step, waited for before the next. There is no barrier between rounds, so a rank waits only for
its own peers (as the simulator's ordered exchange models it, moe_core.sim.collectives); the result is
exact whatever the order.

Every rank must hold the same schedule, so every rank needs the whole traffic matrix:
``gather_traffic_matrix`` all-gathers the split sizes once per exchange (a small collective and a
host sync; equal splits need none).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from moe_core.comm.transmission import Schedule, rank_steps


def _splits(splits: list[int] | None, rows: int, world: int) -> list[int]:
    if splits is None:
        if rows % world:
            raise ValueError(f"equal splits need rows ({rows}) divisible by the group size ({world})")
        return [rows // world] * world
    if len(splits) != world or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"splits {list(splits)} must be {world} non-negative sizes summing to {rows} rows")
    return list(splits)


def gather_traffic_matrix(input: torch.Tensor, input_splits: list[int] | None, group=None) -> np.ndarray:
    """(world, world) int64: rows that group rank i sends to group rank j, the same on every rank.

    ``input`` is this rank's all-to-all input (rows along dim 0). ``None`` splits (equal chunks, the
    same on every rank) need no communication. NOTE: otherwise one all_gather of ``world`` integers
    per rank on ``input``'s device and a host sync: the price every exchange pays for a global order.
    """
    world, rows = dist.get_world_size(group), input.shape[0]
    if input_splits is None:
        return np.full((world, world), _splits(None, rows, world)[0], dtype=np.int64)
    mine = torch.tensor(_splits(input_splits, rows, world), dtype=torch.int64, device=input.device)
    everyone = mine.new_empty(world * world)
    dist.all_gather_into_tensor(everyone, mine, group=group)
    return everyone.view(world, world).cpu().numpy()


def ordered_all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_splits: list[int] | None,
    input_splits: list[int] | None,
    schedule: Schedule,
    group=None,
) -> None:
    """``dist.all_to_all_single(output, input, output_splits, input_splits, group)`` in ``schedule``'s order.

    Args:
        output: (sum(output_splits), ...) contiguous, filled in place; row blocks by source rank.
        input: (sum(input_splits), ...) contiguous; row blocks by destination rank.
        output_splits / input_splits: rows per rank (``None``: equal chunks).
        schedule: rounds of (src, dst, rows) over group ranks that move exactly the traffic matrix
            of these splits (e.g. ``make_schedule(kind, gather_traffic_matrix(...))``).
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    out_splits = _splits(output_splits, output.shape[0], world)
    in_splits = _splits(input_splits, input.shape[0], world)
    in_start = np.concatenate([[0], np.cumsum(in_splits)]).tolist()
    out_start = np.concatenate([[0], np.cumsum(out_splits)]).tolist()
    if in_splits[rank] != out_splits[rank]:
        raise ValueError(f"rank {rank} keeps {in_splits[rank]} rows but expects {out_splits[rank]} from itself")
    steps = rank_steps(schedule, rank)
    _check_steps(steps, rank, in_splits, out_splits)

    output.narrow(0, out_start[rank], out_splits[rank]).copy_(input.narrow(0, in_start[rank], in_splits[rank]))
    sent, received = [0] * world, [0] * world
    for send, recv in steps:
        ops = []
        if send is not None and send[1] > 0:
            peer, rows = send[0], int(send[1])
            ops.append(
                dist.P2POp(dist.isend, input.narrow(0, in_start[peer] + sent[peer], rows), group=group, group_peer=peer)
            )
            sent[peer] += rows
        if recv is not None and recv[1] > 0:
            peer, rows = recv[0], int(recv[1])
            ops.append(
                dist.P2POp(
                    dist.irecv, output.narrow(0, out_start[peer] + received[peer], rows), group=group, group_peer=peer
                )
            )
            received[peer] += rows
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()


def _check_steps(steps, rank: int, in_splits: list[int], out_splits: list[int]) -> None:
    """ValueError unless the steps move whole rows and exactly this rank's splits (the diagonal is local)."""
    sends, receives = [0] * len(in_splits), [0] * len(out_splits)
    for send, recv in steps:
        for peer_rows, total in ((send, sends), (recv, receives)):
            if peer_rows is not None:
                peer, rows = peer_rows
                if rows != int(rows):
                    raise ValueError(f"schedule moves {rows} rows between ranks {rank} and {peer}: not whole rows")
                total[peer] += int(rows)
    sends[rank], receives[rank] = in_splits[rank], out_splits[rank]
    if sends != in_splits or receives != out_splits:
        raise ValueError(
            f"rank {rank}: the schedule sends {sends} and receives {receives} rows per rank, "
            f"but the splits are {in_splits} and {out_splits}"
        )
