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
* **optimizer**: Adam(W) reads parameters, gradients and both moments and writes parameters and
  moments: 7 passes over the float32 parameters (the measured runs keep float32 parameters under
  bf16 autocast), in ``ADAM_OPS`` elementwise ops per tensor, or per step where torch runs the
  multi-tensor (foreach) implementation (its default on CUDA).

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

from dataclasses import dataclass

FLOAT32_BYTES = 4  # parameters, gradients and optimizer moments (float32 masters under autocast)
ADAM_PASSES = 7  # reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq
# Elementwise ops of one AdamW update (torch.optim.adamw: decay mul_, lerp_, mul_, addcmul_, sqrt,
# div_, add_, addcdiv_): per tensor in the for-loop implementation, per step in the foreach one.
ADAM_OPS = 8


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
        """The model of a hardware profile (moe_core.config.schema.HardwareConfig) for a device of
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

    def optimizer(self, params: float, tensors: int, multi_tensor: bool) -> float:
        """An Adam(W) step over ``params`` float32 parameters in ``tensors`` tensors; ``multi_tensor``:
        torch's foreach implementation, whose every op covers all tensors (one launch each)."""
        kernels = ADAM_OPS * (1 if multi_tensor else tensors)
        return self.memory_bound(ADAM_PASSES * FLOAT32_BYTES * params, kernels)

    def _gemm_work(self, m: float, n: float, k: float) -> float:
        """One GEMM's time without its launch: the roofline with the fitted efficiency curve."""
        compute = 2 * m * n * k / (self.peak_flops * self.max_efficiency)
        memory = self._memory_seconds((m * k + k * n + m * n) * self.element_bytes)
        return max(compute + self.exposed_memory * memory, memory)

    def _memory_seconds(self, nbytes: float) -> float:
        return nbytes / self.memory_Bps if self.memory_Bps else 0.0
