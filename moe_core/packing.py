"""Lina's expert packing applied to a running model: the one-time move to a new expert layout.

When a run's packing factor changes (moe_core.lina.packing_factor, decided in
experiments.train_step), every rank must then hold the experts of its place in the new layout,
with their optimizer state, and communicate on the new layout's process groups. Lina does this
with new process groups plus one synchronous exchange of the expert parameters; so do we.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .layer import MoELayer
from .parallel import ParallelGroups, local_experts
from .policies import CommPolicy, make_policy


def exchange_experts(model: torch.nn.Module, optimizer: torch.optim.Optimizer, old: ParallelGroups,
                     new: ParallelGroups) -> None:
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
                raise RuntimeError("exchange_experts runs between steps: clear the gradients first "
                                   "(optimizer.zero_grad(set_to_none=True))")
            moved = nn.Parameter(_all_experts(param.detach(), old.ep_group)[first:first + count].clone())
            state = optimizer.state.pop(param, {})
            if state:
                optimizer.state[moved] = {
                    key: _all_experts(value, old.ep_group)[first:first + count].clone()
                    if torch.is_tensor(value) and value.shape == param.shape else value
                    for key, value in state.items()}
            for group in optimizer.param_groups:
                group["params"] = [moved if p is param else p for p in group["params"]]
            setattr(layer.experts, name, moved)


def _all_experts(local: torch.Tensor, ep_group) -> torch.Tensor:
    """(e_local, ...) on every rank of an "ep" row -> the row's whole stack (E, ...), in expert order
    (group rank i holds experts [i * e_local, (i + 1) * e_local))."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(ep_group))]
    dist.all_gather(parts, local.contiguous(), group=ep_group)
    return torch.cat(parts)


def repack(model: torch.nn.Module, optimizer: torch.optim.Optimizer, policy: CommPolicy,
           groups: ParallelGroups) -> CommPolicy:
    """Move training from ``policy``'s layout to ``groups``' layout; return the policy to train with.

    The policy is detached (its hooks removed), the experts and their optimizer state are exchanged
    (:func:`exchange_experts`), and the same communication policy (same timer, bucket and micro-op
    sizes) is attached again with its buckets on the new groups. Collective; call between two steps.
    """
    policy.detach(model)
    exchange_experts(model, optimizer, policy.groups, groups)
    repacked = make_policy(policy.name, groups, policy.timer, policy.bucket_bytes, policy.partition_bytes)
    repacked.attach(model)
    return repacked
