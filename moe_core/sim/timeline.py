"""What a simulated training step's timeline says: the measured executor's metrics, read off it.

:class:`StepSimulation` holds a step's ops (moe_core.sim.step) and the timeline the engine gave them
(moe_core.sim.engine) and reads from them what the measured train_step records
(moe_core.records.step_metrics): the compute phases, the compute stream's waits for all-to-alls, gradient
syncs, parameter gathers and a 3D grid's collectives, and the MoE layers' spans. One reader for a
whole step and for each pipeline stage's (moe_core.sim.pipeline), so both report the same things.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from moe_core.parallel.grid import GRID_COLLECTIVES
from moe_core.records.step_metrics import STEP_PHASES, a2a_shares, step_terms
from moe_core.sim.engine import Op, Timeline


@dataclass
class StepSimulation:
    """A simulated step: its ops in program order, their timeline, and what the metrics need besides:
    where the backward pass ends (the gradient sync's exposed wait starts there) and the gradient
    sync's cost alone (how much contention and overlap change it)."""

    ops: list[Op]
    timeline: Timeline
    backward_end: int  # index of the last backward compute op
    allreduce_alone_s: float = 0.0  # the gradient sync's collectives each alone, one after another

    def metrics(self) -> dict[str, float]:
        """The measured executor's metrics (moe_core.records.step_metrics, as experiments/train_step.py
        records them), from the timeline, in ms; and
        ``moe_layer_fwd_ms`` / ``moe_layer_bwd_ms`` (``moe_layer_spans_ms``) and ``moe_compute_share``
        (gate + expert time over that wall time), which the measured executor does not record yet.

        Compute phases are their ops' summed times (one compute stream runs them one at a time).
        All-to-all time is what the measured executor times: the compute stream's wait for
        all-to-alls, i.e. the wall time in which one is in flight and no compute runs
        (``waiting_ms``). Without pipelining that is the all-to-alls' own time; with it, the expert
        micro-ops they overlap, and dispatch and combine micro-ops in flight together, are counted
        once, so shares stay shares. Dispatch and combine split it in proportion to their own waits.
        A sharded run's parameter all-gathers (``param_gather_exposed_ms``) count where the compute
        stream waits for them and no all-to-all already does: before a fully sharded block, or
        after a sharded optimizer's step; the step is dense, MoE, exposed gradient sync and these.
        """
        dur = (self.timeline.end_s - self.timeline.start_s) * 1e3
        by_phase = {p: float(sum(d for op, d in zip(self.ops, dur) if op.phase == p)) for p in ("gate", "expert")}
        a2a = self.waiting_ms(lambda op: op.phase.endswith("a2a"))
        own = {p: self.waiting_ms(lambda op, p=p: op.phase == p) for p in ("dispatch_a2a", "combine_a2a")}
        by_phase.update({p: a2a * w / sum(own.values()) if a2a else 0.0 for p, w in own.items()})
        step = self.timeline.makespan_s * 1e3
        optimizer = next(i for i, op in enumerate(self.ops) if op.phase == "optimizer")
        # the gradient all-reduces' wait: from the end of the backward pass to the optimizer's start
        exposed = float(self.timeline.start_s[optimizer] - self.timeline.end_s[self.backward_end]) * 1e3
        # the compute stream's wait for a sharded run's parameter all-gathers beyond its all-to-all wait
        gathers = self.waiting_ms(lambda op: op.phase.endswith("a2a") or op.phase == "param_all_gather") - a2a
        a2a_dir = {
            d: self.waiting_ms(lambda op, d=d: op.phase.endswith("a2a") and op.name.endswith(d))
            for d in (".fwd", ".bwd")
        }
        span = self.moe_layer_spans_ms()
        moe_wall = span["fwd"] + span["bwd"]
        # the compute stream's busy share of the MoE layers' wall time (Lina Fig 11-12's GPU utilisation)
        compute_share = (by_phase["gate"] + by_phase["expert"]) / moe_wall if moe_wall else 0.0
        # all-to-all time in flight, hidden behind compute or not: its pipelining efficiency is the share
        # of it compute overlaps (Lina's and MoNTA's measure of a pipelined exchange; 0 when blocking)
        a2a_in_flight = self.in_flight_ms(lambda op: op.phase.endswith("a2a"))
        terms = step_terms(step, by_phase, a2a, a2a_dir[".fwd"], a2a_dir[".bwd"], exposed, gathers)
        return {
            **terms,
            "a2a_in_flight_ms": a2a_in_flight,
            "a2a_pipelining_efficiency": 1 - a2a / a2a_in_flight if a2a_in_flight else 0.0,
            # every collective (all-to-alls, gradient and tensor-parallel all-reduces, a grid's) that the
            # compute stream waits for, and its share of the step
            "exposed_comm_ms": self.waiting_ms(lambda op: op.transfer is not None),
            "exposed_comm_share": self.waiting_ms(lambda op: op.transfer is not None) / step if step else 0.0,
            **self.grid_metrics(),
            "moe_layer_fwd_ms": span["fwd"],
            "moe_layer_bwd_ms": span["bwd"],
            "moe_compute_share": compute_share,
            "param_gather_exposed_ms": gathers,
            "optimizer_ms": float(dur[optimizer]),  # one Adam step (in dense_ms)
            # cutting pipelined all-to-alls into micro-ops and joining them (in dense_ms)
            "partition_ms": float(sum(d for op, d in zip(self.ops, dur) if op.phase == "partition")),
            # what the gradient sync's units cost to transmit, without contention or overlap
            "allreduce_alone_ms": self.allreduce_alone_s * 1e3,
            **a2a_shares(a2a, terms["moe_layer_ms"], step),
        }

    def waiting_ms(self, selected: Callable[[Op], bool]) -> float:
        """Wall time (ms) in which a ``selected`` op is in flight and no compute op runs."""
        waiting = self._spans(selected)
        return 1e3 * (sum(b - a for a, b in waiting) - _overlap_s(waiting, self._compute_spans))

    @functools.cached_property
    def _compute_spans(self) -> list[tuple[float, float]]:
        """The compute stream's busy spans; every wait reads them (a step's metrics, dozens of times)."""
        return self._spans(lambda op: op.is_compute)

    def in_flight_ms(self, selected: Callable[[Op], bool]) -> float:
        """Wall time (ms) in which a ``selected`` op is in flight, hidden behind compute or not."""
        return 1e3 * sum(b - a for a, b in self._spans(selected))

    def _spans(self, keep: Callable[[Op], bool]) -> list[tuple[float, float]]:
        """The union of the ``keep`` ops' [start, end) intervals, as disjoint sorted spans."""
        spans = sorted(
            (a, b) for op, a, b in zip(self.ops, self.timeline.start_s, self.timeline.end_s) if keep(op) and b > a
        )
        merged: list[tuple[float, float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def grid_metrics(self) -> dict[str, float]:
        """A 3D grid's collectives (moe_core.sim.grid_ops), by kind: the time the compute stream
        waits for them (``grid_<kind>_ms``, what the measured run times) and their time in flight
        (``grid_<kind>_busy_ms``); the difference is what the plan's overlaps hide."""
        metrics = {"grid_comm_ms": self.waiting_ms(lambda op: op.phase.startswith("grid_"))}
        for kind in GRID_COLLECTIVES:
            metrics[f"grid_{kind}_ms"] = self.waiting_ms(lambda op, k=kind: op.phase == f"grid_{k}")
            metrics[f"grid_{kind}_busy_ms"] = self.in_flight_ms(lambda op, k=kind: op.phase == f"grid_{k}")
        return metrics

    def moe_layer_spans_ms(self) -> dict[str, float]:
        """Wall time of the MoE layers per pass (``fwd``, ``bwd``), summed over layers: per layer and
        pass, from the start of its first MoE op (gate or all-to-all) to the end of its last (Lina
        Figs 11-12). Unlike ``moe_layer_ms`` (the sum of the phases' op times) it counts experts
        pipelined behind an all-to-all once, and it holds the copy between the gate and the
        exchanges, so it is the time the layer holds up the step."""
        spans: dict[tuple[str, str], tuple[float, float]] = {}
        for op, start, end in zip(self.ops, self.timeline.start_s, self.timeline.end_s):
            if op.phase in STEP_PHASES:
                key = (op.name.split(".", 1)[0], op.name.rsplit(".", 1)[1])  # ("L3", "fwd")
                lo, hi = spans.get(key, (start, end))
                spans[key] = (min(lo, start), max(hi, end))
        return {p: 1e3 * float(sum(hi - lo for (_, q), (lo, hi) in spans.items() if q == p)) for p in ("fwd", "bwd")}

    def durations_ms(self, suffix: str, phase_suffix: str = "a2a") -> np.ndarray:
        """Durations of the ops whose phase ends with ``phase_suffix`` and name with ``suffix``."""
        keep = self._matching(suffix, phase_suffix)
        return (self.timeline.end_s[keep] - self.timeline.start_s[keep]) * 1e3

    def overlapping(self, suffix: str, other_phase: str, phase_suffix: str = "a2a") -> np.ndarray:
        """For the ops of :meth:`durations_ms`, in its order: whether an op of ``other_phase`` is in
        flight at some moment of theirs: which all-to-alls a gradient all-reduce slows, say."""
        start, end = self.timeline.start_s, self.timeline.end_s
        others = [i for i, op in enumerate(self.ops) if op.phase == other_phase and end[i] > start[i]]
        overlapped = [
            any(start[j] < end[i] and start[i] < end[j] for j in others) for i in self._matching(suffix, phase_suffix)
        ]
        return np.array(overlapped, dtype=bool)

    def _matching(self, suffix: str, phase_suffix: str) -> list[int]:
        """The indices of the ops whose phase ends with ``phase_suffix`` and name with ``suffix``."""
        return [i for i, op in enumerate(self.ops) if op.phase.endswith(phase_suffix) and op.name.endswith(suffix)]


def _overlap_s(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    """The length of the intersection of two lists of disjoint sorted spans, in one merge pass
    (linear in the spans, not their product: a step of thousands of ops has thousands of spans)."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        (a, b), (c, d) = first[i], second[j]
        total += max(0.0, min(b, d) - max(a, c))
        if b < d:
            i += 1
        else:
            j += 1
    return total
