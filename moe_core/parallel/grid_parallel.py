"""3D tensor parallelism of the model's dense linear layers, applied from outside as expert sharding is.

Every linear layer of attention and of the dense FFNs becomes a :class:`GridLinear`: this rank's
depth shard of its (row, col) block of the weight (moe_core.parallel.grid says which block and which
collectives), gathered over "depth" when the layer computes. What overlaps what is the
communication plan's decision (``CommPlan.grid_overlaps``), which the policy hands to every layer
when it attaches (moe_core.schedule.executor); the layers execute it:

* forward: all-gather the weight over "depth" (or take the one prefetched by the previous layer),
  issue the next layer's all-gather if the plan prefetches, ``Y = X W^T``, all-reduce ``Y`` over the
  inner group;
* backward: the weight cached from forward, prefetched or all-gathered; ``dX = dY W`` and its
  all-reduce over the outer group (asynchronous behind the weight-gradient matmul if the plan
  overlaps it); ``dW = dY^T X`` reduce-scattered over "depth" (asynchronous, and written into
  ``.grad`` by :func:`finish_reduce_scatters` after the backward pass, if the plan overlaps it).

A pair's first layer slices its input over "col", its second all-gathers its output over "col", so
the activations between blocks are whole on every rank, as the residual stream and the layer norms
need them. Embeddings, layer norms, the gate, the experts and the head stay unsplit.

Collectives are timed per kind, axis and pass as ``grid_<kind>_<axis>.<fwd|bwd>`` regions (only the
wait, for asynchronous ones), which the training step sums into its grid communication time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from moe_core.host.timing import PhaseTimer
from moe_core.model.layer import MoELayer
from moe_core.parallel.grid import Grid, GridOverlaps, LinearSpec, block_linears


@dataclass
class GridGroups:
    """This rank's place in the grid: its index along every tensor axis and the process group of
    each (None for an axis of size 1, or on the meta device)."""

    grid: Grid
    index: dict[str, int]  # "depth", "row", "col" -> this rank's index
    group: dict[str, object]  # "depth", "row", "col" -> process group


def split_weight(weight: torch.Tensor, spec: LinearSpec, grid: Grid, index: dict[str, int]) -> torch.Tensor:
    """This rank's flat depth shard of ``weight`` [out, in]: the (outer, inner) block, flattened,
    part ``index["depth"]`` of ``grid.depth``."""
    block = split_bias(weight, spec, grid, index)  # the outer (output) rows: stacked matrices split alike
    inner, n_inner = index[spec.inner], grid.size(spec.inner)
    width = spec.in_features // n_inner
    block = block[:, inner * width : (inner + 1) * width].reshape(-1)
    shard = block.numel() // grid.depth
    return block[index["depth"] * shard : (index["depth"] + 1) * shard].clone()


def split_bias(bias: torch.Tensor, spec: LinearSpec, grid: Grid, index: dict[str, int]) -> torch.Tensor:
    """Rows of ``bias`` (or of a weight) for this rank's share of out_features, split over the outer
    group; a stack of ``spec.stacked`` matrices (QKV) keeps its share of each."""
    parts, part = grid.size(spec.outer), index[spec.outer]
    rows = spec.out_features // (spec.stacked * parts)
    stacked = bias.detach().reshape(spec.stacked, parts, rows, *bias.shape[1:])
    return stacked[:, part].reshape(spec.stacked * rows, *bias.shape[1:]).clone()


class GridLinear(nn.Module):
    """One linear layer's shard on one grid rank: ``weight`` is the flat depth shard of its block,
    ``bias`` its share of out_features (replicated over the inner group and "depth")."""

    def __init__(self, linear: nn.Linear, spec: LinearSpec, groups: GridGroups, first_of_pair: bool):
        super().__init__()
        self.spec, self.groups, self.first_of_pair = spec, groups, first_of_pair
        grid = groups.grid
        self.block_shape = (spec.out_features // grid.size(spec.outer), spec.in_features // grid.size(spec.inner))
        self.weight = nn.Parameter(split_weight(linear.weight, spec, grid, groups.index))
        self.bias = nn.Parameter(split_bias(linear.bias, spec, grid, groups.index)) if linear.bias is not None else None
        # set by the communication policy when it attaches (moe_core.schedule.executor)
        self.overlaps, self.cached, self.timer = GridOverlaps(), False, PhaseTimer(enabled=False)
        # the layer that computes next in each pass (forward order / its reverse), for prefetching; a
        # plain dict, so the neighbours are not registered as submodules
        self.upcoming: dict[str, GridLinear | None] = {"fwd": None, "bwd": None}
        self._prefetched: tuple | None = None  # (work, buffer) of an all-gather issued ahead
        self._scattering: tuple | None = None  # (work, buffer) of an overlapped reduce-scatter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first_of_pair:
            x = _SliceCol.apply(x, self)
        y = _GridMatmul.apply(x, self.weight, self)
        if self.bias is not None:
            y = y + self.bias
        return y if self.first_of_pair else _GatherCol.apply(y, self)

    # -- collectives -----------------------------------------------------------------------------
    def collective(self, kind: str, axis: str, pass_: str, tensor: torch.Tensor, async_op: bool = False):
        """Run (or, ``async_op``, start) ``kind`` of ``tensor`` over ``axis``; returns (result, work).
        Over an axis of one rank there is nothing to exchange: (``tensor``, None)."""
        group, size = self.groups.group[axis], self.groups.grid.size(axis)
        if size == 1:
            return tensor, None
        tensor = tensor.contiguous()
        out = {
            "all_reduce": tensor,  # in place
            "all_gather": tensor.new_empty(tensor.numel() * size),
            "reduce_scatter": tensor.new_empty(tensor.numel() // size),
        }[kind]
        if async_op:
            return out, _issue(kind, out, tensor, group, async_op=True)
        with self.timer.region(f"grid_{kind}_{axis}.{pass_}"):
            _issue(kind, out, tensor, group, async_op=False)
        return out, None

    def wait(self, work, kind: str, axis: str, pass_: str) -> None:
        with self.timer.region(f"grid_{kind}_{axis}.{pass_}"):
            work.wait()

    def gathered_weight(self, pass_: str) -> torch.Tensor:
        """The whole (row, col) block of the weight for ``pass_``: gathered over "depth" now, or
        the all-gather a neighbour issued ahead; then, if the plan prefetches, issue the one of the
        layer that computes next in this pass."""
        if self.groups.grid.depth == 1:
            block = self.weight
        elif self._prefetched is not None:
            (block, work), self._prefetched = self._prefetched, None
            self.wait(work, "all_gather", "depth", pass_)
        else:
            block, _ = self.collective("all_gather", "depth", pass_, self.weight.detach())
        if self.overlaps.all_gather:
            upcoming = self.upcoming[pass_]
            if upcoming is not None and upcoming.groups.grid.depth > 1 and not (pass_ == "bwd" and upcoming.cached):
                upcoming._prefetched = upcoming.collective(
                    "all_gather", "depth", pass_, upcoming.weight.detach(), async_op=True
                )
        return block.view(self.block_shape)

    @property
    def defers_gradient(self) -> bool:
        """Whether ``weight.grad`` is written after the backward pass (an overlapped reduce-scatter)."""
        return self.overlaps.defers_gradients(self.groups.grid)

    def finish_reduce_scatter(self) -> None:
        """Complete an overlapped weight-gradient reduce-scatter and accumulate it into ``.grad``."""
        if self._scattering is None:
            return
        (shard, work), self._scattering = self._scattering, None
        self.wait(work, "reduce_scatter", "depth", "bwd")
        self.weight.grad = shard if self.weight.grad is None else self.weight.grad + shard


def _issue(kind: str, out: torch.Tensor, tensor: torch.Tensor, group, async_op: bool):
    """One grid collective of ``tensor`` into ``out`` on ``group``; its work handle when ``async_op``."""
    if kind == "all_reduce":
        return dist.all_reduce(out, group=group, async_op=async_op)
    if kind == "all_gather":
        return dist.all_gather_single(out, tensor, group=group, async_op=async_op)
    return dist.reduce_scatter_single(out, tensor, group=group, async_op=async_op)


class _GridMatmul(torch.autograd.Function):
    """Y = X W^T on the grid, with AxoNN's collectives around it (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, layer: GridLinear):
        w = layer.gathered_weight("fwd")
        y, _ = layer.collective("all_reduce", layer.spec.inner, "fwd", F.linear(x, w).contiguous())
        ctx.layer = layer
        ctx.save_for_backward(x, w if layer.cached else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        layer, (x, cached) = ctx.layer, ctx.saved_tensors
        overlaps, outer = layer.overlaps, layer.spec.outer
        w = cached if cached is not None else layer.gathered_weight("bwd")
        dy = dy.contiguous()
        dx, work = layer.collective("all_reduce", outer, "bwd", dy.matmul(w).contiguous(), overlaps.all_reduce)
        dw = dy.reshape(-1, dy.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1])).reshape(-1)
        if layer.groups.grid.depth == 1:
            grad_w = dw
        elif layer.defers_gradient:
            layer._scattering = layer.collective("reduce_scatter", "depth", "bwd", dw, async_op=True)
            grad_w = None  # written by finish_reduce_scatter
        else:
            grad_w, _ = layer.collective("reduce_scatter", "depth", "bwd", dw)
        if work is not None:
            layer.wait(work, "all_reduce", outer, "bwd")
        return dx, grad_w, None


