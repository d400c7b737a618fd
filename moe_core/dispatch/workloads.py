"""Routing workloads of the dispatcher study: which experts every token of every rank picks.

A workload is a pure function of its name, a seed, a step, the tokens per rank, the experts, the
ranks and top-k (:func:`routing`): per source rank an int array (tokens, top_k) of distinct expert
ids, the same for any executor and layout that asks. Experts sit on ranks contiguously (expert e on
rank e // (experts / ranks)), as the study places them.

Popularity skews, one expert popularity every rank draws from:

* ``uniform``;
* ``zipf:<s>``: weight 1/k^s for the k-th most popular expert of a seeded ranking;
* ``lognormal:<sigma>``: weights exp(sigma * N(0, 1)), seeded.

The load-imbalance workloads of Megatron-LM's token-imbalance benchmark (NVIDIA/Megatron-LM PR 7488,
from its MoE roadmap issue 6757), W0 to W7. The names and the variable each isolates are Megatron's;
the heat parameters are ours, stated here (``HOT_IMBALANCE``, the hot set, ``BURST_PERIOD``, the
ragged profile):

* ``balanced`` (W0): exact round robin; every expert receives the same choices from every rank
  when tokens x top_k is a multiple of the experts;
* ``hot_expert_set`` (W1): the first ``max(1, E // 8)`` experts (contiguous) are hot;
* ``hot_rank`` (W2): the last rank's experts are hot: per-rank heat;
* ``spread_hot_experts`` (W3): W1's number of hot experts, spread at an even stride over the ranks;
* ``source_ragged`` (W4): rank r holds tokens in proportion to r + 1 (the same total), routed
  uniformly: skew before the dispatch;
* ``zero_expert_rank`` (W5): the last rank's experts receive nothing and the last rank sends
  nothing (zero-size splits both ways); on one rank, an empty step (no token at all);
* ``rotating_hotspot`` (W6): W2's heat on rank ``step mod ranks``: a plan made on one step is stale
  on the next;
* ``burst`` (W7): uniform, except that every ``BURST_PERIOD``-th step (step mod P = P - 1) is W2:
  a median over steps hides it.

Heat is stated as an imbalance, not as a share: every hot expert expects ``HOT_IMBALANCE`` (2) times
the mean load, the cold experts share the rest evenly, so a hot workload has the imbalance factor
(max choices per expert / mean) 2 at every size it accepts, with top-1 routing: one hot expert of 4
or of 64, the hot rank of 2 ranks or of 64. (A fixed share of the choices would not: half the choices
on half the experts, one rank of two, is uniform routing.) Where the hot set is half of the experts
the cold ones get nothing; where it is more than half, an imbalance of 2 cannot be had and the size
is refused (:func:`why_not`: W2, W6 and W7 need two ranks, W1 and W3 two experts). With top-k > 1 a
token picks k distinct experts (Gumbel top-k sampling without replacement), so a hot expert cannot
take more than one choice per token and the imbalance is lower where k exceeds the hot set.

Recorded routing, ``trace:<name>``: the choices of the suite's own trained gate, saved as a trace
and replayed layer after layer (moe_core.dispatch.routing_trace, which says how it is replayed).
"""

from __future__ import annotations

import math

import numpy as np

from moe_core.dispatch import routing_trace

POPULARITY_SKEWS = ("uniform", "zipf", "lognormal")
TRACE = "trace"  # trace:<name>, a recorded routing replayed (moe_core.dispatch.routing_trace)
IMBALANCE_WORKLOADS = (
    "balanced",
    "hot_expert_set",
    "hot_rank",
    "spread_hot_experts",
    "source_ragged",
    "zero_expert_rank",
    "rotating_hotspot",
    "burst",
)
HOT_IMBALANCE = 2.0  # every hot expert's expected load over the mean load (top-1): the stated imbalance
HOT_SET_DIVISOR = 8  # W1 and W3 heat max(1, E // 8) experts
BURST_PERIOD = 4  # W7: one hot step in every four
MAX_REDRAWS = 32  # a top-k choice's categorical redraws before the exact fallback (sample_top_k)


def split_name(workload: str) -> tuple[str, float]:
    """``"zipf:1.2"`` -> ("zipf", 1.2), ``"hot_rank"`` -> ("hot_rank", 0.0), ``"trace:<name>"`` ->
    ("trace", 0.0). ValueError when malformed; the config check (moe_core.dispatch_study.parse_skew)
    names the key."""
    kind, _, value = workload.partition(":")
    if kind == TRACE:
        if not value:
            raise ValueError(f"workload {workload!r} needs a trace name: trace:<name>")
        return kind, 0.0
    takes_parameter = kind in ("zipf", "lognormal")
    if kind not in (*POPULARITY_SKEWS, *IMBALANCE_WORKLOADS) or takes_parameter != bool(value):
        raise ValueError(f"unknown workload {workload!r}")
    parameter = float(value) if value else 0.0
    if not math.isfinite(parameter) or parameter < 0:
        raise ValueError(f"workload {workload!r} needs a finite parameter >= 0")
    return kind, parameter


