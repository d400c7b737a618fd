"""Measure what a host's scheduler adds when ranks outnumber its cores (moe_core.sim.time_slicing).

Twice as many processes as cores each compute for ``c`` (a fixed loop that takes ``c`` on a core of
its own, timed first in this process) and then meet at a barrier, again and again. A perfectly
shared host would take ``ranks / cores * c`` per iteration; what the slowest process takes beyond
that is the wait. One row per compute length, ``COMPUTE_MS`` apart by factors of four, from well
below a scheduler slice to well above it. Pure Python work and a multiprocessing barrier: the wait
is the scheduler's, whatever the ranks compute and however they meet (a gloo all-to-all in place of
the barrier waits as long). About two seconds on a 2-core host.

What it reads drifts with the host, more than the held-out steps do (2026-12-07, the 2-core VM): the
wait at 16 ms of compute read 2.6, 8.5, 10.2, 18.0 and 19.1 ms minutes apart, and the median of five
rounds did not settle it (1.2-14.4 ms); the 4-rank training steps of two runs were predicted within
3.6% and 6.9% (median) with a wake of 0.15 ms and a slice of 1-1.5 ms, against 9% and 30% at the
readings their calibrations took. Ranks that sleep in a collective leave their core to the others, which
ranks spinning to a barrier do not; the model's fixed half core per rank does not either.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time

COMPUTE_MS = (0.25, 1.0, 4.0, 16.0)  # each rank's compute between barriers, on a core of its own
TIMED_S = 0.4  # timed seconds per compute length
WARMUP = 3  # untimed iterations first
TIMEOUT_S = 60.0  # for one compute length's processes to report
ALONE_REPEATS = 5  # a compute length alone is the fastest of these timings: one preempted run is not its time


def _spin(n: int) -> int:
    """``n`` steps of pure Python arithmetic: compute that holds one core and nothing else."""
    total = 0
    for i in range(n):
        total += i
    return total


def _spin_ms(n: int) -> float:
    """Milliseconds one ``_spin(n)`` takes."""
    start = time.perf_counter()
    _spin(n)
    return (time.perf_counter() - start) * 1e3


def _spins_per_ms() -> float:
    """How many :func:`_spin` steps this process makes per millisecond (the fastest of ALONE_REPEATS)."""
    n = 200_000
    return n / min(_spin_ms(n) for _ in range(ALONE_REPEATS))


def _rank(n: int, iterations: int, barrier, results) -> None:
    """One process: :func:`_spin` ``n`` then the barrier, ``iterations`` times timed; reports ms each."""
    for _ in range(WARMUP):
        _spin(n)
        barrier.wait()
    start = time.perf_counter()
    for _ in range(iterations):
        _spin(n)
        barrier.wait()
    results.put((time.perf_counter() - start) / iterations * 1e3)


def _slowest_ms(ranks: int, n: int, iterations: int) -> float:
    """The slowest of ``ranks`` processes' ms per iteration of :func:`_rank`."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(n, iterations, barrier, results), daemon=True) for _ in range(ranks)]
    for p in procs:
        p.start()
    try:
        return max(results.get(timeout=TIMEOUT_S) for _ in procs)
    except queue.Empty:
        raise RuntimeError(f"time-slicing measurement: {ranks} processes did not finish in {TIMEOUT_S:g} s") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def measure(cores: int, compute_ms: tuple[float, ...] = COMPUTE_MS) -> list[dict[str, float]]:
    """Rows of ``compute_ms`` (each rank's compute between barriers, timed alone) and ``wait_ms``
    (the slowest of ``2 * cores`` ranks' ms per iteration beyond ``2 * compute_ms``)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    ranks, per_ms = 2 * cores, _spins_per_ms()
    rows = []
    for target in compute_ms:
        n = max(1, round(target * per_ms))
        alone_ms = min(_spin_ms(n) for _ in range(ALONE_REPEATS))
        iterations = max(10, round(TIMED_S * 1e3 / (2 * alone_ms)))
        rows.append({"compute_ms": alone_ms, "wait_ms": _slowest_ms(ranks, n, iterations) - 2 * alone_ms})
    return rows