class _SliceCol(torch.autograd.Function):
    """A pair's input, whole on every rank, cut to this rank's in_features (over "col")."""

    @staticmethod
    def forward(ctx, x, layer: GridLinear):
        ctx.layer = layer
        cols, col = layer.groups.grid.col, layer.groups.index["col"]
        width = x.shape[-1] // cols
        return x[..., col * width : (col + 1) * width].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(ctx.layer, grad, "bwd"), None


class _GatherCol(torch.autograd.Function):
    """A pair's output, split over "col", gathered whole on every rank."""

    @staticmethod
    def forward(ctx, y, layer: GridLinear):
        ctx.layer = layer
        return _gather_last_dim(layer, y, "fwd")

    @staticmethod
    def backward(ctx, grad):
        layer = ctx.layer
        cols, col = layer.groups.grid.col, layer.groups.index["col"]
        width = grad.shape[-1] // cols
        return grad[..., col * width : (col + 1) * width].contiguous(), None


def _gather_last_dim(layer: GridLinear, t: torch.Tensor, pass_: str) -> torch.Tensor:
    """``t`` split over "col" along its last dimension -> whole (rank order = feature order)."""
    cols = layer.groups.grid.col
    if cols == 1:
        return t
    flat, _ = layer.collective("all_gather", "col", pass_, t.contiguous().view(-1))
    return flat.view(cols, *t.shape).movedim(0, -2).reshape(*t.shape[:-1], cols * t.shape[-1])


