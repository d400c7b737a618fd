"""An inference forward pass as a DAG of operations: the simulated executor of placed MoE inference.

Forward only, on one compute stream, block after block as the measured inference runs them
(experiments/inference.py): the embedding, per block its norms and attention and then the dense FFN
or an MoE layer, and the head with its loss. An MoE layer is gate -> copy -> dispatch all-to-all ->
the experts -> combine all-to-all -> copy, with top-1 routing and no capacity (every token is
computed). What a layer exchanges and computes is the caller's: a placement (which devices hold
which expert, how tokens are dealt to replicas) decided per layer and batch gives the (sources,
devices, experts) rows of the exchange (``routed``). The all-to-alls are uneven, priced from their
traffic matrices on the topology: as the library's all-to-all (one fluid operation), or, given a
transmission order (a function of the traffic matrix that returns its rounds, as the measured
executor plans one per exchange, moe_core.schedule.executor), transfer by transfer in that order
(moe_core.sim.collectives.add_ordered_exchange). Each device computes its experts one after
another, one GEMM pair per expert on its rows (as the measured executor does), on its own peak
FLOP/s (devices of a heterogeneous cluster differ); every compute op waits for the slowest device,
and the exchange back waits for the slowest too. Ops are priced by the training step's compute
model (moe_core.sim.kernels, compute.py).

Served models (:func:`simulate_served`): the MoE layers alone (gate, exchanges, experts, the copy
that aggregates what comes back) of one model, or of several models whose experts share the same
devices. Sharing devices, the models take turns stage by stage (every model's gate, then every
model's experts, then every model's aggregation) on each device's one compute stream, while each
model's exchanges run on its own communicator as soon as its data is ready, so one model computes
while another model's tokens cross the network (Aurora's colocation timeline, Table 2), and two
exchanges in flight together share the links.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from omegaconf import DictConfig

from moe_core.comm.transmission import Schedule
from moe_core.dispatch import routes_dropless
from moe_core.model.capacity import moe_blocks
from moe_core.sim.collectives import PointToPoint, add_ordered_exchange, collective_op, simulate_on
from moe_core.sim.engine import Op, Timeline, as_deps
from moe_core.sim.step import StepModel

INFERENCE_PHASES = ("gate", "dispatch_a2a", "expert", "combine_a2a")
# A transmission order: (group, group) traffic bytes -> the rounds of the exchange (moe_core.comm.transmission).
Order = Callable[[np.ndarray], Schedule]


@dataclass(frozen=True)
class Compute:
    """One compute op of an MoE layer: its seconds on each device of the model's group."""

    name: str
    phase: str
    seconds: np.ndarray  # (group,)


@dataclass(frozen=True)
class Exchange:
    """One all-to-all of an MoE layer: bytes between the group's devices, and its order (None: the library's)."""

    name: str
    phase: str
    traffic: np.ndarray  # (group, group) bytes
    order: Order | None


def _stem(name: str) -> str:
    """The operation an op belongs to: an ordered exchange's transfers and markers share their exchange's name."""
    return name.split("[", 1)[0]


