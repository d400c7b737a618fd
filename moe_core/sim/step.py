"""A training step as a DAG of operations: the simulated executor of the measured train_step.

Built from the same config as a measured run and through the same decisions: the layout
(``layout.layout_of``), the expert capacity (``capacity.capacity``) and the policy's communication
plan (``policies.build_plan`` of ``model.gradient_tensors``: gradient units over the model's real
parameters, instantiated on the meta device, their launch rule and priority, the MoE layers' token
exchange, expert packing). Every collective is an SPMD operation whose footprint sums all its
groups (moe_core.sim.topology).

:class:`StepModel` holds what a step is priced on: the layout and the groups it spans, the plan, the
sizes of the MoE layers' exchanges, the collectives' costs on the topology, and its compute ops'
prices (``kernels``, moe_core.sim.kernels); its DAG is built by moe_core.sim.dag and read by
moe_core.sim.timeline. On a GPU (``hardware.device`` cuda) the kernels' launches leave the ops for a
host thread that issues them in program order and may run ahead of the device
(moe_core.sim.engine.issued_by_host, priced as each op's time less its launch-free time); the host
waits for the device only where it reads device data: a dropless exchange's split sizes, and a
gate that reads its expert counts (``moe.gate_host_sync``, DeepSpeed-MoE's before 2024-08). On a CPU
the launches stay in the ops, one after another.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from omegaconf import DictConfig

from moe_core.dispatch import routes_dropless
from moe_core.dispatch.base import Dispatcher, Route
from moe_core.model.capacity import DTYPE_BYTES, dispatch_rows_per_expert, expert_tensor_parallel, moe_tokens
from moe_core.parallel.layout import Layout, expert_layout, layout_of
from moe_core.schedule.gradients import gradient_tensors
from moe_core.schedule.policies import build_plan, layout_decisions
from moe_core.schema.validation import micro_batch_config
from moe_core.sim.collectives import collective_op, simulate_on
from moe_core.sim.dag import StepDag, block_of
from moe_core.sim.engine import Op, issued_by_host
from moe_core.sim.kernels import StepKernels, host_share
from moe_core.sim.time_slicing import with_straggler_waits
from moe_core.sim.timeline import StepSimulation
from moe_core.sim.topology import Transfer


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
        self.dropless = routes_dropless(cfg)  # uneven splits
        self._use_layout(layout_of(cfg))
        if self.layout.world_size > topo.n:
            raise ValueError(f"world_size {self.layout.world_size} exceeds the {topo.n} devices of '{topo.name}'")
        ranks = np.arange(self.layout.world_size)
        self.kernels = StepKernels.on_ranks(self.cfg, topo, ranks, self.elem, self.step_passes)
        # a GPU runs kernels as its host issues them, which can run ahead (engine.issued_by_host); on a
        # CPU the same cores issue and compute, so a kernel's launch is part of its time
        self.asynchronous = cfg.hardware.device == "cuda" and cfg.hardware.kernel_launch_us > 0
        exchange, relayout = layout_decisions(cfg, self.elem)
        if relayout is not None:  # the layout the plan's re-layout decides on simulated costs
            self._use_layout(relayout.decide(self.layout, self._micro_op_costs(exchange)))
        self.plan = build_plan(cfg, self._gradient_tensors(), self.elem)

    def _gradient_tensors(self) -> list:
        """The gradient tensors of this layout that these ranks hold (``embedding``, ``head``)."""
        held = {"embed": self.embedding, "head": self.head}
        return [t for t in gradient_tensors(self.cfg, self.layout) if held.get(block_of(t.name), True)]

    def _use_layout(self, layout: Layout) -> None:
        """Price the step on ``layout``: the experts' layout and the groups its collectives span."""
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

    def gradient_groups(self, group: str) -> np.ndarray:
        """The rank groups a gradient of ``group`` is summed over: the experts' by their own layout."""
        return (self.moe_layout if group == "expert" else self.layout).gradient_groups(group)

    def _micro_op_costs(self, exchange: Dispatcher) -> Callable[[Layout], tuple[float, float]]:
        """This model's (expert FFN seconds, all-to-all seconds) of one micro-op of ``exchange`` on a
        candidate layout, priced on a copy of the model moved to it: the simulated costs the plan's
        packing decision is taken from."""

        @functools.cache
        def per_micro_op(layout: Layout) -> tuple[float, float]:
            candidate = copy.copy(self)
            candidate._use_layout(layout)
            rows, a2a_bytes = candidate.moe_sizes()
            count = candidate.micro_op_count(exchange)
            a2a = (
                candidate.all_to_all(a2a_bytes, exchange.route)[0] if candidate.moe_layout.expert_parallel > 1 else None
            )
            a2a_s = simulate_on(self.cfg.hardware, self.topo, [Op("a2a", "x", **a2a)]).makespan_s if a2a else 0.0
            return candidate.expert_seconds(rows / count, "fwd"), a2a_s / count

        return per_micro_op

    # -- sizes -----------------------------------------------------------------------------------
    def moe_sizes(self) -> tuple[int, float]:
        """(expert rows computed per rank, all-to-all bytes each rank sends per all-to-all)."""
        m, moe = self.cfg.model, self.cfg.moe
        if self.dropless:  # balanced routing: every rank receives top_k * tokens rows
            rows = moe.top_k * moe_tokens(self.cfg)
            return rows, rows * m.d_model * self.elem
        per_expert = dispatch_rows_per_expert(self.cfg)  # G * C
        rows = self.moe_layout.experts_per_rank * self.moe_layout.expert_parallel * per_expert
        return rows, moe.num_experts * per_expert * m.d_model * self.elem

    def micro_op_count(self, exchange: Dispatcher) -> int:
        """The all-to-all micro-ops along the token dimension ``exchange`` cuts a capacity buffer
        into (one, whole, unless it cuts; dropless exchanges are never cut)."""
        if self.dropless:
            return 1
        row_bytes = self.cfg.moe.num_experts * self.cfg.model.d_model * self.elem  # a row for every expert
        return len(exchange.micro_ops(dispatch_rows_per_expert(self.cfg), row_bytes))

    # -- what a rank of the layout computes -----------------------------------------------------
    def expert_seconds(self, rows: float, pass_: str) -> float:
        """The local experts on ``rows`` rows in all (rows / experts each): one batched GEMM pair
        (torch.bmm over the local experts), the activation between; hidden units split over the
        experts' tensor-parallel ranks."""
        e_local = self.moe_layout.experts_per_rank
        return self.kernels.expert_ffn_seconds(pass_, rows / e_local, e_local, self.cfg.model.d_ff / self.expert_tp)

    def copy_seconds(self, buffer_bytes: float) -> float:
        """The contiguous copies on one side of an MoE exchange: the sender's permute of its tokens
        into the expert-major buffer (or back), and under expert parallelism the receiver's
        re-layout of what arrived (moe_core.model.layer). Modelled together on the sender's side."""
        return self.kernels.copy_seconds(buffer_bytes, 2 if self.moe_layout.expert_parallel > 1 else 1)

    def permute_seconds(self, side: str, pass_: str) -> float:
        """One side of an MoE exchange in ``pass_`` (``side`` "dispatch": the tokens into the expert
        slots, or back out in the backward; "combine": the outputs back to the tokens, or the reverse):
        its copies, and under moe.permute=einsum GShard's GEMMs against one-hot slot matrices."""
        seconds = self.copy_seconds(self.moe_sizes()[1])
        moe = self.cfg.moe
        if moe.permute == "einsum":
            tokens = moe_tokens(self.cfg)
            group = moe.group_size or tokens
            groups = tokens // group
            slots = moe.num_experts * dispatch_rows_per_expert(self.cfg) // groups  # E * C a group
            seconds += self.kernels.slot_einsum_seconds(side, pass_, groups, group, slots)
        return seconds

    def optimizer_seconds(self) -> float:
        """AdamW over this rank's parameters, sharded: its 1/p of every tensor's, p the ranks that
        hold replicas of it."""
        return self.kernels.optimizer_seconds([t.numel / self._shards(t.group) for t in self.plan.tensors])

    def _shards(self, group: str) -> int:
        """Over how many ranks a gradient group's parameters and optimizer state are sharded."""
        return 1 if self.sharding == "none" else self.gradient_groups(group).shape[1]

    # -- collectives -----------------------------------------------------------------------------
    def _merged(self, transfers: list[Transfer]) -> Transfer:
        """One SPMD collective's footprint: its groups' transfers summed link by link."""
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

    def all_to_all(self, bytes_per_rank: float, route: Route = "direct") -> list[dict]:
        """The op costs of one MoE all-to-all over every "ep" group along ``route``
        (moe_core.dispatch.base.Collective): one op, or where the groups span nodes the two-phase
        exchange's phases (intra-node, then inter-node, as the measured run does:
        moe_core.comm.hierarchical_a2a) or the forwarded exchange's one op of both legs."""
        if route != "direct" and len(np.unique(self.topo.node_of[self.ep_groups[0]])) > 1:
            p = self.moe_layout.expert_parallel
            traffic = np.full((p, p), bytes_per_rank / p)
            if route == "two_phase":
                phases = zip(*[self.topo.hierarchical_all_to_all(g, traffic) for g in self.ep_groups])
            else:
                phases = [[self.topo.relayed_all_to_all(g, traffic) for g in self.ep_groups]]
            footprints = [self._merged(list(phase)) for phase in phases]
        else:
            footprints = [self._merged([self.topo.uniform_all_to_all(g, bytes_per_rank) for g in self.ep_groups])]
        costs = [collective_op(self.cfg.hardware, self.topo, "all_to_all", f) for f in footprints]
        fit = self.cfg.hardware.collectives.get("all_to_all")
        if fit is not None:  # a blocking exchange inside a step also waits for late peers
            costs[-1]["latency_s"] += fit.in_step_us * 1e-6
        return costs

    def ring(self, collective: str, groups: np.ndarray, bytes_per_rank: float) -> dict | None:
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

    @property
    def gradient_sync(self) -> tuple[str, str]:
        """The gradient sync's (ring collective, op phase): all-reduces, or a sharded run's reduce-scatters."""
        return ("all_reduce", "allreduce") if self.sharding == "none" else ("reduce_scatter", "reduce_scatter")

    def run(self) -> StepSimulation:
        """Simulate the step: its ops (issued by the host thread on an asynchronous device) on the
        topology, with the gradient sync's cost alone for comparison."""
        ops, backward_end = self.build()
        alone_s = self._alone_seconds(ops, self.gradient_sync[1])
        if self.asynchronous:
            work = self._without_launches()
            ops, where = issued_by_host(work, [op.duration_s - w.duration_s for op, w in zip(ops, work)])
            backward_end = where[backward_end]
        else:  # CPU ranks that outnumber the cores also wait for each other's slices
            share = host_share(self.cfg.hardware, self.topo, np.arange(self.layout.world_size))
            ops = with_straggler_waits(ops, self.cfg.hardware, share)
        timeline = simulate_on(self.cfg.hardware, self.topo, ops)
        return StepSimulation(ops, timeline, backward_end, alone_s)

    def _without_launches(self) -> list[Op]:
        """The step's ops priced without kernel launches: the device's share of each op's time (every
        op's price is its kernels' launches plus this, moe_core.sim.compute)."""
        priced = self.kernels
        self.kernels = priced.without_launches()
        try:
            ops, _ = self.build()
        finally:
            self.kernels = priced
        return ops

    def _alone_seconds(self, ops: list[Op], phase: str) -> float:
        """The ``phase`` ops' time each alone on the network, one after another: what their units
        (whole tensors, buckets or micro-ops, each paying its latency) cost to transmit."""
        chain = [replace(op, deps=[k - 1] if k else []) for k, op in enumerate(o for o in ops if o.phase == phase)]
        return simulate_on(self.cfg.hardware, self.topo, chain).makespan_s if chain else 0.0
