"""The compute model: what one op of a simulated step costs on one device, priced by op class.

A single efficiency for every op (FLOPs / (peak x 0.5)) cannot say that small and skinny GEMMs run
far below peak, that softmax, layer norm, top-k, scatter and copies are bound by memory or by kernel
launches, or that the gate of an MoE layer (tens of tiny kernels on tokens x experts elements) can
cost more than its expert GEMMs, as the H200 record shows (results/reference/2026-11-30-h200). So
ops are priced by class, from a device's spec (peak FLOP/s, memory bandwidth) and a few efficiency
parameters fitted to measured op sweeps (experiments/op_sweep.py):

* **GEMM** ``(m, n, k)``, a batch of ``count`` in one kernel (``torch.bmm``, a fused attention)::

      seconds = launch + count * max(F / (P * e) + h * B / W,  B / W)

  with F = 2mnk FLOPs, B = (mk + kn + mn) x element bytes the operands move, P the peak, e the
  efficiency large GEMMs reach (``compute_efficiency``), W the achieved memory bandwidth
  (``memory_GBps`` x ``memory_efficiency``) and h (``gemm_exposed_memory``, 0..1) the share of the
  operand traffic's time the math does not hide. Why this form: it is a roofline (never faster than
  its bytes over bandwidth) whose efficiency rises with arithmetic intensity I = F / B and
  saturates at e, ``efficiency(I) = e * I / (I + h * R)`` with R = P e / W the achieved ridge point,
  so two numbers (e, h) describe every shape, both dimensionless and read off a sweep of square and
  skinny GEMMs. A huge square GEMM reaches e; a skinny one (n = experts) is bound by its bytes; a
  tiny one by its launch.
* **memory-bound** ops (softmax, layer norm, top-k, cumsum, scatter, elementwise):
  ``kernels x launch + bytes / W``.
* **copies** (contiguous copies around an all-to-all, permutes): a memory-bound op reading and
  writing the bytes once.
* **optimizer**: torch's AdamW (the measured runs' optimizer, float32 parameters under bf16
  autocast) is eight elementwise ops (``ADAM_FOREACH_OPS``) making 21 passes over the float32
  parameters; per tensor in the for-loop implementation (CPU), and on CUDA as multi-tensor
  (foreach) ops, each cut into launches of at most 320 chunks of 65,536 elements
  (:func:`multi_tensor_launches`). On an H200 (results/reference/2026-12-04-h200) a 173M-parameter
  model's AdamW ran 72 kernels (8 ops x 9 launches) in 3.7 ms. A profile whose stack fuses the
  update (``fused_optimizer``: XLA, Megatron's FusedAdam) makes 7 passes in one kernel a launch.

``launch`` (``kernel_launch_us``) is the host's cost of one kernel as the step's eager PyTorch
issues it (dispatcher, launch, host gaps), part of every op's price. On a CPU the same core
dispatches and computes, so it adds to the op's time; a GPU runs kernels as the host issues them,
and the step simulation takes the launches out of the ops onto a host thread that can run ahead
(moe_core.sim.engine.issued_by_host), so they cost time only where the host falls behind.

Fallbacks keep a profile without these fields valid and its times unchanged: ``memory_GBps`` 0
means memory traffic is not modelled (every GEMM at ``compute_efficiency``, the former constant
model, and memory-bound ops cost only their launches) and ``kernel_launch_us`` 0 means launches
are free; then only GEMMs cost time, FLOPs / (peak x compute_efficiency).

Another device's profile from a measured curve (e.g. an A100 or A800 from the H200's): e, h and
the memory efficiency are dimensionless, so they are kept, and the spec sheet gives the new peak and
memory bandwidth; the curve's knee moves with the device's ridge point. The launch cost belongs to
the host and the software, so it is kept as measured. What that adds: +-10% on large GEMMs (one GPU
generation's measured fraction of peak carried to another; the H200's own FFN already differed by
7% from its square GEMM's curve), +-10% on memory-bound ops (streaming efficiency), a factor of 2
either way on launch-bound ops (host CPU, driver, Python); an op sweep on the target device removes
all three. moe_core/sim/README.md gives the numbers behind the shipped profiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT32_BYTES = 4  # parameters, gradients and optimizer moments (float32 masters under autocast)
# torch.optim.AdamW's update (torch/optim/adam.py, _multi_tensor_adam and _single_tensor_adam) as
# (op, tensor lists it touches, passes over float32 parameters): decoupled decay param *= 1 - lr*wd;
# exp_avg.lerp_(grad); exp_avg_sq *= beta2; exp_avg_sq += (1 - beta2) grad * grad; denom =
# sqrt(exp_avg_sq) (a new tensor); denom /= sqrt(bias correction); denom += eps; param -= step_size
# exp_avg / denom. A list's depth decides how many tensors one multi-tensor launch may take.
ADAM_FOREACH_OPS = (
    ("mul_", 1, 2),
    ("lerp_", 2, 3),
    ("mul_", 1, 2),
    ("addcmul_", 3, 4),
    ("sqrt", 2, 2),
    ("div_", 1, 2),
    ("add_", 1, 2),
    ("addcdiv_", 3, 4),
)
ADAM_PASSES = sum(passes for _, _, passes in ADAM_FOREACH_OPS)  # 21
# A fused AdamW kernel reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq,
# the four lists in one multi-tensor launch (depth 4).
FUSED_ADAM_PASSES, FUSED_ADAM_DEPTH = 7, 4
# torch's multi-tensor apply (ATen/native/cuda/MultiTensorApply.cuh): blocks of 65,536 elements, at
# most 320 blocks and depth_to_max_tensors[depth - 1] tensors a launch. (Builds with CUDA 13 headers
# may raise both, PR 134373; the H200 record's torch 2.11+cu130 still launched 9 times for 2,640 chunks.)
MULTI_TENSOR_CHUNK = 65536
MULTI_TENSOR_MAX_BLOCKS = 320
MULTI_TENSOR_MAX_TENSORS = (110, 64, 48, 36, 30)


def multi_tensor_launches(numels: list[float], depth: int) -> int:
    """Kernel launches of one multi-tensor (foreach) op over tensors of ``numels`` elements touching
    ``depth`` lists: torch's loop launches when 320 blocks are queued, or when a tensor's last chunk
    fills the launch's tensor slots, and once more for what is left. Counted a tensor at a time, not
    a chunk at a time: a 70B-parameter model has a million chunks."""
    launches, blocks, tensors = 0, 0, 0
    for numel in numels:
        chunks = max(1, math.ceil(numel / MULTI_TENSOR_CHUNK))
        full, blocks = divmod(blocks + chunks, MULTI_TENSOR_MAX_BLOCKS)
        launches += full
        # after a launch inside this tensor its remaining chunks travel alone; one at its last chunk
        # leaves nothing queued
        tensors = (1 if blocks else 0) if full else tensors + 1
        if blocks and tensors == MULTI_TENSOR_MAX_TENSORS[depth - 1]:
            launches, blocks, tensors = launches + 1, 0, 0
    return launches + (blocks > 0)


def backward_shapes(m: float, n: float, k: float) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The backward GEMMs of an (m, n, k) GEMM Y = X W: dX = dY W^T, (m, k, n), and dW = X^T dY, (k, n, m)."""
    return (m, k, n), (k, n, m)


