"""A simulated timeline as a Chrome trace: the Trace Event Format JSON that ``torch.profiler``'s
``export_chrome_trace`` writes and https://ui.perfetto.dev (or chrome://tracing) opens.

Every op of a simulated DAG (moe_core.sim.engine) that takes time becomes one complete event
(``"ph": "X"``) from its start to its end, named by the op, its phase as category and argument, and
for a collective its latency and bytes. Ops are SPMD: one op stands for every rank of the group
that runs the timeline (a collective over all its groups at once, a compute op on each rank), and
the simulator models no per-rank differences, so a trace has one process per timeline, named by its
ranks, not a track per rank; the metadata (``otherData``) says so. A training step is one process
(:func:`step_trace`); a pipelined step, whose stages are simulated one by one and composed by the
1F1B schedule's closed form, has a process per stage (:func:`pipeline_trace`); a forward pass or a
served model's MoE layers (moe_core.sim.forward) are one process of the devices they run on.

A process's tracks (its threads): the compute stream, the host thread that issues a GPU's kernels
(moe_core.sim.engine.issued_by_host), and one track per kind of communication, by the op's phase
(:data:`COMM_TRACKS`). Viewers draw a track's events only when they nest (Perfetto's JSON importer
does not support partial overlaps), and collectives of one kind often run together (gradient
buckets on their own communicators, Lina's micro-ops, an ordered exchange's transfers), so a track
takes as many lanes (``all-to-all``, ``all-to-all #2``, ...) as it has ops in flight at once.

Times are whole nanoseconds, written as microseconds (``ts``, ``dur``) with three decimals, so ops
that follow each other stay back to back through a viewer's rounding; an op shorter than half a
nanosecond (a marker, a host sync, an all-to-all within one rank) has no event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moe_core.records.results import ResultsDirError, atomic_output
from moe_core.sim.engine import Op, Timeline
from moe_core.sim.pipeline import PipelineModel
from moe_core.sim.timeline import StepSimulation

COMPUTE, HOST = "compute", "host: kernel issue"
# A collective's phase -> the track of its kind; a phase not listed has a track of its own name.
COMM_TRACKS = {
    "dispatch_a2a": "all-to-all",
    "combine_a2a": "all-to-all",
    "allreduce": "gradient all-reduce",
    "reduce_scatter": "gradient reduce-scatter",
    "param_all_gather": "parameter all-gather",
    "tp_allreduce": "tensor-parallel all-reduce",
    "grid_all_gather": "grid all-gather",
    "grid_all_reduce": "grid all-reduce",
    "grid_reduce_scatter": "grid reduce-scatter",
    "p2p": "point-to-point",
}
SPMD_NOTE = (
    "Simulated (moe_core.sim). Each event is one SPMD operation that every rank of its process runs "
    "together: a collective over all its groups at once, a compute op on each rank. The simulator models "
    "no per-rank differences, so no rank has a track of its own. Times in microseconds."
)


@dataclass(frozen=True)
class TracedTimeline:
    """One process of a trace: the ranks a timeline stands for (``name``) and its ops, in time."""

    name: str
    ops: list[Op]
    timeline: Timeline
    label: str = ""  # shown beside the name: what the timeline covers


def track_of(op: Op) -> str:
    """The track ``op`` is drawn on: the host's issue stream, the compute stream, or its collective's kind."""
    if op.on_host:
        return HOST
    if op.transfer is None:
        return COMPUTE
    return COMM_TRACKS.get(op.phase, op.phase)


def lanes(spans_ns: list[tuple[int, int]]) -> list[int]:
    """A lane for each ``(start, end)`` span such that no two spans of a lane overlap (one may start
    where the other ends): each span, in order of start, takes the first lane free by then, which
    needs as many lanes as spans are in flight at once."""
    lane_of, lane_end = [0] * len(spans_ns), []
    for i in sorted(range(len(spans_ns)), key=lambda i: spans_ns[i]):
        start, end = spans_ns[i]
        free = next((k for k, busy_until in enumerate(lane_end) if busy_until <= start), len(lane_end))
        if free == len(lane_end):
            lane_end.append(end)
        lane_of[i], lane_end[free] = free, end
    return lane_of


def op_args(op: Op, index: int) -> dict:
    """An event's arguments: the op's phase, its index in program order and those of the ops it waits
    for, and for a collective its latency (before its bytes move), the bytes on its busiest link (all
    its groups together) and the most bytes one rank sends where the exchange states it."""
    args = {"phase": op.phase, "op": index, "deps": list(op.deps)}
    if op.transfer is not None:
        args["latency_us"] = op.latency_s * 1e6
        args["busiest_link_bytes"] = float(op.transfer.nbytes.max()) if op.transfer.nbytes.size else 0.0
        if op.transfer.sent_bytes > 0:
            args["sent_bytes_per_rank"] = op.transfer.sent_bytes
        args["priority"] = op.priority
    return args


def process_events(pid: int, process: TracedTimeline) -> list[dict]:
    """The metadata and complete events of one process: its name and label, its tracks named (the
    compute stream first, then the host's, then the collectives' in the order they first appear in
    the program), and an event for each op of at least a nanosecond."""
    start_ns = np.rint(process.timeline.start_s * 1e9).astype(np.int64)
    end_ns = np.rint(process.timeline.end_s * 1e9).astype(np.int64)
    timed = [i for i in range(len(process.ops)) if end_ns[i] > start_ns[i]]
    by_track: dict[str, list[int]] = {COMPUTE: [], HOST: []}
    for i in timed:
        by_track.setdefault(track_of(process.ops[i]), []).append(i)
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process.name}},
        {"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": process.label}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
    ]
    tid = 0
    for track, ops in by_track.items():
        lane_of = lanes([(int(start_ns[i]), int(end_ns[i])) for i in ops])
        first_tid = tid + 1
        for lane in range(max(lane_of, default=-1) + 1):
            tid += 1
            name = track if lane == 0 else f"{track} #{lane + 1}"
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for i, lane in zip(ops, lane_of):
            op = process.ops[i]
            events.append(
                {
                    "ph": "X",
                    "name": op.name,
                    "cat": op.phase,
                    "pid": pid,
                    "tid": first_tid + lane,
                    "ts": int(start_ns[i]) / 1e3,
                    "dur": int(end_ns[i] - start_ns[i]) / 1e3,
                    "args": op_args(op, i),
                }
            )
    return events


def chrome_trace(processes: list[TracedTimeline], about: dict) -> dict:
    """The trace of ``processes`` (one each, in order), with ``about`` (what was simulated: the point,
    the hardware, the step time) and the SPMD note in its metadata."""
    events = [event for pid, process in enumerate(processes, start=1) for event in process_events(pid, process)]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"spmd": SPMD_NOTE, **about}}


def step_trace(sim: StepSimulation, world_size: int, about: dict) -> dict:
    """A simulated training step's trace: one process for its ``world_size`` ranks; the step time
    (``step_ms``, the timeline's makespan) in the metadata."""
    ranks = TracedTimeline(f"ranks 0-{world_size - 1}", sim.ops, sim.timeline, "one training step")
    return chrome_trace([ranks], {**about, "step_ms": sim.timeline.makespan_s * 1e3})


def pipeline_trace(model: PipelineModel, about: dict) -> dict:
    """A pipelined step's trace: a process per stage, each its stage's simulated forward and backward
    of one micro-batch, then its gradient sync and optimizer step. The step itself is composed from
    these by the 1F1B schedule's closed form (moe_core.sim.pipeline), which has no timeline, so its
    time (``step_ms`` in the metadata) is not a span of the trace."""
    label = "one micro-batch's forward and backward, then the gradient sync and the optimizer step"
    stages = [
        TracedTimeline(f"stage {stage.index}: ranks {stage.ranks[0]}-{stage.ranks[-1]}", sim.ops, sim.timeline, label)
        for stage, sim in zip(model.stages, model.stage_simulations())
    ]
    return chrome_trace(stages, {**about, "step_ms": model.metrics()["step_ms"]})


def write_trace(trace: dict, path: str | Path) -> Path:
    """Write ``trace`` as strict JSON, atomically (the old file or the whole new one, never part); a
    failed write raises ResultsDirError naming the file."""
    text = json.dumps(trace, allow_nan=False)
    try:
        with atomic_output(path) as tmp:
            tmp.write_text(text)
    except OSError as err:
        raise ResultsDirError(
            f"trace '{path}' cannot be written ({err.strerror or err}); give a writable file path"
        ) from err
    return Path(path)
