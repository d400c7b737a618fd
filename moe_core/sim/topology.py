"""Network topologies as arrays of directed links, and the per-link bytes of every collective.

A collective becomes a :class:`Transfer`: the bytes it puts on each link it touches, its number of
sequential algorithm steps (for the latency term) and the link class it crosses. The engine
(moe_core.sim.engine) shares link capacity among concurrent transfers; a transfer alone takes
``max over links of bytes / capacity`` plus its latency, which is the worst-rank (bottleneck) rule
of peers.md §5 for all-to-all(v) and the ring formula ``2(p-1)/p * S / B`` for all-reduce.

On an emulated testbed (moe_core.host.testbed) the NIC links are ``tc tbf`` token buckets; the topology
gives their sizes (``burst_bytes``) and the engine models them.

Two topologies:

* :class:`Cluster`: nodes of ``g`` devices. Inside a node every device has one egress and one
  ingress link to a non-blocking switch (NVSwitch class). Between nodes, devices share the node's
  NICs evenly (one NIC per device when nics_per_node = g); with oversubscription > 1 each node's
  uplink and downlink to the core are narrower than its NICs together. ``g = 1`` with one NIC per
  device is Aurora's non-blocking "big switch". Devices may come in heterogeneous classes (per
  device NIC bandwidth and compute speed).

  With ``intra_node: pcie_tree`` (PCIe servers, ``hardware.pcie``) a node's GPUs instead hang off
  shared PCIe switches (``gpus_per_switch`` each, in device order), the switches off ``sockets``
  CPU root complexes joined by one socket link per direction, and each NIC sits under a named
  switch. Every byte's path comes from one routing rule (``_add_tree_path``): between two
  endpoints under one switch it turns inside the switch; otherwise it climbs the source switch's
  uplink, crosses the socket link when the switches hang off different sockets, and descends the
  destination's downlink. A GPU's own link (``intra_node_GBps``) carries both its GPU-to-GPU and its
  GPU-to-NIC bytes, and inter-node bytes take the tree to the NIC (none beyond the switch when GPU
  and NIC share one: GPUDirect RDMA). Rings visit a node's members in device order, so a ring
  crosses each socket link once per direction as NCCL's PCIe rings do. A ring that spans nodes is
  the average over where its channels enter and leave the node: every hop of the node's cycle
  carries (m-1)/m of a one-node ring's bytes and every member sends and receives 1/m through its
  NIC, so members on a socket without the NIC add their NIC share to the socket link. NCCL
  instead enters and leaves next to the NIC, crossing each socket link once per direction, so
  this overstates a spanning ring's socket-link bytes (by 1/4 on 2 sockets x 2 GPUs, one NIC).
  CPU-side costs (copies through host memory when P2P across sockets is off, root-complex
  arbitration) are not modelled.
* :class:`Torus2D`: GShard's TPU v3 mesh; every device has 4 outgoing links (+x, -x, +y, -y),
  traffic follows dimension-order routing along the shorter way around each ring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from moe_core.dispatch.base import forwarded_traffic, two_phase_traffic
from moe_core.units import GB


@dataclass
class Transfer:
    """A collective's footprint on the network."""

    links: np.ndarray  # (k,) int: link ids
    nbytes: np.ndarray  # (k,) float: bytes on each of those links
    steps: int  # sequential algorithm steps, for the latency term
    crosses_nodes: bool  # whether any byte leaves a node (selects the latency class)
    # The share of its bottleneck's bandwidth the collective reaches by itself (calibrated, or from a
    # size curve): a cap on its rate, not extra bytes, so the share it leaves unused goes to
    # concurrent transfers.
    efficiency: float = 1.0
    # What sizes an exchange for a size curve (moe_core.sim.collectives.SizeCurve): the most bytes one
    # member sends to the others, and the nodes its group spans (0 and 1 where no curve applies).
    sent_bytes: float = 0.0
    nodes: int = 1

    @staticmethod
    def from_dense(
        loads: np.ndarray, steps: int, crosses_nodes: bool, sent_bytes: float = 0.0, nodes: int = 1
    ) -> Transfer:
        idx = np.flatnonzero(loads > 0)
        return Transfer(idx, loads[idx].astype(float), steps, crosses_nodes, sent_bytes=sent_bytes, nodes=nodes)


