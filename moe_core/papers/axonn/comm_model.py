"""AxoNN's communication model (its "second strategy", papers.md §3.1-3.2): price every collective a
4D grid issues, estimate per-GPU memory, and rank the grids of a GPU count. Pure functions, no torch.

What is priced. One rank's collectives per training iteration: the grid-split linears' collectives
of every block (moe_core.parallel.grid.block_collectives: weight all-gathers and reduce-scatters over
``depth``, activation all-reduces over ``row`` / ``col``, the pair-boundary all-gathers over
``col``), and the data-parallel gradient all-reduces: each linear's depth shard over ``data``, and
the whole (replicated) layer norms over ``data x depth`` (every rank of a (row, col) block holds
the same tokens, so their gradients already agree there), each group's gradients in one all-reduce
per iteration (assumed: as Megatron's contiguous gradient buffer reduces them). Out of scope: the
embeddings and the head (replicated whole; their gradient all-reduce is not priced), biases, an MoE
block's experts (their all-to-all and gradients belong to expert parallelism), and any overlap with
compute.

Ring collectives (papers.md §3.2), group of ``p`` ranks, ``V`` the whole per-rank buffer in bytes
(GridCollective's ``elements`` convention), ``beta`` the group's bandwidth::

    all_gather, reduce_scatter: (p - 1)/p * V / beta + (p - 1) * latency
    all_reduce:               2 (p - 1)/p * V / beta + 2 (p - 1) * latency

Bandwidth is Plexus's "v2 placement-aware" model (hpcgroup/plexus ``performance/comm_model.py``
@528554f): a group of ``size`` ranks ``stride`` apart runs inside a node at ``intra_node_GBps`` when
``stride * size <= devices_per_node``; otherwise the ``min(devices_per_node, stride)`` groups that
share a node share its NICs.

Hardware profiles (``configs/hardware/*.yaml``, ``cfg.hardware``): nodes, devices_per_node,
intra_node_GBps, intra_node_latency_us, nic_GBps, nics_per_node, oversubscription,
inter_node_latency_us, and the calibrated ``collectives`` fits. GB = 1e9 bytes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import NamedTuple

import pandas as pd

from moe_core.model.capacity import moe_blocks
from moe_core.parallel.grid import Grid, GridOverlaps, block_collectives, block_linears, grid_split_error
from moe_core.sim.topology import achieved_GBps
from moe_core.units import GB

AXONN_ORDER = ("col", "row", "depth")  # innermost first: moe_core.parallel.grid's rank order
RING_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2}  # ring steps per (p - 1)
BREAKDOWN_KEYS = (
    "all_gather_depth_s",
    "all_reduce_col_s",
    "all_reduce_row_s",
    "all_gather_col_s",
    "reduce_scatter_depth_s",
    "all_reduce_data_s",
)
LAYER_NORM_PARAMS = 4  # per block, times d_model: two layer norms' gains and shifts
# Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), bytes per
# token and per d_model a block keeps for backward at 2-byte activations (1-byte dropout masks), with
# flash attention (no s^2 score term): 10 whole (the two layer norms' and the two pairs' inputs, the
# dropout masks) and 8 + 4 d_ff/d_model inside the pairs (Q, K, V, the attention output, the FFN's
# hidden activation before and after GeLU; = 24 for d_ff = 4 d_model), which tensor parallelism splits.
KEPT_WHOLE = 10


def _spans_nodes(hw, size: int, stride: int) -> bool:
    """Whether a group of ``size`` ranks ``stride`` apart crosses nodes (never on a one-node profile)."""
    return hw.nodes > 1 and stride * size > hw.devices_per_node


def group_bandwidth_GBps(hw, size: int, stride: int) -> float:
    """Per-rank bandwidth (GB/s per direction) of a group of ``size`` ranks ``stride`` apart.

    Plexus's placement-aware rule: the intra-node rate inside a node; across nodes the node's NIC
    bandwidth (per-NIC rate * nics_per_node / oversubscription) divided by min(devices_per_node,
    stride), the groups that share it; rates as collectives reach them
    (moe_core.sim.topology.achieved_GBps). On a one-node profile (nodes = 1, usually nic_GBps = 0)
    every group is inside the node. ValueError naming the profile key when the bandwidth needed is 0.
    """
    if size < 1 or stride < 1:
        raise ValueError(f"a group needs size >= 1 and stride >= 1, got size={size}, stride={stride}")
    if not _spans_nodes(hw, size, stride):
        if hw.intra_node_GBps <= 0:
            raise ValueError(
                f"hardware '{hw.name}': hardware.intra_node_GBps must be > 0 to price a group of {size} ranks "
                f"inside a node, got {hw.intra_node_GBps}"
            )
        return float(achieved_GBps(hw)[0])
    node_GBps = achieved_GBps(hw)[1] * hw.nics_per_node / hw.oversubscription
    if node_GBps <= 0:
        raise ValueError(
            f"hardware '{hw.name}': hardware.nic_GBps and hardware.nics_per_node must be > 0 to price a group of "
            f"{size} ranks {stride} apart across nodes, got {hw.nic_GBps} x {hw.nics_per_node}"
        )
    return node_GBps / min(hw.devices_per_node, stride)


def axis_strides(grid: Grid, order: tuple[str, str, str] = AXONN_ORDER) -> dict[str, int]:
    """Rank distance between neighbours along each axis when the tensor axes are placed in ``order``
    (innermost first) and ``data`` outermost.

    AxoNN's order is moe_core.parallel.grid's rank order; Plexus also evaluates the other permutations, which
    only this model prices (the measured layers always use AxoNN's).
    """
    if sorted(order) != sorted(AXONN_ORDER):
        raise ValueError(f"order must be a permutation of {AXONN_ORDER}, got {order}")
    strides, stride = {}, 1
    for axis in order:
        strides[axis] = stride
        stride *= grid.size(axis)
    strides["data"] = stride
    return strides


def order_label(order: tuple[str, str, str]) -> str:
    """``("col", "row", "depth")`` -> ``"col<row<depth"`` (innermost first)."""
    return "<".join(order)


def collective_seconds(hw, kind: str, size: int, stride: int, nbytes: float) -> float:
    """Ring time of one collective ``kind`` over ``size`` ranks ``stride`` apart; ``nbytes`` is the whole
    per-rank buffer (an all-reduce's, an all-gather's output, a reduce-scatter's input).

    Latency: a calibrated fit for ``kind`` (else the profile's all-reduce fit) gives alpha_us +
    steps * alpha_step_us and scales the bandwidth by its efficiency; without one every ring step
    costs the profile's intra- or inter-node latency, by placement. A fit's in_step_us (waiting for
    late peers inside a step) is compute jitter, not communication, and is left out.
    """
    if kind not in RING_STEPS:
        raise ValueError(f"unknown collective {kind!r}; expected one of {sorted(RING_STEPS)}")
    if size < 1:
        raise ValueError(f"a group needs size >= 1, got {size}")
    if size == 1:
        return 0.0
    steps = RING_STEPS[kind] * (size - 1)
    bandwidth_Bps = group_bandwidth_GBps(hw, size, stride) * GB
    fit = hw.collectives.get(kind)
    if fit is None:
        fit = hw.collectives.get("all_reduce")
    if fit is None:
        step_us = hw.inter_node_latency_us if _spans_nodes(hw, size, stride) else hw.intra_node_latency_us
        latency_s = steps * step_us * 1e-6
    else:
        latency_s = (fit.alpha_us + steps * fit.alpha_step_us) * 1e-6
        bandwidth_Bps *= fit.efficiency
    return latency_s + steps / size * nbytes / bandwidth_Bps


def predicted_communication(
    hw,
    grid: Grid,
    order: tuple[str, str, str] = AXONN_ORDER,
    *,
    d_model: int,
    d_ff: int,
    n_layers: int,
    tokens_per_rank: int,
    element_bytes: int = 2,
    n_heads: int | None = None,
    cached_layers: int = 0,
    moe_every: int = 0,
) -> dict[str, float]:
    """Communication seconds of one rank per iteration on ``grid`` placed in ``order``.

    Args:
        tokens_per_rank: tokens of a rank (its data x depth share of the batch, whole over row x col).
        element_bytes: bytes per element of weights, activations and gradients (bf16: 2).
        n_heads: when given, the split is checked against it too (heads are split over row).
        cached_layers: the first N blocks keep their gathered weights for backward (no second
            all-gather over depth).
        moe_every: every ``moe_every``-th block (index i with i % moe_every == moe_every - 1) is an MoE
            block whose FFN is not grid-split; 0 = every block dense.

    Returns ``{"total_s": ..., "<kind>_<axis>_s": ...}`` over :data:`BREAKDOWN_KEYS`;
    ``all_reduce_data_s`` holds the data-parallel gradient all-reduces (depth shards over data, layer
    norms over data x depth; one in all when depth is 1). ValueError if the model cannot be split on ``grid``.
    """
    _check_model(grid, d_model, d_ff, n_heads, n_layers, tokens_per_rank, cached_layers, moe_every)
    strides = axis_strides(grid, order)
    seconds, shard_elements = _block_seconds(
        hw, grid, strides, d_model, d_ff, n_layers, tokens_per_rank, element_bytes, cached_layers, moe_every
    )
    shard_bytes = shard_elements * element_bytes
    norm_bytes = n_layers * LAYER_NORM_PARAMS * d_model * element_bytes
    for size, stride, nbytes in _gradient_all_reduces(grid, strides, shard_bytes, norm_bytes):
        seconds["all_reduce_data_s"] += collective_seconds(hw, "all_reduce", size, stride, nbytes)
    return {"total_s": sum(seconds.values()), **seconds}


def _check_model(
    grid: Grid,
    d_model: int,
    d_ff: int,
    n_heads: int | None,
    n_layers: int,
    tokens_per_rank: int,
    cached_layers: int,
    moe_every: int,
) -> None:
    """ValueError unless the model splits on ``grid`` and its counts are in range (:func:`predicted_communication`)."""
    # Without n_heads, row heads (always divisible) leave only the width and depth checks.
    error = grid_split_error(grid, d_model, d_ff, grid.row if n_heads is None else n_heads)
    if error:
        raise ValueError(error)
    if n_layers < 1 or tokens_per_rank < 0 or moe_every < 0 or not 0 <= cached_layers <= n_layers:
        raise ValueError(
            f"need n_layers >= 1, tokens_per_rank >= 0, moe_every >= 0 and 0 <= cached_layers <= n_layers, got "
            f"n_layers={n_layers}, tokens_per_rank={tokens_per_rank}, moe_every={moe_every}, "
            f"cached_layers={cached_layers}"
        )


def _block_seconds(
    hw,
    grid: Grid,
    strides: dict[str, int],
    d_model: int,
    d_ff: int,
    n_layers: int,
    tokens_per_rank: int,
    element_bytes: int,
    cached_layers: int,
    moe_every: int,
) -> tuple[dict[str, float], int]:
    """The blocks' grid collectives: seconds per :data:`BREAKDOWN_KEYS` (``all_reduce_data_s`` left at
    0), and the elements of the rank's depth shards of their grid-split linears (whose gradients the
    data-parallel all-reduce carries). Blocks alike (dense or MoE FFN, weights cached or not) are
    priced once and counted."""
    seconds = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    shard_elements = 0
    moe, overlaps = set(moe_blocks(n_layers, moe_every)), GridOverlaps(cached_layers=cached_layers)
    kinds = Counter((i not in moe, overlaps.caches(i)) for i in range(n_layers))
    for (dense_ffn, cached), blocks in kinds.items():
        for c in block_collectives(grid, d_model, d_ff, dense_ffn, tokens_per_rank, cached):
            t = collective_seconds(hw, c.kind, grid.size(c.axis), strides[c.axis], c.elements * element_bytes)
            seconds[f"{c.kind}_{c.axis}_s"] += blocks * t
        shard_elements += blocks * sum(
            s.block_elements(grid) // grid.depth for s in block_linears(d_model, d_ff, dense_ffn)
        )
    return seconds, shard_elements


def _gradient_all_reduces(
    grid: Grid, strides: dict[str, int], shard_bytes: int, norm_bytes: int
) -> list[tuple[int, int, int]]:
    """The data-parallel gradient all-reduces, ``(group size, stride, bytes)``: the depth shards over
    ``data`` and the layer norms over ``data x depth`` (one all-reduce in all when depth is 1)."""
    # One all-reduce per group per iteration, as Megatron's contiguous gradient buffer. The layer norms'
    # group (data x depth) is one strided group in AxoNN's order; in another it is read by depth's stride.
    if grid.depth == 1:
        return [(grid.data, strides["data"], shard_bytes + norm_bytes)]
    return [(grid.data, strides["data"], shard_bytes), (grid.data * grid.depth, strides["depth"], norm_bytes)]


def block_activation_bytes(tokens: int, d_model: int, d_ff: int, split: int, activation_bytes: int = 2) -> float:
    """Bytes one block keeps for backward for ``tokens`` tokens (Korthikanti et al. 2022, flash
    attention), the activations inside the pairs split ``split`` ways (:data:`KEPT_WHOLE`)."""
    kept_split = 8 + 4 * d_ff / d_model
    return tokens * d_model * (KEPT_WHOLE + kept_split / split) * activation_bytes / 2


def stored_activation_bytes(
    tokens: int,
    d_model: int,
    d_ff: int,
    n_layers: int,
    split: int,
    recompute: bool,
    activation_bytes: int = 2,
    in_flight: int = 1,
) -> float:
    """Peak activation bytes of ``n_layers`` blocks for ``in_flight`` (micro-)batches of ``tokens``
    tokens each: every block's (:func:`block_activation_bytes`), or with full recomputation (one block
    per checkpoint) every block's input plus the activations of the one block being recomputed."""
    block = block_activation_bytes(tokens, d_model, d_ff, split, activation_bytes)
    if recompute:
        return in_flight * n_layers * tokens * d_model * activation_bytes + block
    return in_flight * n_layers * block


