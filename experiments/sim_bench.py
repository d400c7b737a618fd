"""How fast the simulator is: wall time to simulate one training step of a 32-MoE-layer model.

    python -m experiments sim_bench [--gpus 64 256 1024 4096] [--hardware h100-ndr-cluster]

Prints, side by side, the GPU count, the operations in the step DAG, the links of the topology,
the seconds to build the DAG (including the meta-device model that fixes the gradient buckets) and
the seconds to simulate it. Targets on a 2-core machine: 1024 GPUs <= 1 s, 4096 GPUs <= 5 s.
"""

from __future__ import annotations

import argparse
import time

from experiments.simulate import sized_hardware
from moe_core.config.load import load_config
from moe_core.records.console import RowPrinter
from moe_core.sim.collectives import simulate_on
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

MODEL = [
    "model.n_layers=32",
    "model.moe_every=1",
    "model.d_model=2048",
    "model.n_heads=16",
    "model.d_ff=8192",
    "model.seq_len=2048",
    "model.vocab_size=32000",
    "train.batch_size=4",
    "train.dtype=bfloat16",
    "comm.policy=overlap",
    "comm.bucket_mb=25",
]


def bench(gpus: int, hardware: str) -> dict:
    cfg = load_config(
        overrides=[
            *MODEL,
            f"hardware_profile={hardware}",
            f"parallel.world_size={gpus}",
            f"moe.num_experts={gpus}",
            "moe.experts_per_rank=1",
        ],
        whole_run=False,
    )
    started = time.perf_counter()
    hw = sized_hardware(cfg)
    topo = build_topology(hw)
    ops, _ = StepModel(cfg, topo).build()
    built = time.perf_counter()
    timeline = simulate_on(hw, topo, ops)
    done = time.perf_counter()
    return {
        "gpus": gpus,
        "operations": len(ops),
        "links": topo.num_links,
        "build_s": built - started,
        "simulate_s": done - built,
        "total_s": done - started,
        "step_ms": timeline.makespan_s * 1e3,
    }


def run(args: argparse.Namespace) -> None:
    """Time the simulation at every ``--gpus`` count, a table row as each is done."""
    columns = {"GPUs": 6, "operations": 10, "links": 7, "build s": 8, "simulate s": 10, "total s": 8, "step ms": 9}
    rows = RowPrinter(columns, floatfmt=("", "", "", ".3f", ".3f", ".3f", ".1f"))
    print(rows.header(), flush=True)
    for gpus in args.gpus:  # a row as each size is done: the largest take seconds
        r = bench(gpus, args.hardware)
        values = (r["gpus"], r["operations"], r["links"], r["build_s"], r["simulate_s"], r["total_s"], r["step_ms"])
        print(rows.row(values), flush=True)