class Cluster:
    """Two-level cluster (or big switch). Link ids are laid out block by block (see __init__)."""

    def __init__(self, hw: DictConfig):
        self.name = hw.name
        self.nodes, self.g = hw.nodes, hw.devices_per_node
        self.n = self.nodes * self.g
        self.nics_per_node = hw.nics_per_node
        if self.g > 1 and hw.intra_node_GBps <= 0:
            raise ValueError(
                f"hardware '{hw.name}': intra_node_GBps is unknown (0); the simulator needs it "
                f"for {self.g} devices per node (calibrate the profile first)"
            )
        if self.nodes > 1 and hw.nic_GBps <= 0 and not hw.gpu_classes:
            raise ValueError(
                f"hardware '{hw.name}': nic_GBps is unknown (0); the simulator needs it "
                f"for {self.nodes} nodes (calibrate the profile first)"
            )
        self.intra_latency_s = hw.intra_node_latency_us * 1e-6
        self.inter_latency_s = hw.inter_node_latency_us * 1e-6
        self.device_nic_GBps, self.device_tflops = _device_classes(hw, self.n)
        self.node_of = np.arange(self.n) // self.g
        self.nic_of = self.node_of * self.nics_per_node + (np.arange(self.n) % self.g) * self.nics_per_node // self.g
        nic_count = self.nodes * self.nics_per_node
        # Link blocks: intra out | intra in | NIC out | NIC in | node up | node down [| host]
        # [| PCIe switch up | switch down | socket links] (the tree's blocks: _tree_links)
        self.intra_out = np.arange(self.n)
        self.intra_in = self.intra_out + self.n
        self.nic_out = 2 * self.n + np.arange(nic_count)
        self.nic_in = self.nic_out + nic_count
        self.node_up = 2 * self.n + 2 * nic_count + np.arange(self.nodes)
        self.node_down = self.node_up + self.nodes
        # CPU testbeds: one more link, the host's cores, that every byte sent crosses (gloo copies
        # and the TCP stack run there, so a collective's intra- and inter-node bytes contend on it).
        self.host = 2 * self.n + 2 * nic_count + 2 * self.nodes if hw.host_GBps > 0 else None
        self.num_links = 2 * self.n + 2 * nic_count + 2 * self.nodes + (self.host is not None)
        cap = np.empty(self.num_links)
        intra_GBps, nic_GBps = achieved_GBps(hw)
        cap[self.intra_out] = cap[self.intra_in] = intra_GBps * GB
        if hw.gpu_classes and self.nics_per_node != self.g:
            raise ValueError(
                f"hardware '{hw.name}': gpu_classes set per-device NIC speeds, so nics_per_node "
                f"must equal devices_per_node ({self.g})"
            )
        nic_bw = (self.device_nic_GBps * hw.nic_efficiency if hw.gpu_classes else np.full(nic_count, nic_GBps)) * GB
        cap[self.nic_out] = cap[self.nic_in] = nic_bw
        uplink = nic_bw.reshape(self.nodes, self.nics_per_node).sum(axis=1) / hw.oversubscription
        cap[self.node_up] = cap[self.node_down] = uplink
        if self.host is not None:
            cap[self.host] = hw.host_GBps * GB
        cap[cap <= 0] = np.inf  # links the profile leaves out (e.g. no intra links on a big switch)
        self.tree = hw.intra_node == "pcie_tree"
        self.capacity = np.concatenate([cap, self._tree_links(hw)]) if self.tree else cap
        self.num_links = len(self.capacity)
        # An emulated testbed shapes each node's links with tc tbf: token buckets on the NIC links
        # (moe_core.sim.engine.simulate); tc's "kb" is 1024 bytes.
        self.burst_bytes = np.zeros(self.num_links)
        if hw.emulation.enabled:
            self.burst_bytes[np.r_[self.nic_out, self.nic_in]] = hw.emulation.burst_kb * 1024
        self.oversubscribed = hw.oversubscription > 1

    def _tree_links(self, hw: DictConfig) -> np.ndarray:
        """Lay out the PCIe tree's link blocks after the others (switch up | switch down | socket
        links, one per ordered pair of a node's sockets) and return their capacities; sets the maps
        from devices and NICs to switches and from switches to sockets."""
        tree, base = hw.pcie, self.num_links
        self.switches_per_node = self.g // tree.gpus_per_switch
        self.sockets = tree.sockets
        count = self.nodes * self.switches_per_node
        self.switch_of = self.node_of * self.switches_per_node + (np.arange(self.n) % self.g) // tree.gpus_per_switch
        nic_node = np.arange(self.nodes * self.nics_per_node) // self.nics_per_node
        self.nic_switch = nic_node * self.switches_per_node + np.tile(np.asarray(tree.nic_switches), self.nodes)
        self.socket_of_switch = (np.arange(count) % self.switches_per_node) * self.sockets // self.switches_per_node
        self.switch_up = base + np.arange(count)
        self.switch_down = self.switch_up + count
        self.socket_link = base + 2 * count + np.arange(self.nodes * self.sockets**2)
        cap = np.empty(2 * count + len(self.socket_link))
        cap[: 2 * count] = tree.switch_uplink_GBps * hw.intra_node_efficiency * GB
        # A socket's link to itself carries nothing; inf keeps it out of every bottleneck.
        socket_bw = tree.socket_link_GBps * hw.intra_node_efficiency * GB
        cap[2 * count :] = np.tile(np.where(np.eye(self.sockets, dtype=bool), np.inf, socket_bw).ravel(), self.nodes)
        return cap

    # -- all-to-all ------------------------------------------------------------------------------
    def all_to_all(self, group: np.ndarray, traffic: np.ndarray) -> Transfer:
        """Direct all-to-all(v): ``traffic[i, j]`` bytes from group[i] to group[j] (diagonal ignored)."""
        traffic = np.asarray(traffic, dtype=float).copy()
        np.fill_diagonal(traffic, 0.0)
        node = self.node_of[group]
        same = node[:, None] == node[None, :]
        intra, inter = np.where(same, traffic, 0.0), np.where(same, 0.0, traffic)
        loads = np.zeros(self.num_links)
        np.add.at(loads, self.intra_out[group], intra.sum(axis=1))
        np.add.at(loads, self.intra_in[group], intra.sum(axis=0))
        i, j = np.nonzero(intra)
        self._add_tree_flows(loads, group[i], group[j], intra[i, j])
        self._add_inter(loads, group, inter.sum(axis=1), inter.sum(axis=0), inter, node)
        return self._transfer(
            loads, len(group) - 1, bool(inter.any()), sent_bytes=traffic.sum(axis=1).max(), nodes=_spanned(node)
        )

    def uniform_all_to_all(self, group: np.ndarray, bytes_per_rank: float) -> Transfer:
        """Equal-split all-to-all of ``bytes_per_rank`` per rank, in O(group) instead of O(group^2)."""
        p = len(group)
        per_peer = bytes_per_rank / p
        node = self.node_of[group]
        members = np.bincount(node, minlength=self.nodes)[node]  # group members on my node
        intra = (members - 1) * per_peer
        inter = (p - members) * per_peer
        loads = np.zeros(self.num_links)
        np.add.at(loads, self.intra_out[group], intra)
        np.add.at(loads, self.intra_in[group], intra)
        if self.tree:
            i, j = self._node_pairs(group)
            self._add_tree_flows(loads, group[i], group[j], np.full(len(i), per_peer))
        self._add_inter(loads, group, inter, inter, None, node)
        sent = bytes_per_rank * (p - 1) / p
        return self._transfer(loads, p - 1, bool((inter > 0).any()), sent_bytes=sent, nodes=_spanned(node))

    def forwarded_all_to_all(self, group: np.ndarray, network_bytes: float, forwarded_bytes: float) -> Transfer:
        """A dispatch that crosses the network once per destination node and fans out inside it
        (DeepEP's normal kernels): a token for several devices of one node goes, once, to the device
        of the sender's local index there, which forwards it over NVLink to the others; tokens for
        the sender's own node go straight over NVLink. Both legs run at once (one pipelined kernel),
        so the footprint is one transfer. Every member sends and receives ``network_bytes`` through
        its NIC and ``forwarded_bytes`` over its NVLink (a uniform exchange; compare
        :meth:`uniform_all_to_all`, where a token crosses the network once per destination device).
        """
        loads = np.zeros(self.num_links)
        np.add.at(loads, self.intra_out[group], forwarded_bytes)
        np.add.at(loads, self.intra_in[group], forwarded_bytes)
        node = self.node_of[group]
        if self.tree:  # a uniform exchange: the forwarded bytes spread evenly over the node's other members
            i, j = self._node_pairs(group)
            others = np.bincount(node, minlength=self.nodes)[node] - 1
            self._add_tree_flows(loads, group[i], group[j], forwarded_bytes / others[i])
        spans = _spanned(node) > 1
        if spans:
            self._add_inter(loads, group, network_bytes, network_bytes, None, node)
        sent = network_bytes + forwarded_bytes
        return self._transfer(loads, len(group) - 1, spans, sent_bytes=sent, nodes=_spanned(node))

    def relayed_all_to_all(
        self, group: np.ndarray, traffic: np.ndarray, token_bytes: np.ndarray | None = None, top_k: int = 1
    ) -> Transfer:
        """:meth:`forwarded_all_to_all` of any ``traffic`` (bytes group[i] sends group[j]): a row for
        another node crosses the network to the sender's local-index peer there, which forwards it
        over the node's fabric; both legs at once (moe_core.dispatch.base.forwarded_traffic, which
        ``token_bytes`` and ``top_k`` make send a token once per node), one transfer. The group needs
        equally many members on each of its nodes."""
        ordered, network, inside = forwarded_traffic(group, self.node_of[group], traffic, token_bytes, top_k)
        loads = np.zeros(self.num_links)
        np.add.at(loads, self.intra_out[ordered], inside.sum(axis=2))
        np.add.at(loads, self.intra_in[ordered], inside.sum(axis=1))
        src, dst = np.broadcast_arrays(ordered[:, :, None], ordered[:, None, :])
        self._add_tree_flows(loads, src.ravel(), dst.ravel(), inside.ravel())
        flat = ordered.reshape(-1)
        send, recv = network.sum(axis=2).reshape(-1), network.sum(axis=0).T.reshape(-1)
        self._add_inter(loads, flat, send, recv, None, self.node_of[flat])
        sent = (send + inside.sum(axis=2).reshape(-1)).max()
        return self._transfer(loads, len(group) - 1, bool(send.any()), sent_bytes=sent, nodes=ordered.shape[0])

    def hierarchical_all_to_all(self, group: np.ndarray, traffic: np.ndarray) -> tuple[Transfer, Transfer]:
        """Tutel's 2DH all-to-all: an intra-node phase, then an inter-node phase among same-local-rank devices.

        Phase 1: device (n, l) hands device (n, l') everything bound for local index l' on any node.
        Phase 2: device (n, l') sends node n's share for (n2, l') to (n2, l'). "Local index" counts
        the group's members on their node, so the group needs the same number m of members on each
        of its nodes (a strided group qualifies, as in moe_core.comm.hierarchical_a2a); returns both
        phases (phase 2 starts when phase 1 ends).
        """
        ordered, phase1, phase2 = two_phase_traffic(group, self.node_of[group], traffic)
        n_nodes, m = ordered.shape
        loads1 = np.zeros(self.num_links)
        np.add.at(loads1, self.intra_out[ordered], phase1.sum(axis=2))
        np.add.at(loads1, self.intra_in[ordered], phase1.sum(axis=1))
        src, dst = np.broadcast_arrays(ordered[:, :, None], ordered[:, None, :])
        self._add_tree_flows(loads1, src.ravel(), dst.ravel(), phase1.ravel())
        loads2 = np.zeros(self.num_links)
        send2 = phase2.sum(axis=1).reshape(-1)  # per (n, l') in ordered layout
        recv2 = phase2.sum(axis=0).reshape(-1)
        flat = ordered.reshape(-1)
        self._add_inter(loads2, flat, send2, recv2, None, self.node_of[flat])
        return (
            self._transfer(loads1, m - 1, False, sent_bytes=phase1.sum(axis=2).max(), nodes=1),
            self._transfer(loads2, n_nodes - 1, n_nodes > 1, sent_bytes=phase2.sum(axis=1).max(), nodes=n_nodes),
        )

    # -- ring collectives ------------------------------------------------------------------------
    def ring(self, group: np.ndarray, bytes_per_rank: float, collective: str) -> Transfer:
        """Ring all-reduce / reduce-scatter / all-gather of ``bytes_per_rank`` over ``group``.

        Each rank forwards v = 2(p-1)/p * S (all-reduce) or (p-1)/p * S bytes to its ring successor.
        As NCCL does, the ring is split into one channel per NIC, so each node's outgoing inter-node
        share v leaves evenly through its NICs; inside a node, each device forwards the (m-1)/m of v
        that stays on the node (m = members on the node; m/m when the group is one node).
        """
        p = len(group)
        factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[collective]
        v = factor * (p - 1) / p * bytes_per_rank
        node = self.node_of[group]
        spans = len(np.unique(node)) > 1
        members = np.bincount(node, minlength=self.nodes)[node]
        intra = v * (members - 1 if spans else members) / members
        loads = np.zeros(self.num_links)
        np.add.at(loads, self.intra_out[group], intra)
        np.add.at(loads, self.intra_in[group], intra)
        if self.tree:
            member, successor = self._ring_successors(group)
            self._add_tree_flows(loads, group[member], group[successor], intra[member])
        if spans:
            out = v / members  # the node's single outgoing v, spread over its members' NICs
            self._add_inter(loads, group, out, out, None, node)
        steps = int(factor * (p - 1))
        return self._transfer(loads, steps=steps, crosses_nodes=spans)

    # -- helpers ---------------------------------------------------------------------------------
    def _transfer(self, loads: np.ndarray, steps: int, crosses_nodes: bool, **size) -> Transfer:
        """The footprint of ``loads``, plus every byte sent on the host link when there is one;
        ``size``: an exchange's sent_bytes and nodes (Transfer)."""
        if self.host is not None:
            loads[self.host] = loads[self.intra_out].sum() + loads[self.nic_out].sum()
        return Transfer.from_dense(loads, steps, crosses_nodes, **size)

    def _add_inter(self, loads, group, send, recv, pair_bytes, node) -> None:
        """Inter-node bytes: each device's NIC share, and node uplinks when oversubscribed; in a
        PCIe tree also the way between each device and its NIC (its own link, then the tree)."""
        np.add.at(loads, self.nic_out[self.nic_of[group]], send)
        np.add.at(loads, self.nic_in[self.nic_of[group]], recv)
        if self.oversubscribed:
            np.add.at(loads, self.node_up[node], send)
            np.add.at(loads, self.node_down[node], recv)
        if self.tree:
            send, recv = (np.broadcast_to(np.asarray(b, dtype=float), group.shape) for b in (send, recv))
            np.add.at(loads, self.intra_out[group], send)
            np.add.at(loads, self.intra_in[group], recv)
            nic_switch = self.nic_switch[self.nic_of[group]]
            self._add_tree_path(loads, self.switch_of[group], nic_switch, send)
            self._add_tree_path(loads, nic_switch, self.switch_of[group], recv)

    def _add_tree_flows(self, loads, src, dst, nbytes) -> None:
        """Device-to-device bytes inside nodes (``nbytes[k]`` from device ``src[k]`` to ``dst[k]``)
        on the PCIe tree's links beyond the devices' own; nothing without a tree."""
        if self.tree:
            self._add_tree_path(loads, self.switch_of[src], self.switch_of[dst], np.asarray(nbytes, dtype=float))

    def _add_tree_path(self, loads, src_switch, dst_switch, nbytes) -> None:
        """The routing of a PCIe tree: bytes between endpoints (GPUs, NICs) under switches
        ``src_switch`` and ``dst_switch`` of one node. Under one switch they turn inside it (peer to
        peer, GPUDirect RDMA); else they climb the source's uplink, cross the socket link when the
        two switches hang off different sockets, and descend the destination's downlink."""
        cross = src_switch != dst_switch
        np.add.at(loads, self.switch_up[src_switch[cross]], nbytes[cross])
        np.add.at(loads, self.switch_down[dst_switch[cross]], nbytes[cross])
        a, b = self.socket_of_switch[src_switch], self.socket_of_switch[dst_switch]
        far = a != b
        node = src_switch // self.switches_per_node
        np.add.at(loads, self.socket_link[(node * self.sockets + a) * self.sockets + b][far], nbytes[far])

    def _node_pairs(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Indices (i, j) into ``group`` of every ordered pair of distinct members on one node."""
        node = self.node_of[group]
        same = node[:, None] == node[None, :]
        np.fill_diagonal(same, False)
        return np.nonzero(same)

    def _ring_successors(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each member's successor inside its node along the ring (indices into ``group``): the node's
        members in device order, the last back to the first. In a PCIe tree that order walks switch
        after switch and socket after socket, so a ring crosses each socket link once per direction
        (NCCL's PCIe rings do the same)."""
        order = np.lexsort((group, self.node_of[group]))
        node = self.node_of[group[order]]
        k = np.arange(len(order))
        starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
        run_start = starts[np.searchsorted(starts, k, side="right") - 1]
        last = np.r_[node[1:] != node[:-1], True]
        return order, order[np.where(last, run_start, k + 1)]

    def latency_s(self, transfer: Transfer, alpha_s: float = 0.0, alpha_step_s: float | None = None) -> float:
        step = (
            alpha_step_s
            if alpha_step_s is not None
            else (self.inter_latency_s if transfer.crosses_nodes else self.intra_latency_s)
        )
        return alpha_s + transfer.steps * step


class Torus2D:
    """X x Y torus of devices, 4 directed links each, dimension-order routing (x first, then y)."""

    def __init__(self, hw: DictConfig):
        if len(hw.torus_dims) != 2:
            raise ValueError(f"hardware '{hw.name}': topology torus2d needs torus_dims [x, y]")
        self.name = hw.name
        self.X, self.Y = hw.torus_dims
        self.n = self.X * self.Y
        self.num_links = 4 * self.n  # link 4*d + k, k: +x, -x, +y, -y
        self.capacity = np.full(self.num_links, achieved_GBps(hw)[0] * GB)
        self.latency_hop_s = hw.intra_node_latency_us * 1e-6
        self.device_tflops = np.full(self.n, hw.peak_tflops)
        self.node_of = np.arange(self.n)
        self.burst_bytes = np.zeros(self.num_links)  # no emulated torus
        self.host = None  # no CPU host link

    def _coords(self, d):
        return d % self.X, d // self.X

    def _route(self, src: int, dst: int) -> list[int]:
        """Links on the dimension-order path from src to dst (shorter way around each ring)."""
        links = []
        x, y = self._coords(src)
        tx, ty = self._coords(dst)
        for size, pos, target, plus, minus, axis in ((self.X, x, tx, 0, 1, 0), (self.Y, y, ty, 2, 3, 1)):
            fwd = (target - pos) % size
            step, k, hops = (1, plus, fwd) if fwd <= size - fwd else (-1, minus, size - fwd)
            for _ in range(hops):
                d = (pos + y * self.X) if axis == 0 else (x + pos * self.X)
                links.append(4 * d + k)
                pos = (pos + step) % size
            if axis == 0:
                x = pos
        return links

    def all_to_all(self, group: np.ndarray, traffic: np.ndarray) -> Transfer:
        """All-to-all(v) with every flow routed (O(p^2 * hops): for groups up to a few hundred)."""
        loads = np.zeros(self.num_links)
        for i, src in enumerate(group):
            for j, dst in enumerate(group):
                if i != j and traffic[i, j] > 0:
                    np.add.at(loads, self._route(int(src), int(dst)), traffic[i, j])
        return Transfer.from_dense(loads, steps=len(group) - 1, crosses_nodes=True)

    def uniform_all_to_all(self, group: np.ndarray, bytes_per_rank: float) -> Transfer:
        """Uniform all-to-all over the whole torus, by symmetry: every link carries the same load.

        Each dimension's byte-hops (pairs x mean ring distance) spread over its links; the per-link
        load grows as sqrt(D) on a square torus: GShard's O(sqrt(D)) all-to-all cost (Table 4).
        """
        if len(group) != self.n:
            p = len(group)
            return self.all_to_all(group, np.full((p, p), bytes_per_rank / p))
        per_peer = bytes_per_rank / self.n
        loads = np.empty(self.num_links)
        # Byte-hops along x: n^2 pairs x mean x-distance, shared by the 2n x-links (likewise y).
        loads[0::4] = loads[1::4] = per_peer * self.n * _mean_ring_distance(self.X) / 2
        loads[2::4] = loads[3::4] = per_peer * self.n * _mean_ring_distance(self.Y) / 2
        return Transfer(np.arange(self.num_links), loads, self.n - 1, True)

    def ring(self, group: np.ndarray, bytes_per_rank: float, collective: str) -> Transfer:
        """2D ring all-reduce: a ring along x, then along y, each over neighbour links only (O(1) in D)."""
        if len(group) != self.n:
            raise ValueError("torus2d ring collectives are modelled over the whole torus")
        factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[collective]
        vx = factor * (self.X - 1) / self.X * bytes_per_rank
        vy = factor * (self.Y - 1) / self.Y * bytes_per_rank / self.X  # after the x phase, 1/X remains
        loads = np.zeros(self.num_links)
        loads[0::4] = vx / 2  # bidirectional rings: half each way
        loads[1::4] = vx / 2
        loads[2::4] = vy / 2
        loads[3::4] = vy / 2
        return Transfer.from_dense(loads, steps=int(factor * (self.X + self.Y - 2)), crosses_nodes=True)

    def latency_s(self, transfer: Transfer, alpha_s: float = 0.0, alpha_step_s: float | None = None) -> float:
        return alpha_s + transfer.steps * (alpha_step_s if alpha_step_s is not None else self.latency_hop_s)


def _spanned(node: np.ndarray) -> int:
    """How many distinct nodes ``node`` (the node of each group member) names."""
    return len(np.unique(node))


def _mean_ring_distance(k: int) -> float:
    """Mean shortest distance between two positions of a ring of k (self pairs included)."""
    d = np.arange(k)
    return float(np.minimum(d, k - d).mean())


def _device_classes(hw: DictConfig, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-device NIC GB/s and peak TFLOP/s; classes fill devices in order."""
    if not hw.gpu_classes:
        return np.full(n, hw.nic_GBps, dtype=float), np.full(n, hw.peak_tflops, dtype=float)
    counts = [c.count for c in hw.gpu_classes]
    if sum(counts) != n:
        raise ValueError(f"hardware '{hw.name}': gpu_classes count {sum(counts)} devices, the cluster has {n}")
    nic = np.concatenate([np.full(c.count, c.nic_GBps or hw.nic_GBps) for c in hw.gpu_classes])
    tflops = np.concatenate([np.full(c.count, c.peak_tflops or hw.peak_tflops) for c in hw.gpu_classes])
    return nic.astype(float), tflops.astype(float)


def achieved_GBps(hw: DictConfig) -> tuple[float, float]:
    """(per device inside a node, per NIC) GB/s per direction that a collective library reaches: the
    profile's line rates times the shares published microbenchmarks measure (intra_node_efficiency,
    nic_efficiency). Every model of the links reads them here: the topologies and the papers'
    analytical models."""
    return hw.intra_node_GBps * hw.intra_node_efficiency, hw.nic_GBps * hw.nic_efficiency


def build_topology(hw: DictConfig) -> Cluster | Torus2D:
    return Torus2D(hw) if hw.topology == "torus2d" else Cluster(hw)
