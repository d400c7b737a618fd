"""Measure the simulator's op classes on this device and fit its compute model (moe_core.sim.compute).

    python -m experiments.op_sweep --out results/reference/2026-12-01-cpu-op-sweep        # CPU, 1 thread, ~40 s
    python -m experiments.op_sweep --device cuda --dtype bfloat16 --sweep h200 \\
        --peak-tflops 989 --memory-GBps 4800 --out results/reference/<date>-h200-op-sweep
    python -m experiments.op_sweep --fit gpu_check.json --peak-tflops 989 --memory-GBps 4800 --out DIR

Measures, after warm-up, the median of timed iterations (perf_counter on CPU, CUDA events on GPU):

* GEMMs: square ones and the step model's skinny shapes, tokens x (d_model -> experts) as the gate,
  tokens x (d_model -> d_ff) and back as an FFN or an expert;
* memory-bound ops at several sizes: softmax and layer norm over rows, top-2 of 8 (the gate's top-k),
  cumsum, a row gather (the permute into a dispatch buffer), a block transpose made contiguous
  (the copy around an all-to-all), an elementwise add;
* an add of one element: the launch cost of one kernel.

Then fits the model's four parameters to all of them at once (scipy.optimize.least_squares on the
log ratio of predicted to measured time, the compute model itself predicting): the launch cost, the
rate large GEMMs reach, the share of a GEMM's memory time left exposed, and the achieved memory
bandwidth. The loss is robust (soft L1 beyond 10%), so an op that is not memory-bound on this device
(top-k on a CPU computes, at a tenth of the streaming ops' rate) does not drag the fit; its error
stays in the record. Given the device's spec sheet (``--peak-tflops``, ``--memory-GBps``) the rates become
fractions of it (``compute_efficiency``, ``memory_efficiency``); without one (a CPU) the fitted
rates are the profile's peak and bandwidth, at efficiency 1.

A CPU rank of a measured run computes on one thread when ranks fill the cores
(moe_core.runtime.distributed.cpu_threads_per_rank), so the CPU sweep runs one thread by default: its
numbers are one device of a CPU testbed. ``--fit`` refits the op sweep of a gpu_check.json record
(experiments/gpu_check.py measures the same ops) or of an op_sweep.json without measuring.

Writes ``<out>/op_sweep.json`` (measurements, fitted parameters, per-point errors) and
``<out>/profile.yaml`` (the hardware profile's compute-model fields), both or neither.
"""

from __future__ import annotations

import argparse
import math
import sys

DTYPES = ("float32", "bfloat16")  # torch dtypes of the measured ops
SWEEPS = {
    # (m, n, k) GEMMs: square n^3, then tokens x (n, k) weights; memory-bound ops over element counts
    "default": dict(
        square=[64, 128, 256, 512, 1024, 2048],
        tokens=[512, 2048, 8192],
        weights=[(8, 256), (64, 512), (1024, 256), (256, 1024)],
        memory_elements=[2**10, 2**14, 2**18, 2**22],
        warmup_iters=3,
        timed_iters=15,
    ),
    "h200": dict(
        square=[256, 1024, 4096, 8192],
        tokens=[1024, 8192, 65536],
        weights=[(8, 1024), (4096, 1024), (1024, 4096), (8192, 2048)],
        memory_elements=[2**16, 2**20, 2**24, 2**27],
        warmup_iters=5,
        timed_iters=20,
    ),
    "quick": dict(
        square=[32, 128],
        tokens=[64, 256],
        weights=[(8, 64), (256, 64)],
        memory_elements=[2**10, 2**14],
        warmup_iters=1,
        timed_iters=3,
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for op_sweep.json and profile.yaml")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default="default", help="sizes: default (CPU), h200, quick")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (a CPU testbed's rank runs one)")
    parser.add_argument("--peak-tflops", type=float, help="the device's spec peak in --dtype (else: the fitted rate)")
    parser.add_argument("--memory-GBps", type=float, help="the device's spec memory bandwidth (else: the fitted one)")
    parser.add_argument("--fit", metavar="RECORD", help="fit the op sweep of this record instead of measuring")
    args = parser.parse_args(argv)
    for name in ("threads", "peak_tflops", "memory_GBps"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            parser.error(f"--{name.replace('_', '-')} must be a number > 0, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from experiments.impl.op_sweep import run  # torch, scipy: once the command line is parsed

    return run(args, SWEEPS[args.sweep])


if __name__ == "__main__":
    sys.exit(main())
