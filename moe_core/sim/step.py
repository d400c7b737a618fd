"""A training step as a DAG of operations: the simulated executor of the measured train_step.

Built from the same config as a measured run and through the same decisions: the layout
(``layout.layout_of``), the expert capacity (``capacity.capacity``) and the policy's communication
plan (``policies.build_plan`` of ``model.gradient_tensors``: gradient units over the model's real
parameters, instantiated on the meta device, their launch rule and priority, the MoE layers' token
exchange, expert packing). Every collective is an SPMD operation whose footprint sums all its
groups (moe_core.sim.topology).

Compute is priced by the compute model (moe_core.sim.compute) on the slowest device, op by op with
the model's real shapes: every linear layer a GEMM (backward: its dX and dW GEMMs), the attention
core two batched GEMMs per pass, layer norms, residual adds and activations memory-bound, the
gate its GEMM plus the routing's kernels and bytes (counted on the real code, ``GATE_ROUTING``),
the experts one batched GEMM pair over the local experts, the contiguous copies on each side of an
all-to-all, and the optimizer step once the gradients are reduced. Under ``train.fp8`` the linear
layers' and experts' GEMMs run at the device's FP8 peak with Transformer Engine's casts of their
operands (``FP8_CAST_BYTES``); the attention core, the gate and the LM head stay in ``train.dtype``.
A calibrated profile's ``phase_efficiency`` multiplies the speed of each op class (dense, gate,
expert), :meth:`StepModel._priced`. On a GPU (``hardware.device`` cuda) the kernels' launches leave
the ops for a host thread that issues them in program order and may run ahead of the device
(moe_core.sim.engine.issued_by_host, priced as each op's time less its launch-free time); the host
waits for the device only where it reads device data: a dropless exchange's split sizes, and a
gate that reads its expert counts (``moe.gate_host_sync``, DeepSpeed-MoE's before 2024-08). On a CPU
the launches stay in the ops, one after another.

:class:`StepDag` builds the DAG in one pass over the blocks. Per layer (MoE layers as in GShard:
gate -> dispatch all-to-all -> experts -> combine all-to-all): forward ops in order, then backward
ops in reverse order, then gradient all-reduces per plan unit: after the whole backward or as soon
as a unit's last gradient is ready, one unit after another on one communicator, then the
optimizer. An MoE layer's exchange between its two copies is the plan's exchange object's own ops
(moe_core.plan.StepExchange.simulate: whole or two-phase all-to-alls, pipelined micro-ops with the
experts behind them, the tensor-parallel drop-and-all-gather chunks), so the builder never asks
which mechanism it is. Under a 3D tensor-parallel grid the attention and dense FFN are its linear
layers with their collectives and overlaps (moe_core.sim.grid_ops).

Data parallelism (``parallel.data_sharding``): replicated, the plan's units are all-reduced; with
a sharded optimizer (ZeRO-1) the same units are reduce-scattered, each rank's optimizer updates its
1/dp of the parameters and the units are all-gathered after it, one after another on one
communicator; fully sharded (ZeRO-3 / FSDP2), the plan's units give way to per-block all-gathers
and reduce-scatters during the passes (moe_core.sim.sharding), and the optimizer updates the shard.
Gradient accumulation (``train.micro_batches``): the forward and backward passes once per
micro-batch, each pass priced on its own shapes (moe_core.schema.micro_batch_config); the plan's
gradient sync follows the last pass only (DDP's ``no_sync`` before it), launched by its rule on the
last pass's gradients, while full sharding reduces every pass's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from omegaconf import DictConfig

from ..activation import in_width
from ..capacity import DTYPE_BYTES, dispatch_rows_per_expert, expert_tensor_parallel, moe_blocks, moe_tokens
from ..grid import GRID_COLLECTIVES
from ..layout import Layout, expert_layout, layout_of
from ..model import gradient_tensors
from ..policies import build_plan
from ..schema import head_dim, kv_heads, micro_batch_config
from ..step_metrics import STEP_PHASES, a2a_shares, step_terms
from .collectives import collective_op, simulate_on
from .compute import ComputeModel
from .engine import Op, Timeline, as_deps, issued_by_host
from .grid_ops import GridOps
from .sharding import ROOT, FullShardOps
from .topology import Transfer

# The memory-bound ops beside the GEMMs (moe_core.model), per pass: (kernels, passes over their
# activation, reads + writes). Layer norm's backward is dX and then its weight and bias gradients;
# a residual add's backward adds the two branches' gradients; a linear layer's bias gradient is a
# reduction over the tokens (its forward add is fused into the GEMM); the embedding is the token
# gather plus the position add, its backward a scatter-add; cross-entropy casts the logits to
# float32, log-softmaxes them and takes the loss.
ELEMENTWISE = {
    "layer_norm": {"fwd": (1, 2), "bwd": (2, 4)},
    "residual": {"fwd": (1, 3), "bwd": (1, 3)},
    "relu": {"fwd": (1, 2), "bwd": (1, 3)},
    # per hidden unit: silu(gate) (2 passes), * up (3); backward two muls, silu_backward and the cat of
    # the gate and up gradients into the input projection's (4 passes); counted by dispatch tracing
    "swiglu": {"fwd": (2, 5), "bwd": (4, 13)},
    "bias": {"fwd": (0, 0), "bwd": (1, 1)},
    "embedding": {"fwd": (3, 5), "bwd": (3, 4)},
    "cross_entropy": {"fwd": (3, 5), "bwd": (3, 5)},
}
# The gate's routing (moe_core.gating.gshard_gating forward, its backward to the logits) per top_k and
# pass: (kernels, bytes per token and expert, bytes per token), counted by running the code on meta
# tensors (tests/test_sim_compute.py traces it and checks this table): top-2 makes 7 float32 passes
# over the tokens x experts gate matrix forward and 19 backward, plus index work per token (sort,
# cumsum, gathers on int64). Random routing adds one kernel, dropless routing drops two.
GATE_ROUTING = {
    1: {"fwd": (43, 16, 329), "bwd": (12, 44, 25)},
    2: {"fwd": (55, 28, 759), "bwd": (29, 76, 206)},
}
# Top-k for k >= 3 (torch.topk, renormalised): the same kernels for every k, bytes linear in k, as
# (kernels, bytes per token and expert, per token, per token and choice); the coefficients are the
# least-squares fit of traces at k = 3, 4, 5, 8 and three (tokens, experts) shapes, which they
# reproduce to 0.01% (the test traces k = 3, 4, 8 and checks them).
GATE_ROUTING_TOP_K = {"fwd": (48, 20, 52, 333), "bwd": (19, 44, 16, 85)}


def gate_routing(top_k: int, pass_: str) -> tuple[int, float, float]:
    """The gate's routing cost in ``pass_`` for ``top_k`` experts per token: (kernels, bytes per
    token and expert, bytes per token), from GATE_ROUTING or, beyond top-2, GATE_ROUTING_TOP_K."""
    if top_k in GATE_ROUTING:
        return GATE_ROUTING[top_k][pass_]
    kernels, per_token_expert, per_token, per_choice = GATE_ROUTING_TOP_K[pass_]
    return kernels, per_token_expert, per_token + per_choice * top_k


# Transformer Engine's casts around an FP8 linear layer (train.fp8), in bytes moved per element of the
# operand cast: read in bfloat16, written in FP8 and as an FP8 transpose in one fused kernel (Hopper's
# FP8 GEMMs take only the "TN" layout, so the backward GEMMs read transposed copies).
FP8_CAST_BYTES = 2 + 1 + 1
FP8_AMAX_BYTES = 2  # current scaling: one more kernel reads the operand for its amax before the cast
FP8_OPERAND_BYTES = 1


# Which calibrated op class (moe_core.schema.COMPUTE_PHASES) prices an op phase: the measured
# ``dense_ms`` holds everything besides the gate and the experts, copies and optimizer included.
PHASE_CLASS = {"copy": "dense", "partition": "dense", "optimizer": "dense"}


def calibration_class(phase: str) -> str:
    """The op class whose calibrated multiplier (``hardware.phase_efficiency``) an op phase takes."""
    return PHASE_CLASS.get(phase, phase)


@dataclass
class StepSimulation:
    ops: list[Op]
    timeline: Timeline
    backward_end: int  # index of the last backward compute op
    allreduce_alone_s: float = 0.0  # the gradient sync's collectives each alone, one after another

    def metrics(self) -> dict[str, float]:
        """The measured executor's metrics (moe_core.step_metrics, as experiments/train_step.py
        records them), from the timeline, in ms; and
        ``moe_layer_fwd_ms`` / ``moe_layer_bwd_ms`` (``moe_layer_spans_ms``) and ``moe_compute_share``
        (gate + expert time over that wall time), which the measured executor does not record yet.

        Compute phases are their ops' summed times (one compute stream runs them one at a time).
        All-to-all time is what the measured executor times: the compute stream's wait for
        all-to-alls, i.e. the wall time in which one is in flight and no compute runs
        (``waiting_ms``). Without pipelining that is the all-to-alls' own time; with it, the expert
        micro-ops they overlap, and dispatch and combine micro-ops in flight together, are counted
        once, so shares stay shares. Dispatch and combine split it in proportion to their own waits.
        A sharded run's parameter all-gathers (``param_gather_exposed_ms``) count where the compute
        stream waits for them and no all-to-all already does: before a fully sharded block, or
        after a sharded optimizer's step; the step is dense, MoE, exposed gradient sync and these.
        """
        dur = (self.timeline.end_s - self.timeline.start_s) * 1e3
        by_phase = {p: float(sum(d for op, d in zip(self.ops, dur) if op.phase == p)) for p in ("gate", "expert")}
        a2a = self.waiting_ms(lambda op: op.phase.endswith("a2a"))
        own = {p: self.waiting_ms(lambda op, p=p: op.phase == p) for p in ("dispatch_a2a", "combine_a2a")}
        by_phase.update({p: a2a * w / sum(own.values()) if a2a else 0.0 for p, w in own.items()})
        step = self.timeline.makespan_s * 1e3
        optimizer = next(i for i, op in enumerate(self.ops) if op.phase == "optimizer")
        # the gradient all-reduces' wait: from the end of the backward pass to the optimizer's start
        exposed = float(self.timeline.start_s[optimizer] - self.timeline.end_s[self.backward_end]) * 1e3
        # the compute stream's wait for a sharded run's parameter all-gathers beyond its all-to-all wait
        gathers = self.waiting_ms(lambda op: op.phase.endswith("a2a") or op.phase == "param_all_gather") - a2a
        a2a_dir = {
            d: self.waiting_ms(lambda op, d=d: op.phase.endswith("a2a") and op.name.endswith(d))
            for d in (".fwd", ".bwd")
        }
        span = self.moe_layer_spans_ms()
        moe_wall = span["fwd"] + span["bwd"]
        # the compute stream's busy share of the MoE layers' wall time (Lina Fig 11-12's GPU utilisation)
        compute_share = (by_phase["gate"] + by_phase["expert"]) / moe_wall if moe_wall else 0.0
        # all-to-all time in flight, hidden behind compute or not: its pipelining efficiency is the share
        # of it compute overlaps (Lina's and MoNTA's measure of a pipelined exchange; 0 when blocking)
        a2a_in_flight = self.in_flight_ms(lambda op: op.phase.endswith("a2a"))
        terms = step_terms(step, by_phase, a2a, a2a_dir[".fwd"], a2a_dir[".bwd"], exposed, gathers)
        return {
            **terms,
            "a2a_in_flight_ms": a2a_in_flight,
            "a2a_pipelining_efficiency": 1 - a2a / a2a_in_flight if a2a_in_flight else 0.0,
            # every collective (all-to-alls, gradient and tensor-parallel all-reduces, a grid's) that the
            # compute stream waits for, and its share of the step
            "exposed_comm_ms": self.waiting_ms(lambda op: op.transfer is not None),
            "exposed_comm_share": self.waiting_ms(lambda op: op.transfer is not None) / step if step else 0.0,
            **self.grid_metrics(),
            "moe_layer_fwd_ms": span["fwd"],
            "moe_layer_bwd_ms": span["bwd"],
            "moe_compute_share": compute_share,
            "param_gather_exposed_ms": gathers,
            "optimizer_ms": float(dur[optimizer]),  # one Adam step (in dense_ms)
            # cutting pipelined all-to-alls into micro-ops and joining them (in dense_ms)
            "partition_ms": float(sum(d for op, d in zip(self.ops, dur) if op.phase == "partition")),
            # what the gradient sync's units cost to transmit, without contention or overlap
            "allreduce_alone_ms": self.allreduce_alone_s * 1e3,
            **a2a_shares(a2a, terms["moe_layer_ms"], step),
        }

    def waiting_ms(self, selected: Callable[[Op], bool]) -> float:
        """Wall time (ms) in which a ``selected`` op is in flight and no compute op runs."""
        waiting, busy = self._spans(selected), self._spans(lambda op: op.is_compute)
        overlap = sum(max(0.0, min(b, d) - max(a, c)) for a, b in waiting for c, d in busy)
        return 1e3 * (sum(b - a for a, b in waiting) - overlap)

    def in_flight_ms(self, selected: Callable[[Op], bool]) -> float:
        """Wall time (ms) in which a ``selected`` op is in flight, hidden behind compute or not."""
        return 1e3 * sum(b - a for a, b in self._spans(selected))

    def _spans(self, keep: Callable[[Op], bool]) -> list[tuple[float, float]]:
        """The union of the ``keep`` ops' [start, end) intervals, as disjoint sorted spans."""
        spans = sorted(
            (a, b) for op, a, b in zip(self.ops, self.timeline.start_s, self.timeline.end_s) if keep(op) and b > a
        )
        merged: list[tuple[float, float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def grid_metrics(self) -> dict[str, float]:
        """A 3D grid's collectives (moe_core.sim.grid_ops), by kind: the time the compute stream
        waits for them (``grid_<kind>_ms``, what the measured run times) and their time in flight
        (``grid_<kind>_busy_ms``); the difference is what the plan's overlaps hide."""
        metrics = {"grid_comm_ms": self.waiting_ms(lambda op: op.phase.startswith("grid_"))}
        for kind in GRID_COLLECTIVES:
            metrics[f"grid_{kind}_ms"] = self.waiting_ms(lambda op, k=kind: op.phase == f"grid_{k}")
            metrics[f"grid_{kind}_busy_ms"] = self.in_flight_ms(lambda op, k=kind: op.phase == f"grid_{k}")
        return metrics

    def moe_layer_spans_ms(self) -> dict[str, float]:
        """Wall time of the MoE layers per pass (``fwd``, ``bwd``), summed over layers: per layer and
        pass, from the start of its first MoE op (gate or all-to-all) to the end of its last (Lina
        Figs 11-12). Unlike ``moe_layer_ms`` (the sum of the phases' op times) it counts experts
        pipelined behind an all-to-all once, and it holds the copy between the gate and the
        exchanges, so it is the time the layer holds up the step."""
        spans: dict[tuple[str, str], tuple[float, float]] = {}
        for op, start, end in zip(self.ops, self.timeline.start_s, self.timeline.end_s):
            if op.phase in STEP_PHASES:
                key = (op.name.split(".", 1)[0], op.name.rsplit(".", 1)[1])  # ("L3", "fwd")
                lo, hi = spans.get(key, (start, end))
                spans[key] = (min(lo, start), max(hi, end))
        return {p: 1e3 * float(sum(hi - lo for (_, q), (lo, hi) in spans.items() if q == p)) for p in ("fwd", "bwd")}

    def durations_ms(self, suffix: str, phase_suffix: str = "a2a") -> np.ndarray:
        """Durations of the ops whose phase ends with ``phase_suffix`` and name with ``suffix``."""
        keep = self._matching(suffix, phase_suffix)
        return (self.timeline.end_s[keep] - self.timeline.start_s[keep]) * 1e3

    def overlapping(self, suffix: str, other_phase: str, phase_suffix: str = "a2a") -> np.ndarray:
        """For the ops of :meth:`durations_ms`, in its order: whether an op of ``other_phase`` is in
        flight at some moment of theirs: which all-to-alls a gradient all-reduce slows, say."""
        start, end = self.timeline.start_s, self.timeline.end_s
        others = [i for i, op in enumerate(self.ops) if op.phase == other_phase and end[i] > start[i]]
        overlapped = [
            any(start[j] < end[i] and start[i] < end[j] for j in others) for i in self._matching(suffix, phase_suffix)
        ]
        return np.array(overlapped, dtype=bool)

    def _matching(self, suffix: str, phase_suffix: str) -> list[int]:
        return [i for i, op in enumerate(self.ops) if op.phase.endswith(phase_suffix) and op.name.endswith(suffix)]


class StepModel:
    """Builds and simulates the training step of ``cfg`` on topology ``topo``.

    ``embedding`` / ``head``: whether the ranks hold the embedding and the final norm, LM head and
    loss; a pipeline stage (moe_core.sim.pipeline) holds only its share, the whole model both.
    ``step_passes``: the micro-batches of the whole step, when ``cfg`` prices one of them (a pipeline
    stage's); what happens once a step (the FP8 cast of the weights) is spread over them.
    """

    def __init__(
        self, cfg: DictConfig, topo, embedding: bool = True, head: bool = True, step_passes: int | None = None
    ):
        if cfg.parallel.pipeline_parallel > 1:
            raise ValueError("a pipelined config is a composition of stages: use moe_core.sim.pipeline.simulate_step")
        # ``self.cfg`` is one pass's: the ops are priced on a micro-batch's shapes
        self.cfg, self.topo = micro_batch_config(cfg), topo
        self.embedding, self.head = embedding, head
        self.passes, self.sharding = cfg.train.micro_batches, cfg.parallel.data_sharding
        # the step's passes over the weights, which share one FP8 cast of them: a pipeline stage is
        # priced on one micro-batch of a step of ``step_passes``
        self.step_passes = step_passes or self.passes
        self.elem = DTYPE_BYTES[cfg.train.dtype]
        self._use_layout(layout_of(cfg))
        if self.layout.world_size > topo.n:
            raise ValueError(f"world_size {self.layout.world_size} exceeds the {topo.n} devices of '{topo.name}'")
        ranks = np.arange(self.layout.world_size)
        tflops = float(np.min(topo.device_tflops[ranks]))
        if tflops <= 0:
            raise ValueError(f"hardware '{topo.name}' has no peak_tflops; set it or calibrate the profile")
        busiest_node = int(np.bincount(topo.node_of[ranks]).max())  # ranks sharing one host's cores
        share = min(1.0, cfg.hardware.host_cores / busiest_node) if cfg.hardware.host_cores else 1.0
        self.compute = ComputeModel.from_profile(cfg.hardware, tflops, self.elem, share)
        # a GPU runs kernels as its host issues them, which can run ahead (engine.issued_by_host); on a
        # CPU the same cores issue and compute, so a kernel's launch is part of its time
        self.asynchronous = cfg.hardware.device == "cuda" and cfg.hardware.kernel_launch_us > 0
        # FP8 linear layers: the same GEMM curve at the device's FP8 peak, on 1-byte operands
        fp8_tflops = tflops * cfg.hardware.fp8_peak_tflops / cfg.hardware.peak_tflops if cfg.hardware.peak_tflops else 0
        self.fp8 = (
            ComputeModel.from_profile(cfg.hardware, fp8_tflops, FP8_OPERAND_BYTES, share)
            if cfg.train.fp8 != "none"
            else None
        )
        self.plan = build_plan(cfg, self._gradient_tensors(), self.elem)
        if self.plan.relayout is not None:  # the layout the plan's re-layout decides on simulated costs
            self._use_layout(self.plan.relayout.decide(self.layout, self._micro_op_costs()))
            self.plan = build_plan(cfg, self._gradient_tensors(), self.elem)  # gradient units of the packed layout

    def _gradient_tensors(self) -> list:
        """The gradient tensors of this layout that these ranks hold (``embedding``, ``head``)."""
        held = {"embed": self.embedding, "head": self.head}
        return [t for t in gradient_tensors(self.cfg, self.layout) if held.get(_block_of(t.name), True)]

    def _use_layout(self, layout: Layout) -> None:
        self._ring_costs: dict = {}
        self.layout = layout
        # the experts' own layout: the run's, or with whole experts under "tp" (expert_tensor_parallel
        # 1) expert parallelism over the ranks alone, every rank routing tokens of its own
        self.expert_tp = expert_tensor_parallel(self.cfg)
        whole = self.expert_tp < layout.tensor_parallel
        self.moe_layout = (
            expert_layout(layout.world_size, layout.num_experts, layout.experts_per_rank) if whole else layout
        )
        self.ep_groups = self.moe_layout.groups("ep")  # rows: the ranks of one expert-parallel group
        self.tp_groups = layout.groups("tp")  # rows: the ranks of one tensor-parallel group

    def _gradient_groups(self, group: str) -> np.ndarray:
        """The rank groups a gradient of ``group`` is summed over: the experts' by their own layout."""
        return (self.moe_layout if group == "expert" else self.layout).gradient_groups(group)

    def _micro_op_costs(self) -> Callable[[Layout], tuple[float, float]]:
        """This model's (expert FFN seconds, all-to-all seconds) of one all-to-all micro-op on a
        candidate layout: the simulated costs the plan's packing decision is taken from."""

        @functools.cache
        def per_micro_op(layout: Layout) -> tuple[float, float]:
            self._use_layout(layout)
            rows, a2a_bytes = self._moe_sizes()
            count = self._micro_op_count()
            a2a = (
                self._all_to_all(a2a_bytes, self.plan.exchange.hierarchical)[0]
                if self.moe_layout.expert_parallel > 1
                else None
            )
            a2a_s = simulate_on(self.cfg.hardware, self.topo, [Op("a2a", "x", **a2a)]).makespan_s if a2a else 0.0
            return self._expert_seconds(rows / count, "fwd"), a2a_s / count

        return per_micro_op

    # -- sizes -----------------------------------------------------------------------------------
    def _moe_sizes(self) -> tuple[int, float]:
        """(expert rows computed per rank, all-to-all bytes each rank sends per all-to-all)."""
        m, moe = self.cfg.model, self.cfg.moe
        if moe.dropless:  # balanced routing: every rank receives top_k * tokens rows
            rows = moe.top_k * moe_tokens(self.cfg)
            return rows, rows * m.d_model * self.elem
        per_expert = dispatch_rows_per_expert(self.cfg)  # G * C
        rows = self.moe_layout.experts_per_rank * self.moe_layout.expert_parallel * per_expert
        return rows, moe.num_experts * per_expert * m.d_model * self.elem

    def _micro_op_count(self) -> int:
        """The all-to-all micro-ops along the token dimension the plan's exchange cuts a capacity
        buffer into (one, whole, unless it cuts; dropless exchanges are never cut)."""
        if self.cfg.moe.dropless:
            return 1
        row_bytes = self.cfg.moe.num_experts * self.cfg.model.d_model * self.elem  # a row for every expert
        return len(self.plan.exchange.micro_ops(dispatch_rows_per_expert(self.cfg), row_bytes))

    # -- compute -------------------------------------------------------------------------------
    def _priced(self, seconds: float, phase: str) -> float:
        """An op's compute-model time under the profile's calibrated multiplier for its class."""
        return seconds / self.cfg.hardware.phase_efficiency.get(calibration_class(phase), 1.0)

    def _gemm(
        self, pass_: str, m: float, n: float, k: float, count: float = 1, model: ComputeModel | None = None
    ) -> float:
        """A GEMM in ``pass_``: forward, or its backward dX and dW GEMMs (on ``model``, default the step's)."""
        model = model or self.compute
        if pass_ == "fwd":
            return model.gemm(m, n, k, count)
        return model.gemm_backward(m, n, k, count)

    def _weight_gemm(self, pass_: str, m: float, n: float, k: float, count: float = 1) -> float:
        """The GEMMs of a linear layer or an expert, X (m x k) times its weight (k x n), in ``pass_``:
        in train.dtype, or under train.fp8 at the FP8 peak with Transformer Engine's casts."""
        if self.fp8 is None:
            return self._gemm(pass_, m, n, k, count)
        return self._gemm(pass_, m, n, k, count, model=self.fp8) + self._fp8_casts(pass_, m, n, k, count)

    def _fp8_casts(self, pass_: str, m: float, n: float, k: float, count: float) -> float:
        """Transformer Engine's casts around ``count`` FP8 GEMMs (m x k) @ (k x n) in ``pass_``: forward
        the input and the weight, backward the output's gradient. The weight is cast once a step
        (Megatron passes ``is_first_microbatch`` and TE keeps the FP8 weight), so a pass pays
        1 / (the step's micro-batches) of it."""
        per_element, kernels = FP8_CAST_BYTES, 1
        if self.cfg.train.fp8 == "current":
            per_element, kernels = per_element + FP8_AMAX_BYTES, 2
        if pass_ != "fwd":
            return self.compute.memory_bound(per_element * count * m * n, kernels)
        inputs = self.compute.memory_bound(per_element * count * m * k, kernels)
        return inputs + self.compute.memory_bound(per_element * count * k * n, kernels) / self.step_passes

    def _elementwise(self, op: str, pass_: str, elements: float, element_bytes: int | None = None) -> float:
        """A memory-bound op of ``ELEMENTWISE`` over ``elements`` activation elements."""
        kernels, passes = ELEMENTWISE[op][pass_]
        return self.compute.memory_bound(passes * elements * (element_bytes or self.elem), kernels)

    def _linear(self, pass_: str, tokens: float, out_features: float, in_features: float) -> float:
        """An ``nn.Linear`` with bias: Y = X W^T + b, its GEMM and, backward, its bias gradient."""
        return self._weight_gemm(pass_, tokens, out_features, in_features) + self._elementwise(
            "bias", pass_, tokens * out_features
        )

    def _tokens(self) -> int:
        return self.cfg.train.batch_size * self.cfg.model.seq_len

    def attention_core_seconds(self, pass_: str, head_split: int) -> float:
        """The attention core (scaled-dot-product attention, one fused kernel per batched GEMM):
        scores Q K^T and context P V for each sequence and head, heads split over ``head_split``
        ranks."""
        m = self.cfg.model
        count, features = self.cfg.train.batch_size * m.n_heads / head_split, head_dim(m)
        scores = self._gemm(pass_, m.seq_len, m.seq_len, features, count)
        context = self._gemm(pass_, m.seq_len, features, m.seq_len, count)
        return self._priced(scores + context, "dense")

    def _norms_seconds(self, pass_: str) -> float:
        """A block's two pre-norms and two residual adds, on whole activations (also under a grid)."""
        elements = self._tokens() * self.cfg.model.d_model
        return self._priced(
            2 * (self._elementwise("layer_norm", pass_, elements) + self._elementwise("residual", pass_, elements)),
            "dense",
        )

    def _attention_seconds(self, pass_: str) -> float:
        """QKV projection (K and V of the n_kv_heads heads), attention core, output projection; heads
        split over "tp"."""
        T, m, tp = self._tokens(), self.cfg.model, self.layout.tensor_parallel
        q, kv = m.n_heads * head_dim(m), kv_heads(m) * head_dim(m)
        linears = self._linear(pass_, T, (q + 2 * kv) / tp, m.d_model) + self._linear(pass_, T, m.d_model, q / tp)
        return self._priced(linears, "dense") + self.attention_core_seconds(pass_, tp)

    def _ffn_seconds(self, pass_: str) -> float:
        """The dense FFN, hidden units split over "tp": W_in (SwiGLU: gate and up), activation, W_out."""
        T, M, tp = self._tokens(), self.cfg.model.d_model, self.layout.tensor_parallel
        H, activation = self.cfg.model.d_ff / tp, self.cfg.model.ffn_activation
        seconds = (
            self._linear(pass_, T, in_width(activation) * H, M)
            + self._elementwise(activation, pass_, T * H)
            + self._linear(pass_, T, M, H)
        )
        return self._priced(seconds, "dense")

    def _expert_seconds(self, rows: float, pass_: str) -> float:
        """The local experts on ``rows`` rows in all (rows / experts each): one batched GEMM pair
        (torch.bmm over the local experts), the activation between; hidden units split over the
        experts' tensor-parallel ranks."""
        e_local = self.moe_layout.experts_per_rank
        return self.expert_ffn_seconds(pass_, rows / e_local, e_local, self.cfg.model.d_ff / self.expert_tp)

    def expert_ffn_seconds(self, pass_: str, rows_each: float, count: int, hidden: float) -> float:
        """``count`` experts of ``hidden`` units on ``rows_each`` rows each, as one (batched) GEMM
        pair with the activation between: W_in (SwiGLU: gate and up), activation, W_out."""
        M, activation = self.cfg.model.d_model, self.cfg.model.ffn_activation
        seconds = (
            self._weight_gemm(pass_, rows_each, in_width(activation) * hidden, M, count)
            + self._elementwise(activation, pass_, count * rows_each * hidden)
            + self._weight_gemm(pass_, rows_each, M, hidden, count)
        )
        return self._priced(seconds, "expert")

    def _gate_seconds(self, pass_: str) -> float:
        """The gate: its GEMM (tokens x d_model x experts) and the routing's kernels and bytes."""
        T, E = moe_tokens(self.cfg), self.cfg.moe.num_experts
        kernels, per_token_expert, per_token = gate_routing(self.cfg.moe.top_k, pass_)
        routing = self.compute.memory_bound(T * (per_token_expert * E + per_token), kernels)
        return self._priced(self._gemm(pass_, T, E, self.cfg.model.d_model) + routing, "gate")

    def _head_seconds(self, passes: tuple[str, ...] = ("fwd", "bwd")) -> float:
        """Final norm, LM head (no bias) and cross-entropy (float32 logits) in ``passes``."""
        T, m = self._tokens(), self.cfg.model
        seconds = sum(
            self._elementwise("layer_norm", p, T * m.d_model)
            + self._gemm(p, T, m.vocab_size, m.d_model)
            + self._elementwise("cross_entropy", p, T * m.vocab_size, element_bytes=4)
            for p in passes
        )
        return self._priced(seconds, "dense")

    def _embedding_seconds(self, pass_: str) -> float:
        return self._priced(self._elementwise("embedding", pass_, self._tokens() * self.cfg.model.d_model), "dense")

    def _copy_seconds(self, buffer_bytes: float) -> float:
        """The contiguous copies on one side of an MoE exchange: the sender's permute of its tokens
        into the expert-major buffer (or back), and under expert parallelism the receiver's
        re-layout of what arrived (moe_core.layer). Modelled together on the sender's side."""
        copies = 2 if self.moe_layout.expert_parallel > 1 else 1
        return self._priced(copies * self.compute.copy(buffer_bytes), "copy")

    def _optimizer_seconds(self) -> float:
        """AdamW over this rank's parameters, sharded: its 1/p of every tensor's, p the ranks that
        hold replicas of it; torch runs its multi-tensor implementation on CUDA."""
        tensors = self.plan.tensors
        params = sum(t.numel / self._shards(t.group) for t in tensors)
        return self._priced(
            self.compute.optimizer(params, len(tensors), multi_tensor=self.cfg.hardware.device == "cuda"), "optimizer"
        )

    def _shards(self, group: str) -> int:
        """Over how many ranks a gradient group's parameters and optimizer state are sharded."""
        return 1 if self.sharding == "none" else self._gradient_groups(group).shape[1]

    # -- collectives -----------------------------------------------------------------------------
    def _merged(self, transfers: list[Transfer]) -> Transfer:
        loads = np.zeros(self.topo.num_links)
        for t in transfers:
            np.add.at(loads, t.links, t.nbytes)
        return Transfer.from_dense(
            loads,
            max(t.steps for t in transfers),
            any(t.crosses_nodes for t in transfers),
            sent_bytes=max(t.sent_bytes for t in transfers),
            nodes=max(t.nodes for t in transfers),
        )

    def _all_to_all(self, bytes_per_rank: float, hierarchical: bool = False) -> list[dict]:
        """The op costs of one MoE all-to-all over every "ep" group: one op, or the hierarchical
        exchange's two phases (intra-node, then inter-node) when ``hierarchical`` and the groups span
        nodes, as the measured run does (moe_core.hierarchical_a2a)."""
        if hierarchical and len(np.unique(self.topo.node_of[self.ep_groups[0]])) > 1:
            p = self.moe_layout.expert_parallel
            traffic = np.full((p, p), bytes_per_rank / p)
            phases = zip(*[self.topo.hierarchical_all_to_all(g, traffic) for g in self.ep_groups])
            footprints = [self._merged(list(phase)) for phase in phases]
        else:
            footprints = [self._merged([self.topo.uniform_all_to_all(g, bytes_per_rank) for g in self.ep_groups])]
        costs = [collective_op(self.cfg.hardware, self.topo, "all_to_all", f) for f in footprints]
        fit = self.cfg.hardware.collectives.get("all_to_all")
        if fit is not None:  # a blocking exchange inside a step also waits for late peers
            costs[-1]["latency_s"] += fit.in_step_us * 1e-6
        return costs

    def _ring(self, collective: str, groups: np.ndarray, bytes_per_rank: float) -> dict | None:
        """A ring ``collective`` of ``bytes_per_rank`` over every group (row) of ``groups`` at once;
        None for groups of one rank, which have nothing to exchange. Cached: a step repeats the
        same collectives layer after layer."""
        if groups.shape[1] == 1:
            return None
        key = (collective, groups.tobytes(), groups.shape, bytes_per_rank)
        if key not in self._ring_costs:
            footprint = self._merged([self.topo.ring(g, bytes_per_rank, collective) for g in groups])
            self._ring_costs[key] = collective_op(self.cfg.hardware, self.topo, collective, footprint)
        return self._ring_costs[key]

    # -- the DAG ---------------------------------------------------------------------------------
    def build(self) -> tuple[list[Op], int]:
        """The step's ops in order and the index of the last backward compute op (:class:`StepDag`)."""
        return StepDag(self).build()

    def _add_gradient_sync(self, ops: list[Op], grads_ready: dict, after_backward: list[int]) -> list[int]:
        """The plan's gradient all-reduces (reduce-scatters under a sharded optimizer), launched by
        its rule, one after another on one communicator; units that yield to the all-to-alls run in
        a lower strict-priority class.
        ``after_backward``: the end of the backward pass and the reduce-scatters a grid completes
        after it, which units launched after the backward pass, and a grid's depth-sharded units
        whose reduce-scatter is deferred, wait for (moe_core.executor). Returns the last all-reduce
        (the optimizer's wait), none when no gradient is reduced."""
        tensors = self.plan.tensors
        priority = 1 if self.plan.gradients_yield_to_a2a else 0
        overlaps = self.plan.grid_overlaps
        deferred = overlaps is not None and overlaps.defers_gradients(self.layout.grid)
        collective, phase = self._gradient_sync
        previous = None
        for k, unit in enumerate(self.plan.gradient_units):
            cost = self._ring(collective, self._gradient_groups(unit.group), unit.numel * self.elem)
            if cost is None:
                continue
            if self.plan.launch_when_ready and not (deferred and unit.group == "data"):
                launch_after = as_deps(grads_ready[_block_of(tensors[unit.last_tensor].name)])
            else:
                launch_after = after_backward
            deps = [*launch_after] + ([previous] if previous is not None else [])
            ops.append(Op(f"{phase}{k}", phase, deps, priority=priority, **cost))
            previous = len(ops) - 1
        return [] if previous is None else [previous]

    @property
    def _gradient_sync(self) -> tuple[str, str]:
        """The gradient sync's (ring collective, op phase): all-reduces, or a sharded run's reduce-scatters."""
        return ("all_reduce", "allreduce") if self.sharding == "none" else ("reduce_scatter", "reduce_scatter")

    def _add_parameter_gathers(self, ops: list[Op], optimizer: int) -> None:
        """A sharded optimizer's all-gathers of the updated parameters, the plan's units one after
        another on one communicator once the optimizer step is done (Megatron's distributed optimizer
        without ``overlap_param_gather``): each rank then holds every parameter for the next step."""
        previous = optimizer
        for k, unit in enumerate(self.plan.gradient_units):
            cost = self._ring("all_gather", self._gradient_groups(unit.group), unit.numel * self.elem)
            if cost is not None:
                ops.append(Op(f"param_gather{k}", "param_all_gather", [previous], **cost))
                previous = len(ops) - 1

    def run(self) -> StepSimulation:
        ops, backward_end = self.build()
        alone_s = self._alone_seconds(ops, self._gradient_sync[1])
        if self.asynchronous:
            work = self._without_launches()
            ops, where = issued_by_host(work, [op.duration_s - w.duration_s for op, w in zip(ops, work)])
            backward_end = where[backward_end]
        timeline = simulate_on(self.cfg.hardware, self.topo, ops)
        return StepSimulation(ops, timeline, backward_end, alone_s)

    def _without_launches(self) -> list[Op]:
        """The step's ops priced without kernel launches: the device's share of each op's time (every
        op's price is its kernels' launches plus this, moe_core.sim.compute)."""
        priced = self.compute, self.fp8
        self.compute = replace(self.compute, launch_s=0.0)
        self.fp8 = self.fp8 and replace(self.fp8, launch_s=0.0)
        try:
            ops, _ = self.build()
        finally:
            self.compute, self.fp8 = priced
        return ops

    def _alone_seconds(self, ops: list[Op], phase: str) -> float:
        """The ``phase`` ops' time each alone on the network, one after another: what their units
        (whole tensors, buckets or micro-ops, each paying its latency) cost to transmit."""
        chain = [replace(op, deps=[k - 1] if k else []) for k, op in enumerate(o for o in ops if o.phase == phase)]
        return simulate_on(self.cfg.hardware, self.topo, chain).makespan_s if chain else 0.0


def _block_of(param_name: str):
    """Which backward op makes this parameter's gradient final (see StepModel.build)."""
    if param_name.startswith("blocks."):
        return int(param_name.split(".")[1])
    return "head" if param_name.startswith(("head", "ln_f")) else "embed"


class StepDag:
    """One build of a step's DAG (:meth:`StepModel.build`): the ops in order, and the methods that
    append a block's parts to them, named ``[mb<j>/][recompute/]L<i>.<part>.<pass>``.

    The plan's exchange (moe_core.plan.StepExchange.simulate) appends each MoE layer's exchange
    through ``add``, ``all_to_all``, ``tp_all_gather`` and ``experts``, sized by ``a2a_bytes`` (what a
    rank sends per whole all-to-all), ``micro_ops`` (the micro-ops it cuts a capacity buffer into),
    ``partition_s`` (cutting the buffer into them, or joining them) and ``tp``.
    """

    def __init__(self, step: StepModel):
        self.step, self.cfg = step, step.cfg
        self.ops: list[Op] = []
        self.prefix = ""  # of a micro-batch's op names, "mb<j>/", when there are several
        self.tp = step.layout.tensor_parallel
        self.rows, self.a2a_bytes = step._moe_sizes()
        self.micro_ops = step._micro_op_count()
        self.op_seconds = {  # per pass
            name: {p: seconds(p) for p in ("fwd", "bwd")}
            for name, seconds in (
                ("norms", step._norms_seconds),
                ("attn", step._attention_seconds),
                ("ffn", step._ffn_seconds),
                ("gate", step._gate_seconds),
                ("expert", lambda p: step._expert_seconds(self.rows, p)),
                ("expert_micro_op", lambda p: step._expert_seconds(self.rows / self.micro_ops, p)),
                ("embed", step._embedding_seconds),
            )
        }
        self.copy_s = step._copy_seconds(self.a2a_bytes)
        # a pipelined exchange in micro-ops copies each one's rows out of the buffer and the results
        # back into one (moe_core.comm.pipelined_exchange): the partition and the concatenation
        self.partition_s = step._priced(step.compute.copy(self.a2a_bytes), "partition")
        self.activation_bytes = step._tokens() * self.cfg.model.d_model * step.elem
        self.a2a_costs: dict[tuple[float, bool], list[dict]] = {}  # one all-to-all's op costs by size
        self.grid = None if step.layout.grid.is_trivial else GridOps(step, self.add)
        self.shards = FullShardOps(step, self.add) if step.sharding == "full" else None
        self.moe_layers = set(moe_blocks(self.cfg.model.n_layers, self.cfg.model.moe_every))

    def add(self, name: str, phase: str, after: int | list[int] | None, **kw) -> int:
        """Append an op after op(s) ``after``; its index."""
        self.ops.append(Op(self.prefix + name, phase, as_deps(after), **kw))
        return len(self.ops) - 1

    # -- the MoE layers' exchanges -----------------------------------------------------------------
    def all_to_all(self, name: str, phase: str, after, share: float, hierarchical: bool = False) -> int:
        """One all-to-all of 1/``share`` of ``a2a_bytes`` over every "ep" group (every micro-op pays
        the latency): one op, or the hierarchical exchange's two phases; a local copy of no time
        without expert parallelism."""
        if self.step.moe_layout.expert_parallel == 1:
            return self.add(name, phase, after, duration_s=0.0)
        nbytes = self.a2a_bytes / share
        if (nbytes, hierarchical) not in self.a2a_costs:
            self.a2a_costs[nbytes, hierarchical] = self.step._all_to_all(nbytes, hierarchical)
        # a dropless exchange's forward dispatch needs its split sizes on the host (NOTE: the host
        # sync of moe_core.layer, and of Megatron's dropless dispatcher)
        sync = self.cfg.moe.dropless and phase == "dispatch_a2a" and name.endswith(".fwd")
        for k, cost in enumerate(self.a2a_costs[nbytes, hierarchical]):
            after = self.add(name, phase, after, host_sync=sync and k == 0, **cost)
        return after

    def tp_all_gather(self, name: str, phase: str, after, share: float) -> int:
        """An all-gather over every "tp" group of 1/``share`` of ``a2a_bytes`` per rank."""
        return self.add(
            name, phase, after, **self.step._ring("all_gather", self.step.tp_groups, self.a2a_bytes / share)
        )

    def experts(self, layer: int, pass_: str, after, micro_op: int | None = None) -> int:
        """The local experts on the layer's rows (or on micro-op ``micro_op`` of them) and, with their
        hidden units split, the all-reduce of their partial sums over "tp"."""
        key, suffix = ("expert", "") if micro_op is None else ("expert_micro_op", str(micro_op))
        last = self.add(f"L{layer}.expert{suffix}.{pass_}", "expert", after, duration_s=self.op_seconds[key][pass_])
        if self.step.expert_tp == 1:
            return last
        nbytes = self.rows * self.cfg.model.d_model * self.step.elem
        return self.tp_all_reduce(f"L{layer}.expert_allreduce{suffix}.{pass_}", last, nbytes)

    def moe_exchange(self, layer: int, first: str, second: str, last: int, pass_: str) -> int:
        """copy -> the plan's exchange (``first`` all-to-all, experts, ``second``) -> copy."""
        last = self.add(f"L{layer}.copy_before.{pass_}", "copy", last, duration_s=self.copy_s)
        last = self.step.plan.exchange.simulate(self, layer, first, second, last, pass_)
        return self.add(f"L{layer}.copy_after.{pass_}", "copy", last, duration_s=self.copy_s)

    # -- the dense parts ---------------------------------------------------------------------------
    def compute(self, kind: str, pass_: str, last, layer: int | None = None) -> int:
        """An op of ``op_seconds``' dense ``kind``, of block ``layer`` or of the whole model."""
        name = kind if layer is None else f"L{layer}.{kind}"
        return self.add(f"{name}.{pass_}", "dense", last, duration_s=self.op_seconds[kind][pass_])

    def tp_all_reduce(self, name: str, after: int, nbytes: float) -> int:
        """Megatron's f (backward) or g (forward) all-reduce of activations over "tp"."""
        if self.tp == 1:
            return after
        return self.add(name, "tp_allreduce", after, **self.step._ring("all_reduce", self.step.tp_groups, nbytes))

    def attention(self, i: int, pass_: str, last):
        """The attention's ops: whole or Megatron-split (with its all-reduce), or on the grid."""
        if self.grid is not None:
            return self.grid.attention(i, pass_, last)
        attn = self.compute("attn", pass_, last, i)
        return self.tp_all_reduce(f"L{i}.attn_allreduce.{pass_}", attn, self.activation_bytes)

    def dense_ffn(self, i: int, pass_: str, last):
        if self.grid is not None:
            return self.grid.ffn(i, pass_, last)
        ffn = self.compute("ffn", pass_, last, i)
        return self.tp_all_reduce(f"L{i}.ffn_allreduce.{pass_}", ffn, self.activation_bytes)

    # -- blocks and passes -------------------------------------------------------------------------
    def block_forward(self, i: int, last) -> int:
        """Block ``i``'s forward ops; full recomputation repeats them, exchanges included, before
        the block's backward (as Megatron's and DeepSpeed's full recompute re-run the whole block)."""
        last = self.attention(i, "fwd", self.compute("norms", "fwd", last, i))
        if i not in self.moe_layers:
            return self.dense_ffn(i, "fwd", last)
        sync = self.cfg.moe.gate_host_sync  # the host reads the gate's counts (DeepSpeed-MoE's gate)
        last = self.add(f"L{i}.gate.fwd", "gate", last, duration_s=self.op_seconds["gate"]["fwd"], host_sync=sync)
        return self.moe_exchange(i, "dispatch", "combine", last, "fwd")

    def attention_core_forward(self, i: int, last) -> int:
        """Selective recomputation (Korthikanti et al. 2022): only the attention core's forward
        (Q K^T, softmax, P V) again before the block's backward, its heads split over "tp"."""
        seconds = self.step.attention_core_seconds("fwd", self.tp)
        return self.add(f"L{i}.attn_core.fwd", "dense", last, duration_s=seconds)

    def block_backward(self, i: int, last) -> int:
        """Block ``i``'s backward ops, after its recomputation (named "recompute/...") if any."""
        recompute, layers = self.cfg.train.recompute, self.cfg.train.recompute_layers
        if recompute != "none" and (i < layers or not layers):
            pass_prefix, self.prefix = self.prefix, self.prefix + "recompute/"
            last = self.block_forward(i, last) if recompute == "full" else self.attention_core_forward(i, last)
            self.prefix = pass_prefix
        if i in self.moe_layers:
            last = self.moe_exchange(i, "combine", "dispatch", last, "bwd")
            last = self.add(f"L{i}.gate.bwd", "gate", last, duration_s=self.op_seconds["gate"]["bwd"])
        else:
            last = self.dense_ffn(i, "bwd", last)
        return self.compute("norms", "bwd", self.attention(i, "bwd", last), i)

    def gathered(self, unit: int | str, pass_: str, last):
        """``last`` and, fully sharded, the all-gathers of ``unit``'s parameters it computes on."""
        return last if self.shards is None else self.shards.before(unit, pass_, last)

    def forward_backward(self, last) -> tuple[int, dict]:
        """One micro-batch's forward and backward passes after op(s) ``last``: the last backward op
        and the op that makes each block's (and the head's, the embeddings') gradients final."""
        step = self.step
        if self.grid is not None:
            self.grid.start_pass()
        if step.embedding:
            last = self.compute("embed", "fwd", self.gathered(ROOT, "fwd", last))
        for i in range(self.cfg.model.n_layers):
            last = self.block_forward(i, self.gathered(i, "fwd", last))
        if step.head:
            last = self.add("head.fwd_bwd", "dense", self.gathered(ROOT, "bwd", last), duration_s=step._head_seconds())
        grads_ready = {"head": last}
        for i in reversed(range(self.cfg.model.n_layers)):
            last = grads_ready[i] = self.block_backward(i, self.gathered(i, "bwd", last))
            if self.shards is not None:
                self.shards.reduce(i, last)
        # the embeddings' gradients are the last: their op ends the backward pass
        last = grads_ready["embed"] = self.compute("embed", "bwd", last) if step.embedding else last
        if self.shards is not None:
            self.shards.reduce(ROOT, last)
        return last, grads_ready

    def build(self) -> tuple[list[Op], int]:
        """The passes (one per micro-batch), the gradient sync, the optimizer (and a sharded
        optimizer's parameter all-gathers); the ops and the index of the backward pass's end."""
        step, last = self.step, None
        for j in range(step.passes):  # gradient accumulation: one forward and backward per micro-batch
            self.prefix = f"mb{j}/" if step.passes > 1 else ""
            last, grads_ready = self.forward_backward(last)
        self.prefix, backward_end = "", last
        deferred = self.grid.deferred if self.grid is not None else []
        if self.shards is not None:  # the passes reduced every block's gradients
            reduced = self.shards.last_reduced()
        else:  # the plan's units, on the last pass's gradients
            reduced = step._add_gradient_sync(self.ops, grads_ready, [backward_end, *deferred])
        optimizer = self.add(
            "optimizer", "optimizer", [backward_end, *deferred, *reduced], duration_s=step._optimizer_seconds()
        )
        if step.sharding == "optimizer":
            step._add_parameter_gathers(self.ops, optimizer)
        return self.ops, backward_end
