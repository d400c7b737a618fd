"""Ranks that outnumber a host's cores: what the scheduler's time slicing adds at each blocking wait.

On a CPU testbed with more ranks than cores (4 ranks on 2 cores), the kernel time-slices the ranks.
The compute model already gives each rank its share of the cores (moe_core.sim.kernels.host_share),
which is right on average, but a bulk-synchronous program also pays at every collective it blocks
on: the ranks that arrive first sleep while the last one, which the scheduler left behind, finishes
its slice alone. How much that is grows with the compute each rank did since its last wait, ``c``,
and levels off near one scheduler slice::

    wait(c) = host_wake_ms + host_slice_ms * (1 - exp(-c / host_slice_ms))

Calibration measures both terms on the host (moe_core.host.time_slicing, fitted by
moe_core.sim.calibrate.fit_time_slicing). On a 2-core VM (Linux 6.18) 4 processes meeting at a
barrier after 0.23, 0.92, 3.6 and 14 ms of compute each waited 0.54, 1.0, 2.4 and 4.3 ms beyond
their fair share of the cores; the same happens with a gloo all-to-all in place of the barrier.
A collective that runs beside compute (an overlapped gradient all-reduce) makes no rank sleep, so
only the collectives compute waits for pay it. GPUs and hosts with a core per rank pay nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace

from omegaconf import DictConfig

from moe_core.sim.engine import Op


def straggler_wait_s(compute_s: float, hw: DictConfig) -> float:
    """Seconds a blocking collective waits for the last rank after ``compute_s`` seconds of compute
    on a core of its own (``hw.host_wake_ms``, ``hw.host_slice_ms``); 0 without compute before it."""
    if compute_s <= 0 or hw.host_slice_ms <= 0:
        return 0.0
    slice_ms = hw.host_slice_ms
    return (hw.host_wake_ms + slice_ms * -math.expm1(-compute_s * 1e3 / slice_ms)) * 1e-3


def with_straggler_waits(ops: list[Op], hw: DictConfig, share: float) -> list[Op]:
    """``ops`` with each collective that compute waits for made later by :func:`straggler_wait_s` of
    the compute since the previous one (each op's time times ``share``, the rank's share of the
    cores: its compute on a core of its own). Unchanged when every rank has a core (``share`` 1)."""
    if share >= 1 or hw.host_slice_ms <= 0:
        return ops
    waited = {d for op in ops if op.transfer is None for d in op.deps if ops[d].transfer is not None}
    out, computed_s = [], 0.0
    for i, op in enumerate(ops):
        if op.is_compute:
            computed_s += op.duration_s * share
        elif i in waited:
            op = replace(op, latency_s=op.latency_s + straggler_wait_s(computed_s, hw))
            computed_s = 0.0
        out.append(op)
    return out