def period(workload: str, ranks: int) -> int:
    """How many steps the workload takes to repeat (1: the same routing every step; a trace's layers)."""
    kind, _ = split_name(workload)
    if kind == TRACE:
        return routing_trace.load(trace_name(workload)).layers
    return {"rotating_hotspot": ranks, "burst": BURST_PERIOD}.get(kind, 1)


def trace_name(workload: str) -> str:
    """The trace a ``trace:<name>`` workload replays."""
    return workload.partition(":")[2]


def popularity(experts: int, workload: str, seed: int) -> np.ndarray:
    """(E,) probability that a token is routed to each expert under a popularity skew."""
    kind, parameter = split_name(workload)
    if kind not in POPULARITY_SKEWS:
        raise ValueError(f"{workload!r} is not a popularity skew")
    weights = popularity_weights(kind, parameter, experts, seed)
    return weights / weights.sum()


def popularity_weights(kind: str, parameter: float, experts: int, seed: int) -> np.ndarray:
    """(E,) unnormalised weights of a popularity skew; the seeded ranking is every rank's."""
    rng = np.random.default_rng(seed)
    if kind == "zipf":
        weights = np.empty(experts)
        weights[rng.permutation(experts)] = 1.0 / np.arange(1, experts + 1) ** parameter
        return weights
    if kind == "lognormal":
        return np.exp(parameter * rng.standard_normal(experts))
    return np.ones(experts)


def heat(experts: int, hot: np.ndarray) -> np.ndarray:
    """(E,) weights giving each of the ``hot`` experts ``HOT_IMBALANCE`` times the mean load (top-1)
    and the other experts the rest evenly; the hot set is at most E / HOT_IMBALANCE experts
    (:func:`why_not` refuses larger ones)."""
    hot_share = HOT_IMBALANCE * hot.size / experts
    assert hot_share <= 1, f"{hot.size} hot experts of {experts} cannot each take {HOT_IMBALANCE:g}x the mean"
    weights = np.full(experts, (1 - hot_share) / (experts - hot.size))
    weights[hot] = hot_share / hot.size
    return weights


