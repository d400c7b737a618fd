"""Which dispatcher when: one MoE layer's token exchange under routing skew, per dispatch path.

Users of MoE frameworks choose between dispatchers whose costs react to skewed routing in opposite
ways. The study times every registered token dispatcher (moe_core.dispatch: capacity, hierarchical,
dropless, allgather, the tensor-parallel duplicate and drop-gather, and the papers' own): the round
trip of one layer (dispatch, then combine) with top-1 routing.

Skew: one expert popularity shared by every rank (``uniform``, ``zipf:<s>`` with weight 1/k^s for
the k-th most popular expert of a seeded ranking, ``lognormal:<sigma>`` with weights exp(sigma*N(0,1))),
each rank's tokens drawn from it. The imbalance factor of a skew is max tokens per expert / mean.

experiments/dispatchers.py measures every path on gloo/NCCL ranks; :func:`simulated_round_trip_s`
times the non-tensor-parallel paths on a modelled cluster (moe_core.sim) from the same token counts.
:func:`measured_paths` and :func:`simulated_paths` enumerate the registry for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from omegaconf import DictConfig

from moe_core.config.sections import (
    SAFE_NAME,
    ConfigError,
    register_section,
    require,
    require_at_least,
    require_positive,
    require_profile,
    require_seed,
)
from moe_core.dispatch import DISPATCHERS, dispatcher
from moe_core.model.capacity import capacity

SKEW_KINDS = ("uniform", "zipf", "lognormal")


@dataclass
class DispatchStudyConfig:
    """The dispatcher comparison (experiments/dispatchers.py): measured on ``world_size`` ranks, one
    expert per rank, ``tokens_per_rank`` tokens of ``d_model`` float32 per rank; simulated on each
    of ``hardware`` with one expert per GPU and ``sim_tokens_per_rank`` bf16 tokens of
    ``sim_d_model``."""

    skews: list[str] = field(default_factory=lambda: ["uniform", "zipf:1.0", "lognormal:1.0"])
    world_size: int = 4
    tokens_per_rank: int = 2048
    d_model: int = 256
    capacity_factor: float = 1.25
    tensor_parallel: int = 2  # of the tensor-parallel dispatchers (moe_core.dispatch)
    chunks: int = 4  # pipelined chunks of a dispatcher that chunks its exchange (MoNTA's)
    warmup_iters: int = 2
    iters: int = 10
    seed: int = 0
    hardware: list[str] = field(default_factory=lambda: ["monta-a800-2x8", "h100-ndr-cluster"])
    sim_world_size: int = 16
    sim_tokens_per_rank: int = 8192
    sim_d_model: int = 4096


# exp(sigma * N(0, 1)) of 16+ experts overflows float64 near sigma 150; far below, one expert
# already takes every token.
MAX_LOGNORMAL_SIGMA = 20.0


def parse_skew(skew: str) -> tuple[str, float]:
    """``"zipf:1.2"`` -> ("zipf", 1.2); ``"uniform"`` -> ("uniform", 0.0). ConfigError when malformed.
    A skew becomes a point name and a command-line word: no spaces or other characters than a name's."""
    key = "config key 'dispatch_study.skews'"
    kind, _, value = skew.partition(":")
    if kind not in SKEW_KINDS or (kind != "uniform") != bool(value) or (value and not SAFE_NAME.match(value)):
        raise ConfigError(f"{key}: invalid skew {skew!r}; use uniform, zipf:<s> or lognormal:<sigma> (no spaces)")
    try:
        parameter = float(value) if value else 0.0
    except ValueError:
        raise ConfigError(f"{key}: {skew!r} has a non-numeric parameter") from None
    if not math.isfinite(parameter) or parameter < 0:
        raise ConfigError(f"{key}: {skew!r} needs a finite parameter >= 0")
    if kind == "lognormal" and parameter > MAX_LOGNORMAL_SIGMA:
        raise ConfigError(f"{key}: {skew!r}: sigma above {MAX_LOGNORMAL_SIGMA:g} overflows the expert weights")
    return kind, parameter


def popularity(num_experts: int, skew: str, seed: int) -> np.ndarray:
    """(E,) probability that a token is routed to each expert, the same on every rank."""
    kind, parameter = parse_skew(skew)
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        weights = np.ones(num_experts)
    elif kind == "zipf":
        weights = np.empty(num_experts)
        weights[rng.permutation(num_experts)] = 1.0 / np.arange(1, num_experts + 1) ** parameter
    else:
        weights = np.exp(parameter * rng.standard_normal(num_experts))
    return weights / weights.sum()