def memory_bytes(
    grid: Grid,
    d_model: int,
    d_ff: int,
    n_layers: int,
    vocab_size: int,
    seq_len: int,
    sequences_per_rank: int,
    bytes_per_param: int = 16,
    activation_bytes: int = 2,
    recompute: bool = True,
) -> float:
    """Per-GPU memory of a dense GPT on ``grid``: states, then activations.

    * States (``bytes_per_param``; mixed-precision Adam: 16 = bf16 weight and gradient, fp32 master
      weight and two moments): every block's grid-split linears divided over depth x row x col; the
      embeddings (the head tied to them), position embeddings and layer norms whole. Biases ignored.
    * Activations of the rank's ``sequences_per_rank`` sequences (its data x depth share, no gradient
      accumulation), :func:`stored_activation_bytes` with the pairs' activations split over ``row``:
      a pair's first layer splits its outputs over its outer axis (row) and they stay whole over col,
      while the block inputs are whole on every rank of a (row, col) block. ``recompute`` (default) is
      full recomputation, one block per checkpoint, as Megatron-AxoNN's run script sets it
      (``--recompute-granularity full --recompute-num-layers 1 --use-flash-attn``). Plus the head's
      logits (tokens x vocab), once, as it keeps them whole.
    """
    split_params = n_layers * sum(s.in_features * s.out_features for s in block_linears(d_model, d_ff, True))
    whole_params = (vocab_size + seq_len + LAYER_NORM_PARAMS * n_layers + 2) * d_model  # + final layer norm
    states = (split_params / (grid.depth * grid.tensor_parallel) + whole_params) * bytes_per_param
    tokens = sequences_per_rank * seq_len
    activations = stored_activation_bytes(tokens, d_model, d_ff, n_layers, grid.row, recompute, activation_bytes)
    return states + activations + tokens * vocab_size * activation_bytes


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def tensor_orders(grid: Grid) -> list[tuple[str, str, str]]:
    """Every placement of the tensor axes that differs on ``grid``: permutations that only move axes of
    size 1 are the same placement (AxoNN's order first, and alone when at most one axis is split)."""
    orders, seen = [], set()
    for order in itertools.permutations(AXONN_ORDER):
        placed = tuple(axis for axis in order if grid.size(axis) > 1)
        if placed not in seen:
            seen.add(placed)
            orders.append(order)
    return orders


