"""Aurora's model deployment for MoE inference: expert-to-GPU assignment and two-model colocation.

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and
Communication Scheduling" (Aurora), arXiv 2410.17043, Sections 5-7 and the evaluation (Section 8).
Pure functions of historical per-expert statistics; every GPU hosts one expert of a model.

Exact:
* ``assign_exclusive`` (Theorem 5.1): experts by load, descending, onto GPUs by performance,
  descending (assumes a faster GPU never has less bandwidth).
* ``pair_sorted`` (Case I, Theorem 6.2): model a ascending against model b descending minimizes the
  largest per-GPU load when every expert sends what it receives.
* ``pair_bottleneck`` (Case II): bottleneck perfect matching on w_ij = max(a_i + b_j,
  a_{n+i} + b_{n+j}) (send and receive sums), binary search over the edge weights with a
  Hopcroft-Karp perfect-matching test (networkx).
Heuristic:
* ``colocate_heterogeneous`` (Section 7; the exact problem is an NP-hard 3-D matching): two bottleneck
  matchings in sequence, experts of a with experts of b, then pairs with GPUs. The paper reports
  1.07x of the brute-force optimum on average; ``brute_force_heterogeneous`` measures the gap here.
Baselines: ``random_assignment`` (RGA), ``random_colocation`` (REC), ``lina_pairing`` (Lina: the most
popular expert with the least popular one of the *same* model).

What the deployments cost is the simulator's (inference_sim.py); the cost model here is Section 7's
objective only (``pair_cost_on_gpus``: the busiest GPU's dispatch bytes over its bandwidth plus its
FFN time over its speed), which the heuristic and the brute force minimize.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np

from moe_core.comm.transmission import check_traffic_matrix


@dataclass
class LayerStats:
    """One MoE layer of one model, indexed by expert: the inputs of the decisions (Table 1's D_N and |F_i|).

    ``traffic[i, j]``: dispatch bytes from expert i's GPU (its token shard's) to expert j's (the
    combine is its transpose); ``ffn_s[j]``: expert j's FFN seconds on a reference GPU (speed 1).
    """

    traffic: np.ndarray  # (n, n) bytes
    ffn_s: np.ndarray  # (n,)

    def __post_init__(self):
        self.traffic = check_traffic_matrix(self.traffic)
        n = len(self.traffic)
        ffn = np.asarray(self.ffn_s, dtype=np.float64)
        if ffn.shape != (n,) or (ffn < 0).any():
            raise ValueError(f"LayerStats.ffn_s must be {n} non-negative times, got {ffn.tolist()}")
        self.ffn_s = ffn

    @property
    def send(self) -> np.ndarray:
        return self.traffic.sum(axis=1)

    @property
    def recv(self) -> np.ndarray:
        return self.traffic.sum(axis=0)

    @property
    def load(self) -> np.ndarray:
        """Bytes each expert's GPU sends and receives: the load its placement is decided by."""
        return self.send + self.recv


def _check_same_length(**arrays) -> int:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"expected equal lengths (one entry per expert or GPU), got {lengths}")
    return next(iter(lengths.values()))


# -- exclusive deployment -------------------------------------------------------------------------
def assign_exclusive(expert_load, gpu_performance) -> np.ndarray:
    """GPU of each expert: the k-th most loaded expert on the k-th best GPU (Theorem 5.1)."""
    load, perf = np.asarray(expert_load, dtype=np.float64), np.asarray(gpu_performance, dtype=np.float64)
    n = _check_same_length(expert_load=load, gpu_performance=perf)
    gpu_of = np.empty(n, dtype=np.int64)
    gpu_of[np.argsort(-load, kind="stable")] = np.argsort(-perf, kind="stable")
    return gpu_of


def exclusive_cost(expert_load, gpu_performance, gpu_of) -> float:
    """Theorem 5.1's objective: the busiest GPU's load over its performance."""
    load, perf = np.asarray(expert_load, dtype=np.float64), np.asarray(gpu_performance, dtype=np.float64)
    return float((load / perf[np.asarray(gpu_of)]).max(initial=0.0))


def brute_force_exclusive(expert_load, gpu_performance) -> tuple[np.ndarray, float]:
    """The optimal exclusive assignment by trying every permutation (n <= 9): (GPU of each expert, cost)."""
    n = _check_same_length(expert_load=expert_load, gpu_performance=gpu_performance)
    if n > 9:
        raise ValueError(f"brute force over {n}! permutations is too slow; use n <= 9")
    best = min(itertools.permutations(range(n)), key=lambda p: exclusive_cost(expert_load, gpu_performance, p))
    return np.array(best, dtype=np.int64), exclusive_cost(expert_load, gpu_performance, best)


def random_assignment(n: int, seed: int) -> np.ndarray:
    """RGA: a random GPU of each expert."""
    return np.random.default_rng(seed).permutation(n)


# -- colocation of two models ---------------------------------------------------------------------
def pair_sorted(a_load, b_load) -> np.ndarray:
    """Case I: b's expert paired with each a expert, a ascending against b descending (Theorem 6.2)."""
    a, b = np.asarray(a_load, dtype=np.float64), np.asarray(b_load, dtype=np.float64)
    n = _check_same_length(a_load=a, b_load=b)
    partner = np.empty(n, dtype=np.int64)
    partner[np.argsort(a, kind="stable")] = np.argsort(-b, kind="stable")
    return partner


