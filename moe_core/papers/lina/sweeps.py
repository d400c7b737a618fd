"""Lina's training-step points, added to the run's measured and simulated sweeps (moe_core.schema.points).

Training steps simulated on the paper's testbed (``lina.hardware``) with experts = GPUs: every ``lina.policy`` at
every ``lina.experts`` count (Figs 10-14), then policy ``lina`` at each ``lina.partition_mb`` at the
largest count (Fig 15). Measured: ``lina.measured_policy`` at the measured sweep's largest world
size with experts = ranks and micro-ops of ``lina.measured_partition_mb``. Its measured inference:
one job per ``inference.experts`` x ``inference.path_lengths`` point (experiments/rules/lina.smk).
"""

from __future__ import annotations

import itertools
from typing import Any

from omegaconf import DictConfig

from moe_core.papers.lina.config import TRAINING_UNSTATED
from moe_core.schema.points import (
    own_layout,
    point_overrides,
    register_measured_points,
    register_override_list,
    register_sim_points,
    sim_point,
    unstated_variants,
)


def lina_model(cfg: DictConfig) -> list[str]:
    """Lina's simulated training model (``lina.overrides``) on the capacity all-to-all: Lina's policies
    pipeline and partition it, never the base config's other one."""
    return [*cfg.lina.overrides, "moe.dispatcher=capacity"]


@register_sim_points
def lina_sim_points(cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    lina, model = cfg.lina, lina_model(cfg)
    points = [
        sim_point(cfg, lina.hardware, "lina", experts, 1, policy, model, cfg.comm.partition_mb)
        for experts, policy in itertools.product(lina.experts, lina.policy)
    ]
    points += [  # the same at the other ends of the unstated parameters' ranges
        (name, (paper, overrides))
        for point, (paper, base) in points
        for name, overrides in unstated_variants(cfg, point, base, TRAINING_UNSTATED).items()
    ]
    points += [
        sim_point(cfg, lina.hardware, "lina", max(lina.experts), 1, "lina", model, partition_mb)
        for partition_mb in lina.partition_mb
    ]
    return dict(points)


@register_measured_points
def lina_measured_points(cfg: DictConfig) -> list[dict[str, Any]]:
    ws = max(cfg.sweep.world_size)
    return [
        dict(
            world_size=ws,
            num_experts=ws,
            experts_per_rank=1,
            policy=policy,
            seed=cfg.sweep.seed[0],
            partition_mb=cfg.lina.measured_partition_mb,
            tensor_parallel=1,  # experts = ranks: no tensor parallelism, whatever the base config's
            dispatcher="capacity",  # Lina's policies pipeline and partition the capacity all-to-all
            paper="lina",
        )
        for policy in cfg.lina.measured_policy
    ]


def inference_points(cfg: DictConfig) -> dict[str, list[str]]:
    """Lina's measured inference jobs: point name -> the overrides of its run (the inference model,
    its layout and path length). The list also checks ``inference.overrides`` at load: each job's
    overrides applied to the run's config are a valid config."""
    inference = cfg.inference
    points = {}
    for experts, length in itertools.product(inference.experts, inference.path_lengths):
        layout = dict(
            world_size=inference.world_size,
            num_experts=experts,
            experts_per_rank=max(1, experts // inference.world_size),
            tensor_parallel=1,  # expert and data parallelism only, whatever the base config's
        )
        points[f"ws{inference.world_size}_e{experts}_k{inference.top_k}_l{length}"] = [
            *inference.overrides,
            *point_overrides(layout),
            f"inference.path_length={length}",
        ]
    return points


register_override_list(
    "lina.overrides", lambda cfg: [[*own_layout(), *lina_model(cfg), f"hardware_profile={cfg.lina.hardware}"]]
)
register_override_list("inference.overrides", lambda cfg: list(inference_points(cfg).values()))