def enumerate_grids(world_size: int, orders: bool = False) -> list[tuple[Grid, tuple[str, str, str]]]:
    """Every ``data x depth x row x col`` factorisation of ``world_size`` (all divisors), with AxoNN's
    order, or with each distinct placement of the tensor axes (:func:`tensor_orders`) when ``orders``."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    result = []
    for data in _divisors(world_size):
        for depth in _divisors(world_size // data):
            for row in _divisors(world_size // (data * depth)):
                grid = Grid(data, depth, row, world_size // (data * depth * row))
                result += [(grid, order) for order in (tensor_orders(grid) if orders else [AXONN_ORDER])]
    return result


def _check_world(hw, world_size: int) -> None:
    """ValueError unless ``world_size`` is a whole number of the profile's nodes (or fits in one)."""
    dpn = hw.devices_per_node
    if world_size < 1 or (world_size > dpn and world_size % dpn):
        raise ValueError(
            f"world_size={world_size} must be at most one node or a multiple of hardware.devices_per_node={dpn} "
            f"(profile '{hw.name}')"
        )
    if world_size > hw.nodes * dpn:
        raise ValueError(
            f"world_size={world_size} exceeds profile '{hw.name}': hardware.nodes={hw.nodes} x devices_per_node={dpn}"
        )