def pairing_weights(a_send, a_recv, b_send, b_recv) -> np.ndarray:
    """(n, n) load of a GPU hosting a's expert i and b's expert j: max(send sum, receive sum)."""
    a_send, a_recv, b_send, b_recv = (np.asarray(x, dtype=np.float64) for x in (a_send, a_recv, b_send, b_recv))
    _check_same_length(a_send=a_send, a_recv=a_recv, b_send=b_send, b_recv=b_recv)
    return np.maximum(np.add.outer(a_send, b_send), np.add.outer(a_recv, b_recv))


def bottleneck_matching(weight) -> np.ndarray:
    """Perfect matching of rows to columns minimizing the largest weight used: column of each row.

    Binary search over the sorted distinct weights; a threshold is feasible when the graph of edges
    at or below it has a perfect matching (Hopcroft-Karp). O(n^2.5 log n).
    """
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weight must be square (n, n), got shape {w.shape}")
    n = len(w)
    if n == 0:
        return np.empty(0, dtype=np.int64)

    def perfect_matching(threshold: float) -> dict | None:
        graph = nx.Graph()
        graph.add_nodes_from(range(2 * n))  # rows 0..n-1, columns n..2n-1
        graph.add_edges_from((i, n + j) for i, j in zip(*np.nonzero(w <= threshold)))
        matching = nx.bipartite.hopcroft_karp_matching(graph, top_nodes=range(n))
        return matching if len(matching) == 2 * n else None

    values = np.unique(w)
    lo, hi = 0, len(values) - 1  # values[hi] (every edge) is always feasible
    while lo < hi:
        mid = (lo + hi) // 2
        if perfect_matching(values[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    matching = perfect_matching(values[lo])
    return np.array([matching[i] - n for i in range(n)], dtype=np.int64)


def pair_bottleneck(a_send, a_recv, b_send, b_recv) -> np.ndarray:
    """Case II: b's expert paired with each a expert so the busiest GPU's load is smallest (exact)."""
    return bottleneck_matching(pairing_weights(a_send, a_recv, b_send, b_recv))


def brute_force_matching(weight) -> tuple[np.ndarray, float]:
    """The optimal bottleneck matching by trying every permutation (n <= 9): (column of each row, cost)."""
    w = np.asarray(weight, dtype=np.float64)
    if len(w) > 9:
        raise ValueError(f"brute force over {len(w)}! permutations is too slow; use n <= 9")
    rows = np.arange(len(w))
    best = min(itertools.permutations(range(len(w))), key=lambda p: w[rows, list(p)].max(initial=0.0))
    return np.array(best, dtype=np.int64), float(w[rows, list(best)].max(initial=0.0))


def random_colocation(n: int, seed: int) -> np.ndarray:
    """REC: a random b expert paired with each a expert."""
    return np.random.default_rng(seed).permutation(n)


def lina_pairing(load) -> list[tuple[int, int]]:
    """Lina's packing within one model: the most popular expert with the least popular, and so on."""
    order = np.argsort(-np.asarray(load, dtype=np.float64), kind="stable")
    if len(order) % 2:
        raise ValueError(f"Lina pairs the experts of one model; {len(order)} experts is odd")
    return [(int(order[k]), int(order[-1 - k])) for k in range(len(order) // 2)]


def pair_cost_on_gpus(a: LayerStats, b: LayerStats, partner: np.ndarray, bandwidth, speed) -> np.ndarray:
    """(n pairs, n GPUs) time of pair (i, partner[i]) on GPU g: its dispatch load / B_g + FFN / speed_g."""
    n = len(partner)
    load = pairing_weights(a.send, a.recv, b.send, b.recv)[np.arange(n), partner]  # (n,) bytes
    ffn = a.ffn_s + b.ffn_s[partner]  # (n,) seconds at speed 1
    bw, sp = (np.broadcast_to(np.asarray(x, dtype=np.float64), (n,)) for x in (bandwidth, speed))
    return load[:, None] / bw[None, :] + ffn[:, None] / sp[None, :]


def colocate_heterogeneous(a: LayerStats, b: LayerStats, bandwidth, speed) -> tuple[np.ndarray, np.ndarray]:
    """Section 7's heuristic: (b partner of each a expert, GPU of each a expert and its partner).

    Step 1: Case II bottleneck matching between the experts of a and b. Step 2: bottleneck matching
    between the pairs and the GPUs, weight = the pair's time on that GPU (``pair_cost_on_gpus``).
    """
    partner = pair_bottleneck(a.send, a.recv, b.send, b.recv)
    return partner, bottleneck_matching(pair_cost_on_gpus(a, b, partner, bandwidth, speed))


def brute_force_heterogeneous(a: LayerStats, b: LayerStats, bandwidth, speed) -> tuple[np.ndarray, np.ndarray, float]:
    """The optimum of Section 7's 3-D matching for small n: (partner, GPU of each pair, busiest GPU's time)."""
    if len(a.send) > 7:
        raise ValueError(f"brute force over {len(a.send)}! pairings is too slow; use n <= 7")
    best = None
    for partner in map(np.array, itertools.permutations(range(len(a.send)))):
        cost_on = pair_cost_on_gpus(a, b, partner, bandwidth, speed)
        gpu_of = bottleneck_matching(cost_on)  # exact for a fixed pairing
        cost = float(cost_on[np.arange(len(partner)), gpu_of].max())
        if best is None or cost < best[2]:
            best = (partner, gpu_of, cost)
    return best
