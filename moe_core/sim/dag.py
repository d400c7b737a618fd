"""One training step's DAG of operations, built in program order (moe_core.sim.step prices and runs it).

:class:`StepDag` builds the DAG in one pass over the blocks. Per layer (MoE layers as in GShard:
gate -> dispatch all-to-all -> experts -> combine all-to-all): forward ops in order, then backward
ops in reverse order, then gradient all-reduces per plan unit: after the whole backward or as soon
as a unit's last gradient is ready, one unit after another on one communicator, then the
optimizer. An MoE layer's exchange between its two copies is the plan's exchange object's own ops
(moe_core.dispatch.base.Dispatcher.simulate: whole or two-phase all-to-alls, pipelined micro-ops with the
experts behind them, the tensor-parallel drop-and-all-gather chunks), so the builder never asks
which mechanism it is. Under a 3D tensor-parallel grid the attention and dense FFN are its linear
layers with their collectives and overlaps (moe_core.sim.grid_ops). Compute ops take the step's
kernel prices (moe_core.sim.kernels), collectives the step's costs on the topology.

Data parallelism (``parallel.data_sharding``): replicated, the plan's units are all-reduced; with
a sharded optimizer (ZeRO-1) the same units are reduce-scattered, each rank's optimizer updates its
1/dp of the parameters and the units are all-gathered after it, one after another on one
communicator; fully sharded (ZeRO-3 / FSDP2), the plan's units give way to per-block all-gathers
and reduce-scatters during the passes (moe_core.sim.sharding), and the optimizer updates the shard.
Gradient accumulation (``train.micro_batches``): the forward and backward passes once per
micro-batch, each pass priced on its own shapes (moe_core.schema.validation.micro_batch_config); the plan's
gradient sync follows the last pass only (DDP's ``no_sync`` before it), launched by its rule on the
last pass's gradients, while full sharding reduces every pass's.
"""

from __future__ import annotations

from moe_core.dispatch.base import Route
from moe_core.model.capacity import moe_blocks
from moe_core.schedule.executor import executor_class
from moe_core.schedule.policies import policy_spec
from moe_core.sim.collectives import queued_in_flight
from moe_core.sim.engine import Op, as_deps
from moe_core.sim.grid_ops import GridOps
from moe_core.sim.sharding import ROOT, FullShardOps


def block_of(param_name: str):
    """Which backward op makes this parameter's gradient final (:meth:`StepDag.forward_backward`'s
    ``grads_ready`` keys): its block's, the head's or the embeddings'."""
    if param_name.startswith("blocks."):
        return int(param_name.split(".")[1])
    return "head" if param_name.startswith(("head", "ln_f")) else "embed"


