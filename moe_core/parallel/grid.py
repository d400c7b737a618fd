"""3D tensor parallelism of a transformer's linear layers on a 4D process grid: the decisions.

Torch-free: the grid, how every linear layer is split on it, and the collectives a block runs, in
order, with their groups and sizes. The measured layers (moe_core.parallel.grid_parallel) execute these
collectives, the step simulator (moe_core.sim.grid_ops) turns them into operations, and cost models
(e.g. AxoNN's, moe_core/papers/axonn) price them; a test checks that the measured run issues exactly
this list.

The grid is ``data x depth x row x col`` ranks, rank order innermost first column -> row -> depth ->
data (AxoNN's ``ax.init`` order, reference/papers.md §3.2)::

    rank = ((data_index * depth + depth_index) * row + row_index) * col + col_index

A linear layer's weight ``[out, in]`` is split with in_features over its *inner* group and
out_features over its *outer* group; the local block is flattened and sharded over ``depth`` (as
FSDP shards a parameter). A normal layer's inner group is ``col`` and its outer group ``row``; a
*transposed* layer swaps them, so the output of a normal layer (split over ``row``) is already the
input a transposed layer expects, and a pair needs no re-layout. The batch is split over
``data x depth``; the ``row x col`` ranks of a block hold the same tokens.

Per linear layer (AxoNN's ``AsyncLinear``):

* forward: all-gather the weight over ``depth``; ``Y = X W^T``; all-reduce ``Y`` over the inner group
  (each rank contracted a slice of in_features);
* backward: all-gather the weight over ``depth`` again, unless the layer cached it; ``dX = dY W`` and
  all-reduce ``dX`` over the outer group; ``dW = dY^T X`` and reduce-scatter ``dW`` over ``depth``.

The attention's QKV and the FFN's first projection are normal layers, the attention output and the
FFN's second projection transposed. Between blocks the activations are whole on every rank (the
residual stream and layer norms need every feature), as AxoNN's own LLaMA integration keeps them:
a pair's first layer slices its input over ``col`` (free forward; an all-gather of ``dX`` over
``col`` backward) and its second all-gathers its output over ``col`` (a slice backward).
Data parallelism all-reduces the depth shards' gradients over ``data``: the communication plan's
gradient units (moe_core.schedule.plan), which reduce them over the grid's "data" groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GRID_AXES = ("data", "depth", "row", "col")  # outermost first
GRID_COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter")


@dataclass(frozen=True)
class Grid:
    """A 4D process grid (sizes per axis)."""

    data: int = 1
    depth: int = 1
    row: int = 1
    col: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.data, self.depth, self.row, self.col)

    @property
    def world_size(self) -> int:
        return math.prod(self.shape)

    @property
    def tensor_parallel(self) -> int:
        """Ranks that hold the same tokens and split every weight: a (row x col) block."""
        return self.row * self.col

    @property
    def is_trivial(self) -> bool:
        """No tensor axis: every linear layer is whole (plain data parallelism)."""
        return self.depth == self.row == self.col == 1

    def size(self, axis: str) -> int:
        return self.shape[GRID_AXES.index(axis)]

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``: the product of the axes inside it."""
        return math.prod(self.shape[GRID_AXES.index(axis) + 1 :])

    def groups(self, axis: str) -> np.ndarray:
        """(groups, size of ``axis``) ranks: each row the ranks that differ only along ``axis``."""
        ranks = np.arange(self.world_size).reshape(self.shape)
        return np.moveaxis(ranks, GRID_AXES.index(axis), -1).reshape(-1, self.size(axis))

    def __str__(self) -> str:
        return "x".join(f"{axis}{size}" for axis, size in zip(GRID_AXES, self.shape))


@dataclass(frozen=True)
class LinearSpec:
    """One linear layer of a block as the grid splits it."""

    name: str  # the module's attribute path inside a block, e.g. "attn.qkv"
    in_features: int
    out_features: int
    transposed: bool  # inner group "row" and outer "col" (else inner "col", outer "row")
    stacked: int = 1  # output features that are this many stacked matrices (QKV: 3), each split alike

    @property
    def inner(self) -> str:
        """The axis in_features are split over (the forward all-reduce's group)."""
        return "row" if self.transposed else "col"

    @property
    def outer(self) -> str:
        """The axis out_features are split over (the backward input-gradient all-reduce's group)."""
        return "col" if self.transposed else "row"

    def block_elements(self, grid: Grid) -> int:
        """Elements of the local weight block (before the depth sharding)."""
        return self.out_features // grid.size(self.outer) * (self.in_features // grid.size(self.inner))


