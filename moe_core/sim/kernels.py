"""The compute pricing of a training step's kernels: what each compute op of a rank costs.

Compute is priced by the compute model (moe_core.sim.compute) on the slowest device of the ranks,
op by op with the model's real shapes: every linear layer a GEMM (backward: its dX and dW GEMMs), the
attention core two batched GEMMs per pass, layer norms, residual adds and activations memory-bound,
the gate its GEMM plus the routing's kernels and bytes (counted on the real code, ``GATE_ROUTING``),
the experts one batched GEMM pair over the local experts, the contiguous copies on each side of an
all-to-all, and the optimizer step once the gradients are reduced. Under ``train.fp8`` the linear
layers' and experts' GEMMs run at the device's FP8 peak with Transformer Engine's casts of their
operands (``FP8_CAST_BYTES``); the attention core, the gate and the LM head stay in ``train.dtype``.
A calibrated profile's ``phase_efficiency`` multiplies the speed of each op class (dense, gate,
expert), :meth:`StepKernels.priced`; the streaming ops around them (copies, the optimizer) keep the op
sweep's price (``STREAMING_PHASES``).

:class:`StepKernels` prices kernels given how they are split (the tensor-parallel ranks of the
attention and FFN, the rows and hidden units of the local experts, the copies of an exchange, the
parameters a rank updates); the step (moe_core.sim.step) says how its layout splits them, and its DAG
(moe_core.sim.dag) places the ops.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from moe_core.model.activation import in_width
from moe_core.model.capacity import moe_tokens
from moe_core.model.heads import head_dim, kv_heads
from moe_core.sim.compute import ComputeModel

# The memory-bound ops beside the GEMMs (moe_core.model.transformer), per pass: (kernels, passes over their
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
# The gate's routing (moe_core.model.gating.gshard_gating forward, its backward to the logits) per top_k and
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


# The one-hot (G, S, E*C) slot matrices of the einsum permutation (moe.permute=einsum; moe_core.model.layer
# _capacity_einsum and slot_matrix), per side and pass: (bytes per element, kernels). Forward, the dispatch
# mask is zeroed and scattered in train.dtype (its element bytes, "elem"), the combine weights zeroed and
# scattered in float32 (4) and cast to train.dtype (read 4, write elem); backward, the combine weights'
# gradient is cast back to float32 (read elem, write 4) and gathered at the slots (per token: nothing
# per element); the mask takes no gradient. Each entry: (float32 bytes, elem multiples, kernels).
SLOT_MATRIX = {
    ("dispatch", "fwd"): (0, 1, 2),
    ("combine", "fwd"): (8, 1, 3),
    ("combine", "bwd"): (4, 1, 2),
    ("dispatch", "bwd"): (0, 0, 0),
}


# Transformer Engine's casts around an FP8 linear layer (train.fp8), in bytes moved per element of the
# operand cast: read in bfloat16, written in FP8 and as an FP8 transpose in one fused kernel (Hopper's
# FP8 GEMMs take only the "TN" layout, so the backward GEMMs read transposed copies).
FP8_CAST_BYTES = 2 + 1 + 1
FP8_AMAX_BYTES = 2  # current scaling: one more kernel reads the operand for its amax before the cast
FP8_OPERAND_BYTES = 1


# The streaming ops outside the layers: the copies around an exchange, the cuts of a pipelined one and
# the optimizer step. The op sweep measures what prices them (a contiguous copy, elementwise ops: the
# memory model), so no calibrated multiplier scales them: a step's dense multiplier is what its GEMMs,
# norms and activations miss. Scaled by it (0.42 on the CPU testbed), AdamW grew with the parameters a
# rank holds to 31 ms of a 16-expert step whose measured dense time is 47-51 ms at 4, 8 and 16 experts
# alike. The measured steps count these ops in ``dense_ms`` (moe_core.records.step_metrics), which is
# where calibration takes them out (moe_core.sim.calibrate.fit_compute).
STREAMING_PHASES = ("copy", "partition", "optimizer")


def calibration_class(phase: str) -> str | None:
    """The op class whose calibrated multiplier (``hardware.phase_efficiency``) an op phase takes:
    None for the streaming ops (:data:`STREAMING_PHASES`), which the op sweep's model prices alone."""
    return None if phase in STREAMING_PHASES else phase


