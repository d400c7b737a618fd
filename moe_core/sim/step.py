"""A training step as a DAG of operations: the simulated executor of the measured train_step.

Built from the same config as a measured run and through the same decisions: the layout
(``config.layout_of``), the expert capacity (``config.capacity``), the gradient buckets
(``policies.assign_buckets`` over the model's real parameters, instantiated on the meta device) and
the policy's launch rule. Compute time is FLOPs / (peak x efficiency of the op class: dense, gate,
expert) of the slowest device; every collective is an SPMD operation whose footprint sums all its
groups (moe_core.sim.topology).

Per layer (MoE layers as in GShard: gate -> dispatch all-to-all -> experts -> combine all-to-all):
forward ops in order, then backward ops in reverse order at twice the forward FLOPs, then gradient
all-reduces per bucket: after the whole backward (``sequential``) or as soon as a bucket's last
gradient is ready, one bucket after another on one communicator (``overlap``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

from ..config import Layout, capacity, layout_of
from ..model import MoETransformer
from ..parallel import is_expert_param
from ..policies import POLICIES, assign_buckets
from .collectives import collective_op
from .engine import Op, Timeline, simulate
from .topology import Transfer

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}
PHASES = ("gate", "dispatch_a2a", "expert", "combine_a2a")


@dataclass
class StepSimulation:
    ops: list[Op]
    timeline: Timeline
    backward_end: int  # index of the last backward compute op

    def metrics(self) -> dict[str, float]:
        """The measured executor's metrics (experiments/train_step.py), from the timeline, in ms."""
        dur = (self.timeline.end_s - self.timeline.start_s) * 1e3
        by_phase = {p: float(sum(d for op, d in zip(self.ops, dur) if op.phase == p)) for p in PHASES}
        a2a = by_phase["dispatch_a2a"] + by_phase["combine_a2a"]
        moe = by_phase["gate"] + a2a + by_phase["expert"]
        step = self.timeline.makespan_s * 1e3
        exposed = step - float(self.timeline.end_s[self.backward_end]) * 1e3
        a2a_dir = {d: float(sum(t for op, t in zip(self.ops, dur) if op.phase.endswith("a2a") and
                                op.name.endswith(d))) for d in (".fwd", ".bwd")}
        return {"step_ms": step, **{f"{p}_ms": v for p, v in by_phase.items()}, "a2a_ms": a2a,
                "a2a_fwd_ms": a2a_dir[".fwd"], "a2a_bwd_ms": a2a_dir[".bwd"], "moe_layer_ms": moe,
                "allreduce_exposed_ms": exposed, "dense_ms": step - moe - exposed,
                "a2a_share": a2a / step, "a2a_share_of_moe": a2a / moe if moe else 0.0}

    def durations_ms(self, suffix: str, phase_suffix: str = "a2a") -> np.ndarray:
        """Durations of the ops whose phase ends with ``phase_suffix`` and name with ``suffix``."""
        keep = [i for i, op in enumerate(self.ops) if op.phase.endswith(phase_suffix) and op.name.endswith(suffix)]
        return (self.timeline.end_s[keep] - self.timeline.start_s[keep]) * 1e3


