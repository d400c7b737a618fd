"""Which dispatcher when: every dispatch path's round trip under routing skew (moe_core.dispatch_study).

Measured, under torchrun (usually through the launcher)::

    python -m experiments.launch --config FILE --nproc 4 -- -m experiments.dispatchers

Its simulated executor is experiments/dispatchers_sim.py.

Measured: on ``dispatch_study.world_size`` ranks, one expert per rank (per expert-parallel rank for
``drop-gather`` and ``monta``, with ``dispatch_study.tensor_parallel`` ranks sharing tokens), for every
skew every rank routes its tokens by the same seeded counts, and each path moves them to their
experts and back: float32 rows of ``d_model``, capacity C = ceil(capacity_factor * tokens / E)
rounded to a multiple of tp * chunks. ``hierarchical`` runs only when the group spans nodes of
``hardware.devices_per_node`` ranks. Before timing, every path's delivery is checked (the
hierarchical and the tensor-parallel exchanges against the flat all-to-all; dropless and allgather
by the rows each expert receives). Methodology as experiments/collectives.py: warm-up, timed
iterations with a barrier before each, the worst rank per iteration (moe_core.benchmark). Records:
``results/raw/common/dispatchers/<point>.json``, all written at the end.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig

from moe_core import comm
from moe_core.benchmark import benchmark_main, measured_record, timed_iterations
from moe_core.dispatch_study import capacity_slots, dropped_fraction, imbalance, popularity, token_counts
from moe_core.distributed import Env
from moe_core.hierarchical_a2a import hierarchical_groups
from moe_core.layout import expert_layout
from moe_core.parallel import own_group
from moe_core.plan import even_ranges
from moe_core.timing import PhaseTimer

PAPER, EXPERIMENT = "common", "dispatchers"


def measured_paths(cfg: DictConfig) -> list[str]:
    spans_nodes = cfg.dispatch_study.world_size > cfg.hardware.devices_per_node
    return ["capacity", *(["hierarchical"] if spans_nodes else []), "dropless", "allgather", "drop-gather", "monta"]


def measured_points(cfg: DictConfig) -> list[str]:
    d = cfg.dispatch_study
    return [f"ws{d.world_size}_{slug(skew)}_{path}" for skew in d.skews for path in measured_paths(cfg)]


def slug(skew: str) -> str:
    """A skew as it appears in point names: ``zipf:1.0`` -> ``zipf1.0``."""
    return skew.replace(":", "")


class Paths:
    """This rank's groups and, per skew, each path's round trip as a callable."""

    def __init__(self, cfg: DictConfig, env: Env):
        d, timeout = cfg.dispatch_study, timedelta(seconds=env.timeout_s)
        self.cfg, self.env, self.world, self.tp = cfg, env, d.world_size, d.tensor_parallel
        flat = expert_layout(self.world, self.world, 1)
        self.group = own_group(flat.groups("ep"), env.rank, timeout)
        self.hierarchical = None
        if "hierarchical" in measured_paths(cfg):
            self.hierarchical = hierarchical_groups(flat.groups("ep").tolist(), cfg.hardware.devices_per_node, timeout)
        sharded = expert_layout(self.world, self.world // self.tp, 1, self.tp)
        self.ep_group = own_group(sharded.groups("ep"), env.rank, timeout)
        self.tp_group = own_group(sharded.groups("tp"), env.rank, timeout)
        self.timer = PhaseTimer(env.device)

    def workload(self, skew: str) -> dict:
        """Token counts and buffers of ``skew``: (world, E) counts of the flat layout and (replicas,
        E/tp) of the tensor-parallel one, with their capacities."""
        d, rank, device = self.cfg.dispatch_study, self.env.rank, self.env.device
        multiple = self.tp * d.chunks
        counts = token_counts(self.world, d.tokens_per_rank, popularity(self.world, skew, d.seed), d.seed)
        experts_tp = self.world // self.tp
        counts_tp = token_counts(experts_tp, d.tokens_per_rank, popularity(experts_tp, skew, d.seed), d.seed)
        capacity = capacity_slots(d.tokens_per_rank, self.world, d.capacity_factor, multiple)
        capacity_tp = capacity_slots(d.tokens_per_rank, experts_tp, d.capacity_factor, multiple)
        generator = torch.Generator().manual_seed(d.seed + rank)
        replica = torch.Generator().manual_seed(d.seed + rank // self.tp)  # a "tp" group shares its tokens
        return {
            "counts": counts,
            "counts_tp": counts_tp,
            "capacity": capacity,
            "capacity_tp": capacity_tp,
            "buffer": torch.randn(self.world * capacity, d.d_model, generator=generator).to(device),
            "buffer_tp": torch.randn(experts_tp * capacity_tp, d.d_model, generator=replica).to(device),
            "tokens": torch.randn(int(counts[rank].sum()), d.d_model, generator=generator).to(device),
        }

    def round_trip(self, path: str, w: dict):
        """Dispatch then combine along ``path``; returns what the experts received."""
        if path in ("capacity", "hierarchical"):
            group = self.group if path == "capacity" else self.hierarchical
            received = comm.exchange(w["buffer"], None, None, group, None)
            comm.exchange(received, None, None, group, None)
            return received
        if path == "dropless":
            return self._dropless(w["tokens"], w["counts"])
        if path == "allgather":
            return self._allgather(w["tokens"], w["counts"])
        chunks = 1 if path == "drop-gather" else self.cfg.dispatch_study.chunks
        ranges = even_ranges(w["capacity_tp"] // self.tp, chunks)
        exchange = comm.tp_exchange
        received = exchange(w["buffer_tp"], w["capacity_tp"], ranges, self.ep_group, self.tp_group, self.timer, "x")
        exchange(received, w["capacity_tp"], ranges, self.ep_group, self.tp_group, self.timer, "x")
        return received

    def _dropless(self, tokens: torch.Tensor, counts: np.ndarray) -> torch.Tensor:
        """All-to-all of the per-expert counts, then all-to-all(v) of the tokens and back."""
        rank = self.env.rank
        send_counts = torch.tensor(counts[rank], dtype=torch.int64, device=tokens.device)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_splits, recv_splits = counts[rank].tolist(), recv_counts.tolist()  # NOTE: host sync, as dropless has
        received = comm.exchange(tokens, recv_splits, send_splits, self.group, None)
        comm.exchange(received, send_splits, recv_splits, self.group, None)
        return received

    def _allgather(self, tokens: torch.Tensor, counts: np.ndarray) -> torch.Tensor:
        """All-gather every rank's tokens (equal rows: padded to the largest rank), keep this rank's
        expert's, reduce-scatter the outputs back."""
        rows = int(counts.sum(axis=1).max())
        padded = tokens.new_zeros(rows, tokens.shape[1])
        padded[: tokens.shape[0]] = tokens
        gathered = tokens.new_empty(self.world * rows, tokens.shape[1])
        dist.all_gather_single(gathered, padded, group=self.group)
        mine = _rows_for_expert(counts, self.env.rank, rows, tokens.device)
        received = gathered[mine]  # the tokens routed to this rank's expert
        outputs = torch.zeros_like(gathered).index_copy_(0, mine, received)
        back = tokens.new_empty(rows, tokens.shape[1])
        dist.reduce_scatter_single(back, outputs, group=self.group)
        return received


