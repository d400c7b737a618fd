"""AxoNN's Perlmutter-scale study, simulated: its experiments, their points and how each is simulated.

experiments/axonn.py writes a record of each point, analysis/papers/axonn.py reads them. Every step
is the step simulator's (moe_core.sim.step) on ``axonn.hardware``: AxoNN's on the grid its
communication model (comm_model.py) ranks first, the Megatron-LM-style baseline (baseline.py) as
one pipeline stage composed by the 1F1B schedule (moe_core.sim.pipeline). The experiments:
``axonn_scaling`` (models.py's weak scaling, both systems), ``axonn_ablation`` (the ~2B model under
each overlap variant) and ``axonn_ranking`` (the model's ranking of every grid of the largest model
that fits, the best few simulated). :func:`study_runs` gives the run at the chosen values and the
sensitivity runs (``AXONN_UNSTATED``); :func:`record_points` names every point without pricing any,
for the workflow.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from moe_core.model.capacity import DTYPE_BYTES
from moe_core.papers.axonn.baseline import megatron_layout
from moe_core.papers.axonn.comm_model import grid_memory, rank_grids
from moe_core.papers.axonn.config import AXONN_UNSTATED, OVERLAP_VARIANTS, overlap_overrides
from moe_core.papers.axonn.models import TWO_B, WEAK_SCALING, GptModel, parameters, with_batch
from moe_core.papers.axonn.sweeps import PAPER
from moe_core.parallel.grid import GRID_AXES, Grid
from moe_core.records.predictions import Prediction
from moe_core.schema.derive import derive_config, hardware_profile
from moe_core.schema.points import own_layout, unstated_param, unstated_variants
from moe_core.sim.pipeline import pipeline_time_s
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

# Caching a block's weights trades memory the ranking already spent on the grid; the measured
# ablation covers it.
SIMULATED_VARIANTS = tuple(v for v in OVERLAP_VARIANTS if v != "all+cache")
# What the sensitivity runs simulate: the abstract's 80B model and the 2B model's overlap gain.
SENSITIVITY_MODELS, SENSITIVITY_VARIANTS = (WEAK_SCALING[-1],), ("none", "all")


def model_overrides(cfg: DictConfig, model: GptModel, gpus: int, n_layers: int | None = None) -> list[str]:
    """The dense GPT ``model`` on ``gpus`` GPUs of ``axonn.hardware`` (``n_layers``: a pipeline stage's)."""
    hw = hardware_profile(cfg.axonn.hardware)
    return [
        f"hardware_profile={cfg.axonn.hardware}",
        f"hardware.nodes={max(1, math.ceil(gpus / hw.devices_per_node))}",
        f"paper={PAPER}",
        "model.moe_every=0",
        "moe.num_experts=1",
        "moe.top_k=1",
        f"model.n_layers={n_layers or model.n_layers}",
        f"model.d_model={model.d_model}",
        f"model.n_heads={model.n_heads}",
        f"model.d_ff={model.d_ff}",
        f"model.vocab_size={model.vocab_size}",
        f"model.seq_len={model.seq_len}",
        "train.dtype=bfloat16",
        f"parallel.world_size={gpus}",
        "comm.policy=sequential",
    ]


def point_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The run's config with ``overrides`` (derive_config keeps the run's ``unstated`` setting, which a
    profile the overrides load would otherwise replace)."""
    return derive_config(cfg, [*own_layout(), *overrides])


def simulate(cfg: DictConfig, overrides: list[str]) -> dict[str, float]:
    """The simulated step's metrics (ms) of the run's config with ``overrides``."""
    point = point_config(cfg, overrides)
    return StepModel(point, build_topology(point.hardware)).run().metrics()


def grid_search(cfg: DictConfig, model: GptModel) -> dict:
    """``model`` as AxoNN's grid search (moe_core/papers/axonn/comm_model.py) takes it: its shape and
    batch on its GPUs, the run's device memory and optimizer bytes, bf16."""
    return {
        "d_model": model.d_model,
        "d_ff": model.d_ff,
        "n_layers": model.n_layers,
        "n_heads": model.n_heads,
        "vocab_size": model.vocab_size,
        "seq_len": model.seq_len,
        "global_sequences": model.global_sequences,
        "memory_GB": cfg.axonn.device_memory_GB,
        "element_bytes": DTYPE_BYTES["bfloat16"],
        "bytes_per_param": cfg.axonn.bytes_per_param,
    }


def ranking(cfg: DictConfig, model: GptModel):
    """AxoNN's communication model's ranking of every grid of ``model`` (AxoNN's placement: the one
    the measured and simulated executors run)."""
    hw = point_config(cfg, model_overrides(cfg, model, model.gpus)).hardware
    return rank_grids(hw, model.gpus, **grid_search(cfg, model))


def ranking_point(model: GptModel, grid: Grid) -> str:
    return f"{model.name}_{grid}"


def grid_overrides(model: GptModel, grid: Grid, variant: str) -> list[str]:
    return [
        f"parallel.grid.depth={grid.depth}",
        f"parallel.grid.row={grid.row}",
        f"parallel.grid.col={grid.col}",
        f"train.batch_size={model.global_sequences // (grid.data * grid.depth)}",
        *overlap_overrides(variant, 0),
    ]


