"""Aurora's inference simulated: its deployments and transmission orders on the simulator's big switch.

The decisions are deployment.py's (with colocation.py and transmission_order.py); this module gives
them a cluster (a big-switch hardware profile grown to the GPUs a study needs), the served model (the
``aurora`` section's sizes) and its token counts, and times them with the simulator's forward
executor (moe_core.sim.forward.simulate_served): per MoE layer, gate -> copy -> dispatch all-to-all,
issued transfer by transfer in the decided order and timed by the network engine -> experts ->
combine all-to-all in the order planned on its own matrix -> copy (the aggregation); two models
colocated on a GPU take turns on its compute stream stage by stage while the other's tokens travel
(Table 2's timeline, with its overlaps simulated rather than bounded). Every compute op is priced
by the simulator's compute model on each GPU's own peak.

Each served model sends ``aurora.tokens_per_gpu`` tokens from every token shard per layer; a
workload's token matrix says how they spread over the experts (``scaled``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig, OmegaConf

from moe_core.comm.transmission import Schedule, make_schedule
from moe_core.papers.aurora import colocation
from moe_core.papers.aurora.deployment import Deployment, Hosted
from moe_core.schema.build import build_config
from moe_core.schema.derive import to_container
from moe_core.schema.points import own_layout
from moe_core.schema.sections import ConfigError
from moe_core.sim.collectives import PointToPoint, add_ordered_exchange, simulate_on
from moe_core.sim.forward import ForwardModel, Order, simulate_served
from moe_core.sim.topology import Cluster, build_topology


@dataclass(frozen=True)
class BigSwitch:
    """A big-switch profile grown to n GPUs: its topology, each GPU's link rate and relative speed."""

    hardware: DictConfig
    topo: Cluster
    bandwidth: np.ndarray  # (n,) bytes/s a GPU's send and receive links carry (line rate x nic_efficiency)
    speed: np.ndarray  # (n,) peak FLOP/s over the fastest GPU's


