"""MoNTA's performance model at the paper's setting: its experiments, their points and how each is predicted.

experiments/monta.py writes a record of each point, analysis/papers/monta.py reads them. The model
is closed-form (performance_model.py), on the paper's model and testbed (sweeps.paper_config):
``monta_strategy`` ranks every (tp, ep, dp) layout of the testbed's GPUs by its predicted dispatch;
``monta_chunk_model`` predicts the pipelined dispatch at the largest tensor-parallel size for every
admissible chunk count and marks the count the run's ``monta`` dispatch picks, again at the other
end of each unstated parameter's range (``MONTA_UNSTATED``). :func:`model_points` names every point,
for the workflow (the model is cheap: it computes them).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from moe_core.model.capacity import DTYPE_BYTES, dispatch_rows_per_expert, moe_blocks
from moe_core.papers.monta.config import MONTA_UNSTATED
from moe_core.papers.monta.decisions import dispatch_volume_bytes, monta_chunks
from moe_core.papers.monta.performance_model import (
    admissible_chunk_counts,
    enumerate_strategies,
    exchange_links,
    pipelined_seconds,
    rank_strategies,
)
from moe_core.papers.monta.sweeps import EXPERTS, paper_config
from moe_core.records.predictions import Prediction
from moe_core.schema.points import unstated_param, unstated_variants


def settings(cfg: DictConfig) -> dict[str, DictConfig]:
    """The paper's config on its testbed by name: at the chosen values (the testbed's name), then at
    the other end of each unstated parameter's range (the name with the setting appended)."""
    runs = {cfg.monta.hardware: [], **unstated_variants(cfg, cfg.monta.hardware, [], MONTA_UNSTATED)}
    return {
        name: OmegaConf.merge(paper_config(cfg, setting), {"moe": {"num_experts": EXPERTS}})
        for name, setting in runs.items()
    }


def strategy_points(cfg: DictConfig, name: str, paper: DictConfig) -> list[Prediction]:
    """One point per (tp, ep, dp) layout, with the model's predictions and rank."""
    hw, m, model = paper.hardware, cfg.monta, paper.model
    world = hw.nodes * hw.devices_per_node
    ranked = rank_strategies(
        enumerate_strategies(
            world_size=world,
            devices_per_node=hw.devices_per_node,
            num_experts=EXPERTS,
            tokens_per_rank=paper.train.batch_size * model.seq_len,
            d_model=model.d_model,
            d_ff=model.d_ff,
            top_k=paper.moe.top_k,
            capacity_factor=paper.moe.capacity_factor,
            element_bytes=DTYPE_BYTES[paper.train.dtype],
            memory_bytes_per_device=m.device_memory_GB * 1e9,
            bytes_per_param=m.bytes_per_param,
            hw=hw,
            chunk_overhead_s=m.chunk_overhead_us * 1e-6,
            moe_layers=len(moe_blocks(model.n_layers, model.moe_every)),
        )
    )
    points = []
    for rank, s in enumerate(ranked, start=1):
        params = {
            "world_size": world,
            "tensor_parallel": s.tp,
            "expert_parallel": s.ep,
            "data_parallel": s.dp,
            "nics_per_node": hw.nics_per_node,
        }
        metrics = {
            "model_exchange_ms": s.exchange_s * 1e3,
            "model_a2a_ms": s.a2a_s * 1e3,
            "model_allgather_ms": s.allgather_s * 1e3,
            "inter_node_bytes": s.inter_node_bytes,
            "memory_GB": s.memory_bytes / 1e9,
            "fits": float(s.fits),
            "model_rank": rank,
            "chunks": s.chunks,
        }
        points.append(_point(paper, "monta_strategy", f"{name}_tp{s.tp}_ep{s.ep}_dp{s.dp}", params, metrics))
    return points


def chunk_points(cfg: DictConfig, name: str, paper: DictConfig) -> list[Prediction]:
    """The model's pipelined dispatch time for every admissible chunk count at the largest tp."""
    hw = paper.hardware
    tp = max(cfg.monta.sim_tensor_parallel, default=1)
    if tp == 1:
        return []
    ep = EXPERTS
    paper = OmegaConf.merge(paper, {"parallel": {"world_size": hw.nodes * hw.devices_per_node, "tensor_parallel": tp}})
    slots, volume = dispatch_rows_per_expert(paper), dispatch_volume_bytes(paper)
    links = exchange_links(hw, ep, tp, cfg.monta.chunk_overhead_us * 1e-6)
    chosen = monta_chunks(paper)  # the decision the run's monta dispatch takes
    points = []
    for n in admissible_chunk_counts(slots, tp):
        params = {"tensor_parallel": tp, "expert_parallel": ep, "chunks": n, "nics_per_node": hw.nics_per_node}
        metrics = {"model_exchange_ms": pipelined_seconds(volume, n, ep, tp, links) * 1e3, "chosen": float(n == chosen)}
        points.append(_point(paper, "monta_chunk_model", f"{name}_tp{tp}_n{n}", params, metrics))
    return points


def study_points(cfg: DictConfig) -> list[Prediction]:
    """Every point of this run: the strategy ranking at the chosen values, the chunk curve at each setting."""
    runs = settings(cfg)
    chosen = cfg.monta.hardware
    return [
        *strategy_points(cfg, chosen, runs[chosen]),
        *(point for name, paper in runs.items() for point in chunk_points(cfg, name, paper)),
    ]


def model_points(cfg: DictConfig) -> dict[str, list[str]]:
    """Experiment -> the point names one run writes (the workflow declares them; the model is cheap)."""
    points: dict[str, list[str]] = {"monta_strategy": [], "monta_chunk_model": []}
    for point in study_points(cfg):
        points[point.experiment].append(point.name)
    return points


def _point(paper: DictConfig, experiment: str, name: str, params: dict, metrics: dict) -> Prediction:
    """A point of the model's predictions at ``paper``'s setting, on its testbed."""
    return Prediction(experiment, name, paper.hardware.name, {**unstated_param(paper), **params}, metrics, "model")
