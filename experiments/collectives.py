"""nccl-tests-style microbenchmark of the collectives an MoE layer uses, alone and in pairs.

Run under torchrun (every rank runs this file)::

    torchrun --standalone --nproc-per-node=4 -m experiments.collectives [--config FILE]... [key=value]... [--check]

For every size S from ``collectives.min_bytes`` to ``max_bytes`` (times ``step_factor``) it times

* ``all_reduce``: an fp32 tensor of S bytes, summed in place;
* ``all_to_all``: ``all_to_all_single`` of an S-byte buffer per rank, equal splits;
* ``all_to_all_v``: ``all_to_all_single`` with the uneven splits of
  :func:`moe_core.comm.workloads.zipf_traffic_matrix` (every rank sends S bytes, a few receive most);
* each all-to-all again while an S-byte all-reduce runs concurrently on its own process group (the
  gradient all-reduce of data parallelism overlapping the expert all-to-all; PARAM's
  ``commsOverlapBench``). Paired and alone iterations alternate in the same loop, so ``slowdown``
  compares numbers taken under the same conditions.

Methodology (reference/peers.md §4): warm-up iterations, then per timed iteration a barrier and
one timed call (more iterations for latency-bound sizes, :func:`timed_iterations`) (``perf_counter``
on CPU, CUDA events on GPU); each iteration keeps the worst rank.
``algbw = S / t`` and ``busbw = algbw * factor`` with the nccl-tests factors
(:func:`bus_bandwidth_factor`); GB/s are 1e9 bytes/s. Rank 0 writes one record per (collective,
concurrent, size) to ``results/raw/common/collectives/<point>.json``, all of them at the end, so
a failed run leaves no partial set of new records.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from tqdm import tqdm

from moe_core.comm.workloads import ELEMENT_BYTES, zipf_traffic_matrix
from moe_core.config.load import ConfigError, config_arg_parser, load_config
from moe_core.records.results import exit_if_unwritable, write_records
from moe_core.records.tracking import log_point
from moe_core.runtime.benchmark import measured_record
from moe_core.runtime.distributed import Env, init_distributed, naming_failed_ranks, shutdown
from moe_core.runtime.timing import PhaseTimer, gather_worst_rank

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "collectives.world_size"

PAPER, EXPERIMENT = "common", "collectives"
# (collective, concurrent): each collective alone, then each all-to-all next to an all-reduce.
CASES = [
    ("all_reduce", None),
    ("all_to_all", None),
    ("all_to_all_v", None),
    ("all_to_all", "all_reduce"),
    ("all_to_all_v", "all_reduce"),
]


# ----------------------------------------------------------------------------------------------
# What the run produces (pure; used by the Snakemake rule to declare outputs)


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """nccl-tests busbw/algbw factor for ``n`` ranks (doc/PERFORMANCE.md).

    all-reduce moves 2(n-1)/n of the buffer over each rank's link (reduce-scatter + all-gather);
    all-to-all sends all but the local 1/n of it. For all_to_all_v the algorithm bytes are already
    the bottleneck rank's off-rank bytes (:func:`bottleneck_bytes`), so busbw = algbw: the achieved
    bandwidth of the busiest link (DeepEP's "bottleneck bandwidth").
    """
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "all_to_all":
        return (n - 1) / n
    if collective == "all_to_all_v":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


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


def collective_point_name(collective: str, concurrent: str | None, world_size: int, size_bytes: int) -> str:
    """Record name: ``all_reduce_ws4_4KiB``, ``all_to_all_v+all_reduce_ws4_1MiB``."""
    pair = f"+{concurrent}" if concurrent else ""
    return f"{collective}{pair}_ws{world_size}_{size_label(size_bytes)}"


def collective_points(cfg: DictConfig) -> list[str]:
    """Every point name one run with ``cfg`` writes, in run order."""
    ws = cfg.collectives.world_size
    return [collective_point_name(coll, conc, ws, size) for coll, conc in CASES for size in sizes_bytes(cfg)]


def check_sizes(cfg: DictConfig) -> None:
    """Equal all-to-all splits need whole fp32 elements per peer; raise ConfigError otherwise.

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
    """One collective at one size, with its buffers filled with the caller's rank id.

    ``splits`` is the traffic matrix in elements for the all-to-alls (None for all_reduce). Only
    all_to_all_v passes it to all_to_all_single; all_to_all takes the equal-split path.
    """

    name: str
    send: torch.Tensor  # (S/4,) float32; for all_reduce also the result (in place)
    recv: torch.Tensor  # (received elements,) float32
    splits: list[list[int]] | None  # [src][dst] elements
    group: dist.ProcessGroup | None
    rank: int

    @property
    def uneven(self) -> bool:
        return self.name == "all_to_all_v"

    def launch(self, async_op: bool = False):
        if self.name == "all_reduce":
            return dist.all_reduce(self.send, group=self.group, async_op=async_op)
        in_splits = self.splits[self.rank] if self.uneven else None
        out_splits = [row[self.rank] for row in self.splits] if self.uneven else None
        return dist.all_to_all_single(self.recv, self.send, out_splits, in_splits, group=self.group, async_op=async_op)

    def fill(self) -> None:
        """Reset the send buffer to the rank id (all-reduce accumulates in place)."""
        self.send.fill_(self.rank)

    def correct(self) -> bool:
        """After fill() and one launch: all_reduce gives sum(ranks); all-to-alls deliver, from each
        peer j, exactly splits[j][rank] elements of value j."""
        n = dist.get_world_size(self.group)
        if self.name == "all_reduce":
            return torch.equal(self.send, torch.full_like(self.send, n * (n - 1) / 2))
        counts = torch.tensor([row[self.rank] for row in self.splits], device=self.recv.device)
        expected = torch.repeat_interleave(torch.arange(n, device=self.recv.device), counts)
        return torch.equal(self.recv, expected.to(self.recv.dtype))


def make_collective(name: str, size_bytes: int, cfg: DictConfig, env: Env, group=None) -> Collective:
    """Buffers and splits of ``name`` with an S = ``size_bytes`` buffer per rank."""
    n = env.world_size
    if name == "all_to_all_v":
        c = cfg.collectives
        matrix = zipf_traffic_matrix(n, size_bytes, c.traffic_zipf, c.seed, ELEMENT_BYTES)
        splits = (matrix // ELEMENT_BYTES).tolist()
    elif name == "all_to_all":
        splits = [[size_bytes // ELEMENT_BYTES // n] * n for _ in range(n)]
    else:
        splits = None
    recv_elements = sum(row[env.rank] for row in splits) if splits else 0
    send = torch.empty(size_bytes // ELEMENT_BYTES, dtype=torch.float32, device=env.device)
    recv = torch.empty(recv_elements, dtype=torch.float32, device=env.device)
    coll = Collective(name, send, recv, splits, group, env.rank)
    coll.fill()
    return coll


def bottleneck_bytes(coll: Collective, size_bytes: int) -> int:
    """Algorithm bytes: S for all_reduce and equal all-to-all; for all_to_all_v the busiest rank's
    off-rank bytes, the larger of what it sends to or receives from other ranks (its own chunk is a
    local copy and crosses no link)."""
    if not coll.uneven:
        return size_bytes
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


def run_check(op: Collective, side: Collective | None) -> None:
    """--check: one (paired) launch on freshly filled buffers; every rank raises if any rank got
    wrong data (agreeing first, so no rank is left waiting in the next collective)."""
    op.fill()
    if side:
        side.fill()
    work = side.launch(async_op=True) if side else None
    op.launch()
    if work:
        work.wait()
    ok = op.correct() and (side is None or side.correct())
    all_ok = torch.tensor([int(ok)], device=op.send.device)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if not all_ok.item():
        pair = f"+{side.name}" if side else ""
        raise RuntimeError(
            f"--check failed: {op.name}{pair} of {op.send.numel() * ELEMENT_BYTES} bytes per rank "
            f"delivered wrong data (this rank {'correct' if ok else 'wrong'})"
        )


def timed_iterations(size_bytes: int, c: DictConfig) -> int:
    """Timed iterations of one point: ``latency_iters`` for latency-bound sizes (<= ``latency_bytes``),
    else ``iters``. Decided from the size alone, so every rank runs the same count."""
    return c.latency_iters if size_bytes <= c.latency_bytes else c.iters


def measure(
    op: Collective, side: Collective | None, cfg: DictConfig, timer: PhaseTimer, check: bool
) -> dict[str, list[float]]:
    """Warm-up, optional check, timed iterations; per-iteration samples of the worst rank.

    Alone: ``time_ms``. Paired: alone and paired iterations alternate; ``alone_ms`` is the alone
    time, ``time_ms`` and ``concurrent_ms`` come from the paired ones.
    """
    c = cfg.collectives
    for _ in range(c.warmup_iters):
        run_iteration(op, None, timer)
        if side:
            run_iteration(op, side, timer)
    if check:
        run_check(op, side)
    local: dict[str, list[float]] = {"time_ms": []}
    if side:
        local.update(alone_ms=[], concurrent_ms=[])
    for _ in range(timed_iterations(op.send.numel() * ELEMENT_BYTES, c)):
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


def run_benchmark(cfg: DictConfig, env: Env, check: bool) -> list[dict]:
    """Every case at every size; returns the records on rank 0 (an empty list elsewhere)."""
    side_group = dist.new_group(backend=cfg.hardware.backend, timeout=timedelta(seconds=cfg.parallel.timeout_s))
    timer = PhaseTimer(env.device)
    sizes = sizes_bytes(cfg)
    items = [(coll, conc, size) for coll, conc in CASES for size in sizes]
    records = []
    for name, concurrent, size in tqdm(items, desc="collectives", file=sys.stderr, disable=env.rank != 0):
        op = make_collective(name, size, cfg, env)
        side = make_collective(concurrent, size, cfg, env, group=side_group) if concurrent else None
        samples = measure(op, side, cfg, timer, check)
        algo_bytes = bottleneck_bytes(op, size)
        del op, side  # free this size's buffers before allocating the next
        bandwidth_samples(samples, name, env.world_size, algo_bytes)
        if env.rank != 0:
            continue  # every rank holds the same worst-rank samples; rank 0 writes them
        params = dict(collective=name, world_size=env.world_size, size_bytes=size, concurrent=concurrent)
        if name == "all_to_all_v":
            params["traffic_zipf"] = cfg.collectives.traffic_zipf
        point = collective_point_name(name, concurrent, env.world_size, size)
        records.append(
            measured_record(
                cfg,
                paper=PAPER,
                experiment=EXPERIMENT,
                point=point,
                params=params,
                samples=samples,
                extra_metrics={"algo_bytes": algo_bytes},
            )
        )
    return records


def save(records: list[dict], cfg: DictConfig) -> None:
    """Write every record, then mirror a few to W&B.

    One W&B run per record would be ~50 runs per benchmark, so only the pair records (the overlap
    question) and the largest size of each collective alone (its peak bandwidth) are logged; the
    JSON records hold everything.
    """
    with exit_if_unwritable():
        write_records(records, cfg.results_dir)
    max_bytes = sizes_bytes(cfg)[-1]
    for record in records:
        p = record["params"]
        if p["concurrent"] or p["size_bytes"] == max_bytes:
            log_point(record, cfg, group=f"collectives-{cfg.sweep.name}")


def main(argv: list[str] | None = None) -> None:
    parser = config_arg_parser(__doc__)
    parser.add_argument("--check", action="store_true", help="verify the collectives' results after warm-up")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        check_sizes(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    env = init_distributed(cfg, world_size_key=WORLD_SIZE_KEY)
    try:
        with naming_failed_ranks(env):
            records = run_benchmark(cfg, env, args.check)
        if env.rank == 0:
            save(records, cfg)
    finally:
        shutdown()


if __name__ == "__main__":
    main()
