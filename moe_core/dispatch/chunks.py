"""How an exchange is cut into pieces that travel one after another: micro-ops and chunks.

The measured exchanges (moe_core.comm.all_to_all), the dispatchers' step and study methods and
the simulated step all cut rows with these, so a cut is decided once.
"""

from __future__ import annotations

import math


def chunk_count(nbytes: float, micro_op_bytes: float) -> int:
    """Equal micro-ops of at most ``micro_op_bytes`` that ``nbytes`` is cut into (at least one)."""
    if micro_op_bytes <= 0:
        raise ValueError(f"micro-op size must be > 0 bytes, got {micro_op_bytes}")
    return max(1, math.ceil(nbytes / micro_op_bytes))


def a2a_micro_ops(rows: int, row_bytes: int, micro_op_bytes: float) -> list[tuple[int, int]]:
    """An all-to-all of ``rows`` token rows (per destination) cut along the token dimension into
    micro-ops of at most ``micro_op_bytes``: (start, stop) row ranges, at most one per row."""
    if rows <= 0:
        return [(0, 0)]
    return even_ranges(rows, min(rows, chunk_count(rows * row_bytes, micro_op_bytes)))


def even_ranges(rows: int, count: int) -> list[tuple[int, int]]:
    """``rows`` cut into ``count`` consecutive (start, stop) ranges whose lengths differ by at most one."""
    bounds = [round(k * rows / count) for k in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))