def grid_linears(model: nn.Module) -> list[GridLinear]:
    """The model's grid layers in forward order."""
    return [m for m in model.modules() if isinstance(m, GridLinear)]


def shard_grid(model: nn.Module, groups: GridGroups) -> None:
    """Replace every attention and dense-FFN linear of ``model`` by its :class:`GridLinear` shard on
    this rank (no-op on a grid without tensor axes). Works on the meta device too (groups None):
    moe_core.schedule.gradients.gradient_tensors reads a rank's gradient shapes from a meta model sharded alike.
    Weights are split after the full model is initialised with the run's seed, so a grid model
    starts as the single-process one."""
    if groups.grid.is_trivial:
        return
    for block in model.blocks:
        dense_ffn = not isinstance(block.ffn, MoELayer)
        d_ff = block.ffn.w_in.out_features if dense_ffn else 0
        specs = block_linears(block.attn.proj.in_features, d_ff, dense_ffn)
        for k, spec in enumerate(specs):
            parent_name, attr = spec.name.split(".")
            parent = getattr(block, parent_name)
            setattr(parent, attr, GridLinear(getattr(parent, attr), spec, groups, first_of_pair=k % 2 == 0))
    layers = grid_linears(model)
    for before, after in zip(layers, layers[1:]):
        before.upcoming["fwd"], after.upcoming["bwd"] = after, before


def attach_grid_plan(model: nn.Module, overlaps: GridOverlaps, timer: PhaseTimer) -> list[GridLinear]:
    """Hand the plan's overlaps (and the step's timer) to every grid layer; blocks below
    ``overlaps.cached_layers`` keep their gathered weights for backward. Returns the layers."""
    for i, block in enumerate(model.blocks):
        for layer in grid_linears(block):
            layer.overlaps, layer.timer, layer.cached = overlaps, timer, overlaps.caches(i)
    return grid_linears(model)


def finish_reduce_scatters(layers: list[GridLinear]) -> None:
    """Complete every overlapped weight-gradient reduce-scatter of the step (after backward)."""
    for layer in layers:
        layer.finish_reduce_scatter()