def hot_experts(kind: str, experts: int, ranks: int, step: int) -> np.ndarray | None:
    """The experts a heat workload makes hot at ``step`` (None: ``kind`` heats none then)."""
    if kind == "hot_expert_set":
        return np.arange(max(1, experts // HOT_SET_DIVISOR))
    if kind == "spread_hot_experts":
        hot_set = max(1, experts // HOT_SET_DIVISOR)
        return np.arange(hot_set) * (experts // hot_set)
    if kind == "hot_rank" or (kind == "burst" and step % BURST_PERIOD == BURST_PERIOD - 1):
        return experts_of_rank(ranks - 1, experts, ranks)
    if kind == "rotating_hotspot":
        return experts_of_rank(step % ranks, experts, ranks)
    return None


def experts_of_rank(rank: int, experts: int, ranks: int) -> np.ndarray:
    """The experts rank ``rank`` holds (contiguous)."""
    per_rank = experts // ranks
    return np.arange(rank * per_rank, (rank + 1) * per_rank)


def expert_weights(kind: str, parameter: float, experts: int, ranks: int, seed: int, step: int) -> np.ndarray:
    """(E,) unnormalised weights of the experts every source rank draws from at ``step``."""
    if kind in POPULARITY_SKEWS:
        return popularity_weights(kind, parameter, experts, seed)
    hot = hot_experts(kind, experts, ranks, step)
    if hot is not None:
        return heat(experts, hot)
    weights = np.ones(experts)
    if kind == "zero_expert_rank":
        weights[experts_of_rank(ranks - 1, experts, ranks)] = 0.0
    return weights  # also source_ragged, and burst off its hot steps


def source_tokens(kind: str, tokens_per_rank: int, ranks: int) -> list[int]:
    """Tokens each source rank routes: ``tokens_per_rank`` each, except W4's ragged profile (the same
    total, rank r's share in proportion to r + 1) and W5's silent last rank."""
    if kind == "source_ragged":
        total = tokens_per_rank * ranks
        shares = [total * (r + 1) // (ranks * (ranks + 1) // 2) for r in range(ranks)]
        shares[-1] += total - sum(shares)
        return shares
    if kind == "zero_expert_rank":
        return [tokens_per_rank] * (ranks - 1) + [0]
    return [tokens_per_rank] * ranks


def sample_top_k(weights: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """(tokens, top_k) distinct experts per token, in the order drawn: successive draws without
    replacement in proportion to ``weights`` (each choice from the experts the token has not chosen
    yet), zero weights never drawn.

    Each choice is a categorical draw over all experts, redrawn while it repeats one the token already
    chose: a draw conditioned on landing outside the chosen set, which is the successive draw itself,
    in O(tokens x top_k) draws. (A Gumbel key per token and expert, the same distribution, costs
    O(tokens x experts): 6 hours for 4,096 ranks of 4,096 tokens over 4,096 experts.) Rows still
    repeating after ``MAX_REDRAWS`` draws (a few heavy experts holding most of the weight) take that
    choice as the largest Gumbel key among the experts they have not chosen: the same draw again."""
    p = weights / weights.sum()
    chosen = np.empty((tokens, top_k), dtype=np.int64)  # (tokens, k)
    for slot in range(top_k):
        pending = np.arange(tokens)
        for _ in range(MAX_REDRAWS):
            draws = rng.choice(weights.size, size=pending.size, p=p)
            repeats = (chosen[pending, :slot] == draws[:, None]).any(axis=1)
            chosen[pending[~repeats], slot] = draws[~repeats]
            pending = pending[repeats]
            if not pending.size:
                break
        else:
            with np.errstate(divide="ignore"):
                keys = np.log(weights) + rng.gumbel(size=(pending.size, weights.size))  # (pending, E)
            np.put_along_axis(keys, chosen[pending, :slot], -np.inf, axis=1)
            chosen[pending, slot] = keys.argmax(axis=1)
    return chosen


def why_not(workload: str, *, experts: int, ranks: int, top_k: int) -> str | None:
    """Why ``workload`` cannot route ``top_k`` of ``experts`` experts on ``ranks`` ranks (None: it
    can): experts that do not spread evenly, a hot set too large for the stated imbalance (one rank's
    experts are all of them; one hot expert of one), a top-k beyond the experts it routes to (W5
    silences a rank's, a hot set of half the experts leaves the others none), a trace recorded with
    experts the run's do not divide or with fewer choices."""
    kind, _ = split_name(workload)
    if ranks < 1 or experts % ranks:
        return f"{experts} experts do not spread evenly over {ranks} ranks"
    if kind == TRACE:
        misfit = routing_trace.why_not_replayed(routing_trace.load(trace_name(workload)), experts, top_k)
        return misfit and f"{workload}: {misfit}"
    live = experts - (experts // ranks if kind == "zero_expert_rank" and ranks > 1 else 0)
    hot = hot_experts(kind, experts, ranks, step=BURST_PERIOD - 1)  # one size at every step; burst's hot one
    if hot is not None:
        if HOT_IMBALANCE * hot.size > experts:
            needs = "experts" if kind in ("hot_expert_set", "spread_hot_experts") else "ranks"
            return (
                f"{workload!r} heats {hot.size} of {experts} experts on {ranks} rank(s), so none can take "
                f"{HOT_IMBALANCE:g}x the mean load; it needs at least 2 {needs}"
            )
        live = int(np.count_nonzero(heat(experts, hot)))  # a hot half leaves the others nothing
    if not 1 <= top_k <= live:
        return f"top_k={top_k} needs 1..{live} experts to route to under {workload!r}"
    return None


def routing(
    workload: str, *, seed: int, step: int, tokens_per_rank: int, experts: int, ranks: int, top_k: int
) -> list[np.ndarray]:
    """Per source rank, (tokens, top_k) int64 expert ids of ``workload`` at ``step``; every row has
    ``top_k`` distinct experts (a replayed trace's may repeat one where it merges experts,
    moe_core.dispatch.routing_trace). ValueError naming what does not fit (the layout, top-k, W5's
    spare experts, a trace's experts)."""
    misfit = why_not(workload, experts=experts, ranks=ranks, top_k=top_k)
    if misfit:
        raise ValueError(misfit)
    kind, parameter = split_name(workload)
    if kind == TRACE:
        trace = routing_trace.load(trace_name(workload))
        return routing_trace.replay(
            trace, step=step, tokens_per_rank=[tokens_per_rank] * ranks, experts=experts, top_k=top_k
        )
    counts = source_tokens(kind, tokens_per_rank, ranks)
    if not any(counts):
        return [np.empty((0, top_k), dtype=np.int64) for _ in counts]
    if kind == "balanced":
        starts = np.cumsum([0, *counts[:-1]])
        return [
            (((start + np.arange(n))[:, None] * top_k + np.arange(top_k)) % experts).astype(np.int64)
            for start, n in zip(starts, counts)
        ]
    weights = expert_weights(kind, parameter, experts, ranks, seed, step)
    rngs = [np.random.default_rng([seed, step, rank]) for rank in range(ranks)]
    return [sample_top_k(weights, n, top_k, rng).astype(np.int64) for n, rng in zip(counts, rngs)]


def routing_counts(routes: list[np.ndarray], experts: int) -> np.ndarray:
    """(ranks, E) choices each source rank routes to each expert."""
    return np.stack([np.bincount(r.ravel(), minlength=experts) for r in routes])
