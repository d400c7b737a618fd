"""nccl-tests-style microbenchmark of the collectives an MoE layer uses, alone and in pairs.

Run under torchrun (every rank runs it)::

    torchrun --standalone --nproc-per-node=4 -m experiments collectives [--config FILE]... [key=value]... [--check]

For every size S from ``collectives.min_bytes`` to ``max_bytes`` (times ``step_factor``) it times

* ``all_reduce``: an fp32 tensor of S bytes, summed in place;
* ``all_gather``: every rank's S/n bytes gathered into an S-byte tensor on every rank, and
  ``reduce_scatter``: an S-byte tensor summed over the ranks, each keeping its S/n bytes (the two
  collectives of the dispatchers' all-gather path);
* ``all_to_all``: ``all_to_all_single`` of an S-byte buffer per rank, equal splits;
* ``all_to_all_v``: ``all_to_all_single`` with the uneven splits of
  :func:`moe_core.comm.workloads.zipf_traffic_matrix` (every rank sends S bytes, a few receive most);
* each all-to-all again while an S-byte all-reduce runs concurrently on its own process group (the
  gradient all-reduce of data parallelism overlapping the expert all-to-all; PARAM's
  ``commsOverlapBench``), and the all-reduce next to another (the dense and the expert gradients
  of an MoE, all-reduced over their two data-parallel groups at once). Paired and alone iterations
  alternate in the same loop, so ``slowdown`` compares numbers taken under the same conditions.

Methodology (reference/peers.md §4): warm-up iterations, then per timed iteration a barrier and
one timed call (more iterations for latency-bound sizes: experiments.collectives.timed_iterations)
(``perf_counter`` on CPU, CUDA events on GPU); each iteration keeps the worst rank.
``algbw = S / t`` and ``busbw = algbw * factor`` with the nccl-tests factors
(experiments.collectives.bus_bandwidth_factor); GB/s are 1e9 bytes/s. ``--check`` checks every point's result
before timing it (all-reduce, reduce-scatter: the sum of the rank ids; all-gather: each rank's
chunk of its rank id, in rank order; all-to-alls: from each peer exactly its
elements, of its rank id) and counts the wrong elements over all ranks: a point with any is not
timed, and the run exits 1 naming it once the others are measured; a passed check leaves
``wrong_elements: 0`` in the record. Rank 0 prints a row of nccl-tests' table as each point
finishes (size, count, type, time, algbw, busbw, #wrong; slowdown for the pairs) and writes one
record per (collective, concurrent, size) to ``results/raw/common/collectives/<point>.json``, all
of them at the end, so a failed run leaves no partial set of new records.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from tqdm import tqdm

from experiments.benchmark import CellsFailed, measured_main, measured_record
from moe_core.comm.workloads import ELEMENT_BYTES, bus_bandwidth_factor, zipf_traffic_matrix
from moe_core.config.load import ConfigError
from moe_core.host.timing import PhaseTimer, gather_worst_rank
from moe_core.records.console import RowPrinter
from moe_core.runtime.distributed import Env

PAPER, EXPERIMENT = "common", "collectives"
# (collective, concurrent): each collective alone, then each all-to-all and the all-reduce next to an
# all-reduce on another process group.
CASES = [
    ("all_reduce", None),
    ("all_gather", None),
    ("reduce_scatter", None),
    ("all_to_all", None),
    ("all_to_all_v", None),
    ("all_to_all", "all_reduce"),
    ("all_to_all_v", "all_reduce"),
    ("all_reduce", "all_reduce"),
]


# ----------------------------------------------------------------------------------------------
# What the run produces (pure; used by the Snakemake rule to declare outputs)


def sizes_bytes(cfg: DictConfig) -> list[int]:
    """min_bytes, min_bytes * step_factor, ... up to and including max_bytes."""
    c = cfg.collectives
    sizes = [c.min_bytes]
    while sizes[-1] * c.step_factor <= c.max_bytes:
        sizes.append(sizes[-1] * c.step_factor)
    return sizes


def size_label(size_bytes: int) -> str:
    """1024 -> '1KiB', 64 * 2**20 -> '64MiB'; sizes that are no whole KiB stay in bytes ('1000B')."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return f"{size_bytes}B"


def case_label(collective: str, concurrent: str | None) -> str:
    """``all_reduce``, or a pair ``all_to_all_v+all_reduce``."""
    return f"{collective}+{concurrent}" if concurrent else collective


