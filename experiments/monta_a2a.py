"""MoNTA's exchange measured: one MoE dispatch of tokens the tensor-parallel ranks hold in duplicate.

Run under torchrun (every rank runs it), usually through the launcher::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments monta_a2a [key=value ...]

For every ``monta.tensor_parallel`` size t on ``monta.world_size`` ranks (layout dp x ep x tp with
ep = world / t, tp innermost as moe_core.parallel.layout places it), every rank holds a dispatch buffer of
``monta.bytes_per_rank`` bytes (float32 rows of ``monta.d_model``; one block per expert-parallel
rank), the same on the ranks of a "tp" group. One exchange moves it along each path:

* the ``duplicate`` dispatcher: the whole buffer through the "ep" all-to-all (every tp rank sends its copy);
* ``drop-gather``: 1/t of it through the all-to-all, then an all-gather over "tp" (DeepSpeed);
* ``monta`` in k pipelined chunks (moe_core.comm.all_to_all.tp_exchange), for every ``monta.chunks``
  count k > 1 that divides the slots a rank sends;
* at t = 1, ``capacity``'s all_to_all_single and, when the "ep" group spans nodes of
  ``hardware.devices_per_node`` ranks, ``hierarchical``'s two phases (moe_core.comm.hierarchical_a2a).

A path is a registered dispatcher (moe_core.dispatch) and its chunk count (:class:`Path`); a record
carries both as params, and its point is named by :attr:`Path.name` (``flat``, ``monta-n4``).

Every path's output is checked against ``duplicate``'s (``flat``'s at t = 1) before timing.
Methodology as experiments/collectives.py: ``monta.warmup_iters``, then ``monta.iters`` timed
exchanges, a barrier before each, the worst rank per iteration kept. A record per point also carries
MoNTA's performance-model prediction and chunk choice for this buffer on ``cfg.hardware`` when the
profile states its links (moe_core/papers/monta/performance_model.py); rank 0 writes all records at
the end, ``results/raw/monta/monta_a2a/<point>.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from experiments.benchmark import measured_main, measured_record, timed_iterations
from moe_core.comm import all_to_all as comm
from moe_core.comm.hierarchical_a2a import hierarchical_groups
from moe_core.dispatch import dispatcher
from moe_core.dispatch.chunks import even_ranges
from moe_core.host.timing import PhaseTimer
from moe_core.papers.monta.config import exchange_buffer_shape
from moe_core.papers.monta.decisions import knows_links
from moe_core.papers.monta.performance_model import (
    admissible_chunk_counts,
    choose_chunk_count,
    dispatch_seconds,
    exchange_links,
)
from moe_core.papers.monta.sweeps import PAPER
from moe_core.parallel.layout import expert_layout
from moe_core.parallel.parallelize import own_group
from moe_core.runtime.distributed import Env

EXPERIMENT = "monta_a2a"


def spans_nodes(cfg: DictConfig) -> bool:
    """Whether the tp = 1 exchange group (all ranks) spans nodes of ``hardware.devices_per_node``."""
    return cfg.monta.world_size > cfg.hardware.devices_per_node


@dataclass(frozen=True)
class Path:
    """One measured path: a registered dispatcher and the pipelined chunks it runs in."""

    dispatcher: str
    chunks: int = 1

    @property
    def name(self) -> str:
        """Its point's name: the dispatcher's (``flat`` for the capacity all-to-all), ``-n<k>`` where
        it pipelines k > 1 chunks."""
        name = "flat" if self.dispatcher == "capacity" else self.dispatcher
        return f"{name}-n{self.chunks}" if self.chunks > 1 else name


def paths(cfg: DictConfig, tp: int) -> list[Path]:
    """The paths measured at tensor-parallel size ``tp`` (pure: the workflow declares them)."""
    if tp == 1:
        return [Path("capacity"), Path("hierarchical")] if spans_nodes(cfg) else [Path("capacity")]
    _, rows = exchange_buffer_shape(cfg.monta, tp)
    admissible = set(admissible_chunk_counts(rows, tp))
    chunked = [Path("monta", n) for n in cfg.monta.chunks if n in admissible and n > 1]
    return [Path("duplicate"), Path("drop-gather"), *chunked]


def measured_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes."""
    return [point_of(cfg, tp, path) for tp in cfg.monta.tensor_parallel for path in paths(cfg, tp)]


def point_of(cfg: DictConfig, tp: int, path: Path) -> str:
    return f"ws{cfg.monta.world_size}_tp{tp}_{path.name}"