def grid_params(grid: Grid) -> dict[str, int]:
    """A grid as record parameters (the names moe_core.schema.points gives a measured run's)."""
    return {f"grid_{axis}": size for axis, size in zip(GRID_AXES, grid.shape)}


def best_grid(cfg: DictConfig, model: GptModel, every_overlap: bool = False) -> Grid:
    """The grid AxoNN's model ranks first for ``model``; with ``every_overlap``, the first on which
    each overlap has something to hide (depth > 1 for the all-gather and reduce-scatter, an outer
    group, row, for the backward all-reduce): the ablation's, where the best may be plain data
    parallelism."""
    ranked = ranking(cfg, model).query("fits")
    if every_overlap:
        ranked = ranked.query("depth > 1 and row > 1")
    best = ranked.iloc[0]
    return Grid(int(best.data), int(best.depth), int(best.row), int(best.col))


def model_flops(model: GptModel) -> float:
    """FLOPs of one iteration: 6 per parameter of the blocks and the head per token (forward and
    backward), plus attention's scores and weighted sums, 12 L s d per token."""
    tokens = model.global_sequences * model.seq_len
    matmul = 12 * model.n_layers * model.d_model**2 + model.d_model * model.vocab_size
    return tokens * (6 * matmul + 12 * model.n_layers * model.seq_len * model.d_model)


def throughput(cfg: DictConfig, model: GptModel, batch_s: float) -> dict[str, float]:
    peak = hardware_profile(cfg.axonn.hardware).peak_tflops * 1e12
    achieved = model_flops(model) / batch_s
    return {"batch_s": batch_s, "pflops": achieved / 1e15, "peak_share": achieved / (peak * model.gpus)}


def axonn_scaling(cfg: DictConfig, model: GptModel) -> tuple[dict, dict]:
    grid = best_grid(cfg, model)
    m = simulate(cfg, [*model_overrides(cfg, model, model.gpus), *grid_overrides(model, grid, "all")])
    params = {"system": "axonn", **grid_params(grid)}
    return params, {**throughput(cfg, model, m["step_ms"] / 1e3), **m}