def collective_point_name(collective: str, concurrent: str | None, world_size: int, size_bytes: int) -> str:
    """Record name: ``all_reduce_ws4_4KiB``, ``all_to_all_v+all_reduce_ws4_1MiB``."""
    return f"{case_label(collective, concurrent)}_ws{world_size}_{size_label(size_bytes)}"


def collective_points(cfg: DictConfig) -> list[str]:
    """Every point name one run with ``cfg`` writes, in run order."""
    ws = cfg.collectives.world_size
    return [collective_point_name(coll, conc, ws, size) for coll, conc in CASES for size in sizes_bytes(cfg)]


def check_sizes(cfg: DictConfig) -> None:
    """Equal all-to-all splits and all-gather / reduce-scatter chunks need whole fp32 elements per
    rank; raise ConfigError otherwise.

    Every size is min_bytes times an integer power of step_factor, so checking min_bytes suffices.
    """
    multiple = ELEMENT_BYTES * cfg.collectives.world_size
    if cfg.collectives.min_bytes % multiple:
        raise ConfigError(
            f"config key 'collectives.min_bytes': must be a multiple of 4 bytes * "
            f"collectives.world_size = {multiple}, got {cfg.collectives.min_bytes}"
        )


# ----------------------------------------------------------------------------------------------
# One collective at one size: buffers, launch, correctness check


@dataclass
class Collective:
    """One collective at one size S (nccl-tests' size), with its buffers filled with the caller's
    rank id.

    ``splits`` is the traffic matrix in elements for the all-to-alls (None for the ring
    collectives). Only all_to_all_v passes it to all_to_all_single; all_to_all takes the equal-split
    path. The all-gather and reduce-scatter are the calls the dispatchers' all-gather path makes
    (moe_core.comm.all_to_all.gather_rows, scatter_rows).
    """

    name: str
    size_bytes: int  # S, as the point names it: the same on every rank, whatever its buffers hold
    send: torch.Tensor  # float32: S bytes (S/n for all_gather); for all_reduce also the result (in place)
    recv: torch.Tensor  # float32: the received elements (S/n for reduce_scatter, S for all_gather)
    splits: list[list[int]] | None  # [src][dst] elements
    group: dist.ProcessGroup | None
    rank: int

    @property
    def uneven(self) -> bool:
        return self.name == "all_to_all_v"

    def launch(self, async_op: bool = False):
        if self.name == "all_reduce":
            return dist.all_reduce(self.send, group=self.group, async_op=async_op)
        if self.name == "all_gather":
            return dist.all_gather_single(self.recv, self.send, group=self.group, async_op=async_op)
        if self.name == "reduce_scatter":
            return dist.reduce_scatter_single(self.recv, self.send, group=self.group, async_op=async_op)
        in_splits = self.splits[self.rank] if self.uneven else None
        out_splits = [row[self.rank] for row in self.splits] if self.uneven else None
        return dist.all_to_all_single(self.recv, self.send, out_splits, in_splits, group=self.group, async_op=async_op)

    def fill(self) -> None:
        """Reset the send buffer to the rank id (all-reduce accumulates in place)."""
        self.send.fill_(self.rank)

    def wrong_elements(self) -> int:
        """After fill() and one launch, this rank's elements that differ from the expected result:
        all_reduce and reduce_scatter give sum(ranks) everywhere; all_gather holds rank j's chunk,
        of value j, at the j-th place; all-to-alls deliver, from each peer j, exactly splits[j][rank]
        elements of value j."""
        n = dist.get_world_size(self.group)
        if self.name == "all_reduce":
            return int((self.send != n * (n - 1) / 2).sum())
        if self.name == "reduce_scatter":
            return int((self.recv != n * (n - 1) / 2).sum())
        if self.name == "all_gather":
            expected = torch.arange(n, device=self.recv.device).repeat_interleave(self.send.numel())
            return int((self.recv != expected.to(self.recv.dtype)).sum())
        counts = torch.tensor([row[self.rank] for row in self.splits], device=self.recv.device)
        expected = torch.repeat_interleave(torch.arange(n, device=self.recv.device), counts)
        return int((self.recv != expected.to(self.recv.dtype)).sum())


