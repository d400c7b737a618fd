"""Aurora's four simulated experiments on its system model: workloads, points and the run.

Workloads (moe_core.workloads), each with a name recorded on every point: ``gating-z<zipf>`` are
real routing traces of our MoE model trained on data of Zipf skew ``aurora.gating_zipf``;
``zipf-<zipf>`` are parametric matrices of skew ``aurora.traffic_zipf``. Each has
``aurora.moe_layers`` layers of ``aurora.num_experts`` experts, expert e on GPU e. The traces give
token counts; the served model's size gives each token's cost (``system_model.Costs``).

Experiments (records under results/raw/aurora/<experiment>/<point>.json, written by experiments/aurora.py):

* ``aurora_order``: per network, workload, layer and transmission order (naive, sjf, rcs,
  aurora = Algorithm 1, exact = BvN): the dispatch all-to-all's time without slot barriers
  (``async_time``), in barrier-separated rounds (``rounds_time``), and both over T*. Also Fig. 4's
  3-GPU example (workload ``fig4-toy``).
* ``aurora_deployment``: per setting (exclusive/colocated x homogeneous/heterogeneous), workload
  (two workloads, one per model, when colocated) and policy: inference time and GPU utilisation of
  the model(s) over all layers, each layer deployed from its own statistics; a baseline's record
  also carries Aurora's speedup over it (Figs. 11, 12). Random baselines have one sample per draw.
* ``aurora_gap``: per model pair and layer, on ``aurora.gap_gpus`` heterogeneous GPUs: the
  busiest GPU's time of Section 7's colocation heuristic over the brute-force optimum (Fig. 13).
* ``aurora_imprecision``: per heterogeneous setting, workload and imprecision level p: Aurora
  plans layer l on (1 - p) * D_l + p * D_{l+1} (the next layer's traffic as the noise, Fig. 14's
  "other layers as noise") and is timed on D_l, against the random baselines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from moe_core.workloads import FIG4_TOY_TOKENS, coarsen, gating_token_matrices, traffic_bytes, zipf_token_matrices

from . import colocation
from .system_model import (
    DEPLOYMENT_ORDER,
    DEPLOYMENT_POLICIES,
    IMPRECISION_BASELINE,
    NETWORKS,
    SETTINGS,
    STUDIED_ORDERS,
    big_switch_of,
    colocated,
    costs_of,
    draws,
    exclusive,
    imprecise,
    order_points,
    over_layers,
)


def workload_names(cfg: DictConfig) -> list[str]:
    """Names of the workloads, in run order (gating traces, then Zipf matrices)."""
    a = cfg.aurora
    return [f"gating-z{z:g}" for z in a.gating_zipf] + [f"zipf-{z:g}" for z in a.traffic_zipf]


def model_pairs(cfg: DictConfig) -> list[tuple[str, str]]:
    """The colocated model pairs: each workload with the next one (cyclically); a lone workload with itself."""
    names = workload_names(cfg)
    return [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]


def pair_name(pair: tuple[str, str]) -> str:
    return "+".join(pair)


def trace_config(cfg: DictConfig, data_zipf: float) -> DictConfig:
    """The config of the traced model: ``aurora.num_experts`` experts in every one of
    ``aurora.moe_layers`` layers, top-1 dropless routing (a trace counts every token's choice)."""
    a = cfg.aurora
    return OmegaConf.merge(
        cfg,
        {
            "model": {"n_layers": a.moe_layers, "moe_every": 1},
            "moe": {"num_experts": a.num_experts, "top_k": 1, "dropless": True},
            "train": {"data_zipf": data_zipf},
        },
    )


def token_workloads(cfg: DictConfig, n_gpus: int) -> dict[str, np.ndarray]:
    """Workload name -> (layers, n_gpus, n_gpus) token counts (see the module docstring)."""
    a = cfg.aurora
    workloads = {
        f"gating-z{z:g}": gating_token_matrices(trace_config(cfg, z), n_gpus, a.train_steps, a.trace_batch_size)
        for z in a.gating_zipf
    }
    tokens_per_gpu = a.trace_batch_size * cfg.model.seq_len // n_gpus
    for z in a.traffic_zipf:
        workloads[f"zipf-{z:g}"] = zipf_token_matrices(n_gpus, tokens_per_gpu, z, a.moe_layers, cfg.train.seed)
    return workloads


# ---- the run ----


@dataclass
class Point:
    """One record to write: its experiment, point name, parameters, samples and single-value metrics."""

    experiment: str
    name: str
    params: dict[str, Any]
    samples: dict[str, list[float]]
    extra: dict[str, float]


def aurora_points(cfg: DictConfig) -> dict[str, list[str]]:
    """Experiment -> point names one run writes (pure; the workflow declares them as outputs)."""
    a, names = cfg.aurora, workload_names(cfg)
    pairs = [pair_name(p) for p in model_pairs(cfg)]
    order = [f"homogeneous_fig4-toy_l1_{k}" for k in STUDIED_ORDERS]
    order += [
        f"{net}_{w}_l{layer_index + 1}_{k}"
        for net in NETWORKS
        for w in names
        for layer_index in range(a.moe_layers)
        for k in STUDIED_ORDERS
    ]
    deployment = [
        f"{s}_{w}_{p}"
        for s in SETTINGS
        for w in (names if s.startswith("exclusive") else pairs)
        for p in DEPLOYMENT_POLICIES[s]
    ]
    gap = [f"{pair}_l{layer_index + 1}" for pair in pairs for layer_index in range(a.moe_layers)]
    imprecision = [
        f"{s}_{w}_p{level:g}"
        for s in IMPRECISION_BASELINE
        for w in (names if s.startswith("exclusive") else pairs)
        for level in a.imprecision
    ]
    return {
        "aurora_order": order,
        "aurora_deployment": deployment,
        "aurora_gap": gap,
        "aurora_imprecision": imprecision,
    }


def run(cfg: DictConfig, hardware: dict[str, DictConfig], progress: Callable[[str], None]) -> list[Point]:
    """Every point of the four experiments (nothing written)."""
    a = cfg.aurora
    n, seed = a.num_experts, cfg.train.seed
    costs = costs_of(cfg, hardware["homogeneous"])
    clusters = {net: big_switch_of(hardware[net], n, costs.reference_flops) for net in NETWORKS}
    tokens = token_workloads(cfg, n)
    progress(f"workloads: {', '.join(tokens)}")
    stats = {w: [costs.stats(t) for t in layers] for w, layers in tokens.items()}
    base = {"n_gpus": n, "moe_layers": a.moe_layers}
    points = []

    # (a) transmission order
    toy = traffic_bytes(FIG4_TOY_TOKENS, costs.d_model, costs.element_bytes)
    toy_bw = clusters["homogeneous"].bandwidth[0]
    for kind, metrics in order_points(toy, toy_bw, seed).items():
        points.append(_order_point("homogeneous", "fig4-toy", 0, kind, metrics, {**base, "n_gpus": len(toy)}))
    for net in NETWORKS:
        for w, layers in stats.items():
            for layer_index, layer in enumerate(layers):
                for kind, metrics in order_points(layer.traffic, clusters[net].bandwidth, seed).items():
                    points.append(_order_point(net, w, layer_index, kind, metrics, base))
    progress("transmission order done")

    # (b) deployment
    t_aurora: dict[tuple[str, str], float] = {}
    for setting in SETTINGS:
        deployment, net = setting.split("-")
        cluster = clusters[net]
        units = list(stats) if deployment == "exclusive" else [pair_name(p) for p in model_pairs(cfg)]
        for unit in units:
            for policy in DEPLOYMENT_POLICIES[setting]:
                times, utils = [], []
                for s in draws(cfg, policy):
                    if deployment == "exclusive":
                        t, u = exclusive(stats[unit], cluster, policy, s)
                    else:
                        w_a, w_b = unit.split("+")
                        t, u = colocated(stats[w_a], stats[w_b], cluster, policy, s)
                    times.append(1e3 * t)
                    utils.append(u)
                samples = {"inference_ms": times, "gpu_utilisation": utils}
                if policy == "aurora":
                    t_aurora[setting, unit] = times[0]
                elif policy != "aurora-exclusive":
                    samples["aurora_speedup"] = [t / t_aurora[setting, unit] for t in times]
                points.append(
                    Point(
                        "aurora_deployment",
                        f"{setting}_{unit}_{policy}",
                        {
                            **base,
                            "setting": setting,
                            "deployment": deployment,
                            "network": net,
                            "workload": unit,
                            "policy": policy,
                        },
                        samples,
                        {},
                    )
                )
    progress("deployment done")

    # (c) gap of Section 7's heuristic to the brute-force optimum
    g = a.gap_gpus
    small = big_switch_of(hardware["heterogeneous"], g, costs.reference_flops)
    for w_a, w_b in model_pairs(cfg):
        for layer_index in range(a.moe_layers):
            la, lb = (costs.stats(coarsen(tokens[w][layer_index], g)) for w in (w_a, w_b))
            partner, gpu_of = colocation.colocate_heterogeneous(la, lb, small.bandwidth, small.speed)
            heuristic = colocation.pair_cost_on_gpus(la, lb, partner, small.bandwidth, small.speed)[
                np.arange(g), gpu_of
            ].max()
            optimum = colocation.brute_force_heterogeneous(la, lb, small.bandwidth, small.speed)[2]
            points.append(
                Point(
                    "aurora_gap",
                    f"{w_a}+{w_b}_l{layer_index + 1}",
                    {
                        **base,
                        "n_gpus": g,
                        "setting": "colocated-heterogeneous",
                        "network": "heterogeneous",
                        "workload": f"{w_a}+{w_b}",
                        "layer": layer_index + 1,
                        "policy": "aurora",
                    },
                    {
                        "heuristic_ms": [1e3 * heuristic],
                        "optimum_ms": [1e3 * optimum],
                        "gap_to_optimum": [heuristic / optimum],
                    },
                    {},
                )
            )
    progress("gap to optimum done")

    # (d) imprecision: Aurora plans on perturbed traffic, is timed on the true traffic
    for setting, baseline in IMPRECISION_BASELINE.items():
        deployment, net = setting.split("-")
        cluster = clusters[net]
        units = list(stats) if deployment == "exclusive" else [pair_name(p) for p in model_pairs(cfg)]
        for unit in units:
            baseline_ms = next(
                p.samples["inference_ms"]
                for p in points
                if p.experiment == "aurora_deployment" and p.name == f"{setting}_{unit}_{baseline}"
            )
            for level in a.imprecision:
                if deployment == "exclusive":
                    plan = [costs.stats(t) for t in imprecise(tokens[unit], level)]
                    t, _ = over_layers(
                        [
                            colocation.exclusive_inference(
                                [true],
                                colocation.assign_exclusive(p.send + p.recv, cluster.speed),
                                cluster.bandwidth,
                                cluster.speed,
                                DEPLOYMENT_ORDER,
                            )
                            for true, p in zip(stats[unit], plan)
                        ]
                    )
                else:
                    w_a, w_b = unit.split("+")
                    plan_a, plan_b = ([costs.stats(t) for t in imprecise(tokens[w], level)] for w in (w_a, w_b))
                    t, _ = colocated(stats[w_a], stats[w_b], cluster, "aurora", seed, plan_a, plan_b)
                points.append(
                    Point(
                        "aurora_imprecision",
                        f"{setting}_{unit}_p{level:g}",
                        {
                            **base,
                            "setting": setting,
                            "deployment": deployment,
                            "network": net,
                            "workload": unit,
                            "policy": "aurora",
                            "baseline": baseline,
                            "imprecision": level,
                        },
                        {"inference_ms": [1e3 * t], "aurora_speedup": [b / (1e3 * t) for b in baseline_ms]},
                        {},
                    )
                )
    progress("imprecision done")
    return points


def _order_point(
    net: str, workload: str, layer: int, kind: str, metrics: dict[str, float], base: dict[str, Any]
) -> Point:
    extra = {k: metrics.pop(k) for k in ("rounds", "receiver_skew")}  # single values, not samples
    return Point(
        "aurora_order",
        f"{net}_{workload}_l{layer + 1}_{kind}",
        {**base, "network": net, "workload": workload, "layer": layer + 1, "policy": kind},
        {k: [v] for k, v in metrics.items()},
        extra,
    )
