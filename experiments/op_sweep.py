"""Measure the simulator's op classes on this device and fit its compute model (moe_core.sim.compute).

    python -m experiments op_sweep --out results/reference/2026-12-01-cpu-op-sweep        # CPU, 1 thread, ~40 s
    python -m experiments op_sweep --device cuda --dtype bfloat16 --sweep h200 \\
        --peak-tflops 989 --memory-GBps 4800 --out results/reference/<date>-h200-op-sweep
    python -m experiments op_sweep --fit gpu_check.json --peak-tflops 989 --memory-GBps 4800 --out DIR

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
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import least_squares

from moe_core.host.timing import PhaseTimer
from moe_core.records.results import atomic_output, environment, write_record
from moe_core.sim.compute import ComputeModel

ROW = 1024  # row width of the row-wise ops (softmax, layer norm), a d_model
GATE_EXPERTS = 8  # the top-k op's row width: a gate's experts
COPY_BLOCK = 128  # contiguous run of the block transpose: a d_model slice the all-to-all layout keeps whole
# Fitted parameters: launch (us), log10 GEMM rate (TFLOP/s), exposed memory share, log10 bandwidth (GB/s)
LOWER, UPPER = [0.0, -4.0, 0.0, -3.0], [1e4, 4.0, 1.0, 5.0]
ROBUST_SCALE = 0.1  # log-ratio beyond which a point's pull on the fit grows linearly, not quadratically
# The sizes of each --sweep (its choices: experiments.entry_points.OP_SWEEP_SIZES).
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


def gemm_shapes(sweep: dict) -> list[tuple[int, int, int]]:
    """The sweep's (m, n, k) GEMMs: square, then each weight shape at each token count."""
    return [(n, n, n) for n in sweep["square"]] + [(m, n, k) for n, k in sweep["weights"] for m in sweep["tokens"]]


def median_ms(fn, device: torch.device, warmup_iters: int, timed_iters: int) -> float:
    """Median time of ``fn`` over timed iterations (CUDA events on GPU, read after the loop)."""
    for _ in range(warmup_iters):
        fn()
    timer = PhaseTimer(device)
    for i in range(timed_iters):
        start = timer.stamp()
        fn()
        timer.add(f"iter{i}", start, timer.stamp())
    return statistics.median(timer.elapsed_ms().values())


