"""Aurora's experiments on its big-switch system model: the simulated executor of Aurora's decisions.

    python -m experiments.aurora --config configs/default.yaml [key=value ...]

Li et al., "Optimizing Mixture-of-Experts Inference Time Combining Model Deployment and Communication
Scheduling", arXiv 2410.17043 (reference/papers.md §5). The decisions are moe_core.a2a_schedule
(transmission order) and moe_core.colocation (expert-to-GPU assignment, colocation); this module only
feeds them workloads and reads their times off Aurora's system model (Section 3): a non-blocking big
switch with per-GPU send and receive caps, synchronous all-to-alls, no overlap inside one model.

Workloads (moe_core.workloads), each with a name recorded on every point: ``gating-z<zipf>`` are
real routing traces of our MoE model trained on data of Zipf skew ``aurora.gating_zipf``;
``zipf-<zipf>`` are parametric matrices of skew ``aurora.traffic_zipf``. Each has
``aurora.moe_layers`` layers of ``aurora.num_experts`` experts, expert e on GPU e. The traces give
token counts; the served model's size gives each token's cost: one ``aurora.d_model`` activation of
``aurora.element_bytes`` on the wire, and gate, FFN (``aurora.d_ff``) and aggregation FLOPs on the
hardware profile's GPUs (``peak_tflops * compute_efficiency``). Networks: ``aurora.homogeneous_hardware`` (100 Gb/s per
GPU) and ``aurora.heterogeneous_hardware`` (100/80/50/40 Gb/s, GPU speed assumed proportional).

Experiments (results/raw/aurora/<experiment>/<point>.json, mode simulated, backend sim):

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

All records are computed first and written at the end (each atomically), so a failing run writes none.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from moe_core import colocation as co
from moe_core.a2a_schedule import async_time, lower_bound, make_schedule, rounds_time
from moe_core.config import CONFIG_DIR, ConfigError, config_arg_parser, load_config, to_container
from moe_core.results import make_record, record_path, write_record
from moe_core.workloads import (FIG4_TOY_TOKENS, coarsen, gating_token_matrices, receiver_skew, traffic_bytes,
                                zipf_token_matrices)

PAPER = "aurora"
ORDERS = ("naive", "sjf", "rcs", "aurora", "exact")  # moe_core.a2a_schedule.SCHEDULE_KINDS, baselines first
NETWORKS = ("homogeneous", "heterogeneous")
SETTINGS = ("exclusive-homogeneous", "exclusive-heterogeneous", "colocated-homogeneous", "colocated-heterogeneous")
# Policies per setting; the first is Aurora, the others its baselines (papers.md §5.4). Orders are the
# baselines of the exclusive homogeneous case; elsewhere every all-to-all runs in the exact order, so a
# speedup isolates the deployment decision. ``aurora-exclusive`` (colocated settings, Fig. 12 only):
# each model alone on its own GPUs of the same kind, i.e. twice the GPUs.
POLICIES = {
    "exclusive-homogeneous": ("aurora", "naive", "sjf", "rcs"),
    "exclusive-heterogeneous": ("aurora", "rga"),
    "colocated-homogeneous": ("aurora", "lina", "rec", "aurora-exclusive"),
    "colocated-heterogeneous": ("aurora", "lina", "rec", "rga+rec", "aurora-exclusive"),
}
RANDOM_POLICIES = ("rcs", "rga", "rec", "rga+rec")  # one sample per draw of aurora.random_draws
IMPRECISION_BASELINE = {"exclusive-heterogeneous": "rga", "colocated-heterogeneous": "rga+rec"}
DEPLOYMENT_ORDER = "exact"


# ---- configuration ----------------------------------------------------------------------------

def check_config(cfg: DictConfig) -> None:
    """The aurora section's checks a type cannot express; ConfigError naming the key."""
    a = cfg.aurora
    known = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))
    for key in ("homogeneous_hardware", "heterogeneous_hardware"):
        if a[key] not in known:
            raise ConfigError(f"config key 'aurora.{key}': '{a[key]}' has no configs/hardware/{a[key]}.yaml; "
                              f"allowed: {known}")
    for key in ("num_experts", "moe_layers", "trace_batch_size", "random_draws", "world_size", "d_model", "d_ff",
                "bytes_per_rank", "iters", "element_bytes"):
        if a[key] < 1:
            raise ConfigError(f"config key 'aurora.{key}': must be >= 1, got {a[key]}")
    for key in ("train_steps", "warmup_iters"):
        if a[key] < 0:
            raise ConfigError(f"config key 'aurora.{key}': must be >= 0, got {a[key]}")
    if a.moe_layers < 2:
        raise ConfigError(f"config key 'aurora.moe_layers': the imprecision experiment needs >= 2 layers, "
                          f"got {a.moe_layers}")
    if not 2 <= a.gap_gpus <= 7:
        raise ConfigError(f"config key 'aurora.gap_gpus': brute force needs 2..7 GPUs, got {a.gap_gpus}")
    if a.num_experts % 2 or a.num_experts % a.gap_gpus:
        raise ConfigError(f"config key 'aurora.num_experts': must be even (Lina packs experts in pairs) and a "
                          f"multiple of aurora.gap_gpus={a.gap_gpus}, got {a.num_experts}")
    if a.num_experts % a.world_size or a.world_size < 2:
        raise ConfigError(f"config key 'aurora.world_size': must be >= 2 and divide aurora.num_experts="
                          f"{a.num_experts}, got {a.world_size}")
    tokens = a.trace_batch_size * cfg.model.seq_len
    if tokens % a.num_experts:
        raise ConfigError(f"config key 'aurora.trace_batch_size': the traced tokens (trace_batch_size * "
                          f"model.seq_len = {tokens}) must split evenly over aurora.num_experts={a.num_experts} GPUs")
    if not a.gating_zipf and not a.traffic_zipf:
        raise ConfigError("config key 'aurora.gating_zipf': give at least one workload (gating_zipf or traffic_zipf)")
    for key in ("gating_zipf", "traffic_zipf"):
        if any(z < 0 for z in a[key]):
            raise ConfigError(f"config key 'aurora.{key}': Zipf exponents must be >= 0, got {list(a[key])}")
    if not a.imprecision or any(not 0 <= p < 1 for p in a.imprecision):
        raise ConfigError(f"config key 'aurora.imprecision': levels must be in [0, 1), got {list(a.imprecision)}")


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
    return OmegaConf.merge(cfg, {"model": {"n_layers": a.moe_layers, "moe_every": 1},
                                 "moe": {"num_experts": a.num_experts, "top_k": 1, "dropless": True},
                                 "train": {"data_zipf": data_zipf}})


