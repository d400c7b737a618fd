"""MoNTA's training-step points, added to the run's measured and simulated sweeps (moe_core.schema.points).

Simulated on MoNTA's testbed (``monta.hardware``) with the paper's model (``monta.overrides``),
every point a full training step of the step simulator:

* ``dispatch``: every dispatch at every ``monta.sim_tensor_parallel`` (ep = 2 experts' ranks, the
  rest data parallel), MoNTA's chunk count from its model (Fig (a), (c)); those at the largest
  tensor-parallel size again at the other end of each unstated parameter's range
  (``MONTA_UNSTATED``: the NIC count), for the range of the abstract's numbers;
* ``chunks``: MoNTA's dispatch at the largest tensor-parallel size with each admissible
  ``monta.sim_chunks`` (Fig (b));
* ``strategy``: every (tp, ep, dp) layout of the strategy ranking whose tp is in
  ``monta.sim_tensor_parallel`` (Fig (d));
* ``hierarchical``: flat vs hierarchical all-to-all, one expert per GPU, on clusters of
  ``monta.hierarchical_nodes`` nodes (Fig (e)).

Measured: the measured sweep's largest world size at ``monta.measured_tensor_parallel`` with two
experts, one run per ``monta.measured_dispatch``.
"""

from __future__ import annotations

import itertools
from typing import Any

from omegaconf import DictConfig, OmegaConf

from moe_core.dispatch import dispatcher
from moe_core.model.capacity import dispatch_rows_per_expert
from moe_core.papers.monta.config import EXPERTS, MONTA_UNSTATED
from moe_core.papers.monta.performance_model import admissible_chunk_counts
from moe_core.schema.derive import derive_config
from moe_core.schema.points import (
    point_name,
    point_overrides,
    register_measured_points,
    register_override_list,
    register_sim_points,
    unstated_variants,
)

PAPER = "monta"


def sim_point(cfg: DictConfig, nodes: int | None = None, **params) -> tuple[str, tuple[str, list[str]]]:
    """One simulated point on ``monta.hardware`` (with ``nodes`` nodes, if given)."""
    m = cfg.monta
    point = {"seed": cfg.train.seed, "policy": "overlap", "tp_chunks": 0, **params}
    hardware = [f"hardware.nodes={nodes}"] if nodes else []
    name = m.hardware + (f"-n{nodes}" if nodes else "") + f"_{point_name(point)}"
    overrides = [*m.overrides, f"hardware_profile={m.hardware}", f"paper={PAPER}", *hardware, *point_overrides(point)]
    return name, (PAPER, overrides)


def layout_params(world: int, experts: int, ep: int, tp: int, dispatch: str, chunks: int = 0) -> dict[str, Any]:
    """A point's layout: ``experts`` over ``ep`` ranks, ``tp`` tensor-parallel, the rest data parallel,
    and its token dispatcher: ``dispatch``, or at tp 1 where that one shares tokens over "tp" the
    capacity all-to-all."""
    return dict(
        world_size=world,
        num_experts=experts,
        experts_per_rank=experts // ep,
        tensor_parallel=tp,
        dispatcher=dispatch if tp > 1 or not dispatcher(dispatch).tensor_parallel else "capacity",
        tp_chunks=chunks,
    )


def paper_config(cfg: DictConfig, setting: list[str] = ()) -> DictConfig:
    """The run's config with the paper's model on its testbed (and ``setting``'s overrides after it, e.g.
    a sensitivity run's): what the simulated points' sizes, and the performance model's inputs, are
    read from."""

    return derive_config(cfg, [*paper_model(cfg), *setting])


def paper_model(cfg: DictConfig) -> list[str]:
    """The overrides of the paper's model on its testbed, on the paper's own layout (its two experts on
    their own ranks, no tensor parallelism: every point sets its own), whatever the base config's."""
    layout = point_overrides(layout_params(EXPERTS, EXPERTS, EXPERTS, 1, "capacity"))
    return [*cfg.monta.overrides, f"hardware_profile={cfg.monta.hardware}", *layout]


@register_sim_points
def monta_sim_points(cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    m, paper = cfg.monta, paper_config(cfg)
    hw = paper.hardware
    world = hw.nodes * hw.devices_per_node  # 16 A800 [ABS]
    points = [sim_point(cfg, **params) for tp in m.sim_tensor_parallel for params in dispatch_layouts(world, tp)]
    tp = max(m.sim_tensor_parallel, default=1)
    if tp > 1:
        points += sensitivity_points(cfg, world, tp)
        slots = dispatch_rows_per_expert(OmegaConf.merge(paper, {"moe": {"num_experts": EXPERTS}}))
        admissible = set(admissible_chunk_counts(slots, tp))
        points += [
            sim_point(cfg, **layout_params(world, EXPERTS, EXPERTS, tp, "monta", n))
            for n in m.sim_chunks
            if n in admissible
        ]
    for tp, ep in strategy_layouts(world, hw.devices_per_node):
        if tp in m.sim_tensor_parallel:
            points.append(sim_point(cfg, **layout_params(world, EXPERTS, ep, tp, "monta")))
    for nodes, algorithm in itertools.product(m.hierarchical_nodes, ("capacity", "hierarchical")):
        ranks = nodes * hw.devices_per_node  # one expert per GPU
        points.append(sim_point(cfg, nodes=nodes, **layout_params(ranks, ranks, ranks, 1, algorithm)))
    return dict(points)


def dispatch_layouts(world: int, tp: int) -> list[dict[str, Any]]:
    """The paper's layout (both experts on their own ranks) at ``tp`` with every dispatch (tp 1: none
    to choose)."""
    dispatches = ["duplicate", "drop-gather", "monta"] if tp > 1 else ["capacity"]
    return [layout_params(world, EXPERTS, EXPERTS, tp, d) for d in dispatches]


def sensitivity_points(cfg: DictConfig, world: int, tp: int) -> list[tuple[str, tuple[str, list[str]]]]:
    """The paper's layout at ``tp`` with every dispatch, at the other end of each unstated parameter's
    range (``MONTA_UNSTATED``): what the abstract's numbers are reproduced from, so their range."""
    points = []
    for params in dispatch_layouts(world, tp):
        name, (_, overrides) = sim_point(cfg, **params)
        points += [(v, (PAPER, o)) for v, o in unstated_variants(cfg, name, overrides, MONTA_UNSTATED).items()]
    return points


def strategy_layouts(world: int, devices_per_node: int) -> list[tuple[int, int]]:
    """Every (tp, ep) of the strategy ranking: tp within a node, ep a divisor of the experts."""
    return [
        (tp, ep)
        for tp in range(1, devices_per_node + 1)
        for ep in range(1, EXPERTS + 1)
        if devices_per_node % tp == 0 and EXPERTS % ep == 0 and world % (tp * ep) == 0
    ]


@register_measured_points
def monta_measured_points(cfg: DictConfig) -> list[dict[str, Any]]:
    ws, tp = max(cfg.sweep.world_size), cfg.monta.measured_tensor_parallel  # a layout config.py checked
    return [
        {
            **layout_params(ws, EXPERTS, EXPERTS, tp, dispatch),
            "policy": "overlap",
            "seed": cfg.sweep.seed[0],
            "paper": PAPER,
        }
        for dispatch in cfg.monta.measured_dispatch
    ]


register_override_list("monta.overrides", lambda cfg: [paper_model(cfg)])
