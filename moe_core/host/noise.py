"""How noisy the host was while a measured record was taken, and one rule deciding "noisy".

Every measured record carries (moe_core.records.results.make_record)::

    "noise": {"load_avg": [l1, l5, l15], "cpus": 2, "contention": 0.03, "cv": {"step_ms": 0.05, ...}}

* ``load_avg``: ``os.getloadavg()`` when the timed work ended. It counts this job's own ranks (4
  ranks on 2 cores make a load of about 4 by themselves), so alone it cannot tell noise.
* ``contention``: the share of the host's CPU time during the timed window used by processes other
  than this job: host busy time (``/proc/stat``) minus the CPU time of this job's processes (the
  torchrun agent, or experiments.launch above it, and everything under it), over wall time x cores.
  ``None`` where it cannot be read (no ``/proc``, or no window was timed).
* ``cv``: the coefficient of variation (std / mean) of each per-iteration metric's samples.

The window is opened on rank 0 by the first ``PhaseTimer.reset()`` after the previous window
closed (the first warm-up iteration of a point) and closed by ``gather_worst_rank`` (the end of
the timed iterations); see moe_core.host.timing. Two reads per window, no polling; a window shorter
than :data:`MIN_WINDOW_S` is widened back over the job's earlier points (:class:`NoiseWindow`).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import psutil

# What others may use of the host before a measurement counts as noisy. One CPU-bound process
# takes a whole core, 1 / cores of the host (0.5 on 2 cores), and slows every rank sharing that core;
# on a 2-core host a quiet window read 0.00 (step 25 ms) and windows under other jobs 0.36-0.67
# (steps 33-84 ms). 0.15 lies far above the quiet level and below one foreign busy core on hosts of
# up to 6 cores.
NOISY_CONTENTION = 0.15
# Without a contention reading: the coefficient of variation of the record's per-iteration time
# (the first of ITERATION_METRICS it has). A 2-core host's only quiet window measured (contention
# 0.00) gave step times a CV of 0.14; windows where others used 36-67% of the host gave 0.19-0.40
# (median 0.23), though one such window gave 0.12: the spread is a weak sign, hence only the fallback.
NOISY_CV = 0.2
ITERATION_METRICS = ("step_ms", "time_ms", "exchange_ms", "forward_ms", "a2a_ms")
# A set of records (a calibration, a validation) counts as noisy when more than this share of its
# records is: fits and medians tolerate a few outliers, not a noisy majority.
NOISY_SHARE = 0.2

# The shortest window contention is read over: tick counting (10 ms) errs by a few ticks per CPU
# and process, a few percent of 1 s on 2 cores.
MIN_WINDOW_S = 1.0

# Commands whose process tree is this job: the ranks' torchrun agent and the launcher above it.
JOB_LAUNCHERS = ("torch.distributed.run", "torchrun", "experiments.launch")


@dataclass(frozen=True)
class HostSample:
    """One reading: wall clock, the host's busy CPU seconds, this job's CPU seconds."""

    wall_s: float
    host_busy_s: float
    job_cpu_s: float


def _job_root(me: psutil.Process) -> psutil.Process:
    """The outermost process of this job: up through the torchrun agent and experiments.launch."""
    root = me
    for parent in me.parents()[:2]:
        if not any(name in " ".join(parent.cmdline()) for name in JOB_LAUNCHERS):
            break
        root = parent
    return root


def _tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and every process under it, including their reaped children."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between listing and reading: its time moved to its parent's children_*
        total += t.user + t.system + t.children_user + t.children_system
    return total


def sample_host() -> HostSample | None:
    """A reading of the host and this job, or None where /proc (or the job's processes) cannot be read."""
    try:
        host = psutil.cpu_times()
        busy = host.user + host.nice + host.system + getattr(host, "irq", 0.0) + getattr(host, "softirq", 0.0)
        busy += getattr(host, "steal", 0.0)  # another VM on our cores is noise too
        return HostSample(time.monotonic(), busy, _tree_cpu_s(_job_root(psutil.Process())))
    except (OSError, psutil.Error, AttributeError):
        return None


def contention(start: HostSample | None, end: HostSample | None, cpus: int) -> float | None:
    """Share of the host's CPU capacity between two readings used by processes other than this job."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    others_s = (end.host_busy_s - start.host_busy_s) - (end.job_cpu_s - start.job_cpu_s)
    return float(min(1.0, max(0.0, others_s / ((end.wall_s - start.wall_s) * cpus))))


def coefficients_of_variation(samples: dict[str, list[float]]) -> dict[str, float]:
    """std / |mean| of each metric's samples; metrics whose mean is 0 (undefined ratio) are left out,
    unless every sample is 0 (no variation: 0)."""
    out = {}
    for name, values in samples.items():
        x = np.asarray(values, dtype=float)
        if x.size == 0:
            continue
        mean, std = abs(float(x.mean())), float(x.std())
        if mean > 0:
            out[name] = std / mean
        elif std == 0:
            out[name] = 0.0
    return out


class NoiseWindow:
    """The current timed window of this process: opened once, closed (possibly again) at its end.

    /proc/stat and process CPU times count in scheduler ticks (10 ms), too coarse for a window of a
    few milliseconds (a small collective's point), so a window shorter than :data:`MIN_WINDOW_S` is
    widened back to the latest earlier reading that makes it long enough (earlier points of the
    same job; the first reading is taken when this module is imported)."""

    def __init__(self) -> None:
        first = sample_host()
        self.readings: list[HostSample] = [first] if first else []  # every open's, oldest first
        self.end: HostSample | None = None
        self.load_avg: tuple[float, float, float] | None = None
        self.is_open = False

    def open(self) -> None:
        """Start a window unless one is open (later calls within it cost nothing)."""
        if not self.is_open:
            reading = sample_host()
            self.readings += [reading] if reading else []
            self.end, self.load_avg, self.is_open = None, None, True

    def close(self) -> None:
        """End the window now; a second close before the next open moves the end (several gathers)."""
        if self.is_open or self.load_avg is not None:
            self.end, self.load_avg, self.is_open = sample_host(), os.getloadavg(), False

    def start(self) -> HostSample | None:
        """The reading the last closed window is measured from: the latest at least
        :data:`MIN_WINDOW_S` before its end, else the earliest."""
        if self.end is None or not self.readings:
            return None
        long_enough = [r for r in self.readings if self.end.wall_s - r.wall_s >= MIN_WINDOW_S]
        return long_enough[-1] if long_enough else self.readings[0]

    def noise(self, samples: dict[str, list[float]]) -> dict:
        """The record's ``noise`` block for ``samples`` taken in the last closed window."""
        cpus = os.cpu_count() or 1
        load = self.load_avg if self.load_avg is not None else os.getloadavg()
        return {
            "load_avg": [float(v) for v in load],
            "cpus": cpus,
            "contention": None if self.is_open else contention(self.start(), self.end, cpus),
            "cv": coefficients_of_variation(samples),
        }


WINDOW = NoiseWindow()  # this process's; moe_core.host.timing opens and closes it on rank 0


def is_noisy(noise: dict | None) -> bool:
    """The one rule: a record was taken on a noisy host when others used more than
    :data:`NOISY_CONTENTION` of its CPU; without a contention reading, when the coefficient of
    variation of its per-iteration time (:data:`ITERATION_METRICS`) exceeds :data:`NOISY_CV`. A
    record without a noise block (simulated, or written before records carried one) is not known
    to be noisy."""
    if not noise:
        return False
    if noise.get("contention") is not None:
        return noise["contention"] > NOISY_CONTENTION
    cv = noise.get("cv", {})
    time_cv = next((cv[name] for name in ITERATION_METRICS if name in cv), None)
    return time_cv is not None and time_cv > NOISY_CV


def noise_summary(records: list[dict]) -> dict[str, float]:
    """How many of the measured ``records`` were noisy, and the median and worst contention of those."""
    measured = [r for r in records if r.get("mode") == "measured"]
    noisy = [r for r in measured if is_noisy(r.get("noise"))]
    summary = {"records": len(measured), "noisy_records": len(noisy), "noisy_share": len(noisy) / max(1, len(measured))}
    readings = [r["noise"]["contention"] for r in noisy if r["noise"].get("contention") is not None]
    if readings:
        summary |= {"noisy_contention_median": statistics.median(readings), "noisy_contention_max": max(readings)}
    return summary


def summary_is_noisy(summary: dict[str, float]) -> bool:
    """A set of records is noisy when more than :data:`NOISY_SHARE` of it is."""
    return summary.get("noisy_share", 0.0) > NOISY_SHARE


def noise_warning(summary: dict[str, float], what: str) -> str | None:
    """A warning line naming how many of ``what`` were noisy and by how much, or None if none was."""
    if not summary.get("noisy_records"):
        return None
    how = (
        f"others used {summary['noisy_contention_median']:.0%} of the host's CPU (median; worst "
        f"{summary['noisy_contention_max']:.0%})"
        if "noisy_contention_median" in summary
        else f"their per-iteration times varied by more than {NOISY_CV:.0%} (coefficient of variation)"
    )
    return (
        f"warning: {summary['noisy_records']:g} of {summary['records']:g} {what} were measured on a noisy host: "
        f"{how}; rerun them on a quiet host for trustworthy numbers"
    )
