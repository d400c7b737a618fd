"""Event-driven fluid simulation of a DAG of compute and communication operations.

Operations, not flows: a collective is one fluid entity with a footprint (bytes per link,
moe_core.sim.topology.Transfer) that moves at one rate, in bytes per second of its largest per-link
stream, on every link it crosses. Concurrent transfers share links by max-min fairness in those
bytes per second (progressive filling): every unfrozen transfer speeds up by the same bytes per
second until a link saturates or the transfer reaches its cap (its calibrated efficiency times the
speed it has alone); transfers crossing a saturated link freeze, the rest go on. So two transfers
of one byte stream each on a shared link get the same bytes per second whatever their other links,
and one limited elsewhere (a slower link, its cap) leaves the rest of the shared link to the others:
textbook max-min fairness for point-to-point flows, which TCP approximates (measured on the
emulated testbed with nodes of unequal rates: experiments/link_sharing.py). Strict priority classes
fill one after another, lower class numbers first, each on what the classes before it left (Lina's
all-to-all-first rule). A transfer alone therefore takes exactly its bottleneck time over its
efficiency, two equal transfers on one link take twice as long, and a high-priority transfer keeps
the whole link.

Cost: rates are recomputed only when the set of active transfers changes, each time in
O(active transfers x their links), so a step costs O(operations x links), independent of the
number of flows (peers.md §3: the gap between ASTRA-sim's FIFO links and SimAI's fitted curves).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from moe_core.sim.topology import Transfer

EPS = 1e-12


@dataclass
class Op:
    """One node of the step DAG. Compute: ``duration_s``. Communication: ``latency_s`` then ``transfer``."""

    name: str
    phase: str  # what the time counts as: gate, dispatch_a2a, expert, combine_a2a, dense, allreduce, ...
    deps: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    transfer: Transfer | None = None
    latency_s: float = 0.0
    priority: int = 0  # strict priority class of the transfer, 0 highest
    # Asynchronous devices (:func:`issued_by_host`): an op of the host's issue stream, not the device's;
    # the host op that issues this compute op (its span then runs to that op's end at least); and
    # whether the host must wait for this op's inputs before issuing it (it reads them: split sizes).
    on_host: bool = False
    issued_by: int | None = None
    host_sync: bool = False

    @property
    def is_compute(self) -> bool:
        """A device's compute op (not a transfer, not the host issuing kernels)."""
        return self.transfer is None and not self.on_host


def as_deps(after) -> list[int]:
    """Dependencies given as None, one op index or a list of them (Nones dropped) -> a list."""
    if after is None:
        return []
    if isinstance(after, int):
        return [after]
    return [d for d in after if d is not None]


@dataclass
class Timeline:
    start_s: np.ndarray  # (ops,)
    end_s: np.ndarray  # (ops,)

    @property
    def makespan_s(self) -> float:
        return float(self.end_s.max()) if len(self.end_s) else 0.0


def issued_by_host(ops: list[Op], issue_s: list[float]) -> tuple[list[Op], list[int]]:
    """``ops`` (in program order) as an asynchronous device (a GPU) runs them under one host thread.

    The host issues the ops one after another: compute op i takes ``issue_s[i]`` of host time (its
    kernels' launches, which its ``duration_s`` no longer holds), a collective none. The device
    starts a compute op once its inputs are ready and the host has begun issuing it, and ends it no
    earlier than the host's last launch for it (``issued_by``: the CUDA events around it span the
    gap); a collective starts once its inputs are ready and the host has issued the ops it waits on
    (as a hook or a prefetch issues it, not after everything listed before it). So launches cost the
    step nothing while the host runs ahead and all of their time where it falls behind (small
    kernels, a host-bound model). The host waits for the device only before an op marked
    ``host_sync`` (it reads what that op's inputs computed, such as the split sizes of a dropless
    all-to-all) and at the start. Returns the new ops and where each of ``ops`` went.
    """
    new: list[Op] = []
    where: list[int] = []
    issued_at: list[int | None] = []  # per op of ``ops``: the host op after which it is issued
    host: int | None = None  # the host's last op
    for op, issue in zip(ops, issue_s):
        deps = [where[d] for d in op.deps]
        if op.host_sync:  # the host reads the inputs: it waits for the device to compute them
            new.append(Op(f"sync/{op.name}", "host", as_deps([host, *deps]), on_host=True))
            host = len(new) - 1
        if op.transfer is None:
            begun = host
            new.append(Op(f"issue/{op.name}", "host", as_deps(host), duration_s=issue, on_host=True))
            host = len(new) - 1
            new.append(replace(op, deps=as_deps([*deps, begun]), issued_by=host))
            issued_at.append(host)
        else:
            after = (
                host if op.host_sync else max((issued_at[d] for d in op.deps if issued_at[d] is not None), default=None)
            )
            new.append(replace(op, deps=as_deps([*deps, after])))
            issued_at.append(after)
        where.append(len(new) - 1)
    return new, where