def host_share(hw: DictConfig, topo, ranks: np.ndarray) -> float:
    """The share of a core each of ``ranks`` computes on: 1 on devices of their own (GPUs), else
    the host's cores over the ranks of its busiest node (a CPU testbed's, ``hw.host_cores``)."""
    if not hw.host_cores:
        return 1.0
    busiest_node = int(np.bincount(topo.node_of[ranks]).max())
    return min(1.0, hw.host_cores / busiest_node)


@dataclass(frozen=True)
class StepKernels:
    """The prices of one rank's kernels in a pass of ``cfg`` (one micro-batch's config: its shapes):
    on ``compute`` in ``train.dtype`` (``elem`` bytes an element), the FP8 GEMMs on ``fp8`` (None
    without ``train.fp8``), the weights' FP8 cast spread over the step's ``step_passes`` passes.
    Frozen: a variant (launch-free, another device's peak) is a copy with other compute models.
    ``cfg`` is held as plain dataclasses (``OmegaConf.to_object``): every op's price reads it, and a
    DictConfig lookup costs microseconds, most of a simulated pass's time."""

    cfg: Any
    compute: ComputeModel
    fp8: ComputeModel | None
    elem: int
    step_passes: int

    @classmethod
    def on_ranks(cls, cfg: DictConfig, topo, ranks: np.ndarray, elem: int, step_passes: int) -> StepKernels:
        """The kernels of ``ranks`` of ``topo``, priced on the slowest of them (whose pace a step
        keeps), their host cores shared by the ranks of the busiest node."""
        hw = cfg.hardware
        tflops = float(np.min(topo.device_tflops[ranks]))
        if tflops <= 0:
            raise ValueError(f"hardware '{topo.name}' has no peak_tflops; set it or calibrate the profile")
        share = host_share(hw, topo, ranks)
        compute = ComputeModel.from_profile(hw, tflops, elem, share)
        # FP8 linear layers: the same GEMM curve at the device's FP8 peak, on 1-byte operands
        fp8_tflops = tflops * hw.fp8_peak_tflops / hw.peak_tflops if hw.peak_tflops else 0
        fp8 = ComputeModel.from_profile(hw, fp8_tflops, FP8_OPERAND_BYTES, share) if cfg.train.fp8 != "none" else None
        return cls(OmegaConf.to_object(cfg), compute, fp8, elem, step_passes)

    def without_launches(self) -> StepKernels:
        """These kernels without their launches: the device's share of each op's time."""
        fp8 = self.fp8 and replace(self.fp8, launch_s=0.0)
        return replace(self, compute=replace(self.compute, launch_s=0.0), fp8=fp8)

    @property
    def tokens(self) -> int:
        """The tokens of a pass on one rank: its sequences times their length."""
        return self.cfg.train.batch_size * self.cfg.model.seq_len

    def priced(self, seconds: float, phase: str) -> float:
        """An op's compute-model time under the profile's calibrated multiplier for its class."""
        op_class = calibration_class(phase)
        return seconds if op_class is None else seconds / self.cfg.hardware.phase_efficiency.get(op_class, 1.0)

    # -- kernel classes ----------------------------------------------------------------------------
    def gemm(
        self, pass_: str, m: float, n: float, k: float, count: float = 1, model: ComputeModel | None = None
    ) -> float:
        """A GEMM in ``pass_``: forward, or its backward dX and dW GEMMs (on ``model``, default ``compute``)."""
        model = model or self.compute
        if pass_ == "fwd":
            return model.gemm(m, n, k, count)
        return model.gemm_backward(m, n, k, count)

    def weight_gemm(self, pass_: str, m: float, n: float, k: float, count: float = 1) -> float:
        """The GEMMs of a linear layer or an expert, X (m x k) times its weight (k x n), in ``pass_``:
        in train.dtype, or under train.fp8 at the FP8 peak with Transformer Engine's casts."""
        if self.fp8 is None:
            return self.gemm(pass_, m, n, k, count)
        return self.gemm(pass_, m, n, k, count, model=self.fp8) + self.fp8_casts(pass_, m, n, k, count)

    def fp8_casts(self, pass_: str, m: float, n: float, k: float, count: float) -> float:
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

    def elementwise(self, op: str, pass_: str, elements: float, element_bytes: int | None = None) -> float:
        """A memory-bound op of ``ELEMENTWISE`` over ``elements`` activation elements."""
        kernels, passes = ELEMENTWISE[op][pass_]
        return self.compute.memory_bound(passes * elements * (element_bytes or self.elem), kernels)

    def linear(self, pass_: str, tokens: float, out_features: float, in_features: float) -> float:
        """An ``nn.Linear`` with bias: Y = X W^T + b, its GEMM and, backward, its bias gradient."""
        return self.weight_gemm(pass_, tokens, out_features, in_features) + self.elementwise(
            "bias", pass_, tokens * out_features
        )

    # -- a block's ops -----------------------------------------------------------------------------
    def attention_core_seconds(self, pass_: str, head_split: int) -> float:
        """The attention core (scaled-dot-product attention, one fused kernel per batched GEMM):
        scores Q K^T and context P V for each sequence and head, heads split over ``head_split``
        ranks."""
        m = self.cfg.model
        count, features = self.cfg.train.batch_size * m.n_heads / head_split, head_dim(m)
        scores = self.gemm(pass_, m.seq_len, m.seq_len, features, count)
        context = self.gemm(pass_, m.seq_len, features, m.seq_len, count)
        return self.priced(scores + context, "dense")

    def norms_seconds(self, pass_: str) -> float:
        """A block's two pre-norms and two residual adds, on whole activations (also under a grid)."""
        elements = self.tokens * self.cfg.model.d_model
        return self.priced(
            2 * (self.elementwise("layer_norm", pass_, elements) + self.elementwise("residual", pass_, elements)),
            "dense",
        )

    def attention_seconds(self, pass_: str, tp: int) -> float:
        """QKV projection (K and V of the n_kv_heads heads), attention core, output projection; heads
        split over ``tp`` tensor-parallel ranks."""
        T, m = self.tokens, self.cfg.model
        q, kv = m.n_heads * head_dim(m), kv_heads(m) * head_dim(m)
        linears = self.linear(pass_, T, (q + 2 * kv) / tp, m.d_model) + self.linear(pass_, T, m.d_model, q / tp)
        return self.priced(linears, "dense") + self.attention_core_seconds(pass_, tp)

    def ffn_seconds(self, pass_: str, tp: int) -> float:
        """The dense FFN, hidden units split over ``tp`` tensor-parallel ranks: W_in (SwiGLU: gate and
        up), activation, W_out."""
        T, M = self.tokens, self.cfg.model.d_model
        H, activation = self.cfg.model.d_ff / tp, self.cfg.model.ffn_activation
        seconds = (
            self.linear(pass_, T, in_width(activation) * H, M)
            + self.elementwise(activation, pass_, T * H)
            + self.linear(pass_, T, M, H)
        )
        return self.priced(seconds, "dense")

    def expert_ffn_seconds(self, pass_: str, rows_each: float, count: int, hidden: float) -> float:
        """``count`` experts of ``hidden`` units on ``rows_each`` rows each, as one (batched) GEMM
        pair with the activation between: W_in (SwiGLU: gate and up), activation, W_out."""
        M, activation = self.cfg.model.d_model, self.cfg.model.ffn_activation
        seconds = (
            self.weight_gemm(pass_, rows_each, in_width(activation) * hidden, M, count)
            + self.elementwise(activation, pass_, count * rows_each * hidden)
            + self.weight_gemm(pass_, rows_each, M, hidden, count)
        )
        return self.priced(seconds, "expert")

    def gate_seconds(self, pass_: str) -> float:
        """The gate: its GEMM (tokens x d_model x experts) and the routing's kernels and bytes."""
        T, E = moe_tokens(self.cfg), self.cfg.moe.num_experts
        kernels, per_token_expert, per_token = gate_routing(self.cfg.moe.top_k, pass_)
        routing = self.compute.memory_bound(T * (per_token_expert * E + per_token), kernels)
        return self.priced(self.gemm(pass_, T, E, self.cfg.model.d_model) + routing, "gate")

    def head_seconds(self, passes: tuple[str, ...] = ("fwd", "bwd")) -> float:
        """Final norm, LM head (no bias) and cross-entropy (float32 logits) in ``passes``."""
        T, m = self.tokens, self.cfg.model
        seconds = sum(
            self.elementwise("layer_norm", p, T * m.d_model)
            + self.gemm(p, T, m.vocab_size, m.d_model)
            + self.elementwise("cross_entropy", p, T * m.vocab_size, element_bytes=4)
            for p in passes
        )
        return self.priced(seconds, "dense")

    def embedding_seconds(self, pass_: str) -> float:
        """The token embedding's gather and the position add (backward: its scatter-add)."""
        return self.priced(self.elementwise("embedding", pass_, self.tokens * self.cfg.model.d_model), "dense")

    # -- around the exchanges and after the passes -------------------------------------------------
    def copy_seconds(self, buffer_bytes: float, copies: int) -> float:
        """``copies`` contiguous copies of a ``buffer_bytes`` buffer on one side of an MoE exchange."""
        return self.priced(copies * self.compute.copy(buffer_bytes), "copy")

    def slot_einsum_seconds(self, side: str, pass_: str, groups: int, group_tokens: int, slots: int) -> float:
        """One side of GShard's einsum permutation (moe.permute=einsum) in ``pass_``, over ``groups``
        groups of ``group_tokens`` tokens and ``slots`` = E * C slots each: its GEMMs against the
        one-hot slot matrices and the matrices' own memory traffic (SLOT_MATRIX). Forward, the dispatch
        is (E*C x S) @ (S x M) a group and the combine (S x E*C) @ (E*C x M); backward, the combine
        takes both its gradients (the expert outputs' and its weights', to the gate) and the dispatch
        only the tokens' (its mask is constant)."""
        M = self.cfg.model.d_model
        if (side, pass_) == ("dispatch", "fwd"):
            gemms = self.gemm("fwd", slots, M, group_tokens, groups)
        elif side == "combine":
            gemms = self.gemm(pass_, group_tokens, M, slots, groups)
        else:  # the dispatch's backward: dX = mask^T dY, one GEMM
            gemms = self.gemm("fwd", group_tokens, M, slots, groups)
        float32_bytes, elems, kernels = SLOT_MATRIX[side, pass_]
        elements = groups * group_tokens * slots
        matrices = self.compute.memory_bound((float32_bytes + elems * self.elem) * elements, kernels)
        return self.priced(gemms + matrices, "copy")

    def partition_seconds(self, buffer_bytes: float) -> float:
        """Cutting a ``buffer_bytes`` buffer into a pipelined exchange's micro-ops, or joining them
        (moe_core.comm.all_to_all.pipelined_exchange copies each one's rows out of it, and the results back)."""
        return self.priced(self.compute.copy(buffer_bytes), "partition")

    def optimizer_seconds(self, numels: list[float]) -> float:
        """AdamW over tensors of ``numels`` elements: fused where the profile's stack fuses it, else
        torch's default (its multi-tensor implementation on CUDA, a loop over tensors on CPU)."""
        hw = self.cfg.hardware
        implementation = "fused" if hw.fused_optimizer else "foreach" if hw.device == "cuda" else "for-loop"
        return self.priced(self.compute.optimizer(numels, implementation), "optimizer")