class Exchanges:
    """This rank's groups and buffer at one tensor-parallel size, and each path as a callable."""

    def __init__(self, cfg: DictConfig, env: Env, tp: int):
        world, timeout = cfg.monta.world_size, timedelta(seconds=env.timeout_s)
        layout = expert_layout(world, world // tp, 1, tp)
        self.ep_group = own_group(layout.groups("ep"), env.rank, timeout)
        self.tp_group = own_group(layout.groups("tp"), env.rank, timeout) if tp > 1 else None
        self.two_phase = None
        if tp == 1 and spans_nodes(cfg):
            self.two_phase = hierarchical_groups(layout.groups("ep").tolist(), cfg.hardware.devices_per_node, timeout)
        self.tp, self.timer = tp, PhaseTimer(env.device)
        self.blocks, self.rows = exchange_buffer_shape(cfg.monta, tp)
        generator = torch.Generator().manual_seed(env.rank // tp)  # a "tp" group holds one buffer
        self.buffer = torch.randn(self.blocks * self.rows, cfg.monta.d_model, generator=generator).to(env.device)

    def path(self, path: Path) -> Callable[[], torch.Tensor]:
        """``path``'s exchange of this rank's buffer: the dispatcher's all-to-all of the whole buffer
        (along its route), or its drop of the "tp" duplicates and all-gather, in ``path.chunks``."""
        chosen = dispatcher(path.dispatcher)
        if not chosen.tensor_parallel or chosen.sends_duplicates:
            group = self.two_phase if chosen.route == "two_phase" else self.ep_group
            return lambda: comm.exchange(self.buffer, None, None, group, None)
        ranges = even_ranges(self.rows // self.tp, path.chunks)
        return lambda: comm.tp_exchange(
            self.buffer, self.rows, ranges, self.ep_group, self.tp_group, self.timer, "dispatch_a2a"
        )


def check_paths(exchanges: Exchanges, measured: list[Path]) -> None:
    """Every path delivers what the first one delivers, on every rank (agreed, so no rank hangs)."""
    reference = exchanges.path(measured[0])()
    ok = all(torch.equal(exchanges.path(path)(), reference) for path in measured[1:])
    all_ok = torch.tensor([int(ok)], device=reference.device)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if not all_ok.item():
        raise RuntimeError(
            f"a dispatch path delivered other data than {measured[0].name} (this rank {'correct' if ok else 'wrong'})"
        )


def model_metrics(cfg: DictConfig, tp: int, path: Path) -> dict[str, float]:
    """MoNTA's performance model for this exchange on ``cfg.hardware``: its predicted time and the
    chunk count it would pick; nothing when the profile does not state its links."""
    hw = cfg.hardware
    if not knows_links(hw):
        return {}
    blocks, rows = exchange_buffer_shape(cfg.monta, tp)
    ep, volume = blocks, cfg.monta.bytes_per_rank
    links = exchange_links(hw, ep, tp, cfg.monta.chunk_overhead_us * 1e-6)
    if path.dispatcher == "hierarchical":
        return {}  # the model has no two-phase all-to-all
    if tp == 1:
        return {"model_ms": dispatch_seconds("duplicate", volume, ep, tp, links) * 1e3}
    return {
        "model_ms": dispatch_seconds(path.dispatcher, volume, ep, tp, links, path.chunks) * 1e3,
        "model_chunks": choose_chunk_count(volume, rows, ep, tp, links),
    }


def run_benchmark(cfg: DictConfig, env: Env) -> list[dict]:
    """Every tensor-parallel size and path; the records on rank 0 (an empty list elsewhere)."""
    records = []
    for tp in cfg.monta.tensor_parallel:
        exchanges = Exchanges(cfg, env, tp)
        measured = paths(cfg, tp)
        check_paths(exchanges, measured)
        for path in measured:
            m = cfg.monta
            samples = timed_iterations(exchanges.path(path), m.warmup_iters, m.iters, exchanges.timer, "exchange_ms")
            if env.rank != 0:
                continue
            params = {
                "world_size": cfg.monta.world_size,
                "tensor_parallel": tp,
                "expert_parallel": exchanges.blocks,
                "path": path.name,
                "dispatcher": path.dispatcher,
                "chunks": path.chunks,
                "bytes_per_rank": cfg.monta.bytes_per_rank,
                "rows_per_block": exchanges.rows,
            }
            records.append(
                measured_record(
                    cfg,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=point_of(cfg, tp, path),
                    params=params,
                    samples=samples,
                    extra_metrics=model_metrics(cfg, tp, path),
                )
            )
    return records


def run(args: argparse.Namespace, world_size_key: str) -> None:
    """The measurement on every rank for ``args`` (experiments.monta_a2a's command line)."""
    measured_main(args, world_size_key, run_benchmark)