def add_micro_ops(
    ops: list[Op],
    name: str,
    phase: str,
    transfer: Transfer,
    latency_s: float,
    count: int,
    deps: list[int],
    priority: int = 0,
) -> int:
    """Append ``transfer`` as ``count`` equal micro-ops run one after another (Lina's tensor
    partitioning); each pays the latency, so finer partitions cost more. Returns the last op's index.

    Between micro-ops, operations of higher priority that became ready take the links first.
    """
    if count < 1:
        raise ValueError(f"micro-op count must be >= 1, got {count}")
    part = replace(transfer, nbytes=transfer.nbytes / count)
    for k in range(count):
        ops.append(Op(f"{name}.{k}", phase, list(deps), transfer=part, latency_s=latency_s, priority=priority))
        deps = [len(ops) - 1]
    return len(ops) - 1


def simulate(
    ops: list[Op],
    capacity: np.ndarray,
    shared_latency: bool = False,
    burst_bytes: np.ndarray | None = None,
    host_link: int | None = None,
) -> Timeline:
    """Run the DAG; every op starts when all its deps have ended. Returns start and end times.

    ``shared_latency``: the latency phases of concurrent transfers share one processor by max-min
    fairness instead of passing independently. That is a CPU testbed, where a collective's per-step
    latency is protocol work (copies, TCP) on the host's cores: two collectives at once each take
    about twice their latency, which a network-only model misses for small messages.

    ``burst_bytes``: token buckets per link (0 where a link has none; ``tc tbf`` on an emulated
    testbed's links, moe_core.host.testbed). A link holding tokens does not limit what crosses it (the
    transfers' other links do) and its tokens drain by what passes beyond its rate; an empty bucket
    holds the link to its rate; a link used below its rate refills at the difference, up to the
    bucket's size. Buckets start full. So a message within the bucket crosses at host speed and a
    long one at the link's rate, as on the testbed.

    ``host_link``: a link that stands for the host's copy throughput (a CPU testbed's, topology
    ``Cluster.host``), which every byte a collective sends crosses. It limits transfers like any
    link, but it carries no stream of its own: its load is the sum of all the collective's streams,
    so it is not the unit in which a transfer's bytes per second are counted (else a collective
    with more intra-node bytes would get less of a NIC it shares).
    """
    return _EventLoop(ops, capacity, shared_latency, burst_bytes, host_link).run()


def _dependents(ops: list[Op]) -> tuple[list[list[int]], np.ndarray]:
    """Each op's children and its number of deps; ValueError unless every dep is an earlier op."""
    n = len(ops)
    children: list[list[int]] = [[] for _ in range(n)]
    waiting = np.zeros(n, dtype=int)
    for i, op in enumerate(ops):
        for d in op.deps:
            if not 0 <= d < i:
                raise ValueError(f"op {i} ({op.name}) depends on {d}: deps must be earlier ops")
            children[d].append(i)
        waiting[i] = len(op.deps)
    return children, waiting


