"""Synthetic communication workloads: who sends how many bytes to whom.

A traffic matrix ``M`` (world x world, int64 bytes) says that rank i sends ``M[i, j]`` bytes to
rank j. It is the layout-independent description of one all-to-all(v) (peers.md §4, checklist item
4): the microbenchmark turns row i into rank i's send splits and column i into its receive splits.
"""

from __future__ import annotations

import numpy as np


def zipf_traffic_matrix(world_size: int, bytes_per_rank: int, zipf: float, seed: int,
                        element_bytes: int = 4) -> np.ndarray:
    """Skewed all-to-all(v) traffic: every rank sends ``bytes_per_rank``, a few ranks receive most.

    MoE gating sends more tokens to some experts than to others, and the ranks that hold the
    popular experts become hot receivers. We model that with one popularity ranking shared by all
    senders: a seeded random permutation of the ranks, the k-th of which (k = 1, 2, ...) gets
    weight ``1 / k**zipf``. ``zipf = 0`` is uniform; larger exponents concentrate the traffic on
    fewer receivers. Row i splits ``bytes_per_rank`` over the destinations in proportion to the
    weights, in whole elements of ``element_bytes`` (largest-remainder rounding, ties going to the
    more popular rank), so every row sums to ``bytes_per_rank`` exactly. The diagonal is kept: a
    rank's traffic to itself is part of the all-to-all(v) buffer too.

    Returns M with shape (world_size, world_size), dtype int64; M[i, j] = bytes rank i sends to j.
    Pure and deterministic for a given ``seed``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if zipf < 0:
        raise ValueError(f"zipf must be >= 0, got {zipf}")
    if element_bytes < 1 or bytes_per_rank < 0 or bytes_per_rank % element_bytes:
        raise ValueError(f"bytes_per_rank={bytes_per_rank} must be a non-negative multiple of "
                         f"element_bytes={element_bytes}")
    elements = bytes_per_rank // element_bytes
    by_popularity = np.random.default_rng(seed).permutation(world_size)  # by_popularity[k] = k-th hottest rank
    weights = 1.0 / np.arange(1, world_size + 1) ** zipf  # (world,), in popularity order
    quota = elements * weights / weights.sum()
    counts = np.floor(quota).astype(np.int64)
    # Largest remainder; a stable sort keeps popularity order among equal remainders.
    leftover = elements - int(counts.sum())
    counts[np.argsort(-(quota - counts), kind="stable")[:leftover]] += 1
    row = np.empty(world_size, dtype=np.int64)  # (world,) bytes to each destination rank
    row[by_popularity] = counts * element_bytes
    return np.tile(row, (world_size, 1))  # (world, world): all senders share the ranking
