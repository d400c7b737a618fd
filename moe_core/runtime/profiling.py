"""Kernel-level profile of measured training steps: how many ops and kernels a step issues, how long
the host takes to issue them and how long the device is busy.

The simulator prices a step on a GPU as kernels issued by a host thread (``kernel_launch_us`` each)
and run by the device (moe_core.sim.compute); whether a measured step is bound by the host or by the
device is the question its phase timers cannot answer. ``torch.profiler`` can: a step's CUDA kernels
(and copies, fills) with their device times, and the top-level operators the host dispatched.

Profiled steps run after the timed ones and never enter a record's samples (the profiler slows the
host), so a record is the same with or without a profile. The summary counts only the timed part of
a step (the ``TIMED_STEP`` range the training loop opens around it): the next batch's synthetic data
is made on the host between steps and would otherwise add its thousand small ops to every step.
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from moe_core.records.results import atomic_output

PROFILER_WARMUP_STEPS = 1  # the profiler's own warm-up step, traced and dropped (kineto's first-step cost)
TIMED_STEP = "timed_step"  # the record_function range around the timed part of a training step


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


def is_device_work(event) -> bool:
    """A kernel, copy or fill on the GPU; not a range the profiler mirrors onto the device's timeline
    (``record_function`` ranges, ``ProfilerStep#``, the optimizer's step), which span whole steps."""
    return event.device_type == DeviceType.CUDA and not event.is_user_annotation


def timed_windows(events) -> list[tuple[float, float]]:
    """The ``(start_us, end_us)`` of each ``TIMED_STEP`` range on the host, in order (on a GPU the
    profiler also marks the range on the device's timeline)."""
    ranges = [e for e in events if e.name == TIMED_STEP and e.device_type == DeviceType.CPU]
    return sorted((e.time_range.start, e.time_range.end) for e in ranges)


def summarise_profile(prof, steps: int, step_wall_ms: list[float]) -> dict:
    """Per-step numbers of a finished profile of ``steps`` steps: device kernels and their busy time,
    top-level host operators, and the host's time per operator (the wall time of a host-bound step
    divided by its operators: the eager stack's cost of one op, which ``kernel_launch_us`` models).

    Host operators count inside the ``TIMED_STEP`` ranges. A step's device work runs behind its host,
    so its kernels are those that start between its range's start and the next range's (this adds
    the loss's all-reduce and the next batch's two copies, a handful, to each step)."""
    events = prof.events()
    windows = timed_windows(events)
    if len(windows) != steps:
        raise ValueError(f"the profile holds {len(windows)} '{TIMED_STEP}' ranges for {steps} profiled steps")

    def in_a_window(t: float) -> bool:
        return any(start <= t <= end for start, end in windows)

    kernels = [e for e in events if is_device_work(e) and e.time_range.start >= windows[0][0]]
    cpu_ops = [e for e in events if e.device_type == DeviceType.CPU and in_a_window(e.time_range.start)]
    host_ops = [e for e in cpu_ops if is_outermost_aten_op(e)]
    wall = sorted(step_wall_ms)[len(step_wall_ms) // 2] if step_wall_ms else float("nan")
    per_step = {
        "kernels": len(kernels) / steps,
        "device_busy_ms": busy_ms([(e.time_range.start, e.time_range.end) for e in kernels]) / steps,
        "host_ops": len(host_ops) / steps,
        "host_window_ms": sum(end - start for start, end in windows) / steps / 1e3,
        "step_wall_ms": wall,
    }
    per_step["device_busy_share"] = per_step["device_busy_ms"] / wall if kernels else 0.0
    per_step["wall_us_per_host_op"] = 1e3 * wall / per_step["host_ops"] if host_ops else float("nan")
    per_step["wall_us_per_kernel"] = 1e3 * wall / per_step["kernels"] if kernels else float("nan")
    return {
        "steps": steps,
        "per_step": per_step,
        "top_host_ops": heaviest([e for e in cpu_ops if e.name != TIMED_STEP], steps, lambda e: e.self_cpu_time_total),
        "top_kernels": heaviest(kernels, steps, lambda e: e.time_range.end - e.time_range.start),
    }


def heaviest(events, steps: int, cost_us, keep: int = 25) -> list[dict]:
    """The ``keep`` names of ``events`` that cost most in total: calls and microseconds per step."""
    calls, total = Counter(), Counter()
    for e in events:
        calls[e.name] += 1
        total[e.name] += cost_us(e)
    return [
        {"name": name, "calls_per_step": calls[name] / steps, "us_per_step": us / steps}
        for name, us in total.most_common(keep)
    ]


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
