"""Transmission schedules of an all-to-all on a big switch: representation, timing, and orders.

The paper-neutral half of ordered all-to-alls (numpy/scipy). A transmission order is a decision a
policy makes (Aurora's Algorithm 1 and its baselines register theirs in ``ORDERS`` from
moe_core/papers/aurora); this module holds what every order shares.

Model. ``traffic_matrix[i, j]`` is what GPU i sends to GPU j (bytes, or rows of equal size); the
diagonal is local and free. Every GPU has a send cap and a receive cap of ``bandwidth`` (a scalar, or
one value per GPU); a transfer i -> j runs at min(B_i, B_j). A GPU that receives from two senders at
once shares its receive cap, so the order of transmissions matters.

A schedule is an ordered list of rounds; a round is a list of transfers ``(src, dst, bytes)`` in
which no GPU sends twice and no GPU receives twice. A flow may be split over several rounds.

* ``lower_bound``: T* = max(max_i row_i / B_i, max_j col_j / B_j); no order beats it (exact).
* ``exact_schedule``: Birkhoff-von Neumann decomposition of the padded matrix into perfect matchings.
  Exact: its round time equals T* on a homogeneous switch; with per-GPU bandwidths it is optimal
  for rounds at pair rate min(B_i, B_j), which can exceed the per-GPU bound T*.
* ``naive_orders`` + ``order_schedule``: per-sender orders (here ascending destination) packed into
  conflict-free rounds: a sender whose next receiver is taken waits a round, which is how receiver
  contention costs time in the round model.
* ``make_schedule(kind, ...)`` builds the schedule of any registered order (``ORDERS``).

A schedule's time in the paper's slot model is ``rounds_time`` (rounds one after another with a
barrier between them). Without barriers, as the measured executor (moe_core.comm.ordered_a2a) runs it,
each rank walks its own steps (``rank_steps``) and waits only for its peers; the simulator times that
through its network engine (moe_core.sim.collectives.add_ordered_exchange).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moe_core.registry import Registry

Transfer = tuple[int, int, float]  # (src, dst, bytes)
Schedule = list[list[Transfer]]


def check_traffic_matrix(traffic_matrix) -> np.ndarray:
    """The matrix as float64 (n, n) with its diagonal zeroed; ValueError if it is not a traffic matrix."""
    m = np.array(traffic_matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"traffic_matrix must be square (n, n), got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("traffic_matrix has non-finite entries (NaN or inf)")
    if (m < 0).any():
        raise ValueError(f"traffic_matrix has negative bytes: {m[m < 0].min()}")
    np.fill_diagonal(m, 0.0)  # local traffic never crosses the switch
    return m


def _bandwidths(bandwidth, n: int) -> np.ndarray:
    """Per-GPU bandwidth (n,) from a scalar or a sequence; ValueError if not positive."""
    b = np.asarray(bandwidth, dtype=np.float64)
    if b.ndim == 0:
        b = np.full(n, float(b))
    if b.shape != (n,):
        raise ValueError(f"bandwidth must be a scalar or have one value per GPU ({n}), got shape {b.shape}")
    if not (np.isfinite(b).all() and (b > 0).all()):
        raise ValueError(f"bandwidth must be positive and finite, got {b.tolist()}")
    return b


def pair_rate(bandwidth, n: int) -> np.ndarray:
    """(n, n) rate of a lone transfer i -> j: min(B_i, B_j)."""
    b = _bandwidths(bandwidth, n)
    return np.minimum.outer(b, b)


def lower_bound(traffic_matrix, bandwidth=1.0) -> float:
    """T*: the busiest sender's or receiver's bytes over its bandwidth (Theorem 4.2 / 5.2)."""
    m = check_traffic_matrix(traffic_matrix)
    b = _bandwidths(bandwidth, m.shape[0])
    return float(max((m.sum(axis=1) / b).max(initial=0.0), (m.sum(axis=0) / b).max(initial=0.0)))


# -- exact: Birkhoff-von Neumann ----------------------------------------------------------------------
def _padding(row_deficit: np.ndarray, col_deficit: np.ndarray) -> np.ndarray:
    """Non-negative X with the given row and column sums (north-west corner rule; integers stay integers)."""
    n = len(row_deficit)
    x, r, c = np.zeros((n, n)), row_deficit.copy(), col_deficit.copy()
    i = j = 0
    while i < n and j < n:
        x[i, j] = min(r[i], c[j])
        r[i] -= x[i, j]
        c[j] -= x[i, j]
        if r[i] <= 0:
            i += 1
        else:
            j += 1
    return x


def exact_schedule(traffic_matrix, bandwidth=1.0) -> Schedule:
    """Rounds of total time T* (homogeneous switch): BvN decomposition of the padded matrix.

    The time matrix t_ij = bytes_ij / min(B_i, B_j) is padded with artificial traffic until every row
    and column sums to its largest line sum b; a matrix with equal line sums is a non-negative sum of
    permutations (Birkhoff), found one perfect matching at a time on the positive entries
    (``linear_sum_assignment``, heaviest matching first so fewer rounds remain). Padding and self-pairs
    are dropped from each round. Integer byte matrices give integer pieces.
    """
    from scipy.optimize import linear_sum_assignment  # here: 0.3 s to import, and most runs order no exchange

    m = check_traffic_matrix(traffic_matrix)
    n = m.shape[0]
    rate = pair_rate(bandwidth, n)
    real = m / rate  # time each flow needs alone
    b = max(real.sum(axis=1).max(initial=0.0), real.sum(axis=0).max(initial=0.0))
    padded = real + _padding(b - real.sum(axis=1), b - real.sum(axis=0))
    tol = b * 1e-12  # float residue; integer inputs stay exact
    rounds: Schedule = []
    while padded.max(initial=0.0) > tol:
        rows, cols = linear_sum_assignment(np.where(padded > tol, -padded, np.inf))
        weight = padded[rows, cols].min()
        padded[rows, cols] -= weight
        padded[padded <= tol] = 0.0
        transfers = []
        for i, j in zip(rows, cols):
            piece = min(weight, real[i, j])  # real traffic first, the rest of the slot is padding
            if i != j and piece > tol:
                real[i, j] -= piece
                transfers.append((int(i), int(j), float(piece * rate[i, j])))
        if transfers:
            rounds.append(transfers)
    return rounds


# -- baselines: per-sender orders ---------------------------------------------------------------------
def naive_orders(traffic_matrix) -> list[list[int]]:
    """Each sender's destinations in ascending rank order (the paper's Fig. 4 naive order)."""
    m = check_traffic_matrix(traffic_matrix)
    return [[int(j) for j in np.nonzero(row)[0]] for row in m]


def order_schedule(traffic_matrix, orders: list[list[int]]) -> Schedule:
    """Pack per-sender orders into conflict-free rounds, each flow whole.

    Round after round, every sender (lowest rank first) sends its next flow unless another sender
    already took that receiver this round; then it waits. The naive order of Fig. 4 takes 3 rounds.
    """
    m = check_traffic_matrix(traffic_matrix)
    flows = [(int(i), int(j)) for i, j in zip(*np.nonzero(m))]
    if sorted((i, j) for i, row in enumerate(orders) for j in row) != flows:
        raise ValueError("orders must list every non-zero off-diagonal flow of traffic_matrix exactly once")
    position = [0] * len(orders)
    rounds: Schedule = []
    while any(p < len(row) for p, row in zip(position, orders)):
        taken, transfers = set(), []
        for i, row in enumerate(orders):
            if position[i] < len(row) and row[position[i]] not in taken:
                j = row[position[i]]
                taken.add(j)
                transfers.append((i, j, float(m[i, j])))
                position[i] += 1
        rounds.append(transfers)
    return rounds


# An order: (traffic_matrix, bandwidth, seed) -> Schedule. Papers register theirs (register_order).
OrderFn = Callable[..., "Schedule"]
ORDERS: Registry[OrderFn] = Registry("transmission order")


def register_order(name: str) -> Callable[[OrderFn], OrderFn]:
    """Register a transmission order under ``name`` (the name configs and records use)."""
    return lambda fn: ORDERS.register(name, fn)


def make_schedule(kind: str, traffic_matrix, bandwidth=1.0, seed: int = 0) -> Schedule:
    """The schedule of the registered order ``kind`` (``seed`` feeds the random ones)."""
    return ORDERS.lookup(kind)(traffic_matrix, bandwidth, seed)


register_order("exact")(lambda traffic_matrix, bandwidth, seed: exact_schedule(traffic_matrix, bandwidth))
register_order("naive")(
    lambda traffic_matrix, bandwidth, seed: order_schedule(traffic_matrix, naive_orders(traffic_matrix))
)


# -- using a schedule ---------------------------------------------------------------------------------
def transpose(schedule: Schedule) -> Schedule:
    """The schedule of the transposed matrix (every transfer reversed): the combine all-to-all and
    the backward pass run the dispatch order backwards in space, with the same time."""
    return [[(dst, src, nbytes) for src, dst, nbytes in transfers] for transfers in schedule]


def rank_steps(schedule: Schedule, rank: int) -> list[tuple[tuple[int, float] | None, tuple[int, float] | None]]:
    """``rank``'s work in order: per round it takes part in, (send (dst, bytes) | None, recv (src, bytes) | None)."""
    steps = []
    for transfers in schedule:
        send = next(((d, b) for s, d, b in transfers if s == rank), None)
        recv = next(((s, b) for s, d, b in transfers if d == rank), None)
        if send or recv:
            steps.append((send, recv))
    return steps