class GridMemory(NamedTuple):
    """A grid AxoNN's search considers (:func:`grid_memory`): its placement, the sequences of each
    data x depth rank, its per-GPU memory and whether that fits the budget."""

    grid: Grid
    order: tuple[str, str, str]
    sequences_per_rank: int
    memory_GB: float
    fits: bool


def grid_memory(
    world_size: int,
    *,
    d_model: int,
    d_ff: int,
    n_layers: int,
    n_heads: int,
    vocab_size: int,
    seq_len: int,
    global_sequences: int,
    memory_GB: float,
    element_bytes: int = 2,
    bytes_per_param: int = 16,
    recompute: bool = True,
    orders: bool = False,
) -> list[GridMemory]:
    """The grids AxoNN's search considers: every grid of ``world_size`` (and placement, with
    ``orders``) that splits the model and gives each data x depth rank a whole number (>= 1) of the
    ``global_sequences``, with its :func:`memory_bytes` against ``memory_GB``. The one decision of
    which grids fit: :func:`rank_grids` ranks them, and the workflow names the simulated ranking's
    records from it alone (no grid priced, so quick)."""
    out = []
    for grid, order in enumerate_grids(world_size, orders):
        replicas = grid.data * grid.depth
        if grid_split_error(grid, d_model, d_ff, n_heads) or global_sequences % replicas or global_sequences < replicas:
            continue
        sequences = global_sequences // replicas
        memory = memory_bytes(
            grid, d_model, d_ff, n_layers, vocab_size, seq_len, sequences, bytes_per_param, element_bytes, recompute
        )
        out.append(GridMemory(grid, order, sequences, memory / GB, memory / GB <= memory_GB))
    return out