class StepModel:
    """Builds and simulates the training step of ``cfg`` on topology ``topo``."""

    def __init__(self, cfg: DictConfig, topo):
        self.cfg, self.topo = cfg, topo
        self.layout: Layout = layout_of(cfg)
        if self.layout.world_size > topo.n:
            raise ValueError(f"world_size {self.layout.world_size} exceeds the {topo.n} devices of '{topo.name}'")
        ranks = np.arange(self.layout.world_size)
        self.ep_groups = ranks.reshape(self.layout.data_parallel, self.layout.expert_parallel)  # rows
        self.elem = ELEMENT_BYTES[cfg.train.dtype]
        tflops = float(np.min(topo.device_tflops[ranks]))
        if tflops <= 0:
            raise ValueError(f"hardware '{topo.name}' has no peak_tflops; set it or calibrate the profile")
        busiest_node = int(np.bincount(topo.node_of[ranks]).max())  # ranks sharing one host's cores
        share = min(1.0, cfg.hardware.host_cores / busiest_node) if cfg.hardware.host_cores else 1.0
        self.flop_rate = tflops * 1e12 * share

    # -- sizes -----------------------------------------------------------------------------------
    def _moe_sizes(self) -> tuple[int, float]:
        """(expert rows computed per rank, all-to-all bytes each rank sends per all-to-all)."""
        m, moe, tr = self.cfg.model, self.cfg.moe, self.cfg.train
        tokens = tr.batch_size * m.seq_len
        S = moe.group_size or tokens
        G = tokens // S
        if moe.dropless:  # balanced routing: every rank receives top_k * tokens rows
            rows = moe.top_k * tokens
            return rows, rows * m.d_model * self.elem
        C = capacity(S, moe.num_experts, moe.top_k, moe.capacity_factor, moe.min_capacity)
        rows = self.layout.experts_per_rank * self.layout.expert_parallel * G * C
        return rows, moe.num_experts * G * C * m.d_model * self.elem

    def _seconds(self, flops: float, phase: str) -> float:
        hw = self.cfg.hardware
        return flops / (self.flop_rate * hw.phase_efficiency.get(phase, hw.compute_efficiency))

    # -- collectives -----------------------------------------------------------------------------
    def _merged(self, transfers: list[Transfer]) -> Transfer:
        loads = np.zeros(self.topo.num_links)
        for t in transfers:
            np.add.at(loads, t.links, t.nbytes)
        return Transfer.from_dense(loads, max(t.steps for t in transfers), any(t.crosses_nodes for t in transfers))

    def _all_to_all(self, bytes_per_rank: float) -> dict:
        footprint = self._merged([self.topo.uniform_all_to_all(g, bytes_per_rank) for g in self.ep_groups])
        cost = collective_op(self.cfg.hardware, self.topo, "all_to_all", footprint)
        fit = self.cfg.hardware.collectives.get("all_to_all")
        if fit is not None:  # a blocking exchange inside a step also waits for late peers
            cost["latency_s"] += fit.in_step_us * 1e-6
        return cost

    def _all_reduce(self, nbytes: float, expert: bool) -> dict | None:
        groups = self.ep_groups.T if expert else [np.arange(self.layout.world_size)]
        if len(groups[0]) == 1:
            return None  # a group of one rank has nothing to exchange
        footprint = self._merged([self.topo.ring(g, nbytes, "all_reduce") for g in groups])
        return collective_op(self.cfg.hardware, self.topo, "all_reduce", footprint)

    # -- the DAG ---------------------------------------------------------------------------------
    def build(self) -> tuple[list[Op], int]:
        m, moe, tr = self.cfg.model, self.cfg.moe, self.cfg.train
        T, M, H, E = tr.batch_size * m.seq_len, m.d_model, m.d_ff, moe.num_experts
        rows, a2a_bytes = self._moe_sizes()
        t = {"attn": self._seconds(8 * T * M * M + 4 * T * m.seq_len * M, "dense"),
             "ffn": self._seconds(4 * T * M * H, "dense"), "gate": self._seconds(2 * T * M * E, "gate"),
             "expert": self._seconds(4 * rows * M * H, "expert"), "head": self._seconds(2 * T * M * m.vocab_size, "dense")}
        a2a = self._all_to_all(a2a_bytes) if self.layout.expert_parallel > 1 else None
        ops: list[Op] = []

        def add(name: str, phase: str, after: int | None, **kw) -> int:
            ops.append(Op(name, phase, [] if after is None else [after], **kw))
            return len(ops) - 1

        def moe_comm(name: str, phase: str, after: int) -> int:
            if a2a is None:  # expert parallel size 1: the exchange is a local copy
                return add(name, phase, after, duration_s=0.0)
            return add(name, phase, after, **a2a)

        moe_layers = {i for i in range(m.n_layers) if i % m.moe_every == m.moe_every - 1}
        last = None
        for i in range(m.n_layers):
            last = add(f"L{i}.attn.fwd", "dense", last, duration_s=t["attn"])
            if i in moe_layers:
                last = add(f"L{i}.gate.fwd", "gate", last, duration_s=t["gate"])
                last = moe_comm(f"L{i}.dispatch.fwd", "dispatch_a2a", last)
                last = add(f"L{i}.expert.fwd", "expert", last, duration_s=t["expert"])
                last = moe_comm(f"L{i}.combine.fwd", "combine_a2a", last)
            else:
                last = add(f"L{i}.ffn.fwd", "dense", last, duration_s=t["ffn"])
        last = add("head.fwd_bwd", "dense", last, duration_s=3 * t["head"])
        grads_ready = {"head": last}
        for i in reversed(range(m.n_layers)):
            if i in moe_layers:
                last = moe_comm(f"L{i}.combine.bwd", "combine_a2a", last)
                last = add(f"L{i}.expert.bwd", "expert", last, duration_s=2 * t["expert"])
                last = moe_comm(f"L{i}.dispatch.bwd", "dispatch_a2a", last)
                last = add(f"L{i}.gate.bwd", "gate", last, duration_s=2 * t["gate"])
            else:
                last = add(f"L{i}.ffn.bwd", "dense", last, duration_s=2 * t["ffn"])
            last = add(f"L{i}.attn.bwd", "dense", last, duration_s=2 * t["attn"])
            grads_ready[i] = last
        backward_end = grads_ready["embed"] = last
        self._add_gradient_sync(ops, grads_ready, backward_end)
        return ops, backward_end

    def _add_gradient_sync(self, ops: list[Op], grads_ready: dict, backward_end: int) -> None:
        """Bucketed all-reduces, launched by the policy's rule, serialized on one communicator."""
        with torch.device("meta"):
            named = list(reversed(list(MoETransformer(self.cfg).named_parameters())))
        share = self.layout.experts_per_rank / self.cfg.moe.num_experts  # a rank holds its experts only
        sizes = [(p.numel() * self.elem * (share if is_expert_param(n) else 1.0), is_expert_param(n))
                 for n, p in named]
        plan = assign_buckets(sizes, int(self.cfg.comm.bucket_mb * 2**20))
        previous = None
        for k, (expert, idx) in enumerate(plan):
            cost = self._all_reduce(sum(sizes[i][0] for i in idx), expert)
            if cost is None:
                continue
            ready = grads_ready[_block_of(named[idx[-1]][0])]
            launch_after = ready if POLICIES[self.cfg.comm.policy].launch_when_ready else backward_end
            deps = [launch_after] + ([previous] if previous is not None else [])
            ops.append(Op(f"bucket{k}.allreduce", "allreduce", deps, **cost))
            previous = len(ops) - 1

    def run(self) -> StepSimulation:
        ops, backward_end = self.build()
        shared_latency = bool(self.cfg.hardware.host_cores)  # CPU testbed: latency is work on the host's cores
        return StepSimulation(ops, simulate(ops, self.topo.capacity, shared_latency), backward_end)


def _block_of(param_name: str):
    """Which backward op makes this parameter's gradient final (see StepModel.build)."""
    if param_name.startswith("blocks."):
        return int(param_name.split(".")[1])
    return "head" if param_name.startswith(("head", "ln_f")) else "embed"
