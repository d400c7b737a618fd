"""One rank's gradient tensors under a layout: what a communication plan is decided from
(moe_core.schedule.policies.build_plan), in both executors. Read off the model's shapes on the meta
device (moe_core.model.transformer.shape_only_model), split as the parallel wrappers split the
live model, so the plan and the training step cannot disagree on a tensor's size."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from moe_core.model.capacity import expert_tensor_parallel
from moe_core.model.transformer import backward_ordered_params, shape_only_model
from moe_core.parallel.grid_parallel import GridGroups, grid_linears, shard_grid
from moe_core.parallel.layout import Layout
from moe_core.parallel.parallelize import is_expert_param
from moe_core.parallel.tensor_parallel import shard_tensor_parallel
from moe_core.schedule.plan import CommPlan, GradientTensor
from moe_core.schedule.policies import build_plan

# gradient_tensors' results by what they depend on: the model's and the MoE's sections, the layout
# and the experts' tensor parallelism. Building the model on the meta device takes a tenth of a
# second, and a simulated study asks for the same shapes hundreds of times.
_GRADIENT_TENSORS: dict[tuple, tuple[GradientTensor, ...]] = {}


def gradient_tensors(cfg: DictConfig, layout: Layout) -> list[GradientTensor]:
    """One rank's gradient tensors under ``layout``, in backward order, from the model's shapes
    (meta device, split over "tp" or the grid as moe_core.parallel.tensor_parallel and moe_core.parallel.grid_parallel
    split it): dense tensors whole or their tensor-parallel shard, a grid's weights their depth shard,
    expert tensors the rank's share of the expert stack. What a communication plan is decided from
    (moe_core.schedule.policies.build_plan), in both executors."""
    key = (OmegaConf.to_yaml(cfg.model), OmegaConf.to_yaml(cfg.moe), layout, expert_tensor_parallel(cfg))
    if key not in _GRADIENT_TENSORS:
        _GRADIENT_TENSORS[key] = tuple(_gradient_tensors(cfg, layout))
    return list(_GRADIENT_TENSORS[key])


def _gradient_tensors(cfg: DictConfig, layout: Layout) -> list[GradientTensor]:
    """What :func:`gradient_tensors` returns, read off a newly built shape-only model."""
    share = layout.experts_per_rank / cfg.moe.num_experts
    model = shape_only_model(cfg)
    shard_tensor_parallel(model, 0, layout.tensor_parallel, group=None, experts=expert_tensor_parallel(cfg) > 1)
    no_groups = dict.fromkeys(("depth", "row", "col"))
    shard_grid(model, GridGroups(layout.grid, dict.fromkeys(no_groups, 0), no_groups))
    depth_sharded = {id(layer.weight) for layer in grid_linears(model)}
    tensors = []
    for name, p in backward_ordered_params(model):
        if is_expert_param(name):
            tensors.append(GradientTensor(name, round(p.numel() * share), "expert"))
        else:
            tensors.append(GradientTensor(name, p.numel(), "data" if id(p) in depth_sharded else "dense"))
    return tensors


def layout_plan(cfg, layout: Layout, element_bytes: int) -> CommPlan:
    """The plan of ``cfg``'s policy for one rank of ``layout`` holding the whole model: what a
    measured run, and a run that moves its experts to another layout, execute."""
    return build_plan(cfg, gradient_tensors(cfg, layout), element_bytes)
