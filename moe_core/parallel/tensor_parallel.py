"""Megatron-style tensor parallelism of the model, applied from outside as expert sharding is.

The ranks of one "tp" group (moe_core.parallel.layout) hold the same tokens and split every weight matrix
of a block between them:

* attention: the QKV projection column-parallel (each rank computes ``n_heads / tp`` heads), the
  output projection row-parallel;
* dense FFN: ``w_in`` column-parallel, ``w_out`` row-parallel;
* experts: the same split of every expert's hidden units (DeepSpeed's expert tensor parallelism),
  applied by :func:`shard_experts_hidden`; the communication policy wraps the expert computation in
  the two operators below (moe_core.schedule.executor).

Two conjugate operators (Megatron's f and g) keep activations replicated between the parallel
regions: :func:`copy_to_tensor_parallel` (identity forward, all-reduce of the gradient backward)
before a column-parallel matmul, :func:`reduce_from_tensor_parallel` (all-reduce forward, identity
backward) after a row-parallel one: one all-reduce per region and direction.

Embeddings, layer norms, the gate, the head and the row-parallel biases stay replicated. Their
gradients are identical on the ranks of a "tp" group, so every dense gradient is averaged over the
ranks with the same "tp" index only (moe_core.parallel.parallelize.ParallelGroups.dense_grad_group).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from moe_core.model.layer import MoELayer


class _CopyToTensorParallel(torch.autograd.Function):
    """f: the input of a column-parallel region. Each rank's gradient is a partial sum; add them."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: the output of a row-parallel region. Each rank holds a partial sum; add them."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromTensorParallel.apply(x, group)


class _ShardedLinear(nn.Module):
    """A Linear's shard on one rank of a "tp" group; ``weight`` and ``bias`` as nn.Linear names them,
    so parameter names (and gradient plans) are the unsharded model's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group = group


class ColumnParallelLinear(_ShardedLinear):
    """y_local = x W_local^T + b_local: this rank's rows of a Linear's weight (output features)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tensor_parallel(x, self.group), self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """y = sum over ranks of x_local W_local^T, + b: this rank's columns (input features); the bias,
    replicated, is added once after the sum."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tensor_parallel(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def _rows(t: torch.Tensor, index: int, parts: int, blocks: list[int] | None = None) -> torch.Tensor:
    """Part ``index`` of ``parts`` of every row block of ``t`` (dim 0), the blocks ``blocks`` rows
    each (one block of all rows by default)."""
    pieces = torch.split(t.detach(), blocks or [t.shape[0]], dim=0)
    return torch.cat([piece.chunk(parts, dim=0)[index] for piece in pieces], dim=0).clone()


def column_parallel(
    linear: nn.Linear, index: int, parts: int, group, blocks: list[int] | None = None
) -> ColumnParallelLinear:
    """``linear`` split by output features; ``blocks`` (their sizes) splits each of several stacked
    outputs (QKV: rank i keeps its heads of Q, of K and of V; SwiGLU: its units of gate and of up)."""
    bias = _rows(linear.bias, index, parts, blocks) if linear.bias is not None else None
    return ColumnParallelLinear(_rows(linear.weight, index, parts, blocks), bias, group)


def row_parallel(linear: nn.Linear, index: int, parts: int, group) -> RowParallelLinear:
    """``linear`` split by input features."""
    weight = _rows(linear.weight.t(), index, parts).t().contiguous()
    bias = linear.bias.detach().clone() if linear.bias is not None else None
    return RowParallelLinear(weight, bias, group)


def shard_experts_hidden(layer: MoELayer, index: int, parts: int) -> None:
    """Keep part ``index`` of ``parts`` of every expert's hidden units (w_in columns, w_out rows)."""
    count = layer.experts.w_out.shape[1] // parts  # w_out: (E, H, M)
    layer.experts.keep_hidden(index * count, count)


def shard_tensor_parallel(model: nn.Module, index: int, parts: int, group, experts: bool = True) -> None:
    """Split ``model``'s blocks over a "tp" group of ``parts`` ranks; this rank is ``index``.

    Works on any device, the meta device included (moe_core.schedule.gradients.gradient_tensors reads a rank's
    gradient shapes from a meta model sharded the same way). Weights are split after the full
    model is initialised with the run's seed, so a tensor-parallel model starts as the
    single-process one.
    """
    if parts == 1:
        return
    for block in model.blocks:
        attn = block.attn
        attn.qkv = column_parallel(attn.qkv, index, parts, group, blocks=attn.qkv_widths())
        attn.proj = row_parallel(attn.proj, index, parts, group)
        if isinstance(block.ffn, MoELayer):
            if experts:  # False: whole experts (moe.expert_tensor_parallel=1, simulated only)
                shard_experts_hidden(block.ffn, index, parts)
        else:
            block.ffn.w_in = column_parallel(block.ffn.w_in, index, parts, group, blocks=block.ffn.in_blocks())
            block.ffn.w_out = row_parallel(block.ffn.w_out, index, parts, group)
