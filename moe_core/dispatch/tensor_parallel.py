"""The dispatchers of a tensor-parallel layout, whose "tp" ranks hold the same tokens (DeepSpeed's two).

* :class:`Duplicate`: every "tp" rank sends its copy of the tokens: the all-to-all carries tp times
  the bytes;
* :class:`DropGather`: each "tp" rank sends 1/tp of them and an all-gather over "tp" restores the
  rest (moe_core.comm.all_to_all.tp_exchange), here in one chunk; a paper's pipelined variant subclasses it
  with its own chunk count (MoNTA's, moe_core/papers/monta).

A training step's plan takes the chunk count from :meth:`TensorParallelDispatcher.exchange_chunks`
(moe_core.schedule.policies.tp_exchange_chunks): None keeps the plain all-to-all, n makes the plan's exchange
moe_core.dispatch.step.DropAllGather in n chunks, which the measured and the simulated step run.
"""

from __future__ import annotations

import numpy as np

from moe_core.dispatch.base import Collective, Dispatcher, StudyGroups, capacity_rows, run_expert
from moe_core.dispatch.step import even_ranges


class TensorParallelDispatcher(Dispatcher):
    """An exchange of tokens the "tp" ranks share, in the chunks :meth:`exchange_chunks` decides."""

    tensor_parallel = True

    @property
    def step_keys(self) -> dict[str, str]:
        return {"comm.tp_dispatch": self.name}

    def exchange_chunks(self, cfg) -> int | None:
        """What a training step of ``cfg`` does with the duplicates: None sends them all; n drops
        them and all-gathers over "tp" in n pipelined chunks."""
        raise NotImplementedError

    def study_chunks(self, study) -> int | None:
        """The same decision in the dispatcher study (``study`` is the dispatch_study section)."""
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
        if self.study_chunks(study) is None:
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
        chunks = self.study_chunks(workload["study"])
        if chunks is None:
            received = all_to_all(buffer, None, None, groups.ep, groups.timer, "dispatch")
            return all_to_all(run_expert(expert, received), None, None, groups.ep, groups.timer, "combine")
        ranges = even_ranges(rows // groups.tp, chunks)
        received = tp_exchange(buffer, rows, ranges, groups.ep, groups.tp_group, groups.timer, "x")
        return tp_exchange(run_expert(expert, received), rows, ranges, groups.ep, groups.tp_group, groups.timer, "x")

    def routed(self, groups, workload):
        return capacity_rows(workload["buffer_tp"], workload["capacity_tp"])

    def expert_index(self, groups: StudyGroups) -> int:
        import torch.distributed as dist

        return dist.get_rank(groups.ep)


class Duplicate(TensorParallelDispatcher):
    name = "duplicate"

    def exchange_chunks(self, cfg) -> None:
        return None

    def study_chunks(self, study) -> None:
        return None


class DropGather(TensorParallelDispatcher):
    name = "drop-gather"

    def exchange_chunks(self, cfg) -> int:
        return 1

    def study_chunks(self, study) -> int:
        return 1
