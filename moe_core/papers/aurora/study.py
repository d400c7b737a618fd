"""Aurora's four simulated experiments: workloads, points and the run.

Workloads (moe_core.comm.workloads), each with a name recorded on every point: ``gating-z<zipf>`` are
real routing traces of our MoE model trained on data of Zipf skew ``aurora.gating_zipf``;
``zipf-<zipf>`` are parametric matrices of skew ``aurora.traffic_zipf``. Each has
``aurora.moe_layers`` layers of ``aurora.num_experts`` experts, expert e on GPU e. The traces give
how tokens spread; the served model (``aurora`` section: its size and tokens per GPU) how many
there are and what they cost (inference_sim.py).

Experiments (records under results/raw/aurora/<experiment>/<point>.json, written by experiments/aurora.py):

* ``aurora_order``: per network, workload, layer and transmission order (naive, sjf, rcs,
  aurora = Algorithm 1, exact = BvN): the dispatch all-to-all alone, its transfers issued in that
  order through the simulator's network engine (``a2a_ms``), in barrier-separated rounds (the
  paper's time slots, ``rounds_ms``), and both over T*. Also Fig. 4's 3-GPU example (``fig4-toy``).
* ``aurora_deployment``: per setting (exclusive/colocated x homogeneous/heterogeneous), workload
  (two workloads, one per model, when colocated) and policy (deployment.py): the simulated
  inference time of the model(s) over all MoE layers, their all-to-all time and GPU utilisation; a
  baseline's record also carries Aurora's speedup over it (Figs. 11, 12). Random baselines have
  one sample per draw. Also run at the other ends of the unstated parameters' ranges
  (``config.AURORA_UNSTATED``), as sensitivity runs whose records carry the param ``unstated``.
* ``aurora_gap``: per model pair and layer, on ``aurora.gap_gpus`` heterogeneous GPUs: Section 7's
  colocation heuristic against the brute-force optimum of the same 3-D matching objective (the
  busiest GPU's dispatch bytes over its bandwidth plus its FFN time over its speed, Fig. 13), and
  both deployments simulated.
* ``aurora_imprecision``: per heterogeneous setting, workload and imprecision level p: Aurora
  plans layer l on (1 - p) * D_l + p * D_{l+1} (the next layer's traffic as the noise, Fig. 14's
  "other layers as noise") and is simulated on D_l, against the random baselines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from moe_core.comm.transmission import lower_bound, make_schedule, rounds_time
from moe_core.comm.workloads import FIG4_TOY_TOKENS, coarsen, gating_token_matrices, receiver_skew, zipf_token_matrices
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.papers.aurora import (
    colocation,
    deployment,
    transmission_order,  # noqa: F401  (registers the orders of STUDIED_ORDERS)
)
from moe_core.papers.aurora.config import AURORA_UNSTATED
from moe_core.papers.aurora.inference_sim import BigSwitch, ServedModel, big_switch, exchange_seconds
from moe_core.schema.points import unstated_param, unstated_variants

PAPER = "aurora"
NETWORKS = ("homogeneous", "heterogeneous")
STUDIED_ORDERS = ("naive", "sjf", "rcs", "aurora", "exact")  # moe_core.comm.transmission.ORDERS names, baselines first
IMPRECISION_BASELINE = {"exclusive-heterogeneous": "rga", "colocated-heterogeneous": "rga+rec"}
# What a sensitivity run repeats: the deployment experiment's Aurora and Fig 11's baselines (SJF, RCS,
# RGA, Lina), the numbers of Figs 11-12; the other baselines only in the chosen values' run.
SENSITIVITY_POLICIES = ("aurora", "sjf", "rcs", "rga", "lina")
# The settings whose decision places experts, each checked against the brute-force optimum of its
# objective (exclusive homogeneous has no placement: its order is checked against T*): Theorem 5.1's
# sort and Case II's bottleneck matching are exact, Section 7's two matchings a heuristic (Fig 13).
GAP_SETTINGS = ("exclusive-heterogeneous", "colocated-homogeneous", "colocated-heterogeneous")


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


def setting_units(setting: str, names: list[str], pairs: list[str]) -> list[str]:
    """What a setting deploys: each workload's model alone (``names``) in an exclusive setting, model
    pairs (``pairs``) in a colocated one."""
    return names if setting.startswith("exclusive") else pairs


def setting_network(setting: str) -> str:
    """The network of a setting, named ``<deployment>-<network>``."""
    return setting.split("-")[1]


def sensitivity_runs(cfg: DictConfig) -> dict[str, list[str]]:
    """Point-name suffix -> overrides of every sensitivity run (``config.AURORA_UNSTATED``)."""
    return unstated_variants(cfg, "", [], AURORA_UNSTATED)


def trace_config(cfg: DictConfig, data_zipf: float) -> DictConfig:
    """The config of the traced model: ``aurora.num_experts`` experts in every one of
    ``aurora.moe_layers`` layers, top-1 dropless routing (a trace counts every token's choice)."""
    a = cfg.aurora
    return OmegaConf.merge(
        cfg,
        {
            "model": {"n_layers": a.moe_layers, "moe_every": 1},
            "moe": {"num_experts": a.num_experts, "top_k": 1},
            "train": {"data_zipf": data_zipf},
        },
    )


def token_workloads(cfg: DictConfig, n_gpus: int) -> dict[str, np.ndarray]:
    """Workload name -> (layers, n_gpus, n_gpus) token counts (see the module docstring)."""
    a = cfg.aurora
    workloads = {
        f"gating-z{z:g}": gating_token_matrices(
            trace_config(cfg, z), n_gpus, a.train_steps, a.trace_batch_size, dropless=True
        )
        for z in a.gating_zipf
    }
    tokens_per_gpu = a.trace_batch_size * cfg.model.seq_len // n_gpus
    for z in a.traffic_zipf:
        workloads[f"zipf-{z:g}"] = zipf_token_matrices(n_gpus, tokens_per_gpu, z, a.moe_layers, cfg.train.seed)
    return workloads


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
    deployment_points = [
        f"{s}_{w}_{p}"
        for s in deployment.SETTINGS
        for w in setting_units(s, names, pairs)
        for p in deployment.DEPLOYMENT_POLICIES[s]
    ]
    gap = [
        f"{s}_{unit}_l{layer_index + 1}"
        for s in GAP_SETTINGS
        for unit in setting_units(s, names, pairs)
        for layer_index in range(a.moe_layers)
    ]
    imprecision = [
        f"{s}_{w}_p{level:g}"
        for s in IMPRECISION_BASELINE
        for w in setting_units(s, names, pairs)
        for level in a.imprecision
    ]
    deployment_points += [
        f"{name}{suffix}"
        for suffix in sensitivity_runs(cfg)
        for name in deployment_points
        if name.rsplit("_", 1)[1] in SENSITIVITY_POLICIES
    ]
    return {
        "aurora_order": order,
        "aurora_deployment": deployment_points,
        "aurora_gap": gap,
        "aurora_imprecision": imprecision,
    }


class Study:
    """One run's clusters, served models and workloads (a sensitivity run has its own clusters and
    served models, the same workloads)."""

    def __init__(self, cfg: DictConfig, hardware: dict[str, DictConfig], tokens: dict[str, np.ndarray]):
        self.cfg, self.tokens = cfg, tokens
        self.seed = cfg.train.seed
        n = cfg.aurora.num_experts
        self.clusters = {net: big_switch(hardware[net], n) for net in NETWORKS}
        self.served = {net: ServedModel(cfg, cluster) for net, cluster in self.clusters.items()}
        self.stats = {
            net: {w: [served.stats(t) for t in layers] for w, layers in tokens.items()}
            for net, served in self.served.items()
        }
        self.base = {**unstated_param(cfg), "n_gpus": n, "moe_layers": cfg.aurora.moe_layers}

    def draws(self, policy: str) -> list[int]:
        """Seeds of a policy's samples: aurora.random_draws for random baselines, one otherwise."""
        k = self.cfg.aurora.random_draws if policy in deployment.RANDOM_POLICIES else 1
        return [self.seed + i for i in range(k)]

    def units(self, setting: str) -> list[str]:
        """The workloads of a setting: one per model alone, pairs when colocated."""
        return setting_units(setting, list(self.tokens), [pair_name(p) for p in model_pairs(self.cfg)])

    def deploy(self, setting: str, unit: str, policy: str, seed: int, stats=None) -> deployment.Deployment:
        """``policy``'s deployment of ``unit`` in ``setting``, decided on ``stats`` (default: the true ones)."""
        net = setting_network(setting)
        cluster, stats = self.clusters[net], stats or self.stats[net]
        if setting.startswith("exclusive"):
            return deployment.exclusive(stats[unit], cluster.speed, policy, seed)
        w_a, w_b = unit.split("+")
        return deployment.colocated((stats[w_a], stats[w_b]), cluster.bandwidth, cluster.speed, policy, seed)

    def simulate(self, setting: str, unit: str, plan: deployment.Deployment, seed: int) -> dict[str, float]:
        """The simulated inference of ``unit``'s true workloads deployed by ``plan``."""
        workloads = [self.tokens[w] for w in unit.split("+")]
        return self.served[setting_network(setting)].simulate(workloads, plan, seed)


def run(
    cfg: DictConfig, hardware: dict[str, DictConfig], progress: Callable[[str], None], tokens: dict[str, np.ndarray]
) -> list[Point]:
    """Every point of the four experiments (nothing written); ``tokens``: the workloads (``token_workloads``)."""
    study = Study(cfg, hardware, tokens)
    points = _order_points(study)
    progress("aurora_order done")
    points += _deployment_points(study)
    progress("aurora_deployment done")
    points += _gap_points(study)
    progress("aurora_gap done")
    points += _imprecision_points(study, points)
    progress("aurora_imprecision done")
    return points


def run_sensitivity(
    cfg: DictConfig,
    hardware: dict[str, DictConfig],
    progress: Callable[[str], None],
    tokens: dict[str, np.ndarray],
    suffix: str,
) -> list[Point]:
    """A sensitivity run's points (``cfg``: its config): the deployment experiment's
    ``SENSITIVITY_POLICIES``, their names ending in ``suffix``."""
    points = _deployment_points(Study(cfg, hardware, tokens), SENSITIVITY_POLICIES)
    for p in points:
        p.name += suffix
    progress(f"aurora_deployment{suffix} done")
    return points


# ---- (a) transmission order ----


def _order_points(study: Study) -> list[Point]:
    """Fig 4's example and every workload's layers in every order, on both networks."""
    toy = FIG4_TOY_TOKENS * study.cfg.aurora.d_model * DTYPE_BYTES[study.cfg.aurora.dtype]
    toy_switch = big_switch(study.clusters["homogeneous"].hardware, len(toy))
    points = [
        _order_point(study, "homogeneous", "fig4-toy", 0, kind, metrics, len(toy))
        for kind, metrics in order_metrics(toy_switch, toy, study.seed).items()
    ]
    for net in NETWORKS:
        for w, layers in study.stats[net].items():
            for layer_index, layer in enumerate(layers):
                for kind, metrics in order_metrics(study.clusters[net], layer.traffic, study.seed).items():
                    points.append(_order_point(study, net, w, layer_index, kind, metrics))
    return points


def order_metrics(cluster: BigSwitch, traffic: np.ndarray, seed: int) -> dict[str, dict[str, float]]:
    """Per order: the all-to-all's time through the network engine and in rounds, both over T*,
    the number of rounds and the matrix's receiver skew."""
    bound, skew = lower_bound(traffic, cluster.bandwidth), receiver_skew(traffic)
    out = {}
    for kind in STUDIED_ORDERS:
        schedule = make_schedule(kind, traffic, cluster.bandwidth, seed)
        a2a, rounds = exchange_seconds(cluster, schedule), rounds_time(schedule, cluster.bandwidth)
        out[kind] = {
            "a2a_ms": 1e3 * a2a,
            "rounds_ms": 1e3 * rounds,
            "lower_bound_ms": 1e3 * bound,
            "a2a_over_lower_bound": a2a / bound,
            "rounds_over_lower_bound": rounds / bound,
            "rounds": len(schedule),
            "receiver_skew": skew,
        }
    return out


def _order_point(
    study: Study, net: str, workload: str, layer: int, kind: str, metrics: dict[str, float], n_gpus: int | None = None
) -> Point:
    extra = {k: metrics.pop(k) for k in ("rounds", "receiver_skew")}  # single values, not samples
    params = {**study.base, "network": net, "workload": workload, "layer": layer + 1, "policy": kind}
    if n_gpus is not None:
        params["n_gpus"] = n_gpus
    return Point(
        "aurora_order", f"{net}_{workload}_l{layer + 1}_{kind}", params, {k: [v] for k, v in metrics.items()}, extra
    )


# ---- (b) deployment ----


def _deployment_points(study: Study, policies: tuple[str, ...] | None = None) -> list[Point]:
    """Every setting, workload and policy (of ``policies`` only, if given; Aurora's first)."""
    points, t_aurora = [], {}
    for setting in deployment.SETTINGS:
        deployed, net = setting.split("-")
        for unit in study.units(setting):
            for policy in deployment.DEPLOYMENT_POLICIES[setting]:
                if policies is not None and policy not in policies:
                    continue
                results = [
                    study.simulate(setting, unit, study.deploy(setting, unit, policy, s), s)
                    for s in study.draws(policy)
                ]
                samples = {k: [r[k] for r in results] for k in ("inference_ms", "a2a_ms", "gpu_utilisation")}
                if policy == "aurora":
                    t_aurora[setting, unit] = samples["inference_ms"][0]
                elif policy != "aurora-exclusive":
                    samples["aurora_speedup"] = [t / t_aurora[setting, unit] for t in samples["inference_ms"]]
                params = {
                    "setting": setting,
                    "deployment": deployed,
                    "network": net,
                    "workload": unit,
                    "policy": policy,
                }
                points.append(
                    Point("aurora_deployment", f"{setting}_{unit}_{policy}", {**study.base, **params}, samples, {})
                )
    return points


# ---- (c) each deployment decision against the brute-force optimum of its objective ----


def _gap_points(study: Study) -> list[Point]:
    """Every workload (exclusive) or model pair (colocated) and layer on ``aurora.gap_gpus`` GPUs of
    each ``GAP_SETTINGS`` setting: the decision's objective over the brute-force optimum; for the
    heuristic also both deployments' simulated inference (Fig 13)."""
    g = study.cfg.aurora.gap_gpus
    points = []
    for setting in GAP_SETTINGS:
        net = setting_network(setting)
        small = big_switch(study.clusters[net].hardware, g)
        served = ServedModel(study.cfg, small)
        for unit in study.units(setting):
            for layer_index in range(study.cfg.aurora.moe_layers):
                tokens = [coarsen(study.tokens[w][layer_index], g) for w in unit.split("+")]
                stats = [served.stats(t) for t in tokens]
                if setting == "colocated-heterogeneous":
                    samples = _heuristic_gap(study, served, small, tokens, stats)
                else:
                    decided, optimum = _exact_decision_and_optimum(setting, stats, small)
                    samples = {
                        "decision_cost": [decided],
                        "optimum_cost": [optimum],
                        "gap_to_optimum": [decided / optimum],
                    }
                params = {"n_gpus": g, "setting": setting, "network": net, "workload": unit, "layer": layer_index + 1}
                name = f"{setting}_{unit}_l{layer_index + 1}"
                points.append(Point("aurora_gap", name, {**study.base, **params, "policy": "aurora"}, samples, {}))
    return points


def _exact_decision_and_optimum(setting: str, stats: list, cluster: BigSwitch) -> tuple[float, float]:
    """(objective of the decision, brute-force optimum) of an exact setting: Theorem 5.1's busiest GPU's
    load over its speed, or Case II's busiest GPU's send or receive bytes."""
    if setting == "exclusive-heterogeneous":
        load = stats[0].load
        decided = colocation.exclusive_cost(load, cluster.speed, colocation.assign_exclusive(load, cluster.speed))
        return decided, colocation.brute_force_exclusive(load, cluster.speed)[1]
    a, b = stats
    weight = colocation.pairing_weights(a.send, a.recv, b.send, b.recv)
    partner = colocation.pair_bottleneck(a.send, a.recv, b.send, b.recv)
    return float(weight[np.arange(len(partner)), partner].max()), colocation.brute_force_matching(weight)[1]


def _heuristic_gap(study: Study, served: ServedModel, small: BigSwitch, tokens: list, stats: list) -> dict:
    """Section 7's heuristic over the optimum of its objective, and both deployments simulated."""
    la, lb = stats
    g = len(small.speed)
    chosen = colocation.colocate_heterogeneous(la, lb, small.bandwidth, small.speed)
    *best, optimum = colocation.brute_force_heterogeneous(la, lb, small.bandwidth, small.speed)
    heuristic = colocation.pair_cost_on_gpus(la, lb, chosen[0], small.bandwidth, small.speed)[
        np.arange(g), chosen[1]
    ].max()
    devices = tuple(range(g))
    simulated = [
        served.simulate([t[None] for t in tokens], _one_layer_colocation(devices, *plan), study.seed)
        for plan in (chosen, best)
    ]
    return {
        "decision_cost": [heuristic],
        "optimum_cost": [optimum],
        "gap_to_optimum": [heuristic / optimum],
        "simulated_heuristic_ms": [simulated[0]["inference_ms"]],
        "simulated_optimum_ms": [simulated[1]["inference_ms"]],
        "simulated_gap": [simulated[0]["inference_ms"] / simulated[1]["inference_ms"]],
    }


def _one_layer_colocation(devices: tuple[int, ...], partner: np.ndarray, gpu_of: np.ndarray) -> deployment.Deployment:
    """One layer of a and b colocated: a's expert i with b's ``partner[i]`` on GPU ``gpu_of[i]``."""
    hosted = (
        deployment.Hosted(0, devices, (gpu_of,)),
        deployment.Hosted(1, devices, (deployment.partnered(partner, gpu_of),)),
    )
    return deployment.Deployment((hosted,), deployment.DEPLOYMENT_ORDER)


# ---- (d) imprecision: Aurora plans on perturbed traffic, is simulated on the true traffic ----


def imprecise(tokens: np.ndarray, level: float) -> np.ndarray:
    """(layers, n, n) planning traffic: layer l mixed with layer l + 1 (cyclic) at ``level``."""
    return (1 - level) * tokens + level * np.roll(tokens, -1, axis=0)


def _imprecision_points(study: Study, done: list[Point]) -> list[Point]:
    """Every heterogeneous setting, workload and level, against the baseline's points in ``done``."""
    points = []
    for setting, baseline in IMPRECISION_BASELINE.items():
        deployed, net = setting.split("-")
        for unit in study.units(setting):
            baseline_ms = next(
                p.samples["inference_ms"]
                for p in done
                if p.experiment == "aurora_deployment" and p.name == f"{setting}_{unit}_{baseline}"
            )
            for level in study.cfg.aurora.imprecision:
                served = study.served[net]
                plan = {w: [served.stats(t) for t in imprecise(study.tokens[w], level)] for w in unit.split("+")}
                t = study.simulate(setting, unit, study.deploy(setting, unit, "aurora", study.seed, plan), study.seed)
                params = {
                    "setting": setting,
                    "deployment": deployed,
                    "network": net,
                    "workload": unit,
                    "policy": "aurora",
                    "baseline": baseline,
                    "imprecision": level,
                }
                samples = {
                    "inference_ms": [t["inference_ms"]],
                    "aurora_speedup": [b / t["inference_ms"] for b in baseline_ms],
                }
                points.append(
                    Point("aurora_imprecision", f"{setting}_{unit}_p{level:g}", {**study.base, **params}, samples, {})
                )
    return points
