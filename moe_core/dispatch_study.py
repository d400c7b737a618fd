"""Which dispatcher when: one MoE layer's token exchange under routing skew, per dispatch path.

Users of MoE frameworks choose between dispatchers whose costs react to skewed routing in opposite
ways. The study times every registered token dispatcher (moe_core.dispatch: capacity, hierarchical,
dropless, allgather, the kernel libraries' node-forwarding and direct-sends, the tensor-parallel
duplicate and drop-gather, and the papers' own): the round trip of one layer (dispatch, then
combine) with top-1 routing.

Skew: a routing workload of moe_core.dispatch.workloads, one expert per rank: the popularity skews
(``uniform``, ``zipf:<s>``, ``lognormal:<sigma>``) and Megatron-LM's imbalance workloads W0-W7
(``balanced``, ``hot_expert_set``, ``hot_rank``, ``spread_hot_experts``, ``source_ragged``,
``zero_expert_rank``, ``rotating_hotspot``, ``burst``) and recorded routing (``trace:<name>``, one
step per MoE layer of the trace). A workload that changes from step to step (``rotating_hotspot``,
``burst``, a trace) runs its steps in turn, iteration i on step i mod its period. The imbalance
factor of a routing is max tokens per expert / mean; its Gini coefficient, DODOCO's measure.

experiments/dispatchers.py measures every path on gloo/NCCL ranks; :func:`simulated_round_trip_s`
times the non-tensor-parallel paths on a modelled cluster (moe_core.sim) from the same token counts.
:func:`measured_paths` and :func:`simulated_paths` enumerate the registry for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from omegaconf import DictConfig

from moe_core.dispatch import DISPATCHERS, dispatcher, routing_trace
from moe_core.dispatch.workloads import (
    IMBALANCE_WORKLOADS,
    TRACE,
    period,
    routing,
    routing_counts,
    split_name,
    trace_name,
)
from moe_core.model.capacity import capacity
from moe_core.schema.derive import hardware_profile
from moe_core.schema.sections import (
    SAFE_NAME,
    ConfigError,
    register_section,
    require,
    require_at_least,
    require_model_profile,
    require_positive,
    require_profile,
    require_seed,
)

# Megatron's workloads the study runs by default: per-rank heat, skew before the dispatch, a rank
# with zero-size splits both ways, and the two that change between steps (W1 and W3 heat one expert
# of four where every rank holds one, as W2 does; W0 is uniform without the noise).
STUDY_WORKLOADS = ("hot_rank", "source_ragged", "zero_expert_rank", "rotating_hotspot", "burst")


@dataclass
class DispatchStudyConfig:
    """The dispatcher comparison (experiments/dispatchers.py): measured on ``world_size`` ranks, one
    expert per rank, ``tokens_per_rank`` tokens of ``d_model`` float32 per rank; simulated on each
    of ``hardware`` at each of ``sim_world_sizes`` GPUs (the profile grown by whole nodes), one
    expert per GPU and ``sim_tokens_per_rank`` bf16 tokens of ``sim_d_model``."""

    skews: list[str] = field(default_factory=lambda: ["uniform", "zipf:1.0", "lognormal:1.0", *STUDY_WORKLOADS])
    world_size: int = 4
    tokens_per_rank: int = 2048
    d_model: int = 256
    capacity_factor: float = 1.25
    tensor_parallel: int = 2  # of the tensor-parallel dispatchers (moe_core.dispatch)
    chunks: int = 4  # pipelined chunks of a dispatcher that chunks its exchange (MoNTA's)
    warmup_iters: int = 2
    iters: int = 10
    repeats: int = 3  # independent repeats of each measured cell (warm-up and timed iterations each)
    seed: int = 0
    # The profile (name or YAML path) the simulator predicts every measured cell on, in the prediction
    # job (experiments/dispatchers_predictions.py): the testbed's calibrated one (the workflow passes
    # it); empty: the run's own.
    model_profile: str = ""
    hardware: list[str] = field(default_factory=lambda: ["monta-a800-2x8", "h100-ndr-cluster"])
    # Expert-parallel sizes of the simulated sweep. The default run's; the winner map at the
    # issue's scale (EP 8 to 256 on H100 and H800) is a README command (experiments/README.md).
    sim_world_sizes: list[int] = field(default_factory=lambda: [8, 16, 64])
    sim_tokens_per_rank: int = 8192
    sim_d_model: int = 4096


# exp(sigma * N(0, 1)) of 16+ experts overflows float64 near sigma 150; far below, one expert
# already takes every token.
MAX_LOGNORMAL_SIGMA = 20.0


def parse_skew(skew: str) -> tuple[str, float]:
    """``"zipf:1.2"`` -> ("zipf", 1.2); ``"hot_rank"`` -> ("hot_rank", 0.0). ConfigError when malformed.
    A skew becomes a point name and a command-line word: no spaces or other characters than a name's."""
    key = "config key 'dispatch_study.skews'"
    allowed = (
        f"uniform, zipf:<s>, lognormal:<sigma>, trace:<name> or one of {', '.join(IMBALANCE_WORKLOADS)} (no spaces)"
    )
    if not SAFE_NAME.match(skew.replace(":", "")):
        raise ConfigError(f"{key}: invalid skew {skew!r}; use {allowed}")
    try:
        kind, parameter = split_name(skew)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}; use {allowed}") from None
    if kind == TRACE:
        try:
            routing_trace.load(trace_name(skew))
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    if kind == "lognormal" and parameter > MAX_LOGNORMAL_SIGMA:
        raise ConfigError(f"{key}: {skew!r}: sigma above {MAX_LOGNORMAL_SIGMA:g} overflows the expert weights")
    return kind, parameter


