"""Synthetic communication workloads: who sends how many bytes to whom.

A traffic matrix ``M`` (world x world, int64 bytes) says that rank i sends ``M[i, j]`` bytes to
rank j. It is the layout-independent description of one all-to-all(v) (peers.md §4, checklist item
4): the microbenchmark turns row i into rank i's send splits and column i into its receive splits.

Aurora's experiments (experiments/aurora.py, experiments/aurora_a2a.py) use token-count matrices,
one per MoE layer: real routing traces of our model (``gating_token_matrices``, from ``gated_choices``)
and parametric Zipf
ones (``zipf_token_matrices``); ``traffic_bytes`` turns tokens into bytes.
"""

from __future__ import annotations

import numpy as np

# The measured collectives' and ordered all-to-alls' buffers are float32: their traffic matrices
# count whole elements of this size (experiments/collectives.py, experiments/aurora_a2a.py, and
# the simulator's mirror of the microbenchmark, moe_core.sim.collectives).
ELEMENT_BYTES = 4


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``n`` ranks (its doc/PERFORMANCE.md): the bytes each rank's link
    carries per byte of the collective's size S.

    An all-reduce moves 2(n-1)/n of S over each rank's link (a reduce-scatter, then an all-gather);
    an all-gather (S: the gathered output), a reduce-scatter (S: the input) and an equal all-to-all
    (S: the send buffer) move all but the rank's own 1/n of it. For all_to_all_v the size taken is
    already the busiest rank's off-rank bytes (experiments.collectives.bottleneck_bytes), so
    busbw = algbw: the achieved bandwidth of the busiest link (DeepEP's "bottleneck bandwidth").
    """
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "all_to_all_v":
        return 1.0
    raise ValueError(
        f"unknown collective {collective!r}: use all_reduce, all_gather, reduce_scatter, all_to_all or all_to_all_v"
    )


def zipf_traffic_matrix(
    world_size: int, bytes_per_rank: int, zipf: float, seed: int, element_bytes: int = ELEMENT_BYTES
) -> np.ndarray:
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
        raise ValueError(
            f"bytes_per_rank={bytes_per_rank} must be a non-negative multiple of element_bytes={element_bytes}"
        )
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


# Aurora's Fig. 4 example (arXiv 2410.17043): GPU 1 sends one unit to GPUs 2 and 3, GPU 2 one unit to
# GPUs 1 and 3 (0-based here). The naive order takes 3 units, the right order 2 = T*.
FIG4_TOY_TOKENS = np.array([[0, 1, 1], [1, 0, 1], [0, 0, 0]], dtype=np.int64)


# -- traffic from real gating (Aurora's "historical statistics", arXiv 2410.17043 Section 3) ------------
def gated_choices(
    cfg, train_steps: int, trace_batch_size: int, mock_tokens: bool = False, dropless: bool = False
) -> tuple[np.ndarray, ...]:
    """The routing of the suite's own trained gate: per MoE layer, the experts every token chose.

    Trains ``moe_core.model.transformer.MoETransformer`` built from ``cfg`` (model, moe, train sections) for
    ``train_steps`` AdamW steps on one process, on ``moe_core.model.data.MarkovTokens`` whose token
    popularity follows Zipf(``cfg.train.data_zipf``), so the router learns the data's skew the way a
    served model has. Then one batch of ``trace_batch_size`` sequences (a batch the model never
    trained on) goes through it in eval mode. ``mock_tokens``: that batch is token ids drawn uniformly
    at random instead, as benchmark harnesses feed a model (DODOCO, arXiv 2605.20982, finds that mock
    tokens misstate the routing's skew; moe_core.dispatch.routing_trace measures ours). ``dropless``:
    the layers route without capacity (the dispatcher's decision, as for moe_core.model.transformer).

    Returns (expert_index, kept), each (moe_layers, tokens, top_k) in batch order: the chosen experts,
    best first, and whether the layer's capacity kept each choice. Deterministic for
    ``cfg.train.seed`` (it seeds torch's global RNG).
    """
    import torch  # only traces need torch and the model; the Zipf workloads stay numpy-only

    from moe_core.model.data import MarkovTokens
    from moe_core.model.transformer import MoETransformer

    m, tr = cfg.model, cfg.train
    if train_steps < 0 or trace_batch_size < 1:
        raise ValueError(f"train_steps must be >= 0 and trace_batch_size >= 1, got {train_steps}, {trace_batch_size}")
    torch.manual_seed(tr.seed)
    model = MoETransformer(cfg, dropless=dropless)
    data = MarkovTokens(m.vocab_size, tr.data_branching, tr.data_zipf, tr.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tr.lr)
    for step in range(train_steps):
        loss, _ = model(*data.batch(tr.batch_size, m.seq_len, step, rank=0))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.eval()
    inputs, targets = data.batch(trace_batch_size, m.seq_len, train_steps, rank=0)
    if mock_tokens:
        inputs = torch.randint(m.vocab_size, inputs.shape, generator=torch.Generator().manual_seed(tr.seed))
    with torch.no_grad():
        model(inputs, targets)
    tokens = trace_batch_size * m.seq_len
    plans = [layer.last_gating for layer in model.moe_layers()]  # groups are consecutive tokens
    experts = np.stack([plan.expert_index.reshape(tokens, -1).numpy() for plan in plans])
    kept = np.stack([plan.kept.reshape(tokens, -1).numpy() for plan in plans])
    return experts.astype(np.int64), kept


def gating_token_matrices(
    cfg, n_gpus: int, train_steps: int, trace_batch_size: int, dropless: bool = False
) -> np.ndarray:
    """Per MoE layer, tokens each of ``n_gpus`` source shards sends to each GPU, from real gating
    (:func:`gated_choices`): the traced batch's tokens are split evenly over the ``n_gpus``
    data-parallel shards in order, and expert e lives on GPU ``e // (num_experts / n_gpus)``. Every
    kept assignment is one token sent from its shard to its expert's GPU (the diagonal is the local
    part).

    Returns int64 (moe_layers, n_gpus, n_gpus); with top-1 ``dropless`` gating (no capacity) every
    row sums to the shard's tokens.
    """
    tokens = trace_batch_size * cfg.model.seq_len
    if n_gpus < 1 or cfg.moe.num_experts % n_gpus or tokens % n_gpus:
        raise ValueError(
            f"n_gpus ({n_gpus}) must divide moe.num_experts ({cfg.moe.num_experts}) and the traced "
            f"tokens (trace_batch_size * model.seq_len = {tokens})"
        )
    experts, kept = gated_choices(cfg, train_steps, trace_batch_size, dropless=dropless)
    shard = np.arange(tokens) // (tokens // n_gpus)  # (tokens,) source GPU of each token, batch order
    src = np.broadcast_to(shard[:, None], experts.shape[1:])
    dst = experts // (cfg.moe.num_experts // n_gpus)
    return np.stack(
        [
            np.bincount(src[k] * n_gpus + d[k], minlength=n_gpus * n_gpus).reshape(n_gpus, n_gpus)
            for d, k in zip(dst, kept)
        ]
    ).astype(np.int64)


def zipf_token_matrices(n_gpus: int, tokens_per_gpu: int, zipf: float, layers: int, seed: int) -> np.ndarray:
    """Parametric counterpart of ``gating_token_matrices``: (layers, n, n) int64 token counts.

    Layer l is ``zipf_traffic_matrix`` in whole tokens (element_bytes 1) with seed ``seed + l``, so
    every layer has its own popular experts, as the layers of a real model do.
    """
    return np.stack(
        [zipf_traffic_matrix(n_gpus, tokens_per_gpu, zipf, seed + layer, element_bytes=1) for layer in range(layers)]
    )


def traffic_bytes(token_matrix: np.ndarray, d_model: int, element_bytes: int) -> np.ndarray:
    """Bytes of a token-count matrix: every token is one ``d_model`` activation of ``element_bytes``.
    Integer counts give integer bytes; fractional counts (a blend of matrices) stay fractional."""
    return np.asarray(token_matrix) * (d_model * element_bytes)


def coarsen(token_matrix: np.ndarray, n_gpus: int) -> np.ndarray:
    """The same traffic on ``n_gpus`` GPUs: blocks of consecutive sources and destinations summed.

    For ``gating_token_matrices`` this is exact: shards are consecutive slices of the batch and
    experts sit on GPUs in order, so merging k neighbours gives the matrix traced with n / k GPUs.
    """
    m = np.asarray(token_matrix)
    n = m.shape[0]
    if m.shape != (n, n) or n_gpus < 1 or n % n_gpus:
        raise ValueError(f"a ({n}, {n}) matrix can be coarsened only to a divisor of {n} GPUs, got {n_gpus}")
    k = n // n_gpus
    return m.reshape(n_gpus, k, n_gpus, k).sum(axis=(1, 3))


def receiver_skew(traffic_matrix: np.ndarray) -> float:
    """Receiver skew of one layer: the busiest GPU's received tokens (or bytes) over the mean (1 = balanced)."""
    received = np.asarray(traffic_matrix, dtype=np.float64).sum(axis=0)
    return float(received.max() / received.mean())