def block_linears(d_model: int, d_ff: int, dense_ffn: bool) -> list[LinearSpec]:
    """A block's grid-split linear layers in forward order: the attention pair, and the dense FFN's
    pair (an MoE block's experts are not tensor-split: they keep expert parallelism)."""
    linears = [
        LinearSpec("attn.qkv", d_model, 3 * d_model, transposed=False, stacked=3),
        LinearSpec("attn.proj", d_model, d_model, transposed=True),
    ]
    if dense_ffn:
        linears += [
            LinearSpec("ffn.w_in", d_model, d_ff, transposed=False),
            LinearSpec("ffn.w_out", d_ff, d_model, transposed=True),
        ]
    return linears


def grid_split_error(grid: Grid, d_model: int, d_ff: int, n_heads: int) -> str | None:
    """Why the model's linears cannot be split on ``grid`` (naming the config key), or None."""
    if n_heads % grid.row:
        return f"model.n_heads={n_heads} must be divisible by parallel.grid.row={grid.row} (heads are split over row)"
    for name, size in (("model.d_model", d_model), ("model.d_ff", d_ff)):
        for axis in ("row", "col"):
            if size % grid.size(axis):
                return f"{name}={size} must be divisible by parallel.grid.{axis}={grid.size(axis)}"
    for spec in block_linears(d_model, d_ff, dense_ffn=True):
        if spec.block_elements(grid) % grid.depth:
            return (
                f"the {spec.name} weight block of {spec.block_elements(grid)} elements must be divisible by "
                f"parallel.grid.depth={grid.depth}"
            )
    return None


@dataclass(frozen=True)
class GridOverlaps:
    """Which of AxoNN's overlaps a run uses (Megatron-AxoNN's ``--overlap-axonn-*`` flags).

    * ``all_reduce``: the backward input-gradient all-reduce runs asynchronously while the
      weight-gradient matmul computes;
    * ``reduce_scatter``: the weight-gradient reduce-scatter runs asynchronously and is completed
      after the backward pass;
    * ``all_gather``: the next layer's weight all-gather (the previous layer's, in backward) is
      issued before this layer computes;
    * ``cached_layers``: the first N blocks keep the weights gathered in forward for backward.
    """

    all_reduce: bool = False
    reduce_scatter: bool = False
    all_gather: bool = False
    cached_layers: int = 0

    def caches(self, block: int) -> bool:
        """Whether block ``block`` (0-based) keeps the weights it gathered in forward for backward."""
        return block < self.cached_layers

    def defers_gradients(self, grid: Grid) -> bool:
        """Whether the depth-sharded weight gradients are complete only after the backward pass
        (an overlapped reduce-scatter; without "depth" there is none): their data-parallel
        all-reduces cannot start from the backward pass."""
        return self.reduce_scatter and grid.depth > 1


@dataclass(frozen=True)
class GridCollective:
    """One collective of a block's grid layers, per rank: ``elements`` is the whole buffer (an
    all-reduce's, an all-gather's output, a reduce-scatter's input)."""

    linear: str
    pass_: str  # "fwd" or "bwd"
    kind: str  # "all_gather", "all_reduce" or "reduce_scatter"
    axis: str  # the grid axis whose groups run it
    elements: int


def linear_collectives(
    spec: LinearSpec, grid: Grid, tokens: int, cached: bool, first_of_pair: bool
) -> list[GridCollective]:
    """The collectives of one linear layer on a rank with ``tokens`` tokens, forward then backward,
    in the order they are issued (groups of one rank issue none)."""
    block = spec.block_elements(grid)
    out_local = spec.out_features // grid.size(spec.outer)
    in_local = spec.in_features // grid.size(spec.inner)
    fwd = [
        ("all_gather", "depth", block),
        ("all_reduce", spec.inner, tokens * out_local),
    ]
    if not first_of_pair:  # the pair's output is gathered whole over col
        fwd.append(("all_gather", "col", tokens * spec.out_features))
    bwd = [] if cached else [("all_gather", "depth", block)]
    bwd += [("all_reduce", spec.outer, tokens * in_local), ("reduce_scatter", "depth", block)]
    if first_of_pair:  # the pair's input was sliced over col: its gradient is gathered whole
        bwd.append(("all_gather", "col", tokens * spec.in_features))
    return [
        GridCollective(spec.name, pass_, kind, axis, elements)
        for pass_, ops in (("fwd", fwd), ("bwd", bwd))
        for kind, axis, elements in ops
        if grid.size(axis) > 1
    ]


def block_collectives(
    grid: Grid, d_model: int, d_ff: int, dense_ffn: bool, tokens: int, cached: bool
) -> list[GridCollective]:
    """Every collective of one block's grid layers (:func:`linear_collectives`), linear by linear."""
    linears = block_linears(d_model, d_ff, dense_ffn)
    return [
        c
        for k, spec in enumerate(linears)
        for c in linear_collectives(spec, grid, tokens, cached, first_of_pair=k % 2 == 0)
    ]
