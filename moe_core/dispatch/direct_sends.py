"""Low-latency direct sends: DeepEP's low-latency kernels and pplx-kernels.

Every (token, expert) selection is its own message, written straight into the expert's GPU, into
receive buffers sized for the worst case (every token of every rank to one expert), so no count has
to be exchanged before the data: the receiver learns each sender's count from a signal that follows
its messages. No node deduplication and no forwarding: a token with several experts on one node
crosses the network once for each. Per-message and per-peer costs dominate at small batches
(decoding), which is what these kernels are built for.

Measured (the dispatcher study, gloo or NCCL): each rank posts, to every peer it has rows for, one
point-to-point send of the rows (``torch.distributed.batch_isend_irecv``), and receives into a buffer
of the worst case's size; no collective, and no count exchange before the data (the receiver's
counts are the study's, which every rank holds, as the kernels' receivers learn theirs from the
signal that comes with the data). gloo cannot send a message per row
at any useful speed, so the rows to one peer travel as one message: the per-message costs are the
kernel model's (moe_core.sim.ep_kernels), not this exchange's.

Simulated: the routed rows, direct, priced by the kernel model (kernel ``direct_sends``).
"""

from __future__ import annotations

from moe_core.dispatch.base import Collective, StudyGroups, run_expert
from moe_core.dispatch.exchanges import _RoutedRows


class DirectSends(_RoutedRows):
    name = "direct-sends"
    kernel = "direct_sends"

    def runs_on(self, world: int, hw) -> bool:
        """On a cluster (the kernel model prices NVLink and NIC links; a torus has neither)."""
        return hw.topology != "torus2d"

    def refusal(self, cfg) -> str | None:
        return "it is timed by the dispatcher study (experiments/dispatchers.py), not run in a training step"

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """Rows to every peer by point-to-point sends, the expert, and the rows back."""
        from moe_core.comm.peer_sends import peer_sends

        tokens, counts, group, timer = workload["tokens"], workload["counts"], groups["flat"], groups.timer
        send, recv = counts[groups.rank].tolist(), counts[:, groups.rank].tolist()  # rows to / from each rank
        worst = int(counts.sum(axis=1).max())  # a peer's every token to this rank's expert
        received = peer_sends(tokens, send, recv, group, timer, "dispatch", worst)
        return peer_sends(run_expert(expert, received), recv, send, group, timer, "combine")

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Every selection its own message, there and back: the routed rows, no deduplication."""
        routed = counts * float(row_bytes)  # (src, dst) bytes: expert e on rank e
        return [
            Collective("all_to_all", routed, kernel=self.kernel),
            Collective("all_to_all", routed.T, kernel=self.kernel),
        ]