def make_collective(name: str, size_bytes: int, cfg: DictConfig, env: Env, group=None) -> Collective:
    """Buffers and splits of ``name`` of size S = ``size_bytes`` (:class:`Collective`)."""
    n = env.world_size
    if name == "all_to_all_v":
        c = cfg.collectives
        matrix = zipf_traffic_matrix(n, size_bytes, c.traffic_zipf, c.seed, ELEMENT_BYTES)
        splits = (matrix // ELEMENT_BYTES).tolist()
    elif name == "all_to_all":
        splits = [[size_bytes // ELEMENT_BYTES // n] * n for _ in range(n)]
    else:
        splits = None
    elements = size_bytes // ELEMENT_BYTES
    send_elements = elements // n if name == "all_gather" else elements
    if splits:
        recv_elements = sum(row[env.rank] for row in splits)
    else:
        recv_elements = {"all_gather": elements, "reduce_scatter": elements // n}.get(name, 0)
    send = torch.empty(send_elements, dtype=torch.float32, device=env.device)
    recv = torch.empty(recv_elements, dtype=torch.float32, device=env.device)
    coll = Collective(name, size_bytes, send, recv, splits, group, env.rank)
    coll.fill()
    return coll


def bottleneck_bytes(coll: Collective) -> int:
    """Algorithm bytes: S for the ring collectives and the equal all-to-all; for all_to_all_v the
    busiest rank's off-rank bytes, the larger of what it sends to or receives from other ranks (its own chunk is a
    local copy and crosses no link)."""
    if not coll.uneven:
        return coll.size_bytes
    n = len(coll.splits)
    sent = [sum(coll.splits[i][j] for j in range(n) if j != i) for i in range(n)]
    received = [sum(coll.splits[i][j] for i in range(n) if i != j) for j in range(n)]
    return max(sent + received) * ELEMENT_BYTES


# ----------------------------------------------------------------------------------------------
# Timing


def run_iteration(op: Collective, side: Collective | None, timer: PhaseTimer) -> dict[str, float]:
    """One barrier-aligned iteration of ``op``; returns this rank's ``time_ms`` of ``op``.

    With ``side``, its all-reduce is launched asynchronously (on its own group) just before ``op``
    and waited after it; ``concurrent_ms`` is from its launch to its completion.
    """
    timer.reset()
    dist.barrier()
    launched = timer.stamp()
    work = side.launch(async_op=True) if side else None
    start = timer.stamp()
    op.launch()
    timer.add("time_ms", start, timer.stamp())
    if work:
        work.wait()
        timer.add("concurrent_ms", launched, timer.stamp())
    return timer.elapsed_ms()


def run_check(op: Collective, side: Collective | None) -> int:
    """--check: one (paired) launch on freshly filled buffers; the wrong elements of both, summed
    over the ranks (nccl-tests' ``#wrong``; every rank gets the sum, so all agree on the point)."""
    op.fill()
    if side:
        side.fill()
    work = side.launch(async_op=True) if side else None
    op.launch()
    if work:
        work.wait()
    wrong = torch.tensor([op.wrong_elements() + (side.wrong_elements() if side else 0)], device=op.send.device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def timed_iterations(size_bytes: int, c: DictConfig) -> int:
    """Timed iterations of one point: ``latency_iters`` for latency-bound sizes (<= ``latency_bytes``),
    else ``iters``. Decided from the size alone, so every rank runs the same count."""
    return c.latency_iters if size_bytes <= c.latency_bytes else c.iters


def measure(op: Collective, side: Collective | None, cfg: DictConfig, timer: PhaseTimer) -> dict[str, list[float]]:
    """Warm-up, then timed iterations; per-iteration samples of the worst rank.

    Alone: ``time_ms``. Paired: alone and paired iterations alternate; ``alone_ms`` is the alone
    time, ``time_ms`` and ``concurrent_ms`` come from the paired ones.
    """
    c = cfg.collectives
    for _ in range(c.warmup_iters):
        run_iteration(op, None, timer)
        if side:
            run_iteration(op, side, timer)
    local: dict[str, list[float]] = {"time_ms": []}
    if side:
        local.update(alone_ms=[], concurrent_ms=[])
    for _ in range(timed_iterations(op.size_bytes, c)):
        if side:
            local["alone_ms"].append(run_iteration(op, None, timer)["time_ms"])
            paired = run_iteration(op, side, timer)
            local["time_ms"].append(paired["time_ms"])
            local["concurrent_ms"].append(paired["concurrent_ms"])
        else:
            local["time_ms"].append(run_iteration(op, None, timer)["time_ms"])
    return gather_worst_rank(local)


def bandwidth_samples(samples: dict[str, list[float]], collective: str, n: int, algo_bytes: int) -> None:
    """Add algbw_GBps, busbw_GBps (and slowdown for pairs) to the worst-rank ``samples``."""
    factor = bus_bandwidth_factor(collective, n)
    samples["algbw_GBps"] = [algo_bytes / (t_ms * 1e-3) / 1e9 for t_ms in samples["time_ms"]]
    samples["busbw_GBps"] = [bw * factor for bw in samples["algbw_GBps"]]
    if "alone_ms" in samples:
        alone_median_ms = statistics.median(samples["alone_ms"])
        samples["slowdown"] = [t_ms / alone_median_ms for t_ms in samples["time_ms"]]


# Rank 0's table, a row as each point finishes, in nccl-tests' columns (time: the median of the worst
# rank; type: the fp32 buffers of make_collective; #wrong: the elements --check found wrong, "-" without
# --check; slowdown: of a pair, paired over alone): column -> width of its widest value.
TABLE_COLUMNS = {
    "collective": max(len(case_label(*case)) for case in CASES),
    "size(B)": 10,
    "count(elements)": 9,
    "type": 5,
    "time(us)": 9,
    "algbw(GB/s)": 7,
    "busbw(GB/s)": 7,
    "#wrong": 6,
    "slowdown": 5,
}


def table_row(label: str, size_bytes: int, metrics: dict, wrong: int | None) -> list:
    """One point's row of TABLE_COLUMNS from its record's ``metrics`` (none: not timed, its check failed)."""
    median = {name: stats["median"] for name, stats in metrics.items() if "median" in stats}
    time_us = median["time_ms"] * 1e3 if "time_ms" in median else None
    elements = size_bytes // ELEMENT_BYTES
    bandwidths = [median.get("algbw_GBps"), median.get("busbw_GBps")]
    return [label, size_bytes, elements, "float", time_us, *bandwidths, wrong, median.get("slowdown")]


def run_benchmark(cfg: DictConfig, env: Env, check: bool) -> list[dict]:
    """Every case at every size; returns the records on rank 0 (an empty list elsewhere), which
    prints a table row as each point finishes. With ``check`` a point whose result is wrong is not
    timed, and once every other point is, CellsFailed names it."""
    side_group = dist.new_group(backend=cfg.hardware.backend, timeout=timedelta(seconds=cfg.parallel.timeout_s))
    timer = PhaseTimer(env.device)
    sizes = sizes_bytes(cfg)
    items = [(coll, conc, size) for coll, conc in CASES for size in sizes]
    table = RowPrinter(TABLE_COLUMNS, floatfmt=("", "", "", "", ".1f", ".3f", ".3f", "", ".2f"))
    progress = tqdm(items, desc="collectives", file=sys.stderr, disable=env.rank != 0)
    if env.rank == 0:
        progress.write(table.header(), file=sys.stdout)
    records, failed = [], []
    for name, concurrent, size in progress:
        op = make_collective(name, size, cfg, env)
        side = make_collective(concurrent, size, cfg, env, group=side_group) if concurrent else None
        wrong = run_check(op, side) if check else None
        point = collective_point_name(name, concurrent, env.world_size, size)
        if wrong:
            failed.append(f"{point}: #wrong {wrong}")
            if env.rank == 0:
                progress.write(table.row(table_row(case_label(name, concurrent), size, {}, wrong)), file=sys.stdout)
            continue
        samples = measure(op, side, cfg, timer)
        algo_bytes = bottleneck_bytes(op)
        del op, side  # free this size's buffers before allocating the next
        bandwidth_samples(samples, name, env.world_size, algo_bytes)
        if env.rank != 0:
            continue  # every rank holds the same worst-rank samples; rank 0 writes them
        params = dict(collective=name, world_size=env.world_size, size_bytes=size, concurrent=concurrent)
        if name == "all_to_all_v":
            params["traffic_zipf"] = cfg.collectives.traffic_zipf
        extra = {"algo_bytes": algo_bytes}
        if check:
            extra["wrong_elements"] = wrong  # 0: the trace of a passed check
        record = measured_record(
            cfg, paper=PAPER, experiment=EXPERIMENT, point=point, params=params, samples=samples, extra_metrics=extra
        )
        records.append(record)
        row = table_row(case_label(name, concurrent), size, record["metrics"], wrong)
        progress.write(table.row(row), file=sys.stdout)
    if failed:
        raise CellsFailed(
            f"--check found wrong results in {len(failed)} points, not timed: {'; '.join(failed)}", records
        )
    return records


def run(args: argparse.Namespace, world_size_key: str) -> None:
    """The benchmark on every rank for ``args`` (experiments.collectives' command line)."""
    measured_main(args, world_size_key, lambda cfg, env: run_benchmark(cfg, env, args.check), check_sizes)
