"""Aurora's all-to-all transmission order on a big switch: pure decision functions (numpy).

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and
Communication Scheduling" (Aurora), arXiv 2410.17043, Sections 4.2 and 5 (Theorems 4.2, 5.2,
Algorithm 1, Fig. 4). The schedule model, the exact (BvN) schedule, the naive order and the time
models are paper-neutral (moe_core.comm.transmission); this module registers Aurora's orders there:

* ``aurora``: the paper's Algorithm 1, a heuristic: bottleneck GPU first, then the others by
  traffic, each fixing its sending order around the receivers' already fixed busy times. The paper
  orders unit tokens; here flows are split only where a receiver's free time ends. At least T*; on
  random matrices about 1% above it on average, up to 1.4x on skewed ones.
* the paper's baselines ``sjf`` (shortest flow first per sender) and ``rcs`` (seeded random order
  per sender), packed into conflict-free rounds by ``transmission.order_schedule``.
"""

from __future__ import annotations

import numpy as np

from moe_core.comm.transmission import Schedule, check_traffic_matrix, order_schedule, pair_rate, register_order

# -- the paper's Algorithm 1 ----------------------------------------------------------------------
Busy = list[tuple[float, float]]  # one side (send or receive) of a GPU: occupied [start, end) intervals


def _free_until(busy: Busy, t: float) -> float:
    """End of the free window that contains ``t`` (inf if none ends); -1 if ``t`` is busy."""
    if any(s <= t < e for s, e in busy):
        return -1.0
    return min((s for s, _ in busy if s > t), default=np.inf)


def _place_sends(send: Busy, recv: dict[int, Busy], need: dict[int, float]) -> list[tuple[int, float, float]]:
    """Fix one GPU's sending order: flows ``need`` (receiver -> time) around the busy times fixed so far.

    Sweeping time from 0: among the receivers free now, send to the one whose free window closes
    first (its scarce free time is used before it is gone; ties: most remaining, then lowest rank)
    until the window closes or the flow is done. Returns (receiver, start, end) pieces.
    """
    pieces, t = [], 0.0
    while need:
        send_until = _free_until(send, t)
        windows = {j: min(send_until, _free_until(recv[j], t)) for j in need}
        free = [j for j, w in windows.items() if w > t]
        if send_until < 0 or not free:  # wait for the next moment a side is released
            t = min(e for busy in (send, *(recv[j] for j in need)) for _, e in busy if e > t)
            continue
        j = min(free, key=lambda j: (windows[j], -need[j], j))
        end = min(t + need[j], windows[j])
        send.append((t, end))
        recv[j].append((t, end))
        pieces.append((j, t, end))
        if end == t + need[j]:
            del need[j]
        else:
            need[j] -= end - t
        t = end
    return pieces


def _slice_into_rounds(pieces: list[tuple[int, int, float, float]], rate: np.ndarray) -> Schedule:
    """Cut a conflict-free timetable (src, dst, start, end) at every start and end; each busy slice is a round."""
    cuts = sorted({t for _, _, s, e in pieces for t in (s, e)})
    rounds: Schedule = []
    for lo, hi in zip(cuts, cuts[1:]):
        active = sorted((i, j, float((hi - lo) * rate[i, j])) for i, j, s, e in pieces if s <= lo and e >= hi)
        if active:
            rounds.append(active)
    return rounds


def algorithm1_schedule(traffic_matrix, bandwidth=1.0) -> Schedule:
    """Aurora's Algorithm 1: bottleneck GPU first, then the others by traffic, no conflicts.

    The bottleneck GPU (largest send or receive time) fixes its sending order first, then the others
    by send time, descending, each around the receive times fixed before it (``_place_sends``); the
    timetable is then cut into rounds. A greedy heuristic: at least T*, often T*, not always.
    """
    m = check_traffic_matrix(traffic_matrix)
    n = m.shape[0]
    rate = pair_rate(bandwidth, n)
    duration = m / rate  # time each flow needs alone
    bottleneck = int(np.argmax(np.maximum(duration.sum(axis=1), duration.sum(axis=0))))
    sends = duration.sum(axis=1)
    order = [bottleneck] + sorted((g for g in range(n) if g != bottleneck), key=lambda g: (-sends[g], g))

    send_busy: dict[int, Busy] = {g: [] for g in range(n)}
    recv_busy: dict[int, Busy] = {g: [] for g in range(n)}
    pieces: list[tuple[int, int, float, float]] = []
    for g in order:
        flows = {int(j): duration[g, j] for j in np.nonzero(duration[g])[0]}
        pieces += [(g, j, s, e) for j, s, e in _place_sends(send_busy[g], recv_busy, flows)]
    return _slice_into_rounds(pieces, rate)


def sjf_orders(traffic_matrix) -> list[list[int]]:
    """Shortest flow first per sender (SJF); ties by destination."""
    m = check_traffic_matrix(traffic_matrix)
    return [sorted((int(j) for j in np.nonzero(row)[0]), key=lambda j: (row[j], j)) for row in m]


def rcs_orders(traffic_matrix, seed: int) -> list[list[int]]:
    """Random order per sender (RCS), drawn from ``seed`` so every rank draws the same."""
    m = check_traffic_matrix(traffic_matrix)
    rng = np.random.default_rng(seed)
    return [[int(j) for j in rng.permutation(np.nonzero(row)[0])] for row in m]


@register_order("aurora")
def _aurora(traffic_matrix, bandwidth, seed: int) -> Schedule:
    return algorithm1_schedule(traffic_matrix, bandwidth)


@register_order("sjf")
def _sjf(traffic_matrix, bandwidth, seed: int) -> Schedule:
    return order_schedule(traffic_matrix, sjf_orders(traffic_matrix))


@register_order("rcs")
def _rcs(traffic_matrix, bandwidth, seed: int) -> Schedule:
    return order_schedule(traffic_matrix, rcs_orders(traffic_matrix, seed))