@dataclass
class ForwardSimulation:
    ops: list[Op]
    timeline: Timeline
    busy_s: np.ndarray  # (devices of the topology,) compute seconds

    def metrics(self) -> dict[str, float]:
        """The measured inference's per-batch metrics, in ms: ``forward_ms`` (the whole pass),
        ``<phase>_ms`` summed over the MoE layers, ``moe_layer_ms`` (their sum: Lina's MoE-layer
        time) and ``a2a_layer<i>_ms``, both all-to-alls of the i-th MoE layer; and ``a2a_ms`` with
        ``a2a_share``, the all-to-alls' time and share of the pass. An operation's time runs from its
        start to its end (an ordered exchange's: from its first transfer's start to its last's end).
        ``gpu_utilisation``: the mean over the devices that compute of their compute time over the
        pass; and ``least_busy_idle_share``: how much longer the busiest of them computes than the
        least busy one, over the pass: the share of it the least loaded device waits on the others'
        experts."""
        spans = self.spans_ms()
        out = {"forward_ms": self.timeline.makespan_s * 1e3}
        out |= {f"{p}_ms": float(sum(d for (_, phase), d in spans.items() if phase == p)) for p in INFERENCE_PHASES}
        out["moe_layer_ms"] = sum(out[f"{p}_ms"] for p in INFERENCE_PHASES)
        out["a2a_ms"] = out["dispatch_a2a_ms"] + out["combine_a2a_ms"]
        out["a2a_share"] = out["a2a_ms"] / out["forward_ms"]  # of the inference pass (Lina Table 1)
        exchanges = {(name, d) for (name, phase), d in spans.items() if phase.endswith("a2a")}
        layers = sorted({name.split(".")[0] for name, _ in exchanges}, key=lambda s: int(s[1:]))
        for i, layer in enumerate(layers):
            out[f"a2a_layer{i}_ms"] = float(sum(d for name, d in exchanges if name.startswith(f"{layer}.")))
        busy = self.busy_s[self.busy_s > 0]
        out["gpu_utilisation"] = float(busy.mean() / self.timeline.makespan_s)
        out["least_busy_idle_share"] = float((busy.max() - busy.min()) / self.timeline.makespan_s)
        return out

    def spans_ms(self) -> dict[tuple[str, str], float]:
        """(operation, phase) -> ms from the start of its first op to the end of its last."""
        first: dict[tuple[str, str], float] = {}
        last: dict[tuple[str, str], float] = {}
        for op, start, end in zip(self.ops, self.timeline.start_s, self.timeline.end_s):
            key = (_stem(op.name), op.phase)
            first[key], last[key] = min(first.get(key, start), start), max(last.get(key, end), end)
        return {key: 1e3 * float(last[key] - first[key]) for key in first}