def delivered(schedule: Schedule, n: int) -> np.ndarray:
    """(n, n) bytes the schedule moves per pair; ValueError if a round sends or receives twice on a GPU."""
    total = np.zeros((n, n))
    for k, transfers in enumerate(schedule):
        srcs, dsts = [s for s, _, _ in transfers], [d for _, d, _ in transfers]
        if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
            raise ValueError(f"round {k} has a GPU sending or receiving twice: {transfers}")
        for s, d, nbytes in transfers:
            total[s, d] += nbytes
    return total


def _schedule_rate(schedule: Schedule, bandwidth) -> np.ndarray:
    """Pair rates for the GPUs of ``schedule`` (all of ``bandwidth``'s when it is per GPU)."""
    n = (
        np.size(bandwidth)
        if np.ndim(bandwidth)
        else 1 + max((max(s, d) for transfers in schedule for s, d, _ in transfers), default=0)
    )
    return pair_rate(bandwidth, n)


def rounds_time(schedule: Schedule, bandwidth=1.0) -> float:
    """Rounds one after another, each as long as its slowest transfer bytes / min(B_src, B_dst)."""
    rate = _schedule_rate(schedule, bandwidth)
    return float(sum(max(nbytes / rate[s, d] for s, d, nbytes in transfers) for transfers in schedule))