def memory_ops(elements: int, device: torch.device, dtype: torch.dtype) -> dict[str, tuple]:
    """The memory-bound ops over ``elements`` elements: name -> (function, bytes read + written)."""
    x = torch.randn(max(1, elements // ROW), min(elements, ROW), device=device, dtype=dtype)
    n, size = x.numel(), x.element_size()
    rows = torch.randint(0, x.shape[0], (x.shape[0],), device=device)
    gate = x.view(-1, GATE_EXPERTS)  # (tokens, experts)
    blocks = x.view(-1, 2, COPY_BLOCK)  # (rows, 2, block): transposed to (2, rows, block)
    return {
        "softmax": (lambda: torch.softmax(x, dim=-1), 2 * n * size),
        "layer_norm": (lambda: F.layer_norm(x, x.shape[-1:]), 2 * n * size),
        "topk": (lambda: gate.topk(2, dim=-1), n * size + gate.shape[0] * 2 * (size + 8)),  # values + int64 indices
        "cumsum": (lambda: x.cumsum(dim=-1), 2 * n * size),
        "gather_rows": (lambda: x.index_select(0, rows), 2 * n * size + rows.numel() * 8),
        "copy": (lambda: blocks.transpose(0, 1).contiguous(), 2 * n * size),
        "add": (lambda: x + x, 3 * n * size),
    }


def measure_ops(device: torch.device, dtype: torch.dtype, shapes: list, memory_elements: list, iters: tuple) -> dict:
    """The sweep's measurements: GEMM rows (m, n, k, ms, tflops), memory-bound rows (op, elements,
    bytes, ms, GBps) and the launch cost (us) of a one-element add."""
    gemm = []
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        ms = median_ms(lambda a=a, b=b: a @ b, device, *iters)
        gemm.append({"m": m, "n": n, "k": k, "ms": ms, "tflops": 2 * m * n * k / (ms * 1e-3) / 1e12})
    memory = []
    for elements in memory_elements:
        for op, (fn, nbytes) in memory_ops(elements, device, dtype).items():
            ms = median_ms(fn, device, *iters)
            memory.append(
                {"op": op, "elements": elements, "bytes": nbytes, "ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9}
            )
    one = torch.ones(1, device=device, dtype=dtype)
    launch_us = median_ms(lambda: one + one, device, *iters) * 1e3
    return {"element_bytes": one.element_size(), "gemm": gemm, "memory_bound": memory, "launch_us": launch_us}


def model_of(theta: np.ndarray, element_bytes: int) -> ComputeModel:
    """The compute model of fitted parameters ``theta`` (see LOWER/UPPER), rates as achieved."""
    launch_us, log_tflops, exposed, log_GBps = theta
    return ComputeModel(
        peak_flops=10**log_tflops * 1e12,
        max_efficiency=1.0,
        exposed_memory=float(exposed),
        memory_Bps=10**log_GBps * 1e9,
        launch_s=launch_us * 1e-6,
        element_bytes=element_bytes,
    )


def predicted_ms(model: ComputeModel, sweep: dict) -> np.ndarray:
    """The model's time of every measurement of ``sweep`` (GEMMs, memory-bound ops, the launch), in ms."""
    gemm = [model.gemm(g["m"], g["n"], g["k"]) for g in sweep["gemm"]]
    memory = [model.memory_bound(o["bytes"]) for o in sweep["memory_bound"]]
    launch = model.memory_bound(3 * sweep["element_bytes"])  # the one-element add
    return np.array([*gemm, *memory, launch]) * 1e3


def measured_ms(sweep: dict) -> np.ndarray:
    return np.array(
        [g["ms"] for g in sweep["gemm"]] + [o["ms"] for o in sweep["memory_bound"]] + [sweep["launch_us"] / 1e3]
    )


def fit(sweep: dict) -> dict:
    """Least-squares fit of the compute model's four parameters to a sweep's measurements.

    Returns the achieved rates (``launch_us``, ``gemm_tflops``, ``gemm_exposed_memory``,
    ``memory_GBps``), the fit's errors and each point's predicted time."""
    if not sweep.get("gemm") or not sweep.get("memory_bound"):
        raise ValueError("the sweep needs GEMM and memory-bound measurements to fit the compute model")
    measured = measured_ms(sweep)
    if not np.all(np.isfinite(measured) & (measured > 0)):
        raise ValueError("the sweep holds a non-positive or non-finite time; measure again")
    element_bytes = sweep["element_bytes"]

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(predicted_ms(model_of(theta, element_bytes), sweep) / measured)

    # Start: the measured launch, the best GEMM and memory rates, half the memory time exposed.
    best_tflops = max(g["tflops"] for g in sweep["gemm"])
    best_GBps = max(o["GBps"] for o in sweep["memory_bound"])
    theta0 = np.clip([sweep["launch_us"], np.log10(best_tflops), 0.5, np.log10(best_GBps)], LOWER, UPPER)
    result = least_squares(
        residuals, theta0, bounds=(LOWER, UPPER), x_scale="jac", loss="soft_l1", f_scale=ROBUST_SCALE
    )
    errors = np.abs(np.exp(result.fun) - 1)
    launch_us, log_tflops, exposed, log_GBps = (float(v) for v in result.x)
    return {
        "launch_us": launch_us,
        "gemm_tflops": 10**log_tflops,
        "gemm_exposed_memory": exposed,
        "memory_GBps": 10**log_GBps,
        "median_abs_rel_error": float(np.median(errors)),
        "max_abs_rel_error": float(errors.max()),
        "converged": bool(result.status > 0),
        "predicted_ms": predicted_ms(model_of(result.x, element_bytes), sweep).tolist(),
    }


def profile_fields(fitted: dict, peak_tflops: float | None, memory_GBps: float | None) -> dict:
    """The hardware profile's compute-model fields: rates as fractions of the spec sheet's peak and
    bandwidth when given, else the fitted rates themselves at efficiency 1."""
    peak = peak_tflops or fitted["gemm_tflops"]
    bandwidth = memory_GBps or fitted["memory_GBps"]
    for name, achieved, spec in (
        ("GEMM rate", fitted["gemm_tflops"], peak),
        ("bandwidth", fitted["memory_GBps"], bandwidth),
    ):
        if achieved > spec * (1 + 1e-9):
            raise ValueError(
                f"fitted {name} {achieved:.4g} exceeds the spec value {spec:.4g}; "
                "give the spec of this dtype and device"
            )
    return {
        "peak_tflops": peak,
        "compute_efficiency": fitted["gemm_tflops"] / peak,
        "gemm_exposed_memory": fitted["gemm_exposed_memory"],
        "memory_GBps": bandwidth,
        "memory_efficiency": fitted["memory_GBps"] / bandwidth,
        "kernel_launch_us": fitted["launch_us"],
    }


def profile_yaml(fields: dict, record: dict) -> str:
    """The profile fields as YAML, headed by where they come from."""
    fit_ = record["fit"]
    header = (
        f"# Compute-model fields fitted by experiments/op_sweep.py on {record['date']} "
        f"({record['device']}, {record['dtype']}, {record['threads']} thread(s)); "
        f"median error {fit_['median_abs_rel_error']:.1%}, max {fit_['max_abs_rel_error']:.1%}.\n"
    )
    return header + "".join(f"{key}: {value:.6g}\n" for key, value in fields.items())


def load_sweep(path: str) -> dict:
    """The op sweep of an op_sweep.json or a gpu_check.json record (``checks.op_sweep``)."""
    record = json.loads(Path(path).read_text())
    sweep = record.get("sweep") or record.get("checks", {}).get("op_sweep")
    if not sweep:
        raise ValueError(f"'{path}' holds no op sweep (an op_sweep.json, or a gpu_check.json with checks.op_sweep)")
    return sweep


def run(args: argparse.Namespace) -> int:
    """Measure (at the sizes of its ``--sweep``) or refit, and write, for ``args`` (experiments.op_sweep's
    command line); exit code 2, writing nothing, on a device that is not there or a record without a sweep."""
    sizes = SWEEPS[args.sweep]
    if args.device == "cuda" and not args.fit and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    try:
        if args.fit:
            sweep = load_sweep(args.fit)
        else:
            torch.set_num_threads(args.threads)
            iters = (sizes["warmup_iters"], sizes["timed_iters"])
            sweep = measure_ops(device, getattr(torch, args.dtype), gemm_shapes(sizes), sizes["memory_elements"], iters)
        fitted = fit(sweep)
        record = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": args.device,
            "dtype": args.dtype,
            "threads": args.threads if args.device == "cpu" else None,
            "refit_of": args.fit,
            "sweep": sweep,
            "fit": fitted,
            "spec": {"peak_tflops": args.peak_tflops, "memory_GBps": args.memory_GBps},
            "environment": environment(args.device),
        }
        record["profile"] = profile_fields(fitted, args.peak_tflops, args.memory_GBps)
        snippet = profile_yaml(record["profile"], record)
        out = Path(args.out)
        write_record(record, out / "op_sweep.json")  # refuses a non-finite number before writing anything
        with atomic_output(out / "profile.yaml") as tmp:
            tmp.write_text(snippet)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(snippet, end="")
    print(f"wrote {out / 'op_sweep.json'} and {out / 'profile.yaml'}", file=sys.stderr)
    return 0