class _EventLoop:
    """One run of :func:`simulate`: the DAG's progress, the pending timers and the stages in flight.

    A stage is a transfer op ``i`` moving its bytes or, with shared latency, its latency phase, keyed
    ``-1 - i``; ``active`` holds each running stage's remaining fraction and ``rates`` its progress
    rate (fraction per second). Timers are ``(time, kind, op)``: kind 0 = op ends, 1 = latency over.
    """

    def __init__(
        self,
        ops: list[Op],
        capacity: np.ndarray,
        shared_latency: bool,
        burst_bytes: np.ndarray | None,
        host_link: int | None,
    ):
        self.ops, self.host_link = ops, host_link
        self.children, self.waiting = _dependents(ops)
        self.start, self.end = np.full(len(ops), np.nan), np.full(len(ops), np.nan)
        self.footprints = {
            i: _footprint(op.transfer, capacity, host_link) for i, op in enumerate(ops) if op.transfer is not None
        }
        self.num_links = len(capacity) + shared_latency  # the host processor is one more link, of capacity 1
        self.latency_stage: dict[int, int] = {}  # op -> its latency phase's stage key when latency is shared
        if shared_latency:
            self._share_latency(host_processor=len(capacity))
        self.buckets = _Buckets(capacity, burst_bytes, ops)
        self.timers: list[tuple[float, int, int]] = []
        self.active: dict[int, float] = {}
        self.rates: dict[int, float] = {}
        self.now = 0.0
        self.done = 0  # ops ended

    def _share_latency(self, host_processor: int) -> None:
        """Make every transfer's latency phase a stage of its own on the host processor's link."""
        host = np.array([host_processor])
        for i, op in enumerate(self.ops):
            if op.transfer is not None and op.latency_s > 0:
                self.latency_stage[i] = -1 - i
                # its size is its seconds of latency, at most one second of them per second
                self.footprints[-1 - i] = (host, np.ones(1), op.latency_s, 1.0)

    def run(self) -> Timeline:
        """Begin the ops without deps, then handle events until every op has ended."""
        for i in range(len(self.ops)):
            if self.waiting[i] == 0:
                self.begin(i)
        self.rates = self.current_rates()
        while self.done < len(self.ops):
            self.step()
        for i, op in enumerate(self.ops):  # an issued op lasts until its last kernel is launched (issued_by_host)
            if op.issued_by is not None:
                self.end[i] = max(self.end[i], self.end[op.issued_by])
        return Timeline(self.start, self.end)

    def begin(self, i: int) -> None:
        """Op ``i``'s deps have ended: it starts its compute, its shared latency phase or its latency timer."""
        self.start[i] = self.now
        op = self.ops[i]
        if op.transfer is None:
            heapq.heappush(self.timers, (self.now + op.duration_s, 0, i))
        elif i in self.latency_stage:
            self.active[self.latency_stage[i]] = 1.0
        else:
            heapq.heappush(self.timers, (self.now + op.latency_s, 1, i))

    def start_transfer(self, i: int) -> bool:
        """Latency over: the transfer stage starts; False when no link it crosses limits it (none
        finite, or only links holding tokens): then it passes at once, taking its bytes from the
        buckets."""
        if i in self.buckets.ops:
            self.footprints[i] = _footprint(self.ops[i].transfer, self.buckets.capacity(), self.host_link)
        if self.footprints[i][0].size == 0:
            self.buckets.take(i)
            return False
        self.active[i] = 1.0
        return True

    def current_rates(self) -> dict[int, float]:
        """The active stages' rates by max-min fair sharing (:func:`fair_rates`)."""
        active, footprints = self.active, self.footprints
        if self.buckets.ops:  # footprints follow the buckets: a link with tokens limits nothing
            caps = self.buckets.capacity()
            footprints.update(
                {i: _footprint(self.ops[i].transfer, caps, self.host_link) for i in active if i in self.buckets.ops}
            )
        return fair_rates(
            {i: footprints[i] for i in active},
            {i: self.ops[i if i >= 0 else -1 - i].priority for i in active},
            self.num_links,
        )

    def next_finish(self) -> tuple[float, int | None]:
        """When the first active stage finishes at the current rates, and which (inf, None: none will)."""
        next_finish, finisher = np.inf, None
        for i, left in self.active.items():
            t = self.now + left / self.rates[i] if self.rates[i] > 0 else np.inf
            if t < next_finish:
                next_finish, finisher = t, i
        return next_finish, finisher

    def step(self) -> None:
        """Advance to the next event (a timer, a stage finishing, a bucket running dry) and handle it."""
        if not self.timers and not self.active:
            raise RuntimeError("simulation stalled: a dependency cycle or an unreachable op")
        next_timer = self.timers[0][0] if self.timers else np.inf
        next_finish, finisher = self.next_finish()
        next_empty = self.now + self.buckets.time_to_empty(self.active, self.rates)
        t_next = min(next_timer, next_finish, next_empty)
        self.advance(t_next)
        finished = self.due_timers()
        # The transfer that set this event is done, whatever rounding left of it (at large ``now``,
        # ``now + left / rate`` can round back to ``now``); others finishing together go too.
        finished += [
            i
            for i, left in self.active.items()
            if left <= 1e-9 or (i == finisher and next_finish <= min(next_timer, next_empty))
        ]
        self.finish(finished)
        # Rates change when a stage ended or started; with token buckets also when a bucket ran dry
        # (its link limits again) or an op drew on one. A compute op ending changes nothing in flight:
        # the rates stand (most events of a training step are such ends).
        buckets_moved = bool(self.buckets.ops) and (bool(finished) or t_next == next_empty)
        if buckets_moved or set(self.active) != set(self.rates):
            self.rates = self.current_rates()

    def advance(self, t_next: float) -> None:
        """Move the active stages and the buckets on to ``t_next`` at the current rates."""
        dt = t_next - self.now
        for i in self.active:
            self.active[i] -= self.rates[i] * dt
        self.buckets.advance(dt)
        self.now = t_next

    def due_timers(self) -> list[int]:
        """Pop the timers due now: compute ops that end, and latency phases over whose transfer
        starts (those whose transfer passes at once end too). Returns the ops that end."""
        ended: list[int] = []
        while self.timers and self.timers[0][0] <= self.now + EPS:
            _, kind, i = heapq.heappop(self.timers)
            if kind == 0 or not self.start_transfer(i):
                ended.append(i)
        return ended

    def finish(self, finished: list[int]) -> None:
        """End the stages in ``finished``: a shared latency phase starts its transfer (the op ends
        only when that passes at once); an op ends and begins the children waiting only on it."""
        for i in finished:
            if i in self.active:
                del self.active[i]
            if i < 0:  # a shared latency phase ended: its transfer starts
                if self.start_transfer(-1 - i):
                    continue
                i = -1 - i
            self.end[i] = self.now
            self.done += 1
            for c in self.children[i]:
                self.waiting[c] -= 1
                if self.waiting[c] == 0:
                    self.begin(c)


