"""The dispatchers of a tensor-parallel layout, whose "tp" ranks hold the same tokens (DeepSpeed's two).

* :class:`Duplicate`: every "tp" rank sends its copy of the tokens: the all-to-all carries tp times
  the bytes (its training step is the base class's all-to-all of the whole buffer);
* :class:`DropGather`: each "tp" rank sends 1/tp of them and an all-gather over "tp" restores the
  rest (moe_core.comm.all_to_all.tp_exchange), in ``chunks`` pipelined chunks (chunk i's all-gather
  overlaps chunk i+1's all-to-all); DeepSpeed's in one chunk. A paper's pipelined variant
  subclasses it with its own chunk decision (MoNTA's, moe_core/papers/monta).

A tensor-parallel layout dispatches capacity buffers only, so a dropping dispatcher has no ragged
``all_to_all`` of its own beyond the base class's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from moe_core.dispatch.base import Collective, Dispatcher, StudyGroups, capacity_rows, run_expert
from moe_core.dispatch.chunks import even_ranges
from moe_core.model.capacity import dispatch_rows_per_expert


class TensorParallelDispatcher(Dispatcher):
    """An exchange of tokens the "tp" ranks share: all sent (``sends_duplicates``), or dropped and
    all-gathered in ``study_chunks`` pipelined chunks."""

    tensor_parallel = True
    sends_duplicates: ClassVar[bool] = False
    study_groups = ("ep", "tp")

    def study_chunks(self, study) -> int | None:
        """Its chunk count in the dispatcher study (``study`` is the dispatch_study section)."""
        raise NotImplementedError

    def step_chunks(self, cfg) -> int | None:
        """Its chunk count in a training step of ``cfg`` (None: the duplicates are sent)."""
        raise NotImplementedError

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Over ranks r = source x tp + t (tp = ``study.tensor_parallel``): the all-to-all among the
        expert-parallel peers (same t) carries each expert's ``capacity`` slots, all of them
        (``study_chunks`` None) or the rank's 1/tp share, which an all-gather over "tp" then
        completes; there and back. The chunk count pipelines these bytes, it does not change them."""
        sources, tp = counts.shape[0], study.tensor_parallel
        rank = np.arange(sources * tp)
        same_t = rank[:, None] % tp == rank[None, :] % tp
        same_group = rank[:, None] // tp == rank[None, :] // tp
        if self.sends_duplicates:
            return [Collective("all_to_all", same_t * float(capacity * row_bytes))] * 2
        exchange = Collective("all_to_all", same_t * float(capacity // tp * row_bytes))
        gather = Collective("all_gather", same_group * float(sources * capacity // tp * row_bytes))
        return [exchange, gather] * 2

    def study_transfers(self, topo, counts, capacity, row_bytes, top_k=1):
        raise ValueError(
            f"dispatcher '{self.name}' exchanges tokens its \"tp\" ranks share: it is simulated inside "
            "training steps (moe_core.sim.step), not on its own"
        )

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        from moe_core.comm.all_to_all import all_to_all, tp_exchange

        buffer, rows = workload["buffer_tp"], workload["capacity_tp"]
        chunks, ep, tp_group = self.study_chunks(workload["study"]), groups["ep"], groups["tp"]
        if self.sends_duplicates:
            received = all_to_all(buffer, None, None, ep, groups.timer, "dispatch")
            return all_to_all(run_expert(expert, received), None, None, ep, groups.timer, "combine")
        ranges = even_ranges(rows // groups.tp, chunks)
        received = tp_exchange(buffer, rows, ranges, ep, tp_group, groups.timer, "x")
        return tp_exchange(run_expert(expert, received), rows, ranges, ep, tp_group, groups.timer, "x")

    def routed(self, groups, workload):
        return capacity_rows(workload["buffer_tp"], workload["capacity_tp"])

    def expert_index(self, groups: StudyGroups) -> int:
        import torch.distributed as dist

        return dist.get_rank(groups["ep"])


class Duplicate(TensorParallelDispatcher):
    name = "duplicate"
    sends_duplicates = True

    def study_chunks(self, study) -> None:
        return None

    def step_chunks(self, cfg) -> None:
        return None


@dataclass(frozen=True)
class DropGather(TensorParallelDispatcher):
    """Drop the "tp" duplicates, all-to-all, all-gather over "tp", in ``chunks`` pipelined chunks."""

    name = "drop-gather"
    chunks: int = 1

    def study_chunks(self, study) -> int:
        return self.chunks

    def step_chunks(self, cfg) -> int:
        """Its chunk count in a training step of ``cfg``: ``comm.tp_chunks`` when set, else its own."""
        return cfg.comm.tp_chunks or self.chunks

    def for_step(self, cfg) -> DropGather:
        return replace(self, chunks=self.step_chunks(cfg))

    def refusal(self, cfg) -> str | None:
        """Every rank sends 1/tp of each expert's capacity slots, in whole chunks."""
        tp, rows, chunks = cfg.parallel.tensor_parallel, dispatch_rows_per_expert(cfg), self.step_chunks(cfg)
        if rows % tp:
            return (
                f"it gives each tensor-parallel rank 1/{tp} of the {rows} capacity slots per expert, which {tp} "
                "must divide; change moe.capacity_factor, train.batch_size or moe.min_capacity"
            )
        if (rows // tp) % chunks:
            return (
                f"{chunks} chunks must divide the {rows // tp} capacity slots per expert a tensor-parallel rank sends"
            )
        return None

    def exchange_compute_exchange(self, policy, buf, rows_per_expert: int, compute, params):
        received = policy.blocking(lambda x: self._exchange(policy, x, rows_per_expert, "dispatch_a2a"), buf)
        outputs = compute(received, rows_per_expert)
        return policy.blocking(lambda y: self._exchange(policy, y, rows_per_expert, "combine_a2a"), outputs)

    def _exchange(self, policy, x, rows_per_expert: int, name: str):
        """moe_core.comm.all_to_all.tp_exchange of ``x``: every rank keeps 1/tp of each expert's rows, in chunks."""
        from moe_core.comm.all_to_all import tp_exchange

        groups = policy.groups
        ranges = even_ranges(rows_per_expert // groups.layout.tensor_parallel, self.chunks)
        return tp_exchange(x, rows_per_expert, ranges, groups.ep_group, groups.tp_group, policy.timer, name)

    def simulate(self, dag, layer: int, first: str, second: str, after, pass_: str) -> int:
        sent = self._simulated_exchange(dag, f"L{layer}.{first}0", f"{first}_a2a", pass_, after)
        computed = dag.experts(layer, pass_, sent)
        return self._simulated_exchange(dag, f"L{layer}.{second}0", f"{second}_a2a", pass_, computed)

    def _simulated_exchange(self, dag, stem: str, phase: str, pass_: str, after) -> int:
        """The chunks' all-to-alls one after another on the "ep" communicator, each chunk all-gathered
        over "tp" once it has arrived (as moe_core.comm.all_to_all.tp_exchange)."""
        sent = gathered = None
        for j in range(self.chunks):
            sent = dag.all_to_all(f"{stem}c{j}.{pass_}", phase, after if sent is None else sent, dag.tp * self.chunks)
            gathered = dag.tp_all_gather(f"{stem}ag{j}.{pass_}", phase, [sent, gathered], self.chunks)
        return gathered
