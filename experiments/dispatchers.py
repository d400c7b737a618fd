"""Which dispatcher when: every dispatch path's round trip under routing skew (moe_core.dispatch_study).

Measured, under torchrun (usually through the launcher)::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments dispatchers

Its simulated executor is experiments/dispatchers_sim.py.

Measured: every registered token dispatcher (moe_core.dispatch) that applies on
``dispatch_study.world_size`` ranks, one expert per rank (per expert-parallel rank for the
tensor-parallel dispatchers, with ``dispatch_study.tensor_parallel`` ranks sharing tokens); for every
skew every rank routes its tokens by the same seeded counts, and each dispatcher moves them to their
experts and back: float32 rows of ``d_model``, capacity C = ceil(capacity_factor * tokens / E)
rounded to a multiple of tp * chunks. ``hierarchical`` runs only when the group spans nodes of
``hardware.devices_per_node`` ranks. A skew is a routing workload (moe_core.dispatch.workloads);
one that changes between steps runs its steps in turn, iteration i on step i mod its period. Before
timing, every cell is checked against a single-process reference on every step's routing: each
expert multiplies the rows it received by 2 + its index (no expert leaves them as they are), and
every row must come back to its rank as its expert left it (``Dispatcher.routed``: the rows a rank
sends and their experts), so a row sent to the wrong expert or to none, lost, duplicated or
returned to the wrong place counts; then a backward pass must bring every row its exact gradient
(``Paths.wrong_rows``). ``#wrong`` is the rows whose value or gradient differ, summed over ranks and
steps; a cell with any is not timed, and once the others are recorded the run exits 1 naming it.
Methodology as experiments/collectives.py: warm-up, timed iterations with a barrier before each,
the worst rank per iteration, ``dispatch_study.repeats`` repeats of that (each with its own
warm-up; in one process, not separate launches) summarised by their medians' mean and its 95%
interval (experiments.benchmark.repeated_iterations). A record's ``imbalance`` is its steps'
worst, ``dropped_fraction``, ``useful_bytes`` (what had to cross between ranks, there and back) and
``bytes_moved`` (what the path sends between ranks: its traffic,
moe_core.dispatch.base.Dispatcher.traffic, the description the simulator prices) their mean;
``useful_GBps`` is the useful bytes over the median time, ``algbw_GBps`` the same per rank and
``busbw_GBps`` the bytes moved per rank over it (moe_core.dispatch_study.bandwidths). Rank 0 prints
the cells as a table in the manner of nccl-tests. Records:
``results/raw/common/dispatchers/<point>.json``, all written at the end.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from itertools import cycle

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from experiments.benchmark import CellsFailed, measured_main, measured_record, repeated_iterations
from moe_core.dispatch import StudyGroups, dispatcher
from moe_core.dispatch.groups import StudyLayout, build_study_groups
from moe_core.dispatch.workloads import why_not
from moe_core.dispatch_study import (
    cell_metrics,
    measured_capacity,
    measured_paths,
    simulated_paths,
    study_steps,
    token_counts,
)
from moe_core.host.timing import PhaseTimer
from moe_core.model.capacity import DTYPE_BYTES
from moe_core.records.console import table
from moe_core.runtime.distributed import Env

PAPER, EXPERIMENT = "common", "dispatchers"
# The gate's loss weights are drawn from seed + this + rank: a stream apart from the tokens' (seed + rank).
GATE_WEIGHTS_SEED = 1000


def measured_cells(cfg: DictConfig, simulated_only: bool = False) -> list[tuple[str, str, str]]:
    """Every measured (skew, dispatcher, point name) whose skew routes on the dispatcher's experts
    (:func:`routes_on`); ``simulated_only``: the cells whose path the simulator prices on its own
    (experiments/dispatchers_predictions.py)."""
    d, simulated = cfg.dispatch_study, simulated_paths()
    paths = [p for p in measured_paths(cfg) if p in simulated or not simulated_only]
    return [
        (skew, path, cell_point(cfg, skew, path)) for skew in d.skews for path in paths if routes_on(cfg, skew, path)
    ]


def layout_experts(cfg: DictConfig, tensor_parallel: bool) -> int:
    """The experts of the study's flat layout (one per rank) or its tensor-parallel one (one per "tp"
    group), one per expert-parallel rank."""
    d = cfg.dispatch_study
    return d.world_size // d.tensor_parallel if tensor_parallel else d.world_size


def routes_on(cfg: DictConfig, skew: str, path: str) -> bool:
    """Whether ``skew`` can route on ``path``'s layout."""
    return layout_routes(cfg, skew, dispatcher(path).tensor_parallel)


def layout_routes(cfg: DictConfig, skew: str, tensor_parallel: bool) -> bool:
    """Whether ``skew`` can route on the flat or the tensor-parallel layout
    (moe_core.dispatch.workloads.why_not): a hot rank needs two, and 2 ranks of "tp" 2 are one
    expert-parallel group."""
    experts = layout_experts(cfg, tensor_parallel)
    return why_not(skew, experts=experts, ranks=experts, top_k=1) is None