def token_workloads(cfg: DictConfig, n_gpus: int) -> dict[str, np.ndarray]:
    """Workload name -> (layers, n_gpus, n_gpus) token counts (see the module docstring)."""
    a = cfg.aurora
    workloads = {f"gating-z{z:g}": gating_token_matrices(trace_config(cfg, z), n_gpus, a.train_steps,
                                                         a.trace_batch_size)
                 for z in a.gating_zipf}
    tokens_per_gpu = a.trace_batch_size * cfg.model.seq_len // n_gpus
    for z in a.traffic_zipf:
        workloads[f"zipf-{z:g}"] = zipf_token_matrices(n_gpus, tokens_per_gpu, z, a.moe_layers, cfg.train.seed)
    return workloads


# ---- the system model -------------------------------------------------------------------------

@dataclass(frozen=True)
class Cluster:
    """n GPUs on a big switch: per-GPU bandwidth (bytes/s) and speed (relative to the reference GPU)."""

    bandwidth: np.ndarray  # (n,)
    speed: np.ndarray  # (n,)


def cluster_of(hardware: DictConfig, n: int, reference_flops: float) -> Cluster:
    """The profile's devices scaled to ``n`` GPUs: its GPU classes in equal proportion, fastest first."""
    classes = hardware.gpu_classes or [{"count": 1, "nic_GBps": hardware.nic_GBps, "peak_tflops": hardware.peak_tflops}]
    total = sum(c["count"] for c in classes)
    counts = [c["count"] * n // total for c in classes]
    if sum(counts) != n or min(counts) < 1:
        raise ConfigError(f"config key 'aurora.num_experts' / 'aurora.gap_gpus': hardware profile '{hardware.name}' "
                          f"(GPU classes of {[c['count'] for c in classes]} devices) cannot be scaled to {n} GPUs in "
                          f"equal proportion; use a multiple of {len(classes)} GPUs")
    bandwidth = np.repeat([c["nic_GBps"] * 1e9 for c in classes], counts)
    flops = np.repeat([c["peak_tflops"] * 1e12 * hardware.compute_efficiency for c in classes], counts)
    if (bandwidth <= 0).any() or (flops <= 0).any():
        raise ConfigError(f"hardware profile '{hardware.name}' (aurora.*_hardware) needs positive nic_GBps and "
                          "peak_tflops for Aurora's system model")
    return Cluster(bandwidth, flops / reference_flops)


@dataclass(frozen=True)
class Costs:
    """Per-token wire bytes and FLOPs of one MoE layer of the served model, and the reference GPU's rate."""

    d_model: int
    element_bytes: int  # per activation element on the wire
    gate_flops: float  # gate projection: 2 * d_model * num_experts
    ffn_flops: float  # expert FFN, two GEMMs: 4 * d_model * d_ff
    aggregation_flops: float  # weighted sum of the returned expert output: 2 * d_model
    reference_flops: float  # FLOP/s of speed 1

    def stats(self, tokens: np.ndarray) -> co.LayerStats:
        """Table 1's inputs of one layer from its (n, n) token counts: shard i holds row i's tokens
        (gate and aggregation), expert j computes column j's (FFN)."""
        held, received = tokens.sum(axis=1), tokens.sum(axis=0)
        return co.LayerStats(traffic=traffic_bytes(tokens, self.d_model, self.element_bytes),
                             gate_s=held * self.gate_flops / self.reference_flops,
                             ffn_s=received * self.ffn_flops / self.reference_flops,
                             agg_s=held * self.aggregation_flops / self.reference_flops)


def costs_of(cfg: DictConfig, reference: DictConfig) -> Costs:
    a = cfg.aurora
    return Costs(d_model=a.d_model, element_bytes=a.element_bytes, gate_flops=2 * a.d_model * a.num_experts,
                 ffn_flops=4 * a.d_model * a.d_ff, aggregation_flops=2 * a.d_model,
                 reference_flops=reference.peak_tflops * 1e12 * reference.compute_efficiency)


def hardware_of(cfg: DictConfig, args_config: list[str], overrides: list[str], profile: str) -> DictConfig:
    """The hardware section of ``profile``, loaded through the schema like any run's."""
    return load_config(args_config, [*overrides, f"hardware_profile={profile}"]).hardware


def over_layers(per_layer: list[tuple[float, float]]) -> tuple[float, float]:
    """(inference time, utilisation) of layers run one after another: times add, compute adds."""
    total = sum(t for t, _ in per_layer)
    return total, sum(t * u for t, u in per_layer) / total


# ---- (a) transmission order -------------------------------------------------------------------

def order_points(traffic: np.ndarray, bandwidth: np.ndarray, seed: int) -> dict[str, dict[str, float]]:
    """Per order: the dispatch all-to-all's time (async and in rounds), both over T*, the number of
    rounds and the matrix's receiver skew."""
    bound = lower_bound(traffic, bandwidth)
    out = {}
    for kind in ORDERS:
        schedule = make_schedule(kind, traffic, bandwidth, seed)
        a2a, rounds = async_time(schedule, bandwidth), rounds_time(schedule, bandwidth)
        out[kind] = {"a2a_ms": 1e3 * a2a, "rounds_ms": 1e3 * rounds, "lower_bound_ms": 1e3 * bound,
                     "a2a_over_lower_bound": a2a / bound, "rounds_over_lower_bound": rounds / bound,
                     "rounds": len(schedule), "receiver_skew": receiver_skew(traffic)}
    return out


# ---- (b) deployment ---------------------------------------------------------------------------

def exclusive(layers: list[co.LayerStats], cluster: Cluster, policy: str, seed: int) -> tuple[float, float]:
    """One model on its own GPUs; each layer assigned from its own statistics."""
    n = len(cluster.bandwidth)
    results = []
    for layer in layers:
        kind = DEPLOYMENT_ORDER
        if policy == "aurora":  # Theorem 5.1 (identity on a homogeneous cluster)
            gpu_of = co.assign_exclusive(layer.send + layer.recv, cluster.speed)
        elif policy == "rga":
            gpu_of = co.random_assignment(n, seed)
        else:  # an order baseline of the homogeneous case, experts in place
            gpu_of, kind = np.arange(n), policy
        results.append(co.exclusive_inference([layer], gpu_of, cluster.bandwidth, cluster.speed, kind, seed))
    return over_layers(results)


def colocated(layers_a: list[co.LayerStats], layers_b: list[co.LayerStats], cluster: Cluster, policy: str,
              seed: int, plan_a: list[co.LayerStats] | None = None,
              plan_b: list[co.LayerStats] | None = None) -> tuple[float, float]:
    """Two models sharing the GPUs; Aurora decides each layer from ``plan_*`` (default: the true stats)."""
    n = len(cluster.bandwidth)
    bw, speed = cluster.bandwidth, cluster.speed
    plan_a, plan_b = plan_a or layers_a, plan_b or layers_b
    if policy == "lina":
        return over_layers([co.lina_inference([la], [lb], bw, speed) for la, lb in zip(layers_a, layers_b)])
    if policy == "aurora-exclusive":
        (t_a, u_a), (t_b, u_b) = (exclusive(layers, cluster, "aurora", seed) for layers in (layers_a, layers_b))
        return max(t_a, t_b), (u_a + u_b) / 2  # 2n GPUs, each model's busy at its own rate
    results = []
    homogeneous = np.ptp(bw) == 0 and np.ptp(speed) == 0
    for la, lb, pa, pb in zip(layers_a, layers_b, plan_a, plan_b):
        if policy == "aurora" and homogeneous:  # Case II: bottleneck matching, GPUs interchangeable
            partner, gpu_of = co.pair_bottleneck(pa.send, pa.recv, pb.send, pb.recv), np.arange(n)
        elif policy == "aurora":  # Section 7's two bottleneck matchings
            partner, gpu_of = co.colocate_heterogeneous(pa, pb, bw, speed)
        elif policy == "rec":
            partner, gpu_of = co.random_colocation(n, seed), np.arange(n)
        elif policy == "rga+rec":
            partner, gpu_of = co.random_colocation(n, seed), co.random_assignment(n, seed + 1)
        else:
            raise ValueError(f"unknown colocation policy {policy!r}")
        results.append(co.colocated_inference([la], [lb], partner, gpu_of, bw, speed, DEPLOYMENT_ORDER, seed))
    return over_layers(results)


def draws(cfg: DictConfig, policy: str) -> list[int]:
    """Seeds of a policy's samples: aurora.random_draws for random baselines, one otherwise."""
    k = cfg.aurora.random_draws if policy in RANDOM_POLICIES else 1
    return [cfg.train.seed + i for i in range(k)]


# ---- (d) imprecision --------------------------------------------------------------------------

def imprecise(tokens: np.ndarray, level: float) -> np.ndarray:
    """(layers, n, n) planning traffic: layer l mixed with layer l + 1 (cyclic) at ``level``."""
    return (1 - level) * tokens + level * np.roll(tokens, -1, axis=0)


# ---- the run ----------------------------------------------------------------------------------

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
    order = [f"homogeneous_fig4-toy_l1_{k}" for k in ORDERS]
    order += [f"{net}_{w}_l{l + 1}_{k}" for net in NETWORKS for w in names for l in range(a.moe_layers)
              for k in ORDERS]
    deployment = [f"{s}_{w}_{p}" for s in SETTINGS for w in (names if s.startswith("exclusive") else pairs)
                  for p in POLICIES[s]]
    gap = [f"{pair}_l{l + 1}" for pair in pairs for l in range(a.moe_layers)]
    imprecision = [f"{s}_{w}_p{level:g}" for s in IMPRECISION_BASELINE
                   for w in (names if s.startswith("exclusive") else pairs) for level in a.imprecision]
    return {"aurora_order": order, "aurora_deployment": deployment, "aurora_gap": gap,
            "aurora_imprecision": imprecision}


def run(cfg: DictConfig, hardware: dict[str, DictConfig], progress: Callable[[str], None]) -> list[Point]:
    """Every point of the four experiments (nothing written)."""
    a = cfg.aurora
    n, seed = a.num_experts, cfg.train.seed
    costs = costs_of(cfg, hardware["homogeneous"])
    clusters = {net: cluster_of(hardware[net], n, costs.reference_flops) for net in NETWORKS}
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
            for l, layer in enumerate(layers):
                for kind, metrics in order_points(layer.traffic, clusters[net].bandwidth, seed).items():
                    points.append(_order_point(net, w, l, kind, metrics, base))
    progress("transmission order done")

    # (b) deployment
    t_aurora: dict[tuple[str, str], float] = {}
    for setting in SETTINGS:
        deployment, net = setting.split("-")
        cluster = clusters[net]
        units = list(stats) if deployment == "exclusive" else [pair_name(p) for p in model_pairs(cfg)]
        for unit in units:
            for policy in POLICIES[setting]:
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
                points.append(Point("aurora_deployment", f"{setting}_{unit}_{policy}",
                                    {**base, "setting": setting, "deployment": deployment, "network": net,
                                     "workload": unit, "policy": policy}, samples, {}))
    progress("deployment done")

    # (c) gap of Section 7's heuristic to the brute-force optimum
    g = a.gap_gpus
    small = cluster_of(hardware["heterogeneous"], g, costs.reference_flops)
    for w_a, w_b in model_pairs(cfg):
        for l in range(a.moe_layers):
            la, lb = (costs.stats(coarsen(tokens[w][l], g)) for w in (w_a, w_b))
            partner, gpu_of = co.colocate_heterogeneous(la, lb, small.bandwidth, small.speed)
            heuristic = co.pair_cost_on_gpus(la, lb, partner, small.bandwidth, small.speed)[np.arange(g), gpu_of].max()
            optimum = co.brute_force_heterogeneous(la, lb, small.bandwidth, small.speed)[2]
            points.append(Point("aurora_gap", f"{w_a}+{w_b}_l{l + 1}",
                                {**base, "n_gpus": g, "setting": "colocated-heterogeneous", "network": "heterogeneous",
                                 "workload": f"{w_a}+{w_b}", "layer": l + 1, "policy": "aurora"},
                                {"heuristic_ms": [1e3 * heuristic], "optimum_ms": [1e3 * optimum],
                                 "gap_to_optimum": [heuristic / optimum]}, {}))
    progress("gap to optimum done")

    # (d) imprecision: Aurora plans on perturbed traffic, is timed on the true traffic
    for setting, baseline in IMPRECISION_BASELINE.items():
        deployment, net = setting.split("-")
        cluster = clusters[net]
        units = list(stats) if deployment == "exclusive" else [pair_name(p) for p in model_pairs(cfg)]
        for unit in units:
            baseline_ms = next(p.samples["inference_ms"] for p in points if p.experiment == "aurora_deployment"
                               and p.name == f"{setting}_{unit}_{baseline}")
            for level in a.imprecision:
                if deployment == "exclusive":
                    plan = [costs.stats(t) for t in imprecise(tokens[unit], level)]
                    t, _ = over_layers([co.exclusive_inference(
                        [true], co.assign_exclusive(p.send + p.recv, cluster.speed), cluster.bandwidth,
                        cluster.speed, DEPLOYMENT_ORDER) for true, p in zip(stats[unit], plan)])
                else:
                    w_a, w_b = unit.split("+")
                    plan_a, plan_b = ([costs.stats(t) for t in imprecise(tokens[w], level)] for w in (w_a, w_b))
                    t, _ = colocated(stats[w_a], stats[w_b], cluster, "aurora", seed, plan_a, plan_b)
                points.append(Point("aurora_imprecision", f"{setting}_{unit}_p{level:g}",
                                    {**base, "setting": setting, "deployment": deployment, "network": net,
                                     "workload": unit, "policy": "aurora", "baseline": baseline,
                                     "imprecision": level},
                                    {"inference_ms": [1e3 * t], "aurora_speedup": [b / (1e3 * t) for b in baseline_ms]},
                                    {}))
    progress("imprecision done")
    return points


def _order_point(net: str, workload: str, layer: int, kind: str, metrics: dict[str, float],
                 base: dict[str, Any]) -> Point:
    extra = {k: metrics.pop(k) for k in ("rounds", "receiver_skew")}  # single values, not samples
    return Point("aurora_order", f"{net}_{workload}_l{layer + 1}_{kind}",
                 {**base, "network": net, "workload": workload, "layer": layer + 1, "policy": kind},
                 {k: [v] for k, v in metrics.items()}, extra)


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    args = parser.parse_intermixed_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)  # one small model and small matrices: threads only contend (results do not depend on it)
    try:
        cfg = load_config(args.config, args.overrides)
        check_config(cfg)
        hardware = {net: hardware_of(cfg, args.config, args.overrides, cfg.aurora[f"{net}_hardware"])
                    for net in NETWORKS}
        points = run(cfg, hardware, lambda msg: print(f"aurora: {msg} ({time.perf_counter() - started:.1f} s)",
                                                      file=sys.stderr))
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    expected = aurora_points(cfg)
    assert {e: [p.name for p in points if p.experiment == e] for e in expected} == expected, "point names drifted"
    config = to_container(cfg)
    for p in points:
        hw = cfg.aurora[f"{p.params['network']}_hardware"]
        record = make_record(paper=PAPER, experiment=p.experiment, point=p.name, mode="simulated", backend="sim",
                             hardware=hw, params=p.params, samples=p.samples, config=config, extra_metrics=p.extra)
        write_record(record, record_path(cfg.results_dir, PAPER, p.experiment, p.name))
    print(f"aurora: wrote {len(points)} records under {cfg.results_dir}/raw/{PAPER}/ in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
