"""AxoNN's measured grid sweep: which (grid, overlap variant) points experiments/axonn_grids.py runs,
their names, configs and record params (pure, so the workflow declares them before any job), and
AxoNN's communication model's prediction for each, which experiments/axonn_grid_predictions.py
writes as records of their own (the measured records hold measurements only)."""

from __future__ import annotations

from omegaconf import DictConfig

from moe_core.papers.axonn.comm_model import AXONN_ORDER, enumerate_grids, predicted_communication
from moe_core.papers.axonn.config import OVERLAP_VARIANTS, ablation_grid, overlap_overrides
from moe_core.parallel.grid import Grid, grid_split_error
from moe_core.schema.derive import derive_config, hardware_profile
from moe_core.schema.points import point_params, register_override_list, register_run_check
from moe_core.schema.run_checks import derived
from moe_core.schema.sections import ConfigError

PAPER = "axonn"
MEASURED = "axonn_grids"
# The model's prediction for each measured point: same point names and params, simulated records.
PREDICTED = "axonn_grid_predictions"


def measured_model(cfg: DictConfig) -> DictConfig:
    """The run's config with the measured grid sweep's model (``axonn.measured_overrides``)."""

    return derive_config(cfg, measured_settings(cfg))


# The base keys the measured grids set before the measured model: expert and tensor parallelism of
# their own (a grid is the only split) and the flat all-to-all, whatever the base config's.
MEASURED_LAYOUT = ("moe.experts_per_rank=1", "parallel.tensor_parallel=1", "moe.dispatcher=capacity")


def measured_settings(cfg: DictConfig) -> list[str]:
    """The overrides of the measured grids' model: their layout, then ``axonn.measured_overrides``."""
    return [*MEASURED_LAYOUT, *cfg.axonn.measured_overrides]


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
    """One measured point's config (point_settings)."""

    return derive_config(cfg, point_settings(cfg, grid, variant))


def point_settings(cfg: DictConfig, grid: Grid, variant: str) -> list[str]:
    """One measured point's overrides: the measured model on ``grid``, the DP all-reduce after the
    backward pass (AxoNN's), the global batch shared by the data replicas, ``variant``'s overlaps."""
    a = cfg.axonn
    return [
        *measured_settings(cfg),
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


def grid_point_params(point: DictConfig, variant: str) -> dict:
    """The params of a grid point's records (``point``: its config, point_config), its measurement's
    and its prediction's alike: the analysis joins the two on them."""
    return {**point_params(point), "overlap_variant": variant}


register_override_list("axonn.measured_overrides", lambda cfg: [measured_settings(cfg)])


@register_run_check
def check_measured(cfg: DictConfig) -> None:
    """At load, what the measured job would find only after its ranks started: the ablation's point
    with the cache is a valid config."""
    grid = ablation_grid(cfg.axonn)
    blame = {
        "comm.grid_overlap.cached_layers": "axonn.cached_layers",
        "parallel.grid": "axonn.ablation_grid",
        "train": "axonn.global_sequences",
    }
    derived(cfg, point_settings(cfg, grid, "all+cache"), "axonn", blame, f"measured point {grid} all+cache")


def measured_communication(cfg: DictConfig, hw: DictConfig, grid: Grid) -> dict[str, float]:
    """AxoNN's model of one measured step's communication (seconds, total and by collective) for the
    point config ``cfg``'s model on ``grid``, priced on ``hw``: float32 activations, as measured."""
    m = cfg.model
    return predicted_communication(
        hw,
        grid,
        AXONN_ORDER,
        d_model=m.d_model,
        d_ff=m.d_ff,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        tokens_per_rank=cfg.train.batch_size * m.seq_len,
        element_bytes=4,
        moe_every=m.moe_every,
    )


def model_profile(cfg: DictConfig) -> DictConfig:
    """The hardware AxoNN's model prices the measured grids on: ``axonn.model_profile``, or the run's."""
    profile = cfg.axonn.model_profile
    return hardware_profile(profile) if profile else cfg.hardware


def predicted_metrics(point: DictConfig, grid: Grid) -> dict[str, float]:
    """The metrics of a grid point's prediction record (``point``: its config, point_config): AxoNN's
    model of its step's communication on model_profile, ``predicted_comm_ms`` and its breakdown
    ``predicted_<kind>_<axis>_ms``. ConfigError naming ``axonn.model_profile`` when that profile
    cannot be read or lacks a link rate the grid's collectives need."""
    try:
        seconds = measured_communication(point, model_profile(point), grid)
    except ValueError as err:  # a ConfigError too: a profile that does not load
        raise ConfigError(f"config key 'axonn.model_profile': {err}") from None
    total = seconds.pop("total_s")
    return {
        "predicted_comm_ms": total * 1e3,
        **{f"predicted_{k.removesuffix('_s')}_ms": v * 1e3 for k, v in seconds.items()},
    }
