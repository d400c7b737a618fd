"""One-shot sanity check of a single-GPU machine before measured runs are trusted on it.

    python -m experiments gpu_check --out results/gpu_check            # H200, real sizes (~1 min)
    python -m experiments gpu_check --out /tmp/x --device cpu --sizes cpu   # the same on CPU (minutes)

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
import itertools
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from experiments.op_sweep import measure_ops
from moe_core.config.load import load_config
from moe_core.host.timing import PhaseTimer
from moe_core.model.capacity import capacity
from moe_core.model.layer import MoELayer
from moe_core.model.transformer import DenseFFN
from moe_core.records.console import table
from moe_core.records.results import environment, write_record

# Dense bf16 tensor-core peak of an H200 SXM, as torchtitan's get_peak_flops (torchtitan/tools/utils.py).
H200_BF16_PEAK_TFLOPS = 989.0
TARGET_MOE_OVER_DENSE = 0.6
MAX_TIMING_DISAGREEMENT = 0.05
PROFILE = {"cuda": "h200-single", "cpu": "local-cpu"}  # configs/hardware/<profile>.yaml
# (name, capacity_factor, dropless) of the throughput table
MODES = [("capacity-1.0", 1.0, False), ("capacity-1.25", 1.25, False), ("dropless", 1.0, True)]
SPLIT_PHASES = ("gate", "permute", "expert", "unpermute", "combine")  # the MoE layer's forward, in order
ROUTING_PHASES = ("gate", "permute", "unpermute", "combine")  # its work besides the experts
TOP_K = 2

# Full sizes keep every GEMM large (expert GEMMs: 4096 x 2048 x 8192 per expert) so an H200 is
# compute-bound; E*C = top_k * tokens at capacity_factor 1, so padded MoE FLOPs = dense FLOPs.
# ``points``: further (tokens, d_model, d_ff, experts, top_k) settings of the throughput table, each
# in every routing mode of the table (MODES). The keys are the choices of --sizes
# (experiments.entry_points.GPU_CHECK_SIZES).
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


def time_loop(step, device: torch.device, warmup_iters: int, timed_iters: int) -> tuple[list[float], float]:
    """Run ``step`` warmup_iters + timed_iters times; return per-iteration ms and the timed loop's wall ms.

    Per-iteration times come from PhaseTimer stamps (CUDA events on GPU, read after the loop, so
    timing adds no sync inside it); the wall time is perf_counter around the timed loop plus one
    final synchronize.
    """
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup_iters):
        step()
    timer = PhaseTimer(device)
    sync()
    wall_start = time.perf_counter()
    for i in range(timed_iters):
        start = timer.stamp()
        step()
        timer.add(f"iter{i}", start, timer.stamp())
    sync()
    wall_ms = (time.perf_counter() - wall_start) * 1e3
    per_iter = timer.elapsed_ms()
    return [per_iter[f"iter{i}"] for i in range(timed_iters)], wall_ms


def fwd_bwd_step(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """A training step's FFN work: forward, then backward for input and weight gradients."""

    def step():
        module.zero_grad(set_to_none=True)
        x.grad = None
        y, _aux = module(x)  # the aux loss's backward is negligible next to the GEMMs
        y.backward(dy)

    return step


def tflops(flop: float, ms: float) -> float:
    return flop / (ms * 1e-3) / 1e12


def check_matmul(s: dict, device: torch.device) -> dict:
    """bf16 n x n x n matmul: the practical GEMM ceiling of this device."""
    n = s["matmul_n"]
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    ms = statistics.median(time_loop(lambda: a @ b, device, s["warmup_iters"], s["timed_iters"])[0])
    achieved = tflops(2 * n**3, ms)
    return {"n": n, "ms_median": ms, "tflops": achieved, "fraction_of_h200_peak": achieved / H200_BF16_PEAK_TFLOPS}


def op_sweep(s: dict, device: torch.device, ceiling_tflops: float) -> dict:
    """The measurements the simulator's compute model is fitted to (experiments/op_sweep.py, bf16;
    ``python -m experiments op_sweep --fit gpu_check.json`` fits them): GEMMs (m, n, k) over the
    ``gemm_m`` token counts for each ``gemm_nk`` weight shape, with the fraction of ``ceiling_tflops``
    (this device's square bf16 matmul, check a) each reaches; memory-bound ops over
    ``memory_elements``; the launch cost of one kernel."""
    shapes = [(m, n, k) for (n, k), m in itertools.product(s["gemm_nk"], s["gemm_m"])]
    iters = (s["warmup_iters"], s["timed_iters"])
    sweep = measure_ops(device, torch.bfloat16, shapes, s["memory_elements"], iters)
    for g in sweep["gemm"]:
        g["of_square_matmul"] = g["tflops"] / ceiling_tflops
    return sweep


