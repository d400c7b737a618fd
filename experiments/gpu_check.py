"""One-shot sanity check of a single-GPU machine before measured runs are trusted on it.

    python -m experiments.gpu_check --out results/gpu_check            # H200, real sizes (~1 min)
    python -m experiments.gpu_check --out /tmp/x --device cpu --sizes cpu   # the same on CPU (minutes)

Checks, all in this one process:

a. Throughput of an MoE layer (GShard capacity mode, top-2, all experts local) against a dense FFN
   with the same active FLOPs per token (hidden width top_k * d_ff), forward + backward in bf16
   weights (not autocast: no per-step weight casts, so both sides run the same bf16 GEMMs). The
   MoE's extra work (gating, dispatch/combine copies) should keep its tokens/s at >= 0.6 x dense.
   Achieved TFLOP/s are compared with the H200 dense bf16 peak and with a plain bf16 matmul.
b. CUDA-event timing against wall-clock timing of the same MoE loop (the suite times with events).
c. NCCL (gloo on CPU) at world size 1: all_reduce, equal and uneven all_to_all_single, barrier.
d. The throughput table: MoE / dense tokens per second at several (tokens, d_model, d_ff, experts,
   top-k) points, each with capacity factor 1.0 and 1.25 and dropless, and the MoE forward split into
   gate, permute, experts, unpermute and combine (the layer's own timer regions). The target on an
   H200 (issue of the GPU path): MoE >= 0.85 x dense, routing <= 25% of the layer.
e. The op sweep the simulator's compute model is fitted to: GEMM efficiency against shape,
   memory-bound ops' bandwidth against size, the per-kernel launch cost (``op_sweep``).
f. The environment: versions, git commit, device properties.

Writes ``<out>/gpu_check.json`` atomically and prints a summary. Never needed by CI or the tests
(tests/test_gpu_check.py runs it on CPU with --sizes quick).
"""

from __future__ import annotations

import argparse
import sys

# Full sizes keep every GEMM large (expert GEMMs: 4096 x 2048 x 8192 per expert) so an H200 is
# compute-bound; E*C = top_k * tokens at capacity_factor 1, so padded MoE FLOPs = dense FLOPs.
# ``points``: further (tokens, d_model, d_ff, experts, top_k) settings of the throughput table, each
# in every routing mode of the table (MODES, experiments/impl/gpu_check.py).
SIZES = {
    "full": dict(
        batch=8,
        seq_len=2048,
        d_model=2048,
        d_ff=8192,
        num_experts=8,
        matmul_n=8192,
        warmup_iters=5,
        timed_iters=20,
        points=[(16384, 2048, 8192, 8, 2), (16384, 2048, 8192, 8, 1), (16384, 4096, 4096, 64, 2)],
        gemm_m=[128, 512, 2048, 8192, 32768],
        gemm_nk=[(2048, 8192), (8192, 2048), (1024, 1024)],
        memory_elements=[2**16, 2**20, 2**24, 2**27],
    ),
    "cpu": dict(
        batch=4,
        seq_len=512,
        d_model=256,
        d_ff=1024,
        num_experts=8,
        matmul_n=1024,
        warmup_iters=3,
        timed_iters=10,
        points=[(2048, 256, 1024, 8, 2), (2048, 256, 1024, 8, 1), (2048, 256, 256, 64, 2)],
        gemm_m=[16, 128, 1024, 4096],
        gemm_nk=[(256, 1024), (1024, 256), (256, 256)],
        memory_elements=[2**12, 2**16, 2**20, 2**22],
    ),
    "quick": dict(
        batch=2,
        seq_len=64,
        d_model=32,
        d_ff=64,
        num_experts=8,
        matmul_n=128,
        warmup_iters=1,
        timed_iters=3,
        points=[(128, 32, 64, 8, 2)],
        gemm_m=[8, 64],
        gemm_nk=[(32, 64)],
        memory_elements=[2**8, 2**12],
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for gpu_check.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--sizes", choices=sorted(SIZES), default="full", help="full (an H200), cpu (minutes on CPU), quick (a test)"
    )
    args = parser.parse_args(argv)
    from experiments.impl.gpu_check import run  # torch: once the command line is parsed

    return run(args, SIZES[args.sizes])


if __name__ == "__main__":
    sys.exit(main())
