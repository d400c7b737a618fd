"""Aurora's system model (Section 3): the simulated executor of its decisions.

A non-blocking big switch with per-GPU send and receive caps, synchronous all-to-alls, no overlap
inside one model. The decisions are ``transmission_order.py`` (with moe_core.transmission) and
``colocation.py`` (expert-to-GPU assignment, colocation); this module gives them a cluster and each
token's cost, and reads their times off the model. Used by experiments/aurora.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from moe_core.sections import ConfigError
from moe_core.transmission import async_time, lower_bound, make_schedule, rounds_time
from moe_core.workloads import receiver_skew, traffic_bytes

from . import (
    colocation,
    transmission_order,  # noqa: F401  (registers the orders of STUDIED_ORDERS)
)

PAPER = "aurora"
STUDIED_ORDERS = ("naive", "sjf", "rcs", "aurora", "exact")  # moe_core.transmission.ORDERS names, baselines first
NETWORKS = ("homogeneous", "heterogeneous")
SETTINGS = ("exclusive-homogeneous", "exclusive-heterogeneous", "colocated-homogeneous", "colocated-heterogeneous")
# Policies per setting; the first is Aurora, the others its baselines (papers.md §5.4). Orders are the
# baselines of the exclusive homogeneous case; elsewhere every all-to-all runs in the exact order, so a
# speedup isolates the deployment decision. ``aurora-exclusive`` (colocated settings, Fig. 12 only):
# each model alone on its own GPUs of the same kind, i.e. twice the GPUs.
DEPLOYMENT_POLICIES = {
    "exclusive-homogeneous": ("aurora", "naive", "sjf", "rcs"),
    "exclusive-heterogeneous": ("aurora", "rga"),
    "colocated-homogeneous": ("aurora", "lina", "rec", "aurora-exclusive"),
    "colocated-heterogeneous": ("aurora", "lina", "rec", "rga+rec", "aurora-exclusive"),
}
RANDOM_POLICIES = ("rcs", "rga", "rec", "rga+rec")  # one sample per draw of aurora.random_draws
IMPRECISION_BASELINE = {"exclusive-heterogeneous": "rga", "colocated-heterogeneous": "rga+rec"}
DEPLOYMENT_ORDER = "exact"


@dataclass(frozen=True)
class BigSwitch:
    """n GPUs on a big switch: per-GPU bandwidth (bytes/s) and speed (relative to the reference GPU)."""

    bandwidth: np.ndarray  # (n,)
    speed: np.ndarray  # (n,)


def big_switch_of(hardware: DictConfig, n: int, reference_flops: float) -> BigSwitch:
    """The profile's devices scaled to ``n`` GPUs: its GPU classes in equal proportion, fastest first."""
    classes = hardware.gpu_classes or [{"count": 1, "nic_GBps": hardware.nic_GBps, "peak_tflops": hardware.peak_tflops}]
    total = sum(c["count"] for c in classes)
    counts = [c["count"] * n // total for c in classes]
    if sum(counts) != n or min(counts) < 1:
        raise ConfigError(
            f"config key 'aurora.num_experts' / 'aurora.gap_gpus': hardware profile '{hardware.name}' "
            f"(GPU classes of {[c['count'] for c in classes]} devices) cannot be scaled to {n} GPUs in "
            f"equal proportion; use a multiple of {len(classes)} GPUs"
        )
    bandwidth = np.repeat([c["nic_GBps"] * hardware.nic_efficiency * 1e9 for c in classes], counts)
    flops = np.repeat([c["peak_tflops"] * 1e12 * hardware.compute_efficiency for c in classes], counts)
    if (bandwidth <= 0).any() or (flops <= 0).any():
        raise ConfigError(
            f"hardware profile '{hardware.name}' (aurora.*_hardware) needs positive nic_GBps and "
            "peak_tflops for Aurora's system model"
        )
    return BigSwitch(bandwidth, flops / reference_flops)


@dataclass(frozen=True)
class Costs:
    """Per-token wire bytes and FLOPs of one MoE layer of the served model, and the reference GPU's rate."""

    d_model: int
    element_bytes: int  # per activation element on the wire
    gate_flops: float  # gate projection: 2 * d_model * num_experts
    ffn_flops: float  # expert FFN, two GEMMs: 4 * d_model * d_ff
    aggregation_flops: float  # weighted sum of the returned expert output: 2 * d_model
    reference_flops: float  # FLOP/s of speed 1

    def stats(self, tokens: np.ndarray) -> colocation.LayerStats:
        """Table 1's inputs of one layer from its (n, n) token counts: shard i holds row i's tokens
        (gate and aggregation), expert j computes column j's (FFN)."""
        held, received = tokens.sum(axis=1), tokens.sum(axis=0)
        return colocation.LayerStats(
            traffic=traffic_bytes(tokens, self.d_model, self.element_bytes),
            gate_s=held * self.gate_flops / self.reference_flops,
            ffn_s=received * self.ffn_flops / self.reference_flops,
            agg_s=held * self.aggregation_flops / self.reference_flops,
        )


def costs_of(cfg: DictConfig, reference: DictConfig) -> Costs:
    a = cfg.aurora
    return Costs(
        d_model=a.d_model,
        element_bytes=a.element_bytes,
        gate_flops=2 * a.d_model * a.num_experts,
        ffn_flops=4 * a.d_model * a.d_ff,
        aggregation_flops=2 * a.d_model,
        reference_flops=reference.peak_tflops * 1e12 * reference.compute_efficiency,
    )


def over_layers(per_layer: list[tuple[float, float]]) -> tuple[float, float]:
    """(inference time, utilisation) of layers run one after another: times add, compute adds."""
    total = sum(t for t, _ in per_layer)
    return total, sum(t * u for t, u in per_layer) / total


# ---- (a) transmission order ----


def order_points(traffic: np.ndarray, bandwidth: np.ndarray, seed: int) -> dict[str, dict[str, float]]:
    """Per order: the dispatch all-to-all's time (async and in rounds), both over T*, the number of
    rounds and the matrix's receiver skew."""
    bound = lower_bound(traffic, bandwidth)
    out = {}
    for kind in STUDIED_ORDERS:
        schedule = make_schedule(kind, traffic, bandwidth, seed)
        a2a, rounds = async_time(schedule, bandwidth), rounds_time(schedule, bandwidth)
        out[kind] = {
            "a2a_ms": 1e3 * a2a,
            "rounds_ms": 1e3 * rounds,
            "lower_bound_ms": 1e3 * bound,
            "a2a_over_lower_bound": a2a / bound,
            "rounds_over_lower_bound": rounds / bound,
            "rounds": len(schedule),
            "receiver_skew": receiver_skew(traffic),
        }
    return out


# ---- (b) deployment ----


def exclusive(layers: list[colocation.LayerStats], cluster: BigSwitch, policy: str, seed: int) -> tuple[float, float]:
    """One model on its own GPUs; each layer assigned from its own statistics."""
    n = len(cluster.bandwidth)
    results = []
    for layer in layers:
        kind = DEPLOYMENT_ORDER
        if policy == "aurora":  # Theorem 5.1 (identity on a homogeneous cluster)
            gpu_of = colocation.assign_exclusive(layer.send + layer.recv, cluster.speed)
        elif policy == "rga":
            gpu_of = colocation.random_assignment(n, seed)
        else:  # an order baseline of the homogeneous case, experts in place
            gpu_of, kind = np.arange(n), policy
        results.append(colocation.exclusive_inference([layer], gpu_of, cluster.bandwidth, cluster.speed, kind, seed))
    return over_layers(results)


def colocated(
    layers_a: list[colocation.LayerStats],
    layers_b: list[colocation.LayerStats],
    cluster: BigSwitch,
    policy: str,
    seed: int,
    plan_a: list[colocation.LayerStats] | None = None,
    plan_b: list[colocation.LayerStats] | None = None,
) -> tuple[float, float]:
    """Two models sharing the GPUs; Aurora decides each layer from ``plan_*`` (default: the true stats)."""
    n = len(cluster.bandwidth)
    bw, speed = cluster.bandwidth, cluster.speed
    plan_a, plan_b = plan_a or layers_a, plan_b or layers_b
    if policy == "lina":
        return over_layers(
            [colocation.lina_pairing_inference([la], [lb], bw, speed) for la, lb in zip(layers_a, layers_b)]
        )
    if policy == "aurora-exclusive":
        (t_a, u_a), (t_b, u_b) = (exclusive(layers, cluster, "aurora", seed) for layers in (layers_a, layers_b))
        return max(t_a, t_b), (u_a + u_b) / 2  # 2n GPUs, each model's busy at its own rate
    results = []
    homogeneous = np.ptp(bw) == 0 and np.ptp(speed) == 0
    for la, lb, pa, pb in zip(layers_a, layers_b, plan_a, plan_b):
        if policy == "aurora" and homogeneous:  # Case II: bottleneck matching, GPUs interchangeable
            partner, gpu_of = colocation.pair_bottleneck(pa.send, pa.recv, pb.send, pb.recv), np.arange(n)
        elif policy == "aurora":  # Section 7's two bottleneck matchings
            partner, gpu_of = colocation.colocate_heterogeneous(pa, pb, bw, speed)
        elif policy == "rec":
            partner, gpu_of = colocation.random_colocation(n, seed), np.arange(n)
        elif policy == "rga+rec":
            partner, gpu_of = colocation.random_colocation(n, seed), colocation.random_assignment(n, seed + 1)
        else:
            raise ValueError(f"unknown colocation policy {policy!r}")
        results.append(colocation.colocated_inference([la], [lb], partner, gpu_of, bw, speed, DEPLOYMENT_ORDER, seed))
    return over_layers(results)


def draws(cfg: DictConfig, policy: str) -> list[int]:
    """Seeds of a policy's samples: aurora.random_draws for random baselines, one otherwise."""
    k = cfg.aurora.random_draws if policy in RANDOM_POLICIES else 1
    return [cfg.train.seed + i for i in range(k)]


# ---- (d) imprecision ----


def imprecise(tokens: np.ndarray, level: float) -> np.ndarray:
    """(layers, n, n) planning traffic: layer l mixed with layer l + 1 (cyclic) at ``level``."""
    return (1 - level) * tokens + level * np.roll(tokens, -1, axis=0)