class ForwardModel(StepModel):
    """The forward pass of ``cfg``'s model on ``topo`` (tokens per device: train.batch_size x
    model.seq_len), its MoE layers under given placements. ``cfg`` is the inference setting: the
    layout's expert-parallel group is every rank, ``moe.top_k`` 1 and ``moe.dispatcher=dropless``. The
    ranks run on ``devices`` of the topology (default: the first ``parallel.world_size``)."""

    def __init__(self, cfg: DictConfig, topo, devices=None):
        if not routes_dropless(cfg) or cfg.moe.top_k != 1:
            raise ValueError(
                "a simulated inference pass routes top-1 without capacity: set moe.top_k=1 moe.dispatcher=dropless"
            )
        super().__init__(cfg, topo)
        ws = self.layout.world_size
        self.group = np.arange(ws) if devices is None else np.asarray(devices, dtype=np.int64)
        if (
            self.group.shape != (ws,)
            or len(set(self.group.tolist())) != ws
            or not set(self.group) <= set(range(topo.n))
        ):
            raise ValueError(
                f"devices must be {ws} distinct devices of the {topo.n} of '{topo.name}', got {self.group.tolist()}"
            )
        # StepModel priced on the slowest of the first ws devices; each device gets its own peak
        self._base_tflops = float(np.min(topo.device_tflops[:ws]))
        self._pricers: dict[float, ForwardModel] = {}
        # the profile as plain dataclasses (StepKernels): every exchange of a pass reads it
        self._hw = self.kernels.cfg.hardware
        self._expert_s: dict[int, float] = {}  # one expert's seconds by its rows (experts_seconds)
        self._links = PointToPoint(cfg.hardware, topo)
        self._gate_s = np.array([self.priced_on(d).kernels.gate_seconds("fwd") for d in self.group])  # (group,)

    def run(self, routed: list[np.ndarray], order: Order | None = None) -> ForwardSimulation:
        """Simulate one batch; ``routed[i]`` (S, D, E): rows source s sends to device d for expert e in
        the i-th MoE layer (moe_core/papers/lina/placement.py: ``replica_token_counts``); ``order``:
        the all-to-alls' transmission order (None: the library's all-to-all)."""
        busy_s = np.zeros(self.topo.n)
        ops = self.build_forward(routed, order, busy_s)
        return ForwardSimulation(ops, simulate_on(self._hw, self.topo, ops), busy_s)

    def build_forward(self, routed: list[np.ndarray], order: Order | None, busy_s: np.ndarray) -> list[Op]:
        """The pass's ops; ``busy_s`` (per topology device) adds up each device's compute."""
        m, tp = self.cfg.model, self.layout.tensor_parallel
        moe_layers = moe_blocks(m.n_layers, m.moe_every)
        if len(routed) != len(moe_layers):
            raise ValueError(f"the model has {len(moe_layers)} MoE layers, got the routing of {len(routed)}")
        ops: list[Op] = []

        def add(name: str, phase: str, after, duration_s: float) -> int:
            """A dense op, the same on every device."""
            ops.append(Op(name, phase, as_deps(after), duration_s=duration_s))
            busy_s[self.group] += duration_s
            return len(ops) - 1

        last = add("embed.fwd", "dense", None, duration_s=self.kernels.embedding_seconds("fwd"))
        exchanges = iter(routed)
        for i in range(m.n_layers):
            last = add(f"L{i}.norms.fwd", "dense", last, duration_s=self.kernels.norms_seconds("fwd"))
            last = add(f"L{i}.attn.fwd", "dense", last, duration_s=self.kernels.attention_seconds("fwd", tp))
            if i not in moe_layers:
                last = add(f"L{i}.ffn.fwd", "dense", last, duration_s=self.kernels.ffn_seconds("fwd", tp))
                continue
            last = add_stages(ops, [(self, self.moe_layer(f"L{i}", next(exchanges), order))], last, busy_s)
        add("head.fwd", "dense", last, duration_s=self.kernels.head_seconds(passes=("fwd",)))
        return ops

    def moe_layer(self, name: str, rows: np.ndarray, order: Order | None = None) -> list[Compute | Exchange]:
        """The stages of one MoE layer on ``rows`` (S, D, E), in order (module docstring)."""
        traffic = rows.sum(axis=2) * self.kernels.cfg.model.d_model * self.elem  # (S, D) bytes
        per_device = [self.priced_on(d) for d in self.group]
        # each side's copies move the device's sent buffer (modelled on the sender, both ways)
        copies = np.array([p.copy_seconds(float(b)) for p, b in zip(per_device, traffic.sum(axis=1))])
        return [
            Compute(f"{name}.gate.fwd", "gate", self._gate_s),
            Compute(f"{name}.copy_before.fwd", "copy", copies),
            Exchange(f"{name}.dispatch.fwd", "dispatch_a2a", traffic, order),
            Compute(
                f"{name}.expert.fwd",
                "expert",
                np.array([p.experts_seconds(rows[:, d, :].sum(axis=0)) for d, p in enumerate(per_device)]),
            ),
            Exchange(f"{name}.combine.fwd", "combine_a2a", traffic.T, order),
            Compute(f"{name}.copy_after.fwd", "copy", copies),
        ]

    def add_exchange(self, ops: list[Op], exchange: Exchange, after: list[int]) -> int:
        """Append ``exchange``: one fluid all-to-all, or its order's transfers; returns its last op."""
        if exchange.order is None:
            cost = collective_op(self._hw, self.topo, "all_to_all", self.topo.all_to_all(self.group, exchange.traffic))
            ops.append(Op(exchange.name, exchange.phase, list(after), **cost))
            return len(ops) - 1
        rounds = exchange.order(exchange.traffic)
        return add_ordered_exchange(ops, self._links, self.group, rounds, exchange.name, exchange.phase, after)

    def priced_on(self, device: int) -> ForwardModel:
        """This model pricing its ops on ``device``'s peak FLOP/s (memory and launches as the profile's)."""
        peak = float(self.topo.device_tflops[device])
        if peak not in self._pricers:
            pricer, kernels = copy.copy(self), self.kernels
            fp8 = kernels.fp8 and replace(kernels.fp8, peak_flops=kernels.fp8.peak_flops * peak / self._base_tflops)
            compute = replace(kernels.compute, peak_flops=kernels.compute.peak_flops * peak / self._base_tflops)
            pricer.kernels = replace(kernels, compute=compute, fp8=fp8)
            pricer._expert_s = {}  # its own prices
            self._pricers[peak] = pricer
        return self._pricers[peak]

    def experts_seconds(self, rows_per_expert: np.ndarray) -> float:
        """One device's experts, one after another: a GEMM pair per expert with rows."""
        return sum(self.expert_seconds(r) for r in rows_per_expert if r > 0)

    def expert_seconds(self, rows: int) -> float:
        """One expert's GEMM pair on ``rows`` rows, priced once per row count: a run's passes price
        the same few thousand counts tens of thousands of times."""
        if rows not in self._expert_s:
            self._expert_s[rows] = self.kernels.expert_ffn_seconds("fwd", rows, 1, self.kernels.cfg.model.d_ff)
        return self._expert_s[rows]


