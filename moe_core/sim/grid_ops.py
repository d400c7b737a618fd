"""The simulated executor of a 3D tensor-parallel grid's linear layers (moe_core.parallel.grid).

The same schedule as the measured layers (moe_core.parallel.grid_parallel), read from the same decisions:
every linear's collectives come from ``moe_core.parallel.grid.linear_collectives`` and what overlaps what
from the plan's ``grid_overlaps``. Per linear layer:

* forward: the weight's all-gather over "depth" (issued when the previous layer got its weight, if
  the plan prefetches; else after the previous op), the matmul, the all-reduce over the inner group,
  and for a pair's second layer the all-gather of its output over "col";
* backward: the all-gather over "depth" unless the block caches its weights, ``dX = dY W``, its
  all-reduce over the outer group, ``dW = dY^T X`` (after the all-reduce, or beside it if the plan
  overlaps it), the reduce-scatter over "depth" (waited for before the next layer's backward, or
  after the backward pass if the plan overlaps it), and for a pair's first layer the all-gather of
  ``dX`` over "col".

Matmuls are split over row x col: a rank's GEMM is its tokens x its block of the weight, priced by
the step's compute model (moe_core.sim.compute) with that shape; the attention core over "row"
(heads), computed alike by the "col" ranks of a row.
"""

from __future__ import annotations

from collections.abc import Callable

from moe_core.parallel.grid import LinearSpec, block_linears, linear_collectives
from moe_core.sim.compute import backward_shapes
from moe_core.sim.engine import as_deps

RELU_INPUT = {"ffn.w_out"}  # linear layers whose input is the FFN's ReLU output


class GridOps:
    """Adds a block's grid-split attention and dense FFN to a step DAG (moe_core.sim.dag)."""

    def __init__(self, step, add: Callable[..., int]):
        self.step, self.add = step, add
        cfg = step.cfg
        self.grid, self.overlaps = step.layout.grid, step.plan.grid_overlaps
        self.tokens = cfg.train.batch_size * cfg.model.seq_len
        self.specs = {s.name: s for s in block_linears(cfg.model.d_model, cfg.model.d_ff, dense_ffn=True)}
        self.prefetch_anchor: dict[str, int | None] = {}  # the last weight all-gather per pass
        self.deferred: list[int] = []  # reduce-scatters completed after the backward pass
        self.start_pass()

    def start_pass(self) -> None:
        """A new forward and backward pass (gradient accumulation's next micro-batch): the first
        layer's weight all-gather of each pass is not prefetched."""
        self.prefetch_anchor = {"fwd": None, "bwd": None}

    def attention(self, i: int, pass_: str, last) -> int | list[int]:
        core = self.step.kernels.attention_core_seconds(pass_, head_split=self.grid.row)
        qkv, proj = self.specs["attn.qkv"], self.specs["attn.proj"]
        if pass_ == "fwd":
            last = self.linear(i, qkv, True, "fwd", last)
            last = self.add(f"L{i}.attn.core.fwd", "dense", last, duration_s=core)
            return self.linear(i, proj, False, "fwd", last)
        last = self.linear(i, proj, False, "bwd", last)
        last = self.add(f"L{i}.attn.core.bwd", "dense", last, duration_s=core)
        return self.linear(i, qkv, True, "bwd", last)

    def ffn(self, i: int, pass_: str, last) -> int | list[int]:
        w_in, w_out = self.specs["ffn.w_in"], self.specs["ffn.w_out"]
        if pass_ == "fwd":
            return self.linear(i, w_out, False, "fwd", self.linear(i, w_in, True, "fwd", last))
        return self.linear(i, w_in, True, "bwd", self.linear(i, w_out, False, "bwd", last))

    def linear(self, i: int, spec: LinearSpec, first_of_pair: bool, pass_: str, last) -> int | list[int]:
        """One linear layer's ops in ``pass_``; returns what the next op waits for."""
        cached = self.overlaps.caches(i)
        planned = {
            (c.kind, c.axis): c.elements
            for c in linear_collectives(spec, self.grid, self.tokens, cached, first_of_pair)
            if c.pass_ == pass_
        }

        def comm(kind: str, axis: str, after):
            if (kind, axis) not in planned:
                return after
            groups = self.step.layout.groups(axis)
            cost = self.step.ring(kind, groups, planned[kind, axis] * self.step.elem)
            return self.add(f"L{i}.{spec.name}.{kind}_{axis}.{pass_}", f"grid_{kind}", after, **cost)

        gathered = None
        if ("all_gather", "depth") in planned:
            anchor = self.prefetch_anchor[pass_] if self.overlaps.all_gather else None
            gathered = comm("all_gather", "depth", anchor if anchor is not None else last)
            self.prefetch_anchor[pass_] = gathered
        deps = [*as_deps(last), gathered]
        if pass_ == "fwd":
            y = self.add(f"L{i}.{spec.name}.fwd", "dense", deps, duration_s=self.compute_seconds(spec, "fwd"))
            return comm("all_gather", "col", comm("all_reduce", spec.inner, y))
        dx = self.add(f"L{i}.{spec.name}.dx.bwd", "dense", deps, duration_s=self.compute_seconds(spec, "dx"))
        reduced = comm("all_reduce", spec.outer, dx)
        dw = self.add(
            f"L{i}.{spec.name}.dw.bwd",
            "dense",
            dx if self.overlaps.all_reduce else reduced,
            duration_s=self.compute_seconds(spec, "dw"),
        )
        done = [reduced, dw]
        scattered = comm("reduce_scatter", "depth", dw)
        if scattered != dw:
            (self.deferred if self.overlaps.reduce_scatter else done).append(scattered)
        return comm("all_gather", "col", done)

    def compute_seconds(self, spec: LinearSpec, part: str) -> float:
        """One compute op of a grid-split linear layer on this rank's block, X (tokens, in_local) and
        W (out_local, in_local): ``part`` "fwd" (Y = X W^T, after the ReLU if its input is the FFN's
        hidden layer), "dx" (dX = dY W, then the ReLU's backward) or "dw" (dW = dY^T X and the bias
        gradient), priced as the whole layers' ops are (moe_core.sim.kernels)."""
        kernels = self.step.kernels
        out_local = spec.out_features // self.grid.size(spec.outer)
        in_local = spec.in_features // self.grid.size(spec.inner)
        shape = (self.tokens, out_local, in_local)
        if part == "fwd":
            seconds = kernels.compute.gemm(*shape)
        else:
            dx_shape, dw_shape = backward_shapes(*shape)
            seconds = kernels.compute.gemm(*(dx_shape if part == "dx" else dw_shape))
        relu_pass = {"fwd": "fwd", "dx": "bwd"}.get(part)
        if relu_pass and spec.name in RELU_INPUT:
            seconds += kernels.elementwise("relu", relu_pass, self.tokens * in_local)
        if part == "dw":
            seconds += kernels.elementwise("bias", "bwd", self.tokens * out_local)
        return kernels.priced(seconds, "dense")
