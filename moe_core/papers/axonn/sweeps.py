"""AxoNN's measured grid sweep: which (grid, overlap variant) points experiments/axonn_grids.py runs,
their names and their configs (pure, so the workflow declares them before any job)."""

from __future__ import annotations

from omegaconf import DictConfig

from moe_core.grid import Grid, grid_split_error

from .comm_model import enumerate_grids
from .config import OVERLAP_VARIANTS, ablation_grid, overlap_overrides

PAPER = "axonn"
MEASURED = "axonn_grids"


def measured_model(cfg: DictConfig) -> DictConfig:
    """The run's config with the measured grid sweep's model (``axonn.measured_overrides``)."""
    from moe_core.config import load_config, to_container  # the config module imports this one (the registry)

    return load_config(data=to_container(cfg), overrides=list(cfg.axonn.measured_overrides))


def grid_points(cfg: DictConfig) -> dict[str, tuple[Grid, str]]:
    """Every measured point by name: each possible grid of ``axonn.world_size`` with no overlap,
    then every overlap variant on ``axonn.ablation_grid``."""
    a, m = cfg.axonn, measured_model(cfg).model
    points = {}
    for grid, _ in enumerate_grids(a.world_size):
        if (
            grid_split_error(grid, m.d_model, m.d_ff, m.n_heads) is None
            and a.global_sequences % (grid.data * grid.depth) == 0
        ):
            points[point_name(a.world_size, grid, "none")] = (grid, "none")
    ablation = ablation_grid(a)
    for variant in OVERLAP_VARIANTS:
        points[point_name(a.world_size, ablation, variant)] = (ablation, variant)
    return points


def point_name(world_size: int, grid: Grid, variant: str) -> str:
    return f"ws{world_size}_{grid}_{variant}"


def point_config(cfg: DictConfig, grid: Grid, variant: str) -> DictConfig:
    """One measured point's config: the measured model on ``grid``, the DP all-reduce after the
    backward pass (AxoNN's), the global batch shared by the data replicas, ``variant``'s overlaps."""
    from moe_core.config import load_config, to_container

    a = cfg.axonn
    overrides = [
        *a.measured_overrides,
        f"paper={PAPER}",
        f"experiment={MEASURED}",
        f"parallel.world_size={a.world_size}",
        f"parallel.grid.depth={grid.depth}",
        f"parallel.grid.row={grid.row}",
        f"parallel.grid.col={grid.col}",
        f"train.batch_size={a.global_sequences // (grid.data * grid.depth)}",
        f"train.warmup_iters={a.warmup_iters}",
        f"train.iters={a.iters}",
        "comm.policy=sequential",
        *overlap_overrides(variant, a.cached_layers),
    ]
    return load_config(data=to_container(cfg), overrides=overrides)