def add_stages(
    ops: list[Op],
    layers: list[tuple[ForwardModel, list[Compute | Exchange]]],
    after: int | None,
    busy_s: np.ndarray,
) -> int:
    """Append one layer of each of several models served on the same devices (each model with its
    stages, ``ForwardModel.moe_layer``); returns the last op on the compute stream.

    Each model's stages split at its exchanges into segments; segment k of every model runs on the
    compute stream before segment k + 1 of any, models in the given order, each compute op after
    its model's previous stage and the stream's previous op. Each exchange starts as soon as its
    model's compute before it is done, on the model's own communicator: two models' exchanges in
    flight together share the links (each in its own order), which is why their per-device loads add
    up. One model alone is a chain. A compute op takes its slowest device's seconds; ``busy_s`` (per
    topology device) adds up every device's own.
    """
    segments = [_segments(stages) for _, stages in layers]
    stream = after
    data: list[int | None] = [after] * len(layers)
    for k in range(max(len(s) for s in segments)):
        for m, ((model, _), model_segments) in enumerate(zip(layers, segments)):
            if k >= len(model_segments):
                continue
            computes, exchange = model_segments[k]
            for c in computes:
                ops.append(Op(c.name, c.phase, as_deps([data[m], stream]), duration_s=float(c.seconds.max())))
                stream = data[m] = len(ops) - 1
                np.add.at(busy_s, model.group, c.seconds)
            if exchange is not None:
                data[m] = model.add_exchange(ops, exchange, as_deps(data[m]))
    return stream


def _segments(stages: list[Compute | Exchange]) -> list[tuple[list[Compute], Exchange | None]]:
    """Stages cut after each exchange: (the computes before it, the exchange), the last maybe without one."""
    out, computes = [], []
    for stage in stages:
        if isinstance(stage, Exchange):
            out.append((computes, stage))
            computes = []
        else:
            computes.append(stage)
    return [*out, (computes, None)] if computes else out


def simulate_served(models: list[tuple[ForwardModel, list[np.ndarray], Order | None]]) -> ForwardSimulation:
    """The MoE layers alone of one model, or of several whose experts share the same devices
    (module docstring), with every device's compute tracked (``gpu_utilisation``).

    ``models``: per model, its ForwardModel (ranks on the shared devices, one topology), the (S, D, E)
    rows of each of its MoE layers over its ranks, and its all-to-alls' transmission order (None:
    the library's). Layer i of every model runs before layer i + 1 of any.
    """
    first = models[0][0]
    devices = {tuple(sorted(model.group.tolist())) for model, _, _ in models}
    layers = {len(routed) for _, routed, _ in models}
    if len(devices) != 1 or len(layers) != 1 or any(model.topo is not first.topo for model, _, _ in models):
        raise ValueError(
            f"served models must share one topology, the same devices and their number of MoE layers; got "
            f"devices {sorted(devices)} and {sorted(layers)} layers"
        )
    ops: list[Op] = []
    busy = np.zeros(first.topo.n)
    last = None
    for i in range(layers.pop()):
        stages = [
            (model, model.moe_layer(f"L{i}.m{k}", routed[i], order)) for k, (model, routed, order) in enumerate(models)
        ]
        last = add_stages(ops, stages, last, busy)
    return ForwardSimulation(ops, simulate_on(first.cfg.hardware, first.topo, ops), busy)
