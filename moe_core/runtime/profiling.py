"""Kernel-level profile of measured training steps: how many ops and kernels a step issues, how long
the host takes to issue them and how long the device is busy.

The simulator prices a step on a GPU as kernels issued by a host thread (``kernel_launch_us`` each)
and run by the device (moe_core.sim.compute); whether a measured step is bound by the host or by the
device is the question its phase timers cannot answer. ``torch.profiler`` can: a step's CUDA kernels
(and copies, fills) with their device times, and the top-level operators the host dispatched.

Profiled steps run after the timed ones and never enter a record's samples (the profiler slows the
host), so a record is the same with or without a profile.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from moe_core.records.results import atomic_output

PROFILER_WARMUP_STEPS = 1  # the profiler's own warm-up step, traced and dropped (kineto's first-step cost)


def step_profiler(out_dir: str | None, skip_steps: int, steps: int, cuda: bool):
    """A ``torch.profiler.profile`` that records ``steps`` steps after ``skip_steps`` unprofiled ones and
    a warm-up step (call ``.step()`` once per training step), or a no-op context without ``out_dir``."""
    if not out_dir:
        return nullcontext()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    return profile(
        activities=activities,
        schedule=schedule(wait=skip_steps, warmup=PROFILER_WARMUP_STEPS, active=steps, repeat=1),
        record_shapes=False,
    )


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start_us, end_us)`` intervals, in ms (overlapping kernels count once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e3


def is_outermost_aten_op(event) -> bool:
    """An ``aten::`` operator no other ``aten::`` operator called: one op the eager stack dispatched
    (the ops it calls inside, e.g. ``aten::linear`` -> ``aten::addmm``, are its own work)."""
    if not event.name.startswith("aten::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def summarise_profile(prof, steps: int, step_wall_ms: list[float]) -> dict:
    """Per-step numbers of a finished profile of ``steps`` steps: device kernels and their busy time,
    top-level host operators, and the host's time per operator (the wall time of a host-bound step
    divided by its operators: the eager stack's cost of one op, which ``kernel_launch_us`` models)."""
    events = prof.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    host_ops = [e for e in events if e.device_type == DeviceType.CPU and is_outermost_aten_op(e)]
    wall = sorted(step_wall_ms)[len(step_wall_ms) // 2] if step_wall_ms else float("nan")
    per_step = {
        "kernels": len(kernels) / steps,
        "device_busy_ms": busy_ms([(e.time_range.start, e.time_range.end) for e in kernels]) / steps,
        "host_ops": len(host_ops) / steps,
        "step_wall_ms": wall,
    }
    per_step["device_busy_share"] = per_step["device_busy_ms"] / wall if kernels else 0.0
    per_step["wall_us_per_host_op"] = 1e3 * wall / per_step["host_ops"] if host_ops else float("nan")
    per_step["wall_us_per_kernel"] = 1e3 * wall / per_step["kernels"] if kernels else float("nan")
    top = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:25]
    return {
        "steps": steps,
        "per_step": per_step,
        "top_host_ops": [
            {"name": a.key, "calls_per_step": a.count / steps, "self_cpu_us_per_step": a.self_cpu_time_total / steps}
            for a in top
        ],
    }


def write_profile(prof, out_dir: str, rank: int, steps: int, step_wall_ms: list[float]) -> dict:
    """Write this rank's Chrome/Perfetto trace and its summary under ``out_dir``; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise_profile(prof, steps, step_wall_ms)
    with atomic_output(out / f"trace_rank{rank}.json") as tmp:
        prof.export_chrome_trace(str(tmp))
    with atomic_output(out / f"profile_rank{rank}.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
    return summary