class _Buckets:
    """The token buckets of :func:`simulate`: tokens per bucket link, and which ops cross one."""

    TOKEN_EPS = 1.0  # bytes: a bucket with less is empty (rounding must not reopen a saturated link)

    def __init__(self, capacity: np.ndarray, burst_bytes: np.ndarray | None, ops: list[Op]):
        burst = np.zeros(len(capacity)) if burst_bytes is None else np.asarray(burst_bytes, dtype=float)
        self.links = np.flatnonzero(burst > 0)
        self.size = burst[self.links]
        self.tokens = self.size.copy()
        self.rate = capacity[self.links]  # bytes/s
        self._capacity = capacity
        self._drain = 0.0  # bytes/s beyond the rate, per bucket, at the current rates
        index = np.full(len(capacity), -1)
        index[self.links] = np.arange(len(self.links))
        self.ops: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # op -> (its buckets, its bytes on each)
        for i, op in enumerate(ops):
            if op.transfer is not None and self.links.size:
                where = index[op.transfer.links]
                if (where >= 0).any():
                    self.ops[i] = (where[where >= 0], op.transfer.nbytes[where >= 0])

    def capacity(self) -> np.ndarray:
        """Link capacities now: unlimited where a bucket holds tokens."""
        caps = self._capacity.copy()
        caps[self.links[self.tokens >= self.TOKEN_EPS]] = np.inf
        return caps

    def take(self, i: int) -> None:
        """Op ``i`` passed at once: its bytes leave the buckets."""
        if i in self.ops:
            where, nbytes = self.ops[i]
            np.subtract.at(self.tokens, where, nbytes)
            np.clip(self.tokens, 0.0, None, out=self.tokens)

    def time_to_empty(self, active: dict[int, float], rates: dict[int, float]) -> float:
        """Seconds until the next bucket runs dry at the current rates (inf if none will)."""
        if not self.ops:
            return np.inf
        through = np.zeros(len(self.links))
        for i in active:
            if i in self.ops:
                where, nbytes = self.ops[i]
                np.add.at(through, where, rates[i] * nbytes)
        self._drain = through - self.rate
        draining = (self._drain > 0) & (self.tokens >= self.TOKEN_EPS)
        return float(np.min(self.tokens[draining] / self._drain[draining])) if draining.any() else np.inf

    def advance(self, dt: float) -> None:
        """``dt`` seconds at the current rates (a bucket that runs dry is left with less than
        TOKEN_EPS: rounding is far below a byte)."""
        if self.ops:
            np.clip(self.tokens - self._drain * dt, 0.0, self.size, out=self.tokens)