def make_layers(device, tokens, d_model, d_ff, num_experts, top_k, capacity_factor, dropless, batch=1):
    """An MoE layer (all experts local) and a dense FFN of equal active FLOPs per token (hidden width
    top_k * d_ff), bf16 weights, with a bf16 input and output gradient."""
    torch.manual_seed(0)
    with torch.device(device):  # initialise weights on the device (fast at full size)
        moe = MoELayer(
            d_model=d_model,
            d_ff=d_ff,
            num_experts=num_experts,
            top_k=top_k,
            capacity_factor=capacity_factor,
            min_capacity=4,
            group_size=0,
            second_expert_policy="always",
            dropless=dropless,
            aux_loss_scale="e2",
            layer_id=0,
            seed=0,
        )
        dense = DenseFFN(d_model, top_k * d_ff)
        x = torch.randn(batch, tokens // batch, d_model, dtype=torch.bfloat16).requires_grad_()
        dy = torch.randn(batch, tokens // batch, d_model, dtype=torch.bfloat16)
    return moe.to(torch.bfloat16), dense.to(torch.bfloat16), x, dy


def check_moe_vs_dense(s: dict, device: torch.device) -> dict:
    """MoE layer vs dense FFN of equal active FLOPs per token, forward + backward, bf16 weights."""
    tokens, M, H, E = s["batch"] * s["seq_len"], s["d_model"], s["d_ff"], s["num_experts"]
    moe, dense, x, dy = make_layers(device, tokens, M, H, E, TOP_K, 1.0, False, batch=s["batch"])
    iters = (s["warmup_iters"], s["timed_iters"])
    moe_ms, moe_wall_ms = time_loop(fwd_bwd_step(moe, x, dy), device, *iters)
    dense_ms, _ = time_loop(fwd_bwd_step(dense, x, dy), device, *iters)
    plan = moe.last_gating  # fixed input and weights: every iteration routes the same way
    routed_pairs = int(plan.tokens_per_expert.sum())
    capacity_slots = E * capacity(tokens, E, TOP_K, moe.capacity_factor, moe.min_capacity)  # one group: S = tokens

    # Training FLOPs = 3 x forward matmul FLOPs; an FFN's forward is 2 GEMMs of 2 * rows * M * hidden.
    def train_flop(rows: int, hidden: int) -> float:
        return 3 * 2 * rows * 2 * M * hidden

    moe_med, dense_med = statistics.median(moe_ms), statistics.median(dense_ms)
    moe_tflops = {
        "routed": tflops(train_flop(routed_pairs, H), moe_med),
        "padded": tflops(train_flop(capacity_slots, H), moe_med),
    }
    dense_tflops = tflops(train_flop(tokens, TOP_K * H), dense_med)
    return {
        "moe": {
            "ms_median": moe_med,
            "tokens_per_s": tokens / (moe_med * 1e-3),
            "routed_pairs": routed_pairs,
            "capacity_slots": capacity_slots,
            "dropped_fraction": float(plan.dropped_fraction),
            "tflops_routed": moe_tflops["routed"],
            "tflops_padded": moe_tflops["padded"],
            "fraction_of_h200_peak_routed": moe_tflops["routed"] / H200_BF16_PEAK_TFLOPS,
            "fraction_of_h200_peak_padded": moe_tflops["padded"] / H200_BF16_PEAK_TFLOPS,
        },
        "dense": {
            "ms_median": dense_med,
            "tokens_per_s": tokens / (dense_med * 1e-3),
            "tflops": dense_tflops,
            "fraction_of_h200_peak": dense_tflops / H200_BF16_PEAK_TFLOPS,
        },
        "moe_over_dense_tokens_per_s": dense_med / moe_med,
        "timing": {
            "cuda_events_ms": sum(moe_ms),
            "wall_ms": moe_wall_ms,
            "wall_over_events": moe_wall_ms / sum(moe_ms),
        },
    }


def forward_split_ms(moe: MoELayer, x: torch.Tensor, device: torch.device, iters: int) -> dict[str, float]:
    """Mean forward time of the MoE layer's phases (SPLIT_PHASES), from its own timer regions (CUDA
    events on GPU, read once at the end)."""
    moe.timer = PhaseTimer(device)
    for _ in range(iters):
        moe(x)
    totals = moe.timer.elapsed_ms()
    moe.timer = PhaseTimer(enabled=False)
    return {phase: totals.get(f"{phase}.fwd", 0.0) / iters for phase in SPLIT_PHASES}


def check_points(s: dict, device: torch.device) -> list[dict]:
    """The throughput table: MoE / dense tokens per second at every point and routing mode, and the
    share of the MoE forward that is routing (gate, permute, unpermute, combine) rather than experts."""
    rows = []
    for (tokens, d_model, d_ff, experts, top_k), (mode, capacity_factor, dropless) in itertools.product(
        s["points"], MODES
    ):
        moe, dense, x, dy = make_layers(device, tokens, d_model, d_ff, experts, top_k, capacity_factor, dropless)
        iters = (s["warmup_iters"], s["timed_iters"])
        moe_ms = statistics.median(time_loop(fwd_bwd_step(moe, x, dy), device, *iters)[0])
        dense_ms = statistics.median(time_loop(fwd_bwd_step(dense, x, dy), device, *iters)[0])
        split = forward_split_ms(moe, x, device, s["timed_iters"])
        routing = sum(split[p] for p in ROUTING_PHASES)
        rows.append(
            {
                "tokens": tokens,
                "d_model": d_model,
                "d_ff": d_ff,
                "experts": experts,
                "top_k": top_k,
                "mode": mode,
                "moe_over_dense_tokens_per_s": dense_ms / moe_ms,
                "forward_split_ms": split,
                "routing_share_of_forward": routing / (routing + split["expert"]),
                "dropped_fraction": float(moe.last_gating.dropped_fraction),
            }
        )
    return rows


def check_collectives(device: torch.device, backend: str) -> tuple[dict, dict]:
    """World-size-1 process group in this process: every collective must return its input exactly."""
    kwargs = {"device_id": torch.device("cuda", 0)} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    try:
        x = torch.arange(12, dtype=torch.float32, device=device).view(6, 2)
        reduced = x.clone()
        dist.all_reduce(reduced)
        equal = torch.empty_like(x)
        dist.all_to_all_single(equal, x)
        uneven = torch.empty_like(x[:5])
        dist.all_to_all_single(uneven, x[:5], output_split_sizes=[5], input_split_sizes=[5])
        dist.barrier()
        exact = {
            "all_reduce": torch.equal(reduced, x),
            "all_to_all_equal": torch.equal(equal, x),
            "all_to_all_uneven": torch.equal(uneven, x[:5]),
        }
    finally:
        dist.destroy_process_group()
    version = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None
    return {"backend": backend, "world_size": 1, "nccl_version": version}, exact


def device_properties(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    p = torch.cuda.get_device_properties(device)
    return {
        "name": p.name,
        "sm_count": p.multi_processor_count,
        "memory_GiB": p.total_memory / 2**30,
        "compute_capability": f"{p.major}.{p.minor}",
    }


def print_summary(checks: dict, passed: dict, device: torch.device) -> None:
    """The checks as a table. On a CPU the GPU targets (MoE/dense >= 0.6, CUDA events against the wall
    clock) are not judged: the numbers are shown, the verdict says why there is none."""
    m, moe, dense, t = checks["matmul"], checks["moe"], checks["dense"], checks["timing"]
    on_gpu = device.type == "cuda"

    def verdict(key: str) -> str:
        return {True: "PASS", False: "FAIL", None: "not judged on CPU"}[passed[key]]

    peak = f" ({m['fraction_of_h200_peak']:.1%} of H200 peak)" if on_gpu else ""
    timer = "CUDA events" if on_gpu else "timer on CPU"
    rows = [
        (f"bf16 matmul {m['n']}^3", f"{m['tflops']:.1f} TFLOP/s{peak}", ""),
        ("dense FFN fwd+bwd", f"{dense['tokens_per_s']:,.0f} tok/s, {dense['tflops']:.1f} TFLOP/s", ""),
        (
            "MoE fwd+bwd",
            f"{moe['tokens_per_s']:,.0f} tok/s, {moe['tflops_routed']:.1f} routed / "
            f"{moe['tflops_padded']:.1f} padded TFLOP/s, {moe['dropped_fraction']:.1%} dropped",
            "",
        ),
        (
            "MoE / dense tokens/s",
            f"{checks['moe_over_dense_tokens_per_s']:.3f} (H200 target >= {TARGET_MOE_OVER_DENSE})",
            verdict("moe_over_dense"),
        ),
        (
            f"wall / {timer}",
            f"{t['wall_ms']:.1f} / {t['cuda_events_ms']:.1f} ms = {t['wall_over_events']:.3f}",
            verdict("timing_agreement"),
        ),
        (
            f"{checks['collectives']['backend']} world size 1",
            f"version {checks['collectives']['nccl_version']}" if on_gpu else "all_reduce, all_to_all, barrier",
            verdict("collectives_exact"),
        ),
    ]
    print(table([{"check": name, "result": value, "verdict": judged} for name, value, judged in rows]))
    sweep = checks["op_sweep"]
    best = max(sweep["gemm"], key=lambda g: g["tflops"])
    worst = min(sweep["gemm"], key=lambda g: g["tflops"])
    print(
        f"op sweep: GEMM {worst['tflops']:.2f}..{best['tflops']:.2f} TFLOP/s "
        f"({worst['m']}x{worst['n']}x{worst['k']} .. {best['m']}x{best['n']}x{best['k']}), "
        f"memory-bound up to {max(o['GBps'] for o in sweep['memory_bound']):.1f} GB/s, "
        f"launch {sweep['launch_us']:.1f} us"
    )
    points = [
        {
            "tokens x M x H, E, k": f"{p['tokens']} x {p['d_model']} x {p['d_ff']}, {p['experts']}, {p['top_k']}",
            "mode": p["mode"],
            "MoE/dense": p["moe_over_dense_tokens_per_s"],
            "routing share": p["routing_share_of_forward"],
            **{f"{phase} ms": p["forward_split_ms"][phase] for phase in SPLIT_PHASES},
        }
        for p in checks["points"]
    ]
    print(f"\nthroughput, forward split:\n{table(points)}")


def run(args: argparse.Namespace) -> int:
    """Every check for ``args`` (experiments.gpu_check's command line) at its ``--sizes``; the record
    and the summary."""
    sizes = SIZES[args.sizes]
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu --sizes cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    hardware = load_config(overrides=[f"hardware_profile={PROFILE[device.type]}"], whole_run=False).hardware

    def progress(what: str) -> None:
        print(f"gpu_check on {device.type}: {what}", file=sys.stderr, flush=True)

    progress("bf16 matmul, then the MoE layer against a dense FFN")
    checks = {"matmul": check_matmul(sizes, device), **check_moe_vs_dense(sizes, device)}
    progress(f"the throughput table ({len(sizes['points']) * len(MODES)} points)")
    checks["points"] = check_points(sizes, device)
    progress("the op sweep")
    checks["op_sweep"] = op_sweep(sizes, device, checks["matmul"]["tflops"])
    progress(f"{hardware.backend} collectives at world size 1")
    checks["collectives"], exact = check_collectives(device, hardware.backend)
    t = checks["timing"]
    on_gpu = device.type == "cuda"  # the targets are an H200's; on a CPU they are not judged (null)
    passed = {
        "moe_over_dense": checks["moe_over_dense_tokens_per_s"] >= TARGET_MOE_OVER_DENSE if on_gpu else None,
        "timing_agreement": abs(t["wall_over_events"] - 1) <= MAX_TIMING_DISAGREEMENT if on_gpu else None,
        "collectives_exact": all(exact.values()),
        **{f"{k}_exact": v for k, v in exact.items()},
    }
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hardware": hardware.name,
        "sizes": {**sizes, "top_k": TOP_K, "capacity_factor": 1.0, "dtype": "bfloat16 weights"},
        "checks": checks,
        "pass": passed,
        "environment": {**environment(device.type), "device_properties": device_properties(device)},
    }
    path = write_record(record, Path(args.out) / "gpu_check.json")
    print_summary(checks, passed, device)
    print(f"wrote {path}", file=sys.stderr)
    return 0