def token_counts(world_size: int, tokens_per_rank: int, probabilities: np.ndarray, seed: int) -> np.ndarray:
    """(world, E) tokens each rank routes to each expert: a seeded multinomial draw per rank."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.multinomial(tokens_per_rank, probabilities) for _ in range(world_size)])


def imbalance(counts: np.ndarray) -> float:
    """Max tokens per expert over the mean (1 = balanced), over all ranks' tokens."""
    per_expert = counts.sum(axis=0)
    return float(per_expert.max() / per_expert.mean())


def capacity_slots(tokens_per_rank: int, num_experts: int, capacity_factor: float, multiple: int = 1) -> int:
    """Capacity per expert and rank, moe_core.model.capacity.capacity for the study's routing (each token
    to one expert, token_counts; no minimum), rounded up to ``multiple`` (a tensor-parallel rank
    keeps C/tp slots)."""
    return capacity(tokens_per_rank, num_experts, 1, capacity_factor, min_capacity=0, multiple=multiple)


def dropped_fraction(counts: np.ndarray, capacity: int) -> float:
    """Share of the tokens a capacity dispatch drops: every (rank, expert) beyond ``capacity``."""
    return float(np.maximum(counts - capacity, 0).sum() / counts.sum())


def simulated_round_trip_s(hw: DictConfig, counts: np.ndarray, capacity: int, row_bytes: int, path: str) -> float:
    """Simulated dispatch + combine of one layer on ``hw`` (ranks 0..world-1, expert e on rank e):
    the dispatcher's collectives (moe_core.dispatch: ``study_transfers``) on the topology, one after
    the other."""
    from moe_core.sim.collectives import collective_op, simulate_on
    from moe_core.sim.engine import Op
    from moe_core.sim.topology import build_topology

    topo = build_topology(hw)
    steps = dispatcher(path).study_transfers(topo, counts, capacity, row_bytes)
    ops, previous = [], None
    for k, (kind, transfer) in enumerate(steps):
        ops.append(
            Op(f"{path}{k}", path, [] if previous is None else [previous], **collective_op(hw, topo, kind, transfer))
        )
        previous = k
    return simulate_on(hw, topo, ops).makespan_s


def measured_paths(cfg: DictConfig) -> list[str]:
    """The dispatchers the measured study runs on ``dispatch_study.world_size`` ranks: every registered
    one that applies there (the hierarchical exchange only where the ranks span nodes)."""
    world, per_node = cfg.dispatch_study.world_size, cfg.hardware.devices_per_node
    return [name for name, d in DISPATCHERS.items() if d.runs_on(world, per_node)]


def simulated_paths() -> list[str]:
    """The dispatchers the simulated study times: those of ranks holding their own tokens (the
    tensor-parallel ones are simulated inside training steps, moe_core.sim.step)."""
    return [name for name, d in DISPATCHERS.items() if not d.tensor_parallel]


def validate_dispatch_study(cfg: DictConfig) -> None:
    d = cfg.dispatch_study
    require(len(d.skews) > 0, "dispatch_study.skews", "must list at least one skew")
    for skew in d.skews:
        parse_skew(skew)
    require_at_least(d, "dispatch_study", 1, ("world_size", "tokens_per_rank", "d_model", "iters", "chunks"))
    require_at_least(d, "dispatch_study", 1, ("sim_world_size", "sim_tokens_per_rank", "sim_d_model"))
    require_at_least(d, "dispatch_study", 0, ("warmup_iters",))
    require_seed(d.seed, "dispatch_study.seed")
    require_positive(d, "dispatch_study", ("capacity_factor",))
    require(
        d.tensor_parallel >= 2 and d.world_size % d.tensor_parallel == 0,
        "dispatch_study.tensor_parallel",
        f"must be >= 2 and divide dispatch_study.world_size={d.world_size}, got {d.tensor_parallel}",
    )
    require(len(d.hardware) > 0, "dispatch_study.hardware", "must name at least one profile to simulate on")
    for profile in d.hardware:
        require_profile(profile, "dispatch_study.hardware")


register_section("dispatch_study", DispatchStudyConfig, validate_dispatch_study)
