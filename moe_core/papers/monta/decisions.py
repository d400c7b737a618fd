"""MoNTA's dispatch decision: how many pipelined chunks the all-to-all + all-gather runs in.

Registered as the ``monta`` token dispatcher (moe_core.dispatch): DeepSpeed's drop-gather in
pipelined chunks, so the measured executor (moe_core.comm.all_to_all.tp_exchange) and the step simulator both
take the chunk count from :func:`monta_chunks`, and the dispatcher study runs it at its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_core.dispatch import register_dispatcher
from moe_core.dispatch.tensor_parallel import DropGather
from moe_core.model.capacity import DTYPE_BYTES, dispatch_rows_per_expert
from moe_core.papers.monta.performance_model import admissible_chunk_counts, choose_chunk_count, exchange_links
from moe_core.parallel.layout import layout_of

# The released code's fixed choice (EnflameTechnology/DeepSpeed f733615: ``self.shard_num = 4``).
CODE_DEFAULT_CHUNKS = 4


def dispatch_volume_bytes(cfg) -> float:
    """One rank's dispatched buffer (E, G*C, M) in bytes, before the tensor-parallel drop."""
    return cfg.moe.num_experts * dispatch_rows_per_expert(cfg) * cfg.model.d_model * DTYPE_BYTES[cfg.train.dtype]


def knows_links(hw) -> bool:
    """Whether ``hw`` states the link numbers the performance model needs (measured-only profiles do not)."""
    return hw.intra_node_GBps > 0 and (hw.nodes == 1 or hw.nic_GBps > 0)


def monta_chunks(cfg) -> int:
    """The chunk count of MoNTA's pipelined dispatch for ``cfg``.

    ``comm.tp_chunks`` when set (sweeps); else the performance model's best count over the divisors
    of the slots a rank sends per expert, on ``cfg.hardware``'s links. A profile without link
    numbers (a measured-only one, e.g. local-cpu before calibration) gets the released code's
    fixed 4 chunks, or the largest admissible count below it.
    """
    if cfg.comm.tp_chunks:
        return cfg.comm.tp_chunks
    layout = layout_of(cfg)
    ep, tp = layout.expert_parallel, layout.tensor_parallel
    rows = dispatch_rows_per_expert(cfg)
    if not knows_links(cfg.hardware):
        return max(n for n in admissible_chunk_counts(rows, tp) if n <= CODE_DEFAULT_CHUNKS)
    links = exchange_links(cfg.hardware, ep, tp, cfg.monta.chunk_overhead_us * 1e-6)
    return choose_chunk_count(dispatch_volume_bytes(cfg), rows, ep, tp, links)


@dataclass(frozen=True)
class MontaDispatch(DropGather):
    """Drop-gather in the pipelined chunks MoNTA's performance model picks (``dispatch_study.chunks``
    in the dispatcher study)."""

    name = "monta"

    def step_chunks(self, cfg) -> int:
        return monta_chunks(cfg)

    def study_chunks(self, study) -> int:
        return study.chunks


register_dispatcher(MontaDispatch())
