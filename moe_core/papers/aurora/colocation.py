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

Inference-time model (Eqs. 1, 3, 4 and Table 2, as this suite reads them; see each function):
all-to-alls are synchronous and take the time of Aurora's optimal order on the GPU-level traffic
matrix (moe_core.transmission); GPU utilization = (gate + FFN + aggregation time) / inference time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np

from moe_core.transmission import async_time, check_traffic_matrix, make_schedule

# Section 8's big switch, in Gb/s as the paper states it; bytes/s = Gb/s * 1e9 / 8.
HOMOGENEOUS_GBPS = 100.0
HETEROGENEOUS_GBPS = (100.0, 80.0, 50.0, 40.0)  # four GPU types, equal counts, fastest first


def gbps_to_bytes_per_s(gbps) -> np.ndarray:
    return np.asarray(gbps, dtype=np.float64) * 1e9 / 8


def heterogeneous_bandwidth(n_gpus: int) -> np.ndarray:
    """Bytes/s per GPU for Section 8's heterogeneous cluster: the four types in equal counts, fastest first."""
    if n_gpus % len(HETEROGENEOUS_GBPS):
        raise ValueError(f"n_gpus ({n_gpus}) must be a multiple of the {len(HETEROGENEOUS_GBPS)} GPU types")
    return gbps_to_bytes_per_s(np.repeat(HETEROGENEOUS_GBPS, n_gpus // len(HETEROGENEOUS_GBPS)))


@dataclass
class LayerStats:
    """One MoE layer of one model, indexed by expert (Table 1: D_N, |G_i|, |F_i|, |A_i|).

    ``traffic[i, j]``: dispatch bytes from expert i's GPU to expert j's (the combine is its
    transpose); times are seconds on a reference GPU (speed 1).
    """

    traffic: np.ndarray  # (n, n) bytes
    gate_s: np.ndarray  # (n,)
    ffn_s: np.ndarray  # (n,)
    agg_s: np.ndarray  # (n,)

    def __post_init__(self):
        self.traffic = check_traffic_matrix(self.traffic)
        n = len(self.traffic)
        for name in ("gate_s", "ffn_s", "agg_s"):
            value = np.asarray(getattr(self, name), dtype=np.float64)
            if value.shape != (n,) or (value < 0).any():
                raise ValueError(f"LayerStats.{name} must be {n} non-negative times, got {value.tolist()}")
            setattr(self, name, value)

    @property
    def send(self) -> np.ndarray:
        return self.traffic.sum(axis=1)

    @property
    def recv(self) -> np.ndarray:
        return self.traffic.sum(axis=0)


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


# -- inference time and GPU utilization ---------------------------------------------------------------
def gpu_traffic(traffic, gpu_of, n_gpus: int) -> np.ndarray:
    """(n_gpus, n_gpus) bytes between GPUs when expert e sits on GPU gpu_of[e]; same-GPU traffic is local."""
    m = check_traffic_matrix(traffic)
    out = np.zeros((n_gpus, n_gpus))
    np.add.at(out, (np.asarray(gpu_of)[:, None], np.asarray(gpu_of)[None, :]), m)
    np.fill_diagonal(out, 0.0)
    return out


def a2a_time(traffic, bandwidth, kind: str = "exact", seed: int = 0) -> float:
    """All-to-all time of the ``kind`` order (moe_core.transmission.ORDERS), GPUs proceeding
    without slot barriers (``async_time``). ``exact`` is Aurora's optimum: T* when homogeneous."""
    return async_time(make_schedule(kind, traffic, bandwidth, seed), bandwidth)


def _per_gpu(times: np.ndarray, gpu_of, n_gpus: int, speed) -> np.ndarray:
    """Per-GPU compute time: the hosted experts' reference times summed, divided by the GPU's speed."""
    out = np.zeros(n_gpus)
    np.add.at(out, np.asarray(gpu_of), times)
    return out / np.broadcast_to(np.asarray(speed, dtype=np.float64), (n_gpus,))


def exclusive_inference(
    layers: list[LayerStats], gpu_of, bandwidth, speed=1.0, kind: str = "exact", seed: int = 0
) -> tuple[float, float]:
    """(inference time, GPU utilization) of one model on its own GPUs (Eq. 1 with synchronous all-to-alls).

    Per layer: max gate + dispatch a2a + max FFN + combine a2a (the transpose) + max aggregation;
    all-to-alls in the ``kind`` order (``a2a_time``); a GPU hosting several experts of the model
    computes them one after another. Utilization is the mean over GPUs of compute time / inference time.
    """
    n_gpus = int(np.max(gpu_of)) + 1 if np.ndim(bandwidth) == 0 else len(bandwidth)
    total, compute = 0.0, np.zeros(n_gpus)
    for layer in layers:
        g, f, a = (_per_gpu(x, gpu_of, n_gpus, speed) for x in (layer.gate_s, layer.ffn_s, layer.agg_s))
        d = gpu_traffic(layer.traffic, gpu_of, n_gpus)
        dispatch, combine = a2a_time(d, bandwidth, kind, seed), a2a_time(d.T, bandwidth, kind, seed)
        total += g.max() + dispatch + f.max() + combine + a.max()
        compute += g + f + a
    return float(total), float(compute.mean() / total)


def colocated_inference(
    layers_a: list[LayerStats],
    layers_b: list[LayerStats],
    partner,
    gpu_of,
    bandwidth,
    speed=1.0,
    kind: str = "exact",
    seed: int = 0,
) -> tuple[float, float]:
    """(inference time, GPU utilization) of models a and b sharing GPUs: a's expert i and b's expert
    partner[i] on GPU gpu_of[i].

    Per layer, following Table 2's interleaving (G^a, then G^b and F^a while the dispatch tokens of
    both models cross the switch, then F^b and A^a while the combine tokens do, then A^b):
        |G^a| + max(|G^b| + |F^a|, N^{a+b}) + max(|F^b| + |A^a|, C^{a+b}) + |A^b|,
    compute terms as maxima over GPUs, N^{a+b} the all-to-all time of both models' dispatch traffic
    together on the shared GPUs in the ``kind`` order (Theorem 6.1's aggregated communication),
    C^{a+b} its transpose.
    This suite's reading: the paper's per-component start/end formulas are not reproduced.
    """
    partner, gpu_of = np.asarray(partner), np.asarray(gpu_of)
    n_gpus = len(gpu_of)
    for name, perm in (("partner", partner), ("gpu_of", gpu_of)):
        if sorted(perm.tolist()) != list(range(n_gpus)):
            raise ValueError(
                f"{name} must be a permutation of 0..{n_gpus - 1} (one expert per model and GPU), got {perm.tolist()}"
            )
    gpu_of_b = np.empty(n_gpus, dtype=np.int64)
    gpu_of_b[partner] = gpu_of
    total, compute = 0.0, np.zeros(n_gpus)
    for la, lb in zip(layers_a, layers_b, strict=True):
        ga, fa, aa = (_per_gpu(x, gpu_of, n_gpus, speed) for x in (la.gate_s, la.ffn_s, la.agg_s))
        gb, fb, ab = (_per_gpu(x, gpu_of_b, n_gpus, speed) for x in (lb.gate_s, lb.ffn_s, lb.agg_s))
        d = gpu_traffic(la.traffic, gpu_of, n_gpus) + gpu_traffic(lb.traffic, gpu_of_b, n_gpus)
        total += (
            ga.max()
            + max((gb + fa).max(), a2a_time(d, bandwidth, kind, seed))
            + max((fb + aa).max(), a2a_time(d.T, bandwidth, kind, seed))
            + ab.max()
        )
        compute += ga + gb + fa + fb + aa + ab
    return float(total), float(compute.mean() / total)


def lina_pairing_inference(
    layers_a: list[LayerStats], layers_b: list[LayerStats], bandwidth, speed=1.0
) -> tuple[float, float]:
    """(inference time, GPU utilization) of Lina's deployment on the same n GPUs: each model packs
    its experts two per GPU (``lina_pairing`` on the first layer's loads) on its own half of the
    GPUs and runs there exclusively; both models run side by side. ``bandwidth`` and ``speed`` are
    per GPU (or scalars); model a gets the first half of the GPUs."""
    n = len(layers_a[0].send)
    bw = np.broadcast_to(np.asarray(bandwidth, dtype=np.float64), (n,))
    sp = np.broadcast_to(np.asarray(speed, dtype=np.float64), (n,))
    results = []
    for half, layers in ((slice(0, n // 2), layers_a), (slice(n // 2, n), layers_b)):
        gpu_of = np.empty(n, dtype=np.int64)
        for gpu, (i, j) in enumerate(lina_pairing(layers[0].send + layers[0].recv)):
            gpu_of[[i, j]] = gpu
        results.append(exclusive_inference(layers, gpu_of, bw[half], sp[half]))
    (t_a, u_a), (t_b, u_b) = results
    t = max(t_a, t_b)
    return t, float((u_a * t_a + u_b * t_b) / (2 * t))