def _footprint(
    transfer: Transfer, capacity: np.ndarray, host_link: int | None = None
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(links, the share of each link's capacity one byte per second of the transfer's rate uses,
    its size: the bytes of its largest per-link stream, in which its rate is counted, its highest
    rate: its efficiency times the rate that fills its bottleneck). Links whose capacity is infinite
    (or that carry nothing) are left out; a transfer with no link left passes at once. The stream
    on ``host_link`` (the sum of the others) counts as the size only when no other link is left."""
    seconds = transfer.nbytes / capacity[transfer.links]  # time each link alone would need
    finite = seconds > 0
    links, nbytes, seconds = transfer.links[finite], transfer.nbytes[finite], seconds[finite]
    if not links.size:
        return links, seconds, 0.0, transfer.efficiency
    streams = nbytes[links != host_link] if host_link is not None else nbytes
    size = float((streams if streams.size else nbytes).max())
    return links, seconds / size, size, transfer.efficiency * size / float(seconds.max())


def fair_rates(
    footprints: dict[int, tuple[np.ndarray, np.ndarray, float, float]], priority: dict[int, int], num_links: int
) -> dict[int, float]:
    """Progress rates (fraction of the transfer per second) by max-min fair sharing, in bytes per
    second, with rate caps (progressive filling).

    Every unfrozen transfer of a priority class gains the same bytes per second of its size until a
    link it crosses saturates (a transfer at rate ``r`` uses ``r * load`` of each of its links'
    capacity) or it reaches its highest rate; then it freezes. The result is the max-min fair
    allocation: every transfer is at its cap or crosses a saturated link on which no transfer of
    its class gets a higher rate.
    """
    residual = np.ones(num_links)  # share of each link's capacity not yet given out
    rate: dict[int, float] = {}
    for cls in sorted(set(priority.values())):
        unfrozen = [i for i in footprints if priority[i] == cls]
        for i in unfrozen:
            rate[i] = 0.0
        while unfrozen:
            idx = np.concatenate([footprints[i][0] for i in unfrozen])
            load = np.concatenate([footprints[i][1] for i in unfrozen])
            demand = np.bincount(idx, weights=load, minlength=num_links)
            used = demand > 0
            step = min(float(np.min(residual[used] / demand[used])), min(footprints[i][3] - rate[i] for i in unfrozen))
            for i in unfrozen:
                rate[i] += step
            residual[used] -= step * demand[used]
            saturated = residual <= 1e-9
            unfrozen = [
                i
                for i in unfrozen
                if rate[i] < footprints[i][3] * (1 - 1e-12) and not saturated[footprints[i][0]].any()
            ]
    return {i: rate[i] / footprints[i][2] for i in footprints}