def megatron_scaling(cfg: DictConfig, model: GptModel) -> tuple[dict, dict]:
    """The baseline's iteration: a stage's forward and backward of one micro-batch, alone and with its
    data-parallel replicas, composed by the 1F1B schedule, then one optimizer step."""
    hw = point_config(cfg, model_overrides(cfg, model, model.gpus)).hardware
    layout = megatron_layout(model, model.gpus, hw, cfg.axonn.device_memory_GB, cfg.axonn.bytes_per_param)
    tp, pp, dp = layout["tp"], layout["pp"], layout["dp"]
    stage = [
        f"parallel.tensor_parallel={tp}",
        f"moe.dispatcher={'duplicate' if tp > 1 else 'capacity'}",  # Megatron sends the "tp" duplicates
        f"train.batch_size={layout['micro_batch_sequences']}",
    ]
    alone = simulate(cfg, [*model_overrides(cfg, model, tp, model.n_layers // pp), *stage])
    replicated = simulate(cfg, [*model_overrides(cfg, model, tp * dp, model.n_layers // pp), *stage])
    # a simulated step ends with the optimizer, which the iteration runs once, not per micro-batch
    optimizer_s = alone["optimizer_ms"] / 1e3
    stage_s, all_reduce_s = alone["step_ms"] / 1e3 - optimizer_s, (replicated["step_ms"] - alone["step_ms"]) / 1e3
    # the activations of a micro-batch between stages (and their gradients back), each tensor-parallel
    # rank sending its 1/tp over its own NIC (Megatron's scatter-gather)
    boundary = layout["micro_batch_sequences"] * model.seq_len * model.d_model * DTYPE_BYTES["bfloat16"] / tp
    p2p_s = 2 * (boundary / (hw.nic_GBps * 1e9) + hw.inter_node_latency_us * 1e-6) if pp > 1 else 0.0
    batch_s = pipeline_time_s(stage_s, layout["microbatches"], pp, p2p_s) + all_reduce_s + optimizer_s
    metrics = {
        "stage_ms": stage_s * 1e3,
        "dp_allreduce_ms": all_reduce_s * 1e3,
        "p2p_ms": p2p_s * 1e3,
        "optimizer_ms": optimizer_s * 1e3,
    }
    params = {"system": "megatron", **{k: layout[k] for k in ("tp", "pp", "dp", "microbatches")}}
    return params, {**throughput(cfg, model, batch_s), **metrics}


SCALING = {"axonn": axonn_scaling, "megatron": megatron_scaling}


def study_runs(cfg: DictConfig) -> list[tuple[str, list[str], tuple[GptModel, ...], tuple[str, ...]]]:
    """Each run of the study (cheap: the workflow declares its points from it): its point-name
    suffix, its config overrides, the models it scales and the overlaps it ablates. First the run's own
    setting (the chosen values, or the fitted testbed's), then the other end of each unstated
    parameter's range (``AXONN_UNSTATED``), which sets ``unstated``."""
    sensitivity = unstated_variants(cfg, "", [], AXONN_UNSTATED)
    return [("", [], WEAK_SCALING, SIMULATED_VARIANTS)] + [
        (suffix, overrides, SENSITIVITY_MODELS, SENSITIVITY_VARIANTS) for suffix, overrides in sensitivity.items()
    ]


def scaling_point(model: GptModel, system: str, suffix: str) -> str:
    return f"{model.name}_{system}{suffix}"


def ablation_point(model: GptModel, variant: str, suffix: str) -> str:
    return f"{model.name}_{variant}{suffix}"


def scaling_points(cfg: DictConfig, models: tuple[GptModel, ...], suffix: str = "") -> list[Prediction]:
    """Each of ``models`` at the run's batch under AxoNN and the Megatron-style baseline."""
    out = []
    for model in (with_batch(m, cfg.axonn.sequences_per_gpu) for m in models):
        base = {"model": model.name, "parameters": parameters(model), "gpus": model.gpus}
        base["global_sequences"] = model.global_sequences
        for system, run in SCALING.items():
            params, metrics = run(cfg, model)
            out.append(_point(cfg, "axonn_scaling", scaling_point(model, system, suffix), {**base, **params}, metrics))
    return out


def ablation_points(cfg: DictConfig, variants: tuple[str, ...], suffix: str = "") -> list[Prediction]:
    """The ~2B model at the run's batch under each overlap of ``variants``, on the best grid on which
    every overlap acts."""
    model = with_batch(TWO_B, cfg.axonn.sequences_per_gpu)
    grid = best_grid(cfg, model, every_overlap=True)
    out = []
    for variant in variants:
        m = simulate(cfg, [*model_overrides(cfg, model, model.gpus), *grid_overrides(model, grid, variant)])
        params = {"model": model.name, "gpus": model.gpus, "global_sequences": model.global_sequences}
        params.update(overlap_variant=variant, **grid_params(grid))
        out.append(_point(cfg, "axonn_ablation", ablation_point(model, variant, suffix), params, m))
    return out


def ranking_points(cfg: DictConfig) -> list[Prediction]:
    """The model's ranking of every grid of the largest model that fits, the best few simulated; none
    for a run at a setting of the unstated parameters (the fitted testbed's): which grids fit follows
    its batch, so the workflow could not name the records before the fit, and no verdict reads them."""
    if cfg.unstated:
        return []
    largest = with_batch(WEAK_SCALING[-1], cfg.axonn.sequences_per_gpu)
    out = []
    for row in ranking(cfg, largest).query("fits").itertuples():
        grid = Grid(int(row.data), int(row.depth), int(row.row), int(row.col))
        metrics = {k: v for k, v in row._asdict().items() if k.endswith("_s") or k == "memory_GB"}
        metrics["model_rank"] = row.rank
        if row.rank <= cfg.axonn.ranked_grids:
            step = simulate(cfg, [*model_overrides(cfg, largest, largest.gpus), *grid_overrides(largest, grid, "none")])
            metrics["sim_step_ms"] = step["step_ms"]
            metrics["sim_comm_ms"] = step["grid_comm_ms"] + step["allreduce_exposed_ms"]
        params = {"model": largest.name, "gpus": largest.gpus, **grid_params(grid)}
        out.append(_point(cfg, "axonn_ranking", ranking_point(largest, grid), params, metrics))
    return out


def run_points(
    cfg: DictConfig, overrides: list[str], models: tuple[GptModel, ...], variants: tuple[str, ...], suffix: str
) -> tuple[DictConfig, list[Prediction]]:
    """One run of :func:`study_runs`: its config (``overrides`` on the run's ``cfg``) and its scaling
    and ablation points."""
    run = derive_config(cfg, [*own_layout(), *overrides])
    return run, [*scaling_points(run, models, suffix), *ablation_points(run, variants, suffix)]


def record_points(cfg: DictConfig) -> dict[str, list[str]]:
    """Experiment -> the point names one run of the study writes (pure and quick: the workflow
    declares them at every parse; the ranking's grids are those that fit in memory, grid_memory's
    decision, found without pricing any)."""
    largest = with_batch(WEAK_SCALING[-1], cfg.axonn.sequences_per_gpu)
    runs = study_runs(cfg)
    return {
        "axonn_scaling": [
            scaling_point(m, system, suffix) for suffix, _, models, _ in runs for m in models for system in SCALING
        ],
        "axonn_ablation": [ablation_point(TWO_B, v, suffix) for suffix, _, _, variants in runs for v in variants],
        "axonn_ranking": [
            ranking_point(largest, c.grid)
            for c in grid_memory(largest.gpus, **grid_search(cfg, largest))
            if c.fits and not cfg.unstated  # none at a setting (ranking_points)
        ],
    }


def _point(cfg: DictConfig, experiment: str, name: str, params: dict, metrics: dict) -> Prediction:
    """A point of the run ``cfg``, a sensitivity run's with its setting (``unstated``)."""
    return Prediction(experiment, name, cfg.axonn.hardware, {**unstated_param(cfg), **params}, metrics)
