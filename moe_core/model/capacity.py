"""Expert capacity: how many token slots each expert's dispatch buffer has (GShard's C).

Torch-free, so configs validate and the simulator and the papers' models size buffers without
importing torch.
"""

from __future__ import annotations

import math

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # train.dtype -> bytes per activation element (and on the wire)


def moe_blocks(n_layers: int, moe_every: int) -> list[int]:
    """The blocks whose FFN is an MoE layer: every ``moe_every``-th (GShard: 2, the odd blocks);
    none when ``moe_every`` is 0, a dense GPT."""
    return [i for i in range(n_layers) if moe_every and i % moe_every == moe_every - 1]


def capacity(
    tokens_per_group: int, num_experts: int, top_k: int, capacity_factor: float, min_capacity: int, multiple: int = 1
) -> int:
    """Expert capacity per group: C = max(min_capacity, ceil(capacity_factor * top_k * S / E)),
    rounded up to a multiple of ``multiple`` (a tensor-parallel layout whose TP ranks keep C/tp
    slots each, as DeepSpeed's drop_tokens asserts).

    GShard's paper sets C = 2N/(G E) = top_k * S / E (capacity_factor 1). lingvo's
    ``Top2GatingOnLogits`` uses int(S * cf / E) rounded up to a multiple of 4 (a TPU tiling
    choice); we round up to the next integer so that capacity_factor=1 never drops a token under
    perfectly balanced routing.
    """
    slots = max(min_capacity, math.ceil(capacity_factor * top_k * tokens_per_group / num_experts))
    return math.ceil(slots / multiple) * multiple


def expert_tensor_parallel(cfg) -> int:
    """Over how many ranks each expert's hidden units are split: ``moe.expert_tensor_parallel``, or
    when 0 ``parallel.tensor_parallel`` (DeepSpeed's layout, Megatron's default)."""
    return cfg.moe.expert_tensor_parallel or cfg.parallel.tensor_parallel


def moe_tokens(cfg) -> int:
    """Tokens one rank routes per MoE layer: its batch's; with experts split over fewer ranks than
    the dense blocks (expert_tensor_parallel < tensor_parallel), the rank's share of its
    tensor-parallel group's tokens, as Megatron's sequence parallelism hands them to the MoE layer."""
    tokens = cfg.train.batch_size * cfg.model.seq_len
    return tokens * expert_tensor_parallel(cfg) // cfg.parallel.tensor_parallel


def dispatch_rows_per_expert(cfg) -> int:
    """Rows per expert of one rank's capacity-mode dispatch buffer (E, G * C, M): G groups of
    ``moe.group_size`` tokens (one group per rank when 0) of its :func:`moe_tokens`, times the
    capacity C of a group."""
    moe = cfg.moe
    tokens = moe_tokens(cfg)
    group = moe.group_size or tokens
    return (tokens // group) * capacity(group, moe.num_experts, moe.top_k, moe.capacity_factor, moe.min_capacity)
