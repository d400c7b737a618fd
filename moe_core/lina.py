"""Lina's training-time decisions (Li et al., USENIX ATC'23, §4), as pure functions.

Both executors call these: the measured one (the policy moe_core.policies.Lina; expert packing in
the training loop, experiments.train_step) and the step simulator (moe_core.sim.step). What each
executor adds is only how time passes.

* Tensor partitioning: every gradient tensor is cut into equal micro-ops of at most the partition
  size (default 30 MB), never fused with another tensor. With pipelining, every all-to-all is also
  cut along the token dimension into micro-ops of at most the partition size (whole otherwise: its
  micro-ops only matter to overlap them with the experts).
* Priority: an all-reduce micro-op is launched only when no all-to-all is waiting or running, at
  most one is in flight (NCCL ops cannot be preempted, so an all-to-all waits for at most one), and
  none is launched between the start of an MoE layer's backward pass and its all-to-all. On NCCL
  the all-to-alls also get high-priority CUDA streams (moe_core.parallel.build_groups).
* Pipelining: the expert FFN runs on each all-to-all micro-op as it arrives.
* Expert packing: experts per device double (powers of two) until the FFN time of a micro-op
  exceeds the all-to-all time of a micro-op; the expert-parallel group shrinks accordingly. A
  training run starts unpacked and decides after its warm-up steps, then again every few steps
  (``packing_due``; the paper: at step 10, then every 4 steps).

The ablations are cumulative, as in the paper's Fig 14: ``lina-priority`` -> ``lina-partition``
(+ partitioning) -> ``lina-pipeline`` (+ pipelining) -> ``lina`` (+ packing). ``lina-pack`` is
packing alone on top of the ``overlap`` baseline, to isolate its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from omegaconf import DictConfig

from .config import Layout, capacity


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


def chunk_count(nbytes: float, partition_bytes: float) -> int:
    """Equal micro-ops of at most ``partition_bytes`` that ``nbytes`` is cut into (at least one)."""
    if partition_bytes <= 0:
        raise ValueError(f"partition size must be > 0 bytes, got {partition_bytes}")
    return max(1, math.ceil(nbytes / partition_bytes))


def gradient_micro_ops(numels: list[int], element_bytes: int, partition_bytes: float) -> list[tuple[int, int, int]]:
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
        length = math.ceil(n / chunk_count(n * element_bytes, partition_bytes))
        ops += [(i, start, min(start + length, n)) for start in range(0, n, length)]
    return ops


def a2a_micro_ops(rows: int, row_bytes: int, partition_bytes: float) -> list[tuple[int, int]]:
    """An all-to-all of ``rows`` token rows (per destination) cut along the token dimension into
    micro-ops of at most ``partition_bytes``: (start, stop) row ranges, at most one per row."""
    if rows <= 0:
        return [(0, 0)]
    count = min(rows, chunk_count(rows * row_bytes, partition_bytes))
    bounds = [round(k * rows / count) for k in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def layer_a2a_micro_ops(cfg: DictConfig, element_bytes: int) -> list[tuple[int, int]]:
    """The micro-ops of one MoE all-to-all of ``cfg``'s model in capacity mode: the E * G * C rows
    buffer cut along its G * C rows per expert (what the pipelined exchange sends per chunk)."""
    m, moe = cfg.model, cfg.moe
    tokens = cfg.train.batch_size * m.seq_len
    S = moe.group_size or tokens
    rows = (tokens // S) * capacity(S, moe.num_experts, moe.top_k, moe.capacity_factor, moe.min_capacity)
    return a2a_micro_ops(rows, moe.num_experts * m.d_model * element_bytes, cfg.comm.partition_mb * 2**20)


def max_packing_factor(expert_parallel: int) -> int:
    """The largest packing factor a layout allows: the largest power of two dividing its
    expert-parallel size (every expert local at most)."""
    return expert_parallel & -expert_parallel


def packed_layout(layout: Layout, factor: int) -> Layout:
    """``layout`` with ``factor`` times the experts per device (its expert-parallel groups shrink)."""
    return Layout(layout.world_size, layout.num_experts, layout.experts_per_rank * factor)


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
