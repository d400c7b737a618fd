"""Node-deduplicated forwarding: DeepEP's normal kernels and NVIDIA's Hybrid-EP.

A token goes over the network once to each destination node that holds one of its experts, to the
GPU with the sender's local index there, which forwards it over the node's fabric (NVLink) to each
of its experts' GPUs; the combine reverses the way, the forwarding GPU reducing a token's outputs of
its node before the one crossing back. So the NIC carries (token, destination node) pairs, not
(token, expert) selections, at the price of a second, intra-node leg.

Measured (the dispatcher study, gloo or NCCL): the network leg is an all-to-all(v) among the ranks of
one local index (the "two_phase" study group's ``inter``), the forwarding leg one inside each node
(``intra``); on one node only the forwarding leg runs. The study routes top-1, so no token has two
experts on one node and there is nothing to deduplicate or reduce there: the measured exchange is the
route, the deduplication is in its traffic (:meth:`NodeForwarding.traffic`, for any top-k).
Each way starts with a notify step, an all-to-all of the counts (DeepEP's notify kernels); the
splits themselves come from the study's counts, which every rank holds.

Simulated: each way a notify kernel (the counts), then one transfer of both legs at once
(moe_core.sim.topology.Cluster.relayed_all_to_all), each priced by the kernel model
(moe_core.sim.ep_kernels, kernel ``node_forwarding``): two kernel latencies each way.
"""

from __future__ import annotations

import numpy as np

from moe_core.dispatch.base import Collective, StudyGroups, run_expert
from moe_core.dispatch.exchanges import _RoutedRows

COUNT_BYTES = 4  # one int32 count a rank pair in the notify kernel


class NodeForwarding(_RoutedRows):
    name = "node-forwarding"
    route = "forwarded"
    kernel = "node_forwarding"
    study_groups = ("flat", "two_phase")

    def runs_on(self, world: int, hw) -> bool:
        """On a cluster whose nodes hold equally many of the ranks (a torus has no nodes)."""
        return hw.topology != "torus2d" and (world <= hw.devices_per_node or world % hw.devices_per_node == 0)

    def refusal(self, cfg) -> str | None:
        return "it is timed by the dispatcher study (experiments/dispatchers.py), not run in a training step"

    def round_trip(self, groups: StudyGroups, workload: dict, expert=None):
        """Network leg, forwarding leg, the expert, and back the same way (module docstring)."""
        import torch

        from moe_core.comm.all_to_all import all_to_all

        hier, counts, timer = groups["two_phase"], workload["counts"], groups.timer
        _notify(groups, counts, "notify")
        nodes, m = (hier.nodes, hier.members_per_node) if hier is not None else (1, groups.world)
        node, local = divmod(groups.rank, m)
        c = counts.reshape(nodes, m, nodes, m)  # (src node, src local, dst node, dst local) rows
        tokens = workload["tokens"]
        if hier is not None:  # to (n2, local) the rows for node n2's experts, own node included
            sent, came = c[node, local].sum(axis=1).tolist(), c[:, local, node].sum(axis=1).tolist()
            tokens = all_to_all(tokens, came, sent, hier.inter, timer, "dispatch")
        # arrived by (src node, dst local); forward by (dst local, src node)
        arrived = c[:, local, node]  # (src node, dst local) rows this rank holds for its node
        order = torch.from_numpy(_regroup(arrived)).to(tokens.device)
        intra = hier.intra if hier is not None else groups["flat"]
        sent2, came2 = arrived.sum(axis=0).tolist(), c[:, :, node, local].sum(axis=0).tolist()
        received = all_to_all(tokens[order], came2, sent2, intra, timer, "forward")
        _notify(groups, counts, "combine_notify")
        back = all_to_all(run_expert(expert, received), sent2, came2, intra, timer, "combine_forward")
        back = torch.empty_like(back).index_copy(0, order, back)  # (src node, dst local) order again
        if hier is not None:
            back = all_to_all(back, sent, came, hier.inter, timer, "combine")
        return back

    def traffic(self, counts, capacity, row_bytes, study=None, top_k=1):
        """Each way a notify kernel, then the tokens. The notify exchanges every rank's counts (DeepEP's
        notify_dispatch, whose count the host waits for, and cached_notify before the combine:
        csrc/legacy/buffer.hpp), ``COUNT_BYTES`` a rank pair. The tokens: the rows of every choice, with
        each source's tokens' bytes (``token_bytes``), so that Collective.legs sends a token once over the
        network to each other node holding one of its choices and once to each rank holding one. The
        combine is the dispatch reversed (each forwarding rank reduces its node's outputs of a token
        before the one crossing back): the same bytes on the opposite direction of the same links, which
        are equally fast both ways, so it is stated as the same collective."""
        ranks = len(counts)
        notify = Collective("all_to_all", np.full((ranks, ranks), float(COUNT_BYTES)), kernel=self.kernel)
        chosen = counts * float(row_bytes)  # (src, dst) bytes of the choices: expert e on rank e
        tokens = chosen.sum(axis=1) / top_k  # (R,) bytes of each source's tokens
        dispatch = Collective("all_to_all", chosen, self.route, self.kernel, tokens, top_k)
        return [notify, dispatch, notify, dispatch]


def _notify(groups: StudyGroups, counts: np.ndarray, name: str) -> None:
    """The notify step before each way: every rank sends every other its count (one int32 a pair, as
    the model's notify kernel), over the flat group; the exchange's splits are the study's counts."""
    import torch
    import torch.distributed as dist

    sent = torch.tensor(counts[groups.rank], dtype=torch.int32)
    with groups.timer.region(name):
        dist.all_to_all_single(torch.empty_like(sent), sent, group=groups["flat"])


def _regroup(arrived: np.ndarray) -> np.ndarray:
    """The permutation taking rows laid out by (source node, destination local) blocks of sizes
    ``arrived`` (nodes, m) to (destination local, source node) order."""
    starts = np.r_[0, np.cumsum(arrived.ravel())[:-1]].reshape(arrived.shape)
    blocks = [
        np.arange(starts[n, j], starts[n, j] + arrived[n, j])
        for j in range(arrived.shape[1])
        for n in range(arrived.shape[0])
    ]
    return np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, dtype=np.int64)
