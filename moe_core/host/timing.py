"""Phase timing of training steps and collectives, measured the way the field does.

* CPU: ``time.perf_counter``; GPU: CUDA events (read after one synchronize per step, never inside
  the step, so timing adds no host-device sync to the hot path).
* Forward phases are timed with :meth:`PhaseTimer.region`. Backward phases run inside autograd, so
  a segment is bracketed with two identity functions (:meth:`PhaseTimer.mark_backward`): autograd
  calls the backward of the segment's *output* mark first and of its *input* mark last, and the
  time between the two is the segment's backward time.
* Per iteration, every rank's phase times are gathered and the **worst rank** is kept
  (:func:`worst_rank`); records then report median and p95 over iterations.
* Host noise (moe_core.host.noise): on rank 0 the first :meth:`PhaseTimer.reset` after a gather opens a
  noise window (one reading of the host's and this job's CPU time, in the first warm-up iteration,
  outside any timed span) and :func:`gather_worst_rank` closes it, so each point's record can say
  how much of the host others used while it was timed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from moe_core.host.noise import WINDOW


class PhaseTimer:
    """Accumulates time per named phase (``"expert.fwd"``, ``"dispatch_a2a.bwd"``...) for one step."""

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True):
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self._intervals: dict[str, list[tuple]] = defaultdict(list)
        self._open: dict[str, object] = {}
        self.counters: dict[str, float] = defaultdict(float)  # e.g. bytes moved per phase

    def count(self, name: str, value: float) -> None:
        if self.enabled:
            self.counters[name] += value

    def stamp(self):
        """A point in time: a float on CPU, a recorded CUDA event on GPU."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, name: str, start, end) -> None:
        if self.enabled:
            self._intervals[name].append((start, end))

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Time the enclosed (forward) code under ``name``."""
        if not self.enabled:
            yield
            return
        start = self.stamp()
        yield
        self.add(name, start, self.stamp())

    def mark_backward(self, x: torch.Tensor, name: str, edge: str) -> torch.Tensor:
        """Identity on ``x`` whose backward opens (edge="out") or closes (edge="in") ``name.bwd``.

        Put ``edge="in"`` on the segment's input and ``edge="out"`` on its output.
        """
        if not (self.enabled and x.requires_grad):
            return x
        return _BackwardMark.apply(x, self, name, edge)

    def elapsed_ms(self) -> dict[str, float]:
        """Total milliseconds per phase since the last reset (synchronizes the GPU once)."""
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for name, spans in self._intervals.items():
            if self.cuda:
                out[name] = sum(s.elapsed_time(e) for s, e in spans)
            else:
                out[name] = sum(e - s for s, e in spans) * 1e3
        return out

    def reset(self) -> None:
        """Start a step: forget its spans and counters (and open the noise window if none is open)."""
        if self.enabled and _rank0():
            WINDOW.open()
        self._intervals.clear()
        self._open.clear()
        self.counters.clear()


class _BackwardMark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, timer: PhaseTimer, name: str, edge: str):
        ctx.timer, ctx.name, ctx.edge = timer, name, edge
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        timer, key = ctx.timer, f"{ctx.name}.bwd"
        if ctx.edge == "out":
            timer._open[key] = timer.stamp()
        elif key in timer._open:
            timer.add(key, timer._open.pop(key), timer.stamp())
        return grad, None, None, None


def worst_rank(per_rank_iters: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per iteration and metric, the maximum over ranks (the rank on the critical path).

    ``per_rank_iters[r][name][i]`` is rank r's value of ``name`` at iteration i.
    """
    names = per_rank_iters[0].keys()
    return {
        name: [max(rank[name][i] for rank in per_rank_iters) for i in range(len(per_rank_iters[0][name]))]
        for name in names
    }


def gather_worst_rank(local: dict[str, list[float]], group=None) -> dict[str, list[float]]:
    """All-gather every rank's per-iteration values and keep the worst rank per iteration.

    Called once the timed iterations are done, so it also closes the noise window (moe_core.host.noise)."""
    if _rank0():
        WINDOW.close()
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return {k: list(v) for k, v in local.items()}
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, dict(local), group=group)
    return worst_rank(gathered)


def _rank0() -> bool:
    """This process is rank 0 (or runs alone): the one that reads host noise."""
    return not dist.is_initialized() or dist.get_rank() == 0