def big_switch(hardware: DictConfig, n: int) -> BigSwitch:
    """``hardware`` (one GPU per node on a switch) grown or shrunk to ``n`` GPUs, its GPU classes in
    equal proportion, fastest first (the paper's four types in equal counts)."""
    hw = to_container(hardware)
    if hw["devices_per_node"] != 1:
        raise ConfigError(f"hardware profile '{hw['name']}' is not a big switch (devices_per_node must be 1)")
    classes = hw["gpu_classes"]
    total = sum(c["count"] for c in classes) if classes else n
    counts = [c["count"] * n // total for c in classes]
    if classes and (sum(counts) != n or min(counts) < 1):
        raise ConfigError(
            f"config key 'aurora.num_experts' / 'aurora.gap_gpus': hardware profile '{hw['name']}' (GPU classes "
            f"of {[c['count'] for c in classes]} devices) cannot be scaled to {n} GPUs in equal proportion; "
            f"use a multiple of {len(classes)} GPUs"
        )
    for c, count in zip(classes, counts):
        c["count"] = count
    hw.update(nodes=n, nics_per_node=1)
    grown = OmegaConf.create(hw)
    topo = build_topology(grown)
    return BigSwitch(grown, topo, topo.capacity[topo.nic_out], topo.device_tflops / topo.device_tflops.max())


def exchange_seconds(cluster: BigSwitch, schedule: Schedule) -> float:
    """One all-to-all alone on the switch, its transfers in ``schedule``'s order (make_schedule)."""
    ops = []
    group = np.arange(len(cluster.bandwidth))
    add_ordered_exchange(ops, PointToPoint(cluster.hardware, cluster.topo), group, schedule, "a2a", "dispatch_a2a", [])
    return simulate_on(cluster.hardware, cluster.topo, ops).makespan_s


def scaled(tokens: np.ndarray, tokens_per_gpu: int) -> np.ndarray:
    """(n, n) token counts with every shard (row) holding ``tokens_per_gpu`` tokens in the same proportions."""
    tokens = np.asarray(tokens, dtype=np.float64)
    return tokens / tokens.sum(axis=-1, keepdims=True) * tokens_per_gpu


def routed(tokens: np.ndarray, gpu_of: np.ndarray, devices: int) -> np.ndarray:
    """(S, D, E) rows of one layer (moe_core.sim.forward) when shard and expert e sit on ``gpu_of[e]``."""
    experts = len(gpu_of)
    out = np.zeros((devices, devices, experts))
    np.add.at(out, (gpu_of[:, None], gpu_of[None, :], np.arange(experts)[None, :]), tokens)
    return out


class ServedModel:
    """The served model on a big switch: the decisions' inputs of its layers and the simulated
    inference of a deployment. ``cfg``: the run's config (its ``aurora`` section)."""

    def __init__(self, cfg: DictConfig, cluster: BigSwitch):
        self.cfg, self.cluster = cfg, cluster
        self.experts = len(cluster.bandwidth)
        self._models: dict[tuple[int, ...], ForwardModel] = {}

    def forward(self, devices: tuple[int, ...]) -> ForwardModel:
        """The forward executor of the model's experts on ``devices`` (cached): ``experts / devices``
        experts and as many token shards per GPU, top-1 routing without capacity, MoE layers only."""
        if devices not in self._models:
            a, ranks = self.cfg.aurora, len(devices)
            overrides = [
                *own_layout(),
                f"model.d_model={a.d_model}",
                f"model.d_ff={a.d_ff}",
                "model.n_heads=1",  # attention is not simulated (MoE layers only)
                f"model.n_layers={a.moe_layers}",
                "model.moe_every=1",
                f"model.seq_len={a.tokens_per_gpu * self.experts // ranks}",
                "train.batch_size=1",
                f"train.dtype={a.dtype}",
                f"parallel.world_size={ranks}",
                f"moe.num_experts={self.experts}",
                f"moe.experts_per_rank={self.experts // ranks}",
                "moe.top_k=1",
                "moe.dispatcher=dropless",
                "moe.group_size=0",
                "comm.policy=sequential",
            ]
            data = {**to_container(self.cfg), "hardware_profile": self.cluster.hardware.name}
            data["hardware"] = to_container(self.cluster.hardware)
            run = build_config(data=data, overrides=overrides, whole_run=False)
            self._models[devices] = ForwardModel(run, self.cluster.topo, devices)
        return self._models[devices]

    def stats(self, tokens: np.ndarray) -> colocation.LayerStats:
        """One layer's decision inputs from its (n, n) token counts: the dispatch bytes of ``scaled``
        tokens and every expert's FFN time on the fastest GPU (speed 1)."""
        model = self.forward(tuple(range(self.experts)))
        rows = scaled(tokens, self.cfg.aurora.tokens_per_gpu)
        fastest = model.priced_on(int(np.argmax(self.cluster.speed)))
        return colocation.LayerStats(
            traffic=rows * self.cfg.aurora.d_model * model.elem,
            ffn_s=np.array([fastest.experts_seconds(np.array([r])) for r in rows.sum(axis=0)]),
        )

    def simulate(self, workloads: list[np.ndarray], deployment: Deployment, seed: int) -> dict[str, float]:
        """The inference of models a (and b) deployed so: ``workloads[m]`` (layers, n, n) token counts.

        Returns ``inference_ms`` (the slowest group's MoE layers), ``a2a_ms`` (that group's all-to-alls,
        summed over its models) and ``gpu_utilisation`` (every GPU's compute time over its group's
        inference time, GPUs of every group together)."""
        groups, busy_ms, gpu_ms = [], 0.0, 0.0
        for group in deployment.groups:
            sim = simulate_served([self._served(h, workloads[h.model], deployment.order, seed) for h in group])
            metrics = sim.metrics()
            groups.append((metrics["forward_ms"], metrics["a2a_ms"]))
            busy_ms += 1e3 * float(sim.busy_s.sum())
            gpu_ms += len(group[0].devices) * metrics["forward_ms"]
        inference_ms, a2a_ms = max(groups)
        return {"inference_ms": inference_ms, "a2a_ms": a2a_ms, "gpu_utilisation": busy_ms / gpu_ms}

    def _served(self, hosted: Hosted, tokens: np.ndarray, order: str, seed: int):
        """(forward executor, per-layer rows, order) of one hosted model (``simulate_served``'s input)."""
        model = self.forward(hosted.devices)
        per_gpu = self.cfg.aurora.tokens_per_gpu
        layers = [
            routed(scaled(t, per_gpu), g, len(hosted.devices)) for t, g in zip(tokens, hosted.gpu_of, strict=True)
        ]
        return model, layers, self.order(order, hosted.devices, seed)

    def order(self, kind: str, devices: tuple[int, ...], seed: int) -> Order:
        """The transmission order ``kind`` planned on each exchange's own matrix with the GPUs' rates."""
        bandwidth = self.cluster.bandwidth[list(devices)]
        return lambda traffic: make_schedule(kind, traffic, bandwidth, seed)