def study_steps(skew: str, ranks: int) -> int:
    """The steps a study cell runs in turn: the workload's period (1 for a static one)."""
    return period(skew, ranks)


def token_counts(
    skew: str, ranks: int, tokens_per_rank: int, seed: int, step: int = 0, experts: int | None = None, top_k: int = 1
) -> np.ndarray:
    """(ranks, E) tokens each rank routes to each expert at ``step``: ``experts`` (default one per
    rank) contiguous on the ranks, ``top_k`` choices per token."""
    experts = experts or ranks
    routes = routing(
        skew, seed=seed, step=step, tokens_per_rank=tokens_per_rank, experts=experts, ranks=ranks, top_k=top_k
    )
    return routing_counts(routes, experts)


def step_counts(
    skew: str, ranks: int, tokens_per_rank: int, seed: int, experts: int | None = None, top_k: int = 1
) -> list[np.ndarray]:
    """Every step's (ranks, E) counts of ``skew``, in the order a cell runs them (study_steps)."""
    return [
        token_counts(skew, ranks, tokens_per_rank, seed, step, experts, top_k)
        for step in range(study_steps(skew, ranks))
    ]


def imbalance(counts: np.ndarray) -> float:
    """Max tokens per expert over the mean (1 = balanced, also when no token is routed), over all
    ranks' tokens."""
    per_expert = counts.sum(axis=0)
    return float(per_expert.max() / per_expert.mean()) if per_expert.any() else 1.0