def rank_grids(hw, world_size: int, **search) -> pd.DataFrame:
    """AxoNN's search (papers.md §3.2): every grid :func:`grid_memory` considers (``search``: its
    keyword arguments, the model and the budget), priced by :func:`predicted_communication`.

    Columns: data, depth, row, col, order ("col<row<depth", innermost first), predicted_comm_s, the
    :data:`BREAKDOWN_KEYS`, memory_GB, fits (memory_GB within the budget), rank (1 = least
    communication). Grids that fit come first, by predicted_comm_s; those that do not follow, in the
    same order, unranked (rank <NA>), so figures can show them. ValueError if no grid splits the model.
    """
    _check_world(hw, world_size)
    model = {key: search[key] for key in ("d_model", "d_ff", "n_layers", "n_heads")}
    element_bytes = search.get("element_bytes", 2)
    rows = []
    for c in grid_memory(world_size, **search):
        tokens = c.sequences_per_rank * search["seq_len"]
        comm = predicted_communication(
            hw, c.grid, c.order, **model, tokens_per_rank=tokens, element_bytes=element_bytes
        )
        rows.append(_grid_row(c, comm))
    if not rows:
        raise ValueError(
            f"no grid of world_size={world_size} splits the model ({', '.join(f'{k}={v}' for k, v in model.items())}) "
            f"with a whole number of the global_sequences={search['global_sequences']} per data x depth rank"
        )
    return _ranked(rows)


def _grid_row(c: GridMemory, comm: dict[str, float]) -> dict:
    """One row of :func:`rank_grids`' table (before ``rank``): the grid, its placement, its
    communication and its memory against the budget."""
    return {
        "data": c.grid.data,
        "depth": c.grid.depth,
        "row": c.grid.row,
        "col": c.grid.col,
        "order": order_label(c.order),
        "predicted_comm_s": comm["total_s"],
        **{key: comm[key] for key in BREAKDOWN_KEYS},
        "memory_GB": c.memory_GB,
        "fits": c.fits,
    }


def _ranked(rows: list[dict]) -> pd.DataFrame:
    """:func:`rank_grids`' rows as a table: those that fit first, each part by predicted
    communication (stable), ranked 1, 2, ... where they fit and <NA> where they do not."""
    frame = pd.DataFrame(rows).sort_values(["fits", "predicted_comm_s"], ascending=[False, True], kind="stable")
    frame = frame.reset_index(drop=True)
    fitting = int(frame["fits"].sum())
    frame["rank"] = pd.array(list(range(1, fitting + 1)) + [None] * (len(frame) - fitting), dtype="Int64")
    return frame