@dataclass(frozen=True)
class ComputeModel:
    """Prices ops on one device; every method returns seconds.

    Build it with :meth:`from_profile`; the fields are in SI units (FLOP/s, B/s, s).
    """

    peak_flops: float  # FLOP/s of the device in the step's dtype
    max_efficiency: float  # e: fraction of peak large, compute-bound GEMMs reach
    exposed_memory: float  # h: share of a GEMM's operand-traffic time its math does not hide
    memory_Bps: float  # W: achieved memory bandwidth; 0 = memory traffic not modelled
    launch_s: float  # one kernel's cost; 0 = not modelled
    element_bytes: int  # bytes of one activation element (the GEMM operands' dtype)

    @classmethod
    def from_profile(cls, hw, peak_tflops: float, element_bytes: int, share: float = 1.0) -> ComputeModel:
        """The model of a hardware profile (moe_core.schema.core.HardwareConfig) for a device of
        ``peak_tflops``. ``share``: the fraction of its compute a device gets (ranks sharing a CPU
        host's cores, moe_core.sim.kernels): every rate scales with it and every op takes 1/share as long."""
        if peak_tflops <= 0 or not 0 < share <= 1:
            raise ValueError(f"a compute model needs peak_tflops > 0 and a share in (0, 1], got {peak_tflops}, {share}")
        return cls(
            peak_flops=peak_tflops * 1e12 * share,
            max_efficiency=hw.compute_efficiency,
            exposed_memory=hw.gemm_exposed_memory,
            memory_Bps=hw.memory_GBps * 1e9 * hw.memory_efficiency * share,
            launch_s=hw.kernel_launch_us * 1e-6 / share,
            element_bytes=element_bytes,
        )

    def gemm(self, m: float, n: float, k: float, count: float = 1) -> float:
        """``count`` GEMMs (m x k) @ (k x n) of one shape, issued as one (batched) kernel."""
        return self.launch_s + count * self._gemm_work(m, n, k)

    def gemm_backward(self, m: float, n: float, k: float, count: float = 1) -> float:
        """The backward of :meth:`gemm`: its dX and dW GEMMs (:func:`backward_shapes`)."""
        return sum(self.gemm(*shape, count) for shape in backward_shapes(m, n, k))

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        """The fraction of peak a GEMM of this shape reaches, launch excluded (the fitted curve)."""
        return 2 * m * n * k / (self.peak_flops * self._gemm_work(m, n, k))

    def memory_bound(self, nbytes: float, kernels: float = 1) -> float:
        """``kernels`` kernels that move ``nbytes`` in all (read + written)."""
        return kernels * self.launch_s + self._memory_seconds(nbytes)

    def copy(self, nbytes: float) -> float:
        """A contiguous copy of ``nbytes``: read once, written once, one kernel."""
        return self.memory_bound(2 * nbytes)

    def optimizer(self, numels: list[float], implementation: str) -> float:
        """An AdamW step over float32 tensors of ``numels`` elements, as ``implementation`` runs it:
        "fused" (one multi-tensor kernel per launch, 7 passes), "foreach" (torch's default on CUDA: 8
        multi-tensor ops, 21 passes) or "for-loop" (torch's default on CPU: the 8 ops per tensor)."""
        if implementation == "fused":
            kernels, passes = multi_tensor_launches(numels, FUSED_ADAM_DEPTH), FUSED_ADAM_PASSES
        elif implementation == "foreach":
            kernels = sum(multi_tensor_launches(numels, depth) for _, depth, _ in ADAM_FOREACH_OPS)
            passes = ADAM_PASSES
        else:
            kernels, passes = len(ADAM_FOREACH_OPS) * len(numels), ADAM_PASSES
        return self.memory_bound(passes * FLOAT32_BYTES * sum(numels), kernels)

    def _gemm_work(self, m: float, n: float, k: float) -> float:
        """One GEMM's time without its launch: the roofline with the fitted efficiency curve."""
        compute = 2 * m * n * k / (self.peak_flops * self.max_efficiency)
        memory = self._memory_seconds((m * k + k * n + m * n) * self.element_bytes)
        return max(compute + self.exposed_memory * memory, memory)

    def _memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.memory_Bps if self.memory_Bps else 0.0