def _rows_for_expert(counts: np.ndarray, expert: int, rows: int, device) -> torch.Tensor:
    """Rows of the gathered (world * rows) buffer routed to ``expert``: each rank's tokens are sorted
    by expert, so rank r's block for e starts at r * rows + counts[r, :e].sum()."""
    starts = np.arange(counts.shape[0]) * rows + counts[:, :expert].sum(axis=1)
    index = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, counts[:, expert])])
    return torch.from_numpy(index).to(device)


def check_delivery(paths: Paths, names: list[str], w: dict) -> None:
    """Every path delivers to the experts what it must, on every rank (agreed, so no rank hangs)."""
    rank = paths.env.rank
    flat = paths.round_trip("capacity", w)
    ok = True
    for name in names:
        got = paths.round_trip(name, w)
        if name == "hierarchical":
            ok &= torch.equal(got, flat)
        elif name in ("dropless", "allgather"):
            ok &= got.shape[0] == int(w["counts"][:, rank].sum())
        elif name in ("drop-gather", "monta"):
            whole = comm.exchange(w["buffer_tp"], None, None, paths.ep_group, None)
            ok &= torch.equal(got, whole)
    all_ok = torch.tensor([int(ok)], device=flat.device)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if not all_ok.item():
        raise RuntimeError(f"a dispatch path delivered the wrong tokens (this rank {'correct' if ok else 'wrong'})")


def run_measured(cfg: DictConfig, env: Env) -> list[dict]:
    paths, names, records = Paths(cfg, env), measured_paths(cfg), []
    d = cfg.dispatch_study
    for skew in d.skews:
        w = paths.workload(skew)
        check_delivery(paths, names, w)
        for name in names:
            samples = timed_iterations(
                partial(paths.round_trip, name, w), d.warmup_iters, d.iters, paths.timer, "exchange_ms"
            )
            if env.rank != 0:
                continue
            tp_path = name in ("drop-gather", "monta")
            counts, capacity = (w["counts_tp"], w["capacity_tp"]) if tp_path else (w["counts"], w["capacity"])
            dropped = 0.0 if name in ("dropless", "allgather") else dropped_fraction(counts, capacity)
            params = {"skew": skew, "path": name, "world_size": d.world_size, "tokens_per_rank": d.tokens_per_rank}
            params.update(tensor_parallel=d.tensor_parallel if tp_path else 1, capacity=capacity)
            extra = {"imbalance": imbalance(counts), "dropped_fraction": dropped}
            point = f"ws{d.world_size}_{slug(skew)}_{name}"
            records.append(
                measured_record(
                    cfg,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=point,
                    params=params,
                    samples=samples,
                    extra_metrics=extra,
                )
            )
    return records


def main(argv: list[str] | None = None) -> None:
    benchmark_main(argv, __doc__, "dispatch_study.world_size", run_measured)


if __name__ == "__main__":
    main()
