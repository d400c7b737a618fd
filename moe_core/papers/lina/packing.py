"""Lina's expert packing inside a training run: when to decide, and the move to a new expert layout.

:class:`ExpertPacking` is the measured driver of the plan's re-layout hook (moe_core.schedule.plan.Relayout):
it re-decides the packing factor between steps from the run's own times (the decision is the
hook's ``decide``, ``decisions.choose_packed_layout``); when the layout
changes, :func:`repack` gives every rank the experts of its place in the new layout, with their
optimizer state, and the policy of the new layout's process groups. Lina does this with new
process groups plus one synchronous exchange of the expert parameters; so do we.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn

from moe_core.dispatch.chunks import a2a_micro_ops
from moe_core.host.timing import PhaseTimer
from moe_core.model.capacity import dispatch_rows_per_expert
from moe_core.model.layer import MoELayer
from moe_core.papers.lina.decisions import packing_due
from moe_core.parallel.layout import Layout
from moe_core.parallel.parallelize import ParallelGroups, build_groups, local_experts
from moe_core.runtime.distributed import Env
from moe_core.schedule.executor import CommPolicy, make_policy
from moe_core.schedule.gradients import layout_plan


def exchange_experts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, old: ParallelGroups, new: ParallelGroups
) -> None:
    """Give this rank the experts of its place in ``new``'s layout, with their optimizer state.

    Every "ep" row of the ``old`` layout holds all experts, so an all-gather of each stacked expert
    tensor (e_local, ...) within the row rebuilds the whole stack (E, ...), and the rank keeps its
    slice of the new layout; this works for a growing and a shrinking packing factor alike. The
    optimizer's per-element state (AdamW's exp_avg and exp_avg_sq: tensors of the parameter's shape)
    moves the same way. Per-tensor state (AdamW's step) is kept: it counts the steps of the whole
    stack, which every rank has taken equally. Each expert tensor becomes a new Parameter, as
    ``Experts.keep`` makes them (changing an existing one's shape in place would let autograd reuse
    its cached gradient accumulator, which sums gradients down to the old shape), and takes the old
    one's place in the optimizer.

    Collective on ``old.ep_group``: every rank calls it, between two steps (no gradients held).
    NOTE: for a moment each rank holds one tensor's whole expert stack (E / e_local times its share).
    """
    first, count = local_experts(new)
    for layer in model.modules():
        if not isinstance(layer, MoELayer):
            continue
        for name, param in list(layer.experts.named_parameters()):
            if param.grad is not None:
                raise RuntimeError(
                    "exchange_experts runs between steps: clear the gradients first "
                    "(optimizer.zero_grad(set_to_none=True))"
                )
            moved = nn.Parameter(_all_experts(param.detach(), old.ep_group)[first : first + count].clone())
            state = optimizer.state.pop(param, {})
            if state:
                optimizer.state[moved] = {
                    key: _all_experts(value, old.ep_group)[first : first + count].clone()
                    if torch.is_tensor(value) and value.shape == param.shape
                    else value
                    for key, value in state.items()
                }
            for group in optimizer.param_groups:
                group["params"] = [moved if p is param else p for p in group["params"]]
            setattr(layer.experts, name, moved)


def _all_experts(local: torch.Tensor, ep_group) -> torch.Tensor:
    """(e_local, ...) on every rank of an "ep" row -> the row's whole stack (E, ...), in expert order
    (group rank i holds experts [i * e_local, (i + 1) * e_local))."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(ep_group))]
    dist.all_gather(parts, local.contiguous(), group=ep_group)
    return torch.cat(parts)


def repack(
    cfg,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    policy: CommPolicy,
    groups: ParallelGroups,
    element_bytes: int,
) -> CommPolicy:
    """Move training from ``policy``'s layout to ``groups``' layout; return the policy to train with.

    The policy is detached (its hooks removed), the experts and their optimizer state are exchanged
    (:func:`exchange_experts`), and ``cfg``'s communication policy is planned again for the new
    layout (its gradient units change with the experts per rank) and attached, with the same timer,
    on the new groups. Collective; call between two steps.
    """
    policy.detach(model)
    exchange_experts(model, optimizer, policy.groups, groups)
    repacked = make_policy(cfg, layout_plan(cfg, groups.layout, element_bytes), groups, policy.timer)
    repacked.attach(model)
    return repacked


class ExpertPacking:
    """Lina's expert packing inside a training run (Li et al. §4; decision: the plan's ``relayout``).

    The run starts on the configured layout. After the warm-up steps, then every
    ``comm.packing_interval_iters`` steps (``packing_due``), the layout is re-decided from this
    run's own times of one all-to-all micro-op on each candidate layout:

    * FFN time of a micro-op: the median expert phase of the steps since the last decision, per MoE
      layer, pass (backward = 2 forwards) and all-to-all micro-op (plan.a2a_micro_ops of the dispatch buffer). A rank
      computes the rows it sends whatever the packing, so the current layout's time stands for
      every candidate.
    * All-to-all time of a micro-op on a candidate: one micro-op's buffer exchanged by a real
      all_to_all_single on the candidate's expert-parallel groups (median of 5, after one untimed
      exchange).

    Both are the worst rank's (all_reduce MAX), so every rank takes the same decision. A changed
    layout moves the experts and their optimizer state (:func:`repack`). Each layout's process
    groups are built once and kept, since creating a group is collective and costly: the candidates
    measured are the layouts a repack then trains on.
    """

    def __init__(self, cfg, env: Env, groups: ParallelGroups, moe_layers: int, element_bytes: int):
        self.cfg, self.env, self.element_bytes = cfg, env, element_bytes
        self.base = self.layout = groups.layout
        self.groups = {groups.layout: groups}  # layout -> its process groups
        self.repacks, self.exchange_ms = 0, 0.0
        self.expert_ms: list[float] = []  # this rank's expert phase per step since the last decision
        dtype = torch.bfloat16 if cfg.train.dtype == "bfloat16" else torch.float32
        row_bytes = cfg.moe.num_experts * cfg.model.d_model * dtype.itemsize  # a row for every expert
        chunks = a2a_micro_ops(dispatch_rows_per_expert(cfg), row_bytes, cfg.comm.partition_mb * 2**20)
        self.micro_ops = len(chunks) * moe_layers * 3  # per step: forward + backward (2 forwards)
        a, b = chunks[0]
        self.micro_op = torch.zeros(
            cfg.moe.num_experts * (b - a) * cfg.model.d_model, device=env.device, dtype=dtype
        )  # (E * rows, M) flattened: one micro-op's send buffer

    def groups_on(self, layout: Layout) -> ParallelGroups:
        """The process groups of ``layout`` (built on first use; collective then)."""
        if layout not in self.groups:
            high_priority = self.groups[self.base].high_priority_ep
            self.groups[layout] = build_groups(layout, self.env.device.type, self.env.timeout_s, high_priority)
        return self.groups[layout]

    def before_step(self, iteration: int, model, optimizer, policy: CommPolicy) -> CommPolicy:
        """Before step ``iteration``: re-decide the layout when due and repack on a change; return the
        policy to train with. Collective: every rank calls it before every step."""
        if not packing_due(iteration, self.cfg.train.warmup_iters, self.cfg.comm.packing_interval_iters):
            return policy
        ffn_ms = self._worst_rank(statistics.median(self.expert_ms)) / self.micro_ops
        self.expert_ms = []
        layout = policy.plan.relayout.decide(self.base, lambda candidate: (ffn_ms, self._a2a_ms(candidate)))
        if layout == self.layout:
            return policy
        groups = self.groups_on(layout)
        clock = PhaseTimer(self.env.device)
        with clock.region("exchange"):
            policy = repack(self.cfg, model, optimizer, policy, groups, self.element_bytes)
        self.exchange_ms += clock.elapsed_ms()["exchange"]
        self.layout, self.repacks = layout, self.repacks + 1
        return policy

    def after_step(self, metrics: dict[str, float]) -> None:
        """Keep this step's expert phase: the FFN time of the next decision."""
        self.expert_ms.append(metrics["expert_ms"])

    def _a2a_ms(self, layout: Layout) -> float:
        """The worst rank's time of one micro-op's all-to-all on ``layout``."""
        group = self.groups_on(layout).ep_group
        clock, received = PhaseTimer(self.env.device), torch.empty_like(self.micro_op)
        times = []
        for _ in range(6):
            dist.barrier(group)
            clock.reset()
            with clock.region("a2a"):
                dist.all_to_all_single(received, self.micro_op, group=group)
            times.append(clock.elapsed_ms()["a2a"])
        return self._worst_rank(statistics.median(times[1:]))

    def _worst_rank(self, value: float) -> float:
        """The maximum of ``value`` over all ranks (collective)."""
        worst = torch.tensor(value, dtype=torch.float64, device=self.env.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst)

    def metrics(self) -> dict[str, float]:
        """The record's packing metrics: final factor (experts per rank relative to the configured
        layout), number of repacks, the worst rank's total exchange time (collective)."""
        return {
            "packing_factor": self.layout.experts_per_rank // self.base.experts_per_rank,
            "repacks": self.repacks,
            "exchange_ms": self._worst_rank(self.exchange_ms),
        }
