"""Aurora's transmission orders measured: the library all-to-all vs the ordered all-to-all on gating traces.

Run under torchrun (every rank runs it), usually through the launcher::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments aurora_a2a [key=value ...]

Rank 0 traces our MoE model's routing on ``aurora.world_size`` GPUs for every ``aurora.gating_zipf``
(experiments.aurora.token_workloads, the simulated executor's workloads) and broadcasts the token
matrices; each is scaled so that every rank sends ``aurora.bytes_per_rank`` per layer (float32
elements). For every workload and order one "forward pass" is the dispatch all-to-all of each of
the ``aurora.moe_layers`` layers, barrier before each: ``library`` is ``all_to_all_single`` with the
trace's uneven splits; ``aurora`` (Algorithm 1), ``sjf``, ``rcs`` and ``exact`` run
moe_core.comm.ordered_a2a.ordered_all_to_all_single in that moe_core.comm.transmission order. After the
warm-up every order's output is checked against the library's.

Methodology as experiments/collectives.py: ``aurora.warmup_iters``, then ``aurora.iters`` timed
iterations; a rank's sample is the sum of its per-layer times, the worst rank per iteration is kept.
Rank 0 writes one record per (workload, order), ``results/raw/aurora/aurora_a2a/<point>.json``, all
of them at the end.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from experiments.benchmark import measured_main, measured_record
from moe_core.comm.ordered_a2a import ordered_all_to_all_single
from moe_core.comm.transmission import lower_bound, make_schedule
from moe_core.comm.workloads import ELEMENT_BYTES
from moe_core.config.load import ConfigError
from moe_core.host.timing import PhaseTimer, gather_worst_rank
from moe_core.papers.aurora.study import PAPER, token_workloads
from moe_core.runtime.distributed import Env

EXPERIMENT = "aurora_a2a"
MEASURED_ORDERS = ("library", "aurora", "sjf", "rcs", "exact")


def measured_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes (pure; the workflow declares them as outputs)."""
    return [
        f"ws{cfg.aurora.world_size}_gating-z{z:g}_{order}" for z in cfg.aurora.gating_zipf for order in MEASURED_ORDERS
    ]


def scaled(tokens: np.ndarray, bytes_per_rank: int) -> np.ndarray:
    """(layers, n, n) token counts -> float32 elements, each rank sending about ``bytes_per_rank`` per layer."""
    per_rank = tokens.sum(axis=2, keepdims=True)  # (layers, n, 1): tokens each shard holds
    return np.rint(tokens / per_rank * (bytes_per_rank // ELEMENT_BYTES)).astype(np.int64)


class Exchange:
    """One layer's all-to-all on this rank: buffers, splits and every order's schedule."""

    def __init__(self, elements: np.ndarray, env: Env, seed: int):
        self.elements, self.rank = elements, env.rank
        self.in_splits = elements[env.rank].tolist()
        self.out_splits = elements[:, env.rank].tolist()
        # value = source rank * 1e6 + position: a misplaced element cannot go unnoticed
        self.input = (torch.arange(sum(self.in_splits), dtype=torch.float32) + env.rank * 1e6).to(env.device)
        self.output = torch.empty(sum(self.out_splits), dtype=torch.float32, device=env.device)
        self.schedules = {
            order: make_schedule(order, elements, seed=seed) for order in MEASURED_ORDERS if order != "library"
        }

    def run(self, order: str) -> None:
        if order == "library":
            dist.all_to_all_single(self.output, self.input, self.out_splits, self.in_splits)
        else:
            ordered_all_to_all_single(self.output, self.input, self.out_splits, self.in_splits, self.schedules[order])


def check_orders(layers: list[Exchange]) -> None:
    """Every order delivers what the library delivers, on every rank (agreed, so no rank hangs)."""
    ok = True
    for ex in layers:
        ex.run("library")
        reference = ex.output.clone()
        for order in ex.schedules:
            ex.output.fill_(-1)
            ex.run(order)
            ok &= torch.equal(ex.output, reference)
    all_ok = torch.tensor([int(ok)], device=layers[0].input.device)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if not all_ok.item():
        raise RuntimeError(
            f"an ordered all-to-all delivered other data than all_to_all_single "
            f"(this rank {'correct' if ok else 'wrong'})"
        )


def measure(layers: list[Exchange], order: str, cfg: DictConfig, timer: PhaseTimer) -> dict[str, list[float]]:
    """Warm-up, then timed iterations of one forward pass's dispatch all-to-alls; worst rank per iteration."""
    a = cfg.aurora
    local: dict[str, list[float]] = {"a2a_ms": []}
    for it in range(a.warmup_iters + a.iters):
        timer.reset()
        for ex in layers:
            dist.barrier()
            start = timer.stamp()
            ex.run(order)
            timer.add("a2a_ms", start, timer.stamp())
        if it >= a.warmup_iters:
            local["a2a_ms"].append(timer.elapsed_ms()["a2a_ms"])
    return gather_worst_rank(local)


def traces(cfg: DictConfig, env: Env) -> dict[str, np.ndarray]:
    """Rank 0's gating traces of every ``aurora.gating_zipf``, the same on every rank (broadcast)."""
    payload = [None]
    if env.rank == 0:
        workloads = token_workloads(cfg, env.world_size)
        payload = [{name: m for name, m in workloads.items() if name.startswith("gating-")}]
    dist.broadcast_object_list(payload, src=0)
    return payload[0]


def run_benchmark(cfg: DictConfig, env: Env) -> list[dict]:
    """Every workload and order; the records on rank 0 (an empty list elsewhere)."""
    timer = PhaseTimer(env.device)
    records = []
    for workload, tokens in traces(cfg, env).items():
        elements = scaled(tokens, cfg.aurora.bytes_per_rank)  # (layers, n, n)
        layers = [Exchange(m, env, cfg.train.seed) for m in elements]
        check_orders(layers)
        for order in MEASURED_ORDERS:
            samples = measure(layers, order, cfg, timer)
            if env.rank != 0:
                continue
            # T* in bytes at unit bandwidth: the busiest rank's off-rank bytes, summed over layers
            bottleneck = sum(lower_bound(m) for m in elements) * ELEMENT_BYTES
            params = {
                "workload": workload,
                "policy": order,
                "world_size": env.world_size,
                "moe_layers": len(layers),
                "bytes_per_rank": cfg.aurora.bytes_per_rank,
            }
            records.append(
                measured_record(
                    cfg,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=f"ws{env.world_size}_{workload}_{order}",
                    params=params,
                    samples=samples,
                    extra_metrics={"bottleneck_bytes": bottleneck},
                )
            )
    return records


def check_traces(cfg: DictConfig) -> None:
    if not cfg.aurora.gating_zipf:
        raise ConfigError("config key 'aurora.gating_zipf': the measured run needs at least one gating trace")


def run(args: argparse.Namespace, world_size_key: str) -> None:
    """The measurement on every rank for ``args`` (experiments.aurora_a2a's command line)."""
    measured_main(args, world_size_key, run_benchmark, check=check_traces)