def useful_bytes(counts: np.ndarray, row_bytes: int) -> float:
    """Bytes that had to cross between ranks in a round trip: every token routed to an expert on
    another rank (experts contiguous on the ranks of ``counts``' rows), there and back. What a path
    moves beyond them is its own cost (padding to capacity, copies to every rank)."""
    ranks, experts = counts.shape
    local = sum(int(counts[r, r * experts // ranks : (r + 1) * experts // ranks].sum()) for r in range(ranks))
    return 2.0 * float(counts.sum() - local) * row_bytes


def routing_metrics(steps: list[np.ndarray], capacity: int, drops: bool, row_bytes: int) -> dict[str, float]:
    """A study cell's routing over its steps' (ranks, E) counts: the worst step's ``imbalance`` and
    ``gini`` (of the per-expert load, DODOCO's measure: moe_core.dispatch.routing_trace.gini), the
    mean ``dropped_fraction`` (0 for a path that drops nothing) and the mean ``useful_bytes``."""
    dropped = [dropped_fraction(counts, capacity) if drops else 0.0 for counts in steps]
    return {
        "imbalance": max(imbalance(counts) for counts in steps),
        "gini": max(routing_trace.gini(counts.sum(axis=0)) for counts in steps),
        "dropped_fraction": float(np.mean(dropped)),
        "useful_bytes": float(np.mean([useful_bytes(counts, row_bytes) for counts in steps])),
    }


def cell_metrics(
    path: str,
    steps: list[np.ndarray],
    slots_per_expert: int,
    row_bytes: int,
    devices_per_node: int,
    exchange_ms: float,
    study: DictConfig | None = None,
    top_k: int = 1,
) -> dict[str, float]:
    """A cell's metrics beside its round trip of ``exchange_ms``: its routing (:func:`routing_metrics`),
    the mean ``bytes_moved`` between ranks and the bandwidths (:func:`bandwidths`). The bytes moved
    are the dispatcher's own statement (moe_core.dispatch.base.Dispatcher.traffic, the description
    the simulator prices) for each step's counts as the simulator takes them (:func:`rank_counts`),
    ``top_k`` choices a token, with ranks on nodes of ``devices_per_node``; ``study``, the
    tensor-parallel dispatchers' layout."""
    exchange = dispatcher(path)
    metrics = routing_metrics(steps, slots_per_expert, exchange.drops, row_bytes)
    traffic = [
        exchange.traffic(*rank_counts(counts, slots_per_expert), row_bytes, study, top_k=top_k) for counts in steps
    ]
    metrics["bytes_moved"] = float(np.mean([sum(c.bytes_moved(devices_per_node) for c in t) for t in traffic]))
    ranks = len(traffic[0][0].traffic)
    return {**metrics, **bandwidths(metrics["useful_bytes"], metrics["bytes_moved"], ranks, exchange_ms)}


def bandwidths(useful: float, moved: float, ranks: int, exchange_ms: float) -> dict[str, float]:
    """The rates of a round trip of ``exchange_ms`` on ``ranks`` ranks (none for a zero time):

    * ``useful_GBps``: the useful bytes (what had to cross between ranks) over the time, all ranks';
    * ``algbw_GBps``: the same per rank (nccl-tests' algbw is a rank's buffer over the time);
    * ``busbw_GBps``: the bytes the path actually moves, per rank, over the time. For an
      all-to-all, all-gather or reduce-scatter this is nccl-tests' busbw (algbw x (n-1)/n: a rank's
      off-rank bytes over the time); here its base is what the path moves, not a fixed factor of
      the useful bytes, so capacity padding, the all-gather's copies to every rank, duplicates or a
      two-phase exchange's second crossing count, and busbw / algbw = bytes moved / useful bytes.

    A rate whose bytes are zero (every token stays on its rank) is left out."""
    if exchange_ms <= 0:
        return {}
    rate = 1 / (exchange_ms * 1e-3) / 1e9  # GB/s per byte moved in the round trip
    rates = {"useful_GBps": useful * rate, "algbw_GBps": useful / ranks * rate} if useful > 0 else {}
    return {**rates, "busbw_GBps": moved / ranks * rate} if moved > 0 else rates


def rank_counts(counts: np.ndarray, slots_per_expert: int) -> tuple[np.ndarray, int]:
    """(ranks, E) counts with E / ranks experts per rank (contiguous) as (ranks, ranks) counts and the
    slots per rank: what a dispatcher's traffic reads (one expert per rank)."""
    ranks, experts = counts.shape
    per_rank = experts // ranks
    return counts.reshape(ranks, ranks, per_rank).sum(axis=2), per_rank * slots_per_expert


def measured_capacity(d: DictConfig, experts: int) -> int:
    """The measured study's capacity per expert and rank with ``experts`` experts (the flat layout's
    or the tensor-parallel one's): a multiple of tp x chunks, so every tensor-parallel dispatcher
    splits it evenly."""
    return capacity_slots(d.tokens_per_rank, experts, d.capacity_factor, d.tensor_parallel * d.chunks)


def capacity_slots(tokens_per_rank: int, num_experts: int, capacity_factor: float, multiple: int = 1) -> int:
    """Capacity per expert and rank, moe_core.model.capacity.capacity for the study's routing (each token
    to one expert, token_counts; no minimum), rounded up to ``multiple`` (a tensor-parallel rank
    keeps C/tp slots)."""
    return capacity(tokens_per_rank, num_experts, 1, capacity_factor, min_capacity=0, multiple=multiple)


def dropped_fraction(counts: np.ndarray, capacity: int) -> float:
    """Share of the tokens a capacity dispatch drops: every (rank, expert) beyond ``capacity``."""
    routed = counts.sum()
    return float(np.maximum(counts - capacity, 0).sum() / routed) if routed else 0.0


def simulated_round_trip_s(
    hw: DictConfig, counts: np.ndarray, capacity: int, row_bytes: int, path: str, top_k: int = 1
) -> float:
    """Simulated dispatch + combine of one layer on ``hw`` (ranks 0..world-1, expert e on rank e,
    ``top_k`` choices a token): the dispatcher's collectives (moe_core.dispatch: ``study_transfers``)
    on the topology, one after the other."""
    from moe_core.sim.collectives import collective_op, simulate_on
    from moe_core.sim.engine import Op
    from moe_core.sim.topology import build_topology

    topo = build_topology(hw)
    steps = dispatcher(path).study_transfers(topo, counts, capacity, row_bytes, top_k)
    ops, previous = [], None
    for k, (kind, transfer) in enumerate(steps):
        ops.append(
            Op(f"{path}{k}", path, [] if previous is None else [previous], **collective_op(hw, topo, kind, transfer))
        )
        previous = k
    return simulate_on(hw, topo, ops).makespan_s


def simulated_exchange_ms(
    hw: DictConfig, steps: list[np.ndarray], slots_per_expert: int, row_bytes: int, path: str, top_k: int = 1
) -> float:
    """A cell's simulated round trip in ms: the mean over its steps' (ranks, E) counts of ``top_k``
    choices a token (the time per iteration of a long run), each priced rank to rank (experts
    contiguous on the ranks, each rank keeping ``slots_per_expert`` slots for each of its experts)."""
    seconds = [
        simulated_round_trip_s(hw, *rank_counts(counts, slots_per_expert), row_bytes, path, top_k) for counts in steps
    ]
    return float(np.mean(seconds)) * 1e3


def rank_dispatchers(
    hw: DictConfig,
    *,
    ranks: int,
    experts: int,
    top_k: int,
    tokens_per_rank: int,
    row_bytes: int,
    capacity_factor: float,
    workload: str,
    seed: int = 0,
) -> list[dict[str, float | str]]:
    """Every dispatcher the simulator prices alone that applies to ``ranks`` ranks of ``hw``, fastest
    first: one MoE layer's dispatch + combine of ``workload``'s routing (mean over its steps), its
    drops, the useful bytes and the bytes moved with their rates (:func:`cell_metrics`), and its time
    over the fastest one's. Experts sit on the
    ranks contiguously; a capacity path keeps ``capacity`` slots per expert and source rank."""
    slots = capacity(tokens_per_rank, experts, top_k, capacity_factor, min_capacity=0)
    steps = step_counts(workload, ranks, tokens_per_rank, seed, experts, top_k)
    rows = []
    for name, path in DISPATCHERS.items():
        if path.tensor_parallel or not path.runs_on(ranks, hw):
            continue
        exchange_ms = simulated_exchange_ms(hw, steps, slots, row_bytes, name, top_k)
        metrics = cell_metrics(name, steps, slots, row_bytes, hw.devices_per_node, exchange_ms, top_k=top_k)
        rows.append({"dispatcher": name, "exchange_ms": exchange_ms, **metrics})
    rows.sort(key=lambda r: r["exchange_ms"])
    for row in rows:
        row["vs_fastest"] = row["exchange_ms"] / rows[0]["exchange_ms"]
    return rows


def why_not_priced(hw: DictConfig) -> str | None:
    """Why the simulator cannot price the dispatchers alone on the profile ``hw`` (None: it can): a
    torus prices its ring collectives over the whole torus only (moe_core.sim.topology.Torus2D), and
    the dispatchers' all-gathers run over their expert-parallel group."""
    if hw.topology != "cluster":
        return f"a {hw.topology} profile; dispatchers are priced alone on cluster profiles (hardware.topology: cluster)"
    return None


def measured_paths(cfg: DictConfig) -> list[str]:
    """The dispatchers the measured study runs on ``dispatch_study.world_size`` ranks: every registered
    one that applies there (the hierarchical exchange only where the ranks span nodes)."""
    world = cfg.dispatch_study.world_size
    return [name for name, d in DISPATCHERS.items() if d.runs_on(world, cfg.hardware)]


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
    require_at_least(d, "dispatch_study", 1, ("sim_tokens_per_rank", "sim_d_model"))
    require(len(d.sim_world_sizes) > 0, "dispatch_study.sim_world_sizes", "must list at least one size")
    for size in d.sim_world_sizes:
        require(size >= 1, "dispatch_study.sim_world_sizes", f"sizes must be >= 1, got {size}")
    require_at_least(d, "dispatch_study", 0, ("warmup_iters",))
    require_at_least(d, "dispatch_study", 2, ("repeats",))  # a confidence interval needs two
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
        unpriced = why_not_priced(hardware_profile(profile))
        require(unpriced is None, "dispatch_study.hardware", f"'{profile}': {unpriced}")
    require_model_profile(d.model_profile, "dispatch_study.model_profile")


register_section("dispatch_study", DispatchStudyConfig, validate_dispatch_study)