class StepDag:
    """One build of the DAG of ``step`` (a moe_core.sim.step.StepModel, whose ``build`` runs it): the
    ops in order, and the methods that append a block's parts to them, named
    ``[mb<j>/][recompute/]L<i>.<part>.<pass>``; ops are priced by the step's ``kernels`` and costs.

    The plan's exchange (moe_core.dispatch.base.Dispatcher.simulate) appends each MoE layer's exchange
    through ``add``, ``all_to_all``, ``tp_all_gather`` and ``experts``, sized by ``a2a_bytes`` (what a
    rank sends per whole all-to-all), ``micro_ops`` (the micro-ops it cuts a capacity buffer into),
    ``partition_s`` (cutting the buffer into them, or joining them) and ``tp``.
    """

    def __init__(self, step):
        self.step, self.cfg = step, step.cfg
        self.ops: list[Op] = []
        self.prefix = ""  # of a micro-batch's op names, "mb<j>/", when there are several
        self.tp = step.layout.tensor_parallel
        self.rows, self.a2a_bytes = step.moe_sizes()
        self.micro_ops = step.micro_op_count(step.plan.exchange)
        kernels = step.kernels
        self.op_seconds = {  # per pass
            name: {p: seconds(p) for p in ("fwd", "bwd")}
            for name, seconds in (
                ("norms", kernels.norms_seconds),
                ("attn", lambda p: kernels.attention_seconds(p, self.tp)),
                ("ffn", lambda p: kernels.ffn_seconds(p, self.tp)),
                ("gate", kernels.gate_seconds),
                ("expert", lambda p: step.expert_seconds(self.rows, p)),
                ("expert_micro_op", lambda p: step.expert_seconds(self.rows / self.micro_ops, p)),
                ("embed", kernels.embedding_seconds),
            )
        }
        # an exchange's two sides by pass: forward the dispatch's permutation, then the combine's; the
        # backward runs them in reverse
        sides = {"fwd": ("dispatch", "combine"), "bwd": ("combine", "dispatch")}
        self.permute_s = {p: tuple(step.permute_seconds(side, p) for side in sides[p]) for p in sides}
        # a pipelined exchange in micro-ops: the partition and the concatenation
        self.partition_s = kernels.partition_seconds(self.a2a_bytes)
        self.activation_bytes = kernels.tokens * self.cfg.model.d_model * step.elem
        self.a2a_costs: dict[tuple[float, bool], list[dict]] = {}  # one all-to-all's op costs by size
        self.grid = None if step.layout.grid.is_trivial else GridOps(step, self.add)
        self.shards = FullShardOps(step, self.add) if step.sharding == "full" else None
        self.moe_layers = set(moe_blocks(self.cfg.model.n_layers, self.cfg.model.moe_every))
        # the keys the per-layer methods read, read once: a config lookup costs microseconds and a
        # step appends tens of thousands of ops
        self.dropless, self.gate_host_sync = step.dropless, self.cfg.moe.gate_host_sync
        self.recompute, self.recompute_layers = self.cfg.train.recompute, self.cfg.train.recompute_layers
        self.expert_allreduce_bytes = self.rows * self.cfg.model.d_model * step.elem

    def add(self, name: str, phase: str, after: int | list[int] | None, **kw) -> int:
        """Append an op after op(s) ``after``; its index."""
        self.ops.append(Op(self.prefix + name, phase, as_deps(after), **kw))
        return len(self.ops) - 1

    # -- the MoE layers' exchanges -----------------------------------------------------------------
    def all_to_all(self, name: str, phase: str, after, share: float, route: Route = "direct") -> int:
        """One all-to-all of 1/``share`` of ``a2a_bytes`` over every "ep" group (every micro-op pays
        the latency) along ``route``: one op, or a two-phase exchange's phases; a local copy of no
        time without expert parallelism."""
        if self.step.moe_layout.expert_parallel == 1:
            return self.add(name, phase, after, duration_s=0.0)
        nbytes = self.a2a_bytes / share
        if (nbytes, route) not in self.a2a_costs:
            self.a2a_costs[nbytes, route] = self.step.all_to_all(nbytes, route)
        # a dropless exchange's forward dispatch needs its split sizes on the host (NOTE: the host
        # sync of moe_core.model.layer, and of Megatron's dropless dispatcher)
        sync = self.dropless and phase == "dispatch_a2a" and name.endswith(".fwd")
        for k, cost in enumerate(self.a2a_costs[nbytes, route]):
            after = self.add(name, phase, after, host_sync=sync and k == 0, **cost)
        return after

    def tp_all_gather(self, name: str, phase: str, after, share: float) -> int:
        """An all-gather over every "tp" group of 1/``share`` of ``a2a_bytes`` per rank."""
        return self.add(name, phase, after, **self.step.ring("all_gather", self.step.tp_groups, self.a2a_bytes / share))

    def experts(self, layer: int, pass_: str, after, micro_op: int | None = None) -> int:
        """The local experts on the layer's rows (or on micro-op ``micro_op`` of them) and, with their
        hidden units split, the all-reduce of their partial sums over "tp"."""
        key, suffix = ("expert", "") if micro_op is None else ("expert_micro_op", str(micro_op))
        last = self.add(f"L{layer}.expert{suffix}.{pass_}", "expert", after, duration_s=self.op_seconds[key][pass_])
        if self.step.expert_tp == 1:
            return last
        return self.tp_all_reduce(f"L{layer}.expert_allreduce{suffix}.{pass_}", last, self.expert_allreduce_bytes)

    def moe_exchange(self, layer: int, first: str, second: str, last: int, pass_: str) -> int:
        """copy -> the plan's exchange (``first`` all-to-all, experts, ``second``) -> copy."""
        before, after = self.permute_s[pass_]
        last = self.add(f"L{layer}.copy_before.{pass_}", "copy", last, duration_s=before)
        last = self.step.plan.exchange.simulate(self, layer, first, second, last, pass_)
        return self.add(f"L{layer}.copy_after.{pass_}", "copy", last, duration_s=after)

    # -- the dense parts ---------------------------------------------------------------------------
    def compute(self, kind: str, pass_: str, last, layer: int | None = None) -> int:
        """An op of ``op_seconds``' dense ``kind``, of block ``layer`` or of the whole model."""
        name = kind if layer is None else f"L{layer}.{kind}"
        return self.add(f"{name}.{pass_}", "dense", last, duration_s=self.op_seconds[kind][pass_])

    def tp_all_reduce(self, name: str, after: int, nbytes: float) -> int:
        """Megatron's f (backward) or g (forward) all-reduce of activations over "tp"."""
        if self.tp == 1:
            return after
        return self.add(name, "tp_allreduce", after, **self.step.ring("all_reduce", self.step.tp_groups, nbytes))

    def attention(self, i: int, pass_: str, last):
        """The attention's ops: whole or Megatron-split (with its all-reduce), or on the grid."""
        if self.grid is not None:
            return self.grid.attention(i, pass_, last)
        attn = self.compute("attn", pass_, last, i)
        return self.tp_all_reduce(f"L{i}.attn_allreduce.{pass_}", attn, self.activation_bytes)

    def dense_ffn(self, i: int, pass_: str, last):
        """The dense FFN's ops: whole or Megatron-split (with its all-reduce), or on the grid."""
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
        sync = self.gate_host_sync  # the host reads the gate's counts (DeepSpeed-MoE's gate)
        last = self.add(f"L{i}.gate.fwd", "gate", last, duration_s=self.op_seconds["gate"]["fwd"], host_sync=sync)
        return self.moe_exchange(i, "dispatch", "combine", last, "fwd")

    def attention_core_forward(self, i: int, last) -> int:
        """Selective recomputation (Korthikanti et al. 2022): only the attention core's forward
        (Q K^T, softmax, P V) again before the block's backward, its heads split over "tp"."""
        seconds = self.step.kernels.attention_core_seconds("fwd", self.tp)
        return self.add(f"L{i}.attn_core.fwd", "dense", last, duration_s=seconds)

    def block_backward(self, i: int, last) -> int:
        """Block ``i``'s backward ops, after its recomputation (named "recompute/...") if any."""
        recompute, layers = self.recompute, self.recompute_layers
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
            last = self.add(
                "head.fwd_bwd", "dense", self.gathered(ROOT, "bwd", last), duration_s=step.kernels.head_seconds()
            )
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
            reduced = self.gradient_sync(grads_ready, [backward_end, *deferred])
        optimizer = self.add(
            "optimizer", "optimizer", [backward_end, *deferred, *reduced], duration_s=step.optimizer_seconds()
        )
        if step.sharding == "optimizer":
            self.parameter_gathers(optimizer)
        return self.ops, backward_end

    # -- data parallelism's collectives ------------------------------------------------------------
    def gradient_sync(self, grads_ready: dict, after_backward: list[int]) -> list[int]:
        """The plan's gradient sync as its policy's scheduling rule simulates it (the executor class
        the measured run executes it with: moe_core.schedule.executor.CommPolicy.simulate_gradient_sync),
        through :meth:`gradient_cost`, :meth:`gradients_ready`, :meth:`queued_in_flight` and ``add``.
        ``after_backward``: the end of the backward pass and the reduce-scatters a grid completes
        after it. Returns the all-reduces still in flight at the end (the optimizer's wait), none
        when no gradient is reduced."""
        rule = executor_class(policy_spec(self.cfg.comm.policy))
        return rule.simulate_gradient_sync(self, grads_ready, after_backward)

    @property
    def gradient_phase(self) -> str:
        """The phase of the gradient collectives: all-reduce, or reduce-scatter under a sharded optimizer."""
        return self.step.gradient_sync[1]

    def gradient_cost(self, unit) -> dict | None:
        """The op cost of reducing a plan unit over its gradient groups; None where they hold one rank."""
        step = self.step
        return step.ring(step.gradient_sync[0], step.gradient_groups(unit.group), unit.numel * step.elem)

    def gradients_ready(self, grads_ready: dict, unit) -> list[int]:
        """The op that makes a unit's last gradient final (``grads_ready``: by block)."""
        return as_deps(grads_ready[block_of(self.step.plan.tensors[unit.last_tensor].name)])

    def queued_in_flight(self) -> int:
        """How many queued collectives the backend runs at once (gloo's worker threads)."""
        return queued_in_flight(self.cfg.hardware)

    def parameter_gathers(self, optimizer: int) -> None:
        """A sharded optimizer's all-gathers of the updated parameters, the plan's units one after
        another on one communicator once the optimizer step is done (Megatron's distributed optimizer
        without ``overlap_param_gather``): each rank then holds every parameter for the next step."""
        step, previous = self.step, optimizer
        for k, unit in enumerate(step.plan.gradient_units):
            cost = step.ring("all_gather", step.gradient_groups(unit.group), unit.numel * step.elem)
            if cost is not None:
                previous = self.add(f"param_gather{k}", "param_all_gather", [previous], **cost)