def cell_point(cfg: DictConfig, skew: str, path: str) -> str:
    """A cell's point name, its measured record's and its prediction's."""
    return f"ws{cfg.dispatch_study.world_size}_{slug(skew)}_{path}"


def measured_points(cfg: DictConfig, simulated_only: bool = False) -> list[str]:
    return [point for _, _, point in measured_cells(cfg, simulated_only)]


def cell_params(cfg: DictConfig, skew: str, name: str, capacity: int) -> dict:
    """The params of a cell's record, measured or predicted (the analysis joins the two on them)."""
    d, path = cfg.dispatch_study, dispatcher(name)
    params = {"skew": skew, "path": name, "world_size": d.world_size, "tokens_per_rank": d.tokens_per_rank}
    return {**params, "tensor_parallel": d.tensor_parallel if path.tensor_parallel else 1, "capacity": capacity}


def slug(skew: str) -> str:
    """A skew as it appears in point names: ``zipf:1.0`` -> ``zipf1.0``."""
    return skew.replace(":", "")


class Paths:
    """This rank's groups (moe_core.dispatch.StudyGroups) and each skew's workload."""

    def __init__(self, cfg: DictConfig, env: Env):
        d = cfg.dispatch_study
        self.cfg, self.env = cfg, env
        layout = StudyLayout(
            env.rank, d.world_size, d.tensor_parallel, cfg.hardware.devices_per_node, timedelta(seconds=env.timeout_s)
        )
        names = {name for path in measured_paths(cfg) for name in dispatcher(path).study_groups}
        named = build_study_groups(names, layout)
        self.groups = StudyGroups(env.rank, d.world_size, d.tensor_parallel, PhaseTimer(env.device), named)

    def workload(self, skew: str, step: int) -> dict:
        """Token counts and buffers of ``skew`` at ``step``: (world, E) counts of the flat layout and
        (replicas, E/tp) of the tensor-parallel one (None where the skew cannot route there), with
        their capacities."""
        d, rank, device = self.cfg.dispatch_study, self.env.rank, self.env.device
        world, tp, experts_tp = self.groups.world, self.groups.tp, layout_experts(self.cfg, True)
        counts = token_counts(skew, world, d.tokens_per_rank, d.seed, step)
        routes_tp = layout_routes(self.cfg, skew, tensor_parallel=True)  # else no tensor-parallel cell reads it
        counts_tp = token_counts(skew, experts_tp, d.tokens_per_rank, d.seed, step) if routes_tp else None
        capacity, capacity_tp = measured_capacity(d, world), measured_capacity(d, experts_tp)
        generator = torch.Generator().manual_seed(d.seed + rank)
        replica = torch.Generator().manual_seed(d.seed + rank // tp)  # a "tp" group shares its tokens
        return {
            "study": d,
            "counts": counts,
            "counts_tp": counts_tp,
            "capacity": capacity,
            "capacity_tp": capacity_tp,
            "buffer": torch.randn(world * capacity, d.d_model, generator=generator).to(device),
            "buffer_tp": torch.randn(experts_tp * capacity_tp, d.d_model, generator=replica).to(device),
            "tokens": torch.randn(int(counts[rank].sum()), d.d_model, generator=generator).to(device),
        }

    def round_trip(self, path: str, w: dict):
        """Dispatch then combine along ``path`` (the timed exchange: experts that leave rows as they are)."""
        return dispatcher(path).round_trip(self.groups, w)

    def wrong_rows(self, path: str, w: dict) -> int:
        """Rows of ``w`` that ``path`` brings back, or whose gradient it carries back, other than a
        single process would, summed over the ranks (every rank gets the sum, so all agree on a cell).

        Expert e multiplies its rows by 2 + e, so a row that reached another expert or none, or came
        back elsewhere, differs from its reference. Then each rank weighs what came back by seeded
        random weights (the same over a "tp" group, whose ranks hold one replicated output, as a
        tensor-parallel layer's gradient is) and runs the backward pass: every row sent must get its
        weight times 2 + its expert as gradient. Both are exact: one rounding on either side."""
        exchange = dispatcher(path)
        scale = 2 + exchange.expert_index(self.groups)
        w = {**w, **{key: w[key].detach().requires_grad_() for key in ("buffer", "buffer_tp", "tokens")}}
        came_back = exchange.round_trip(self.groups, w, expert=lambda rows: rows * scale)
        rows, experts = exchange.routed(self.groups, w)  # a leaf of ``w``: the gradient lands there
        factor = (2 + experts).to(rows.dtype).unsqueeze(1)
        if came_back.shape != rows.shape:
            wrong = torch.tensor([max(rows.shape[0], 1)], device=rows.device)
        else:
            owner = self.groups.rank // self.groups.tp if exchange.tensor_parallel else self.groups.rank
            seeded = torch.Generator().manual_seed(self.cfg.dispatch_study.seed + GATE_WEIGHTS_SEED + owner)
            weight = torch.randn(came_back.shape, generator=seeded).to(came_back.device)
            came_back.backward(weight)  # every rank: the backward's collectives need them all
            grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
            wrong_value = (came_back.detach() != rows.detach() * factor).any(dim=1)
            wrong = (wrong_value | (grad != weight * factor).any(dim=1)).sum().reshape(1)
        dist.all_reduce(wrong)
        return int(wrong.item())


def run_measured(cfg: DictConfig, env: Env) -> list[dict]:
    paths, records, failed = Paths(cfg, env), [], []
    d, cells = cfg.dispatch_study, measured_cells(cfg)
    for skew in d.skews:
        steps = [paths.workload(skew, step) for step in range(study_steps(skew, d.world_size))]
        for name in (path for cell_skew, path, _ in cells if cell_skew == skew):
            wrong = sum(paths.wrong_rows(name, w) for w in steps)
            if wrong:
                failed.append(f"{name} under {skew}: #wrong {wrong} rows")
                continue
            turns = cycle(steps)  # iteration i runs step i mod the period
            samples, spread = repeated_iterations(
                lambda name=name, turns=turns: paths.round_trip(name, next(turns)),
                d.warmup_iters,
                d.iters,
                d.repeats,
                paths.groups.timer,
                "exchange_ms",
            )
            if env.rank == 0:
                records.append(cell_record(cfg, skew, name, steps, samples, spread))
    if env.rank == 0:
        print(results_table(records), flush=True)
    if failed:
        raise CellsFailed(f"{len(failed)} cells brought rows back wrong, not timed: {'; '.join(failed)}", records)
    return records


def cell_record(cfg: DictConfig, skew: str, name: str, steps: list[dict], samples: list[float], spread: dict) -> dict:
    """The record of one (skew, dispatcher) cell: its samples, routing, bytes and rates, interval."""
    d, path = cfg.dispatch_study, dispatcher(name)
    counts, capacity = ("counts_tp", "capacity_tp") if path.tensor_parallel else ("counts", "capacity")
    capacity = steps[0][capacity]
    row_bytes, exchange_ms = d.d_model * DTYPE_BYTES["float32"], float(np.median(samples))
    extra = cell_metrics(
        name, [w[counts] for w in steps], capacity, row_bytes, cfg.hardware.devices_per_node, exchange_ms, d
    )
    extra.update(spread, wrong_rows=0)
    return measured_record(
        cfg,
        paper=PAPER,
        experiment=EXPERIMENT,
        point=cell_point(cfg, skew, name),
        params=cell_params(cfg, skew, name, capacity),
        samples={"exchange_ms": samples},
        extra_metrics=extra,
    )


def results_table(records: list[dict]) -> str:
    """The cells as nccl-tests prints its results: one line per workload and dispatcher, the median
    round trip of the worst rank with the repeats' 95% interval, the useful bytes and the bytes the
    path moved, and their rates (moe_core.dispatch_study.bandwidths); then a line saying which kind of
    bandwidth each rate is."""
    rows = []
    for r in records:
        m = r["metrics"]
        rows.append(
            {
                "workload": r["params"]["skew"],
                "dispatcher": r["params"]["path"],
                "tokens": r["params"]["tokens_per_rank"],
                "useful(B)": int(m["useful_bytes"]["value"]),
                "moved(B)": int(m["bytes_moved"]["value"]),
                "time(ms)": m["exchange_ms"]["median"],
                "ci95(ms)": f"{m['exchange_ms_ci95_low']['value']:.3f}-{m['exchange_ms_ci95_high']['value']:.3f}",
                "useful(GB/s)": m["useful_GBps"]["value"] if "useful_GBps" in m else None,
                "algbw(GB/s)": m["algbw_GBps"]["value"] if "algbw_GBps" in m else None,
                "busbw(GB/s)": m["busbw_GBps"]["value"] if "busbw_GBps" in m else None,
                "dropped": m["dropped_fraction"]["value"],
                "#wrong": int(m["wrong_rows"]["value"]),
            }
        )
    return table(rows) + "\n" + BANDWIDTH_LEGEND


# what each rate of the table counts: never to be read as another kind (moe_core.dispatch_study.bandwidths)
BANDWIDTH_LEGEND = (
    "useful, algbw: logical GB/s (the bytes the layer had to move between ranks, all ranks' or per rank); "
    "busbw: wire GB/s (the bytes the path puts on the links per rank: padding, copies, forwarding included)"
)


def run(args: argparse.Namespace, world_size_key: str) -> None:
    """The study on every rank for ``args`` (experiments.dispatchers' command line)."""
    measured_main(args, world_size_key, run_measured)
