"""Lina's training scheduler on one rank: the measured executor of its priority rule (Li et al.,
ATC'23 §4; the decisions and the registration of Lina's policies are in ``decisions.py``).

Everything else Lina plans runs on the shared executor, moe_core.schedule.executor.CommPolicy: the
pipelined micro-ops are the plan's exchange (moe_core.dispatch.scheduled.Pipelined), the packing
the training loop's re-layout driver (``packing.py``).
"""

from __future__ import annotations

import torch

from moe_core.schedule.executor import CommPolicy


class _BackwardSignal(torch.autograd.Function):
    """Identity whose backward calls ``callback`` when the gradient passes through."""

    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None


class LinaPriority(CommPolicy):
    """Gradient units that yield to the all-to-alls (the plan's ``gradients_yield_to_a2a``).

    Units become ready in backward order and wait in a FIFO queue, so every rank launches them in
    the same order. One launches only while no all-to-all is running or imminent (an MoE layer's
    backward start, its combine computation, blocks launching until the layer's next all-to-all is
    over) and only once the previous one has completed, so an all-to-all waits behind at most one.
    The queue is served on every gradient hook and at the end of every backward exchange span (each
    all-to-all, or a pipelined exchange as a whole: moe_core.schedule.executor.CommPolicy.blocking);
    ``finish_gradient_sync`` launches the rest. The same sums as without priority.
    """

    def attach(self, model: torch.nn.Module) -> None:
        super().attach(model)
        self.a2a_busy = False
        self.queue: list = []  # ready, not launched
        self.launched: list = []
        for layer in model.moe_layers():
            self.hooks.append(layer.register_forward_hook(self._block_at_backward_start))

    def _block_at_backward_start(self, _layer, _inputs, outputs) -> None:
        if outputs[0].requires_grad:
            outputs[0].register_hook(lambda _grad: setattr(self, "a2a_busy", True))

    def blocking(self, exchange, x: torch.Tensor) -> torch.Tensor:
        """Signal around every span of the exchange: once its backward is over, and that one is next."""
        x = _BackwardSignal.apply(x, self._a2a_over)  # its gradient exists once the backward exchange is over
        y = super().blocking(exchange, x)
        return _BackwardSignal.apply(y, lambda: setattr(self, "a2a_busy", True))  # the exchange is next

    def _a2a_over(self) -> None:
        self.a2a_busy = False
        self._serve()

    def units_ready(self, units: list) -> None:
        self.queue += units
        self._serve()

    def _launch_next(self) -> None:
        unit = self.queue.pop(0)
        unit.launch(async_op=True)
        self.launched.append(unit)

    def _serve(self) -> None:
        if self.queue and not self.a2a_busy and (not self.launched or self.launched[-1].done()):
            self._launch_next()

    def finish_gradient_sync(self) -> None:
        launched = {id(u) for u in self.launched}
        queued = {id(u) for u in self.queue}
        self.queue += [u for u in self.gradient_units if id(u) not in launched and id(u) not in queued]  # never ready
        while self.queue:
            self._launch_next()
        for unit in self.launched:
            unit.finish()
        self.pending = {id(u): len(u.params) for u in self.gradient_units}
        self._average_micro_ops()
        self.launched, self.a2a_busy = [], False
