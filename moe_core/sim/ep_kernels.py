"""The pricing of expert-parallel communication kernels (DeepEP's, pplx's), beside NCCL's collectives.

A kernel library does not run a collective library's all-to-all: a few SMs push every token
straight into the peers' buffers (RDMA writes through the NIC, stores over NVLink), all at once, and
signal when done. Its cost is therefore not NCCL's (per-step latencies, a size curve) but

    time = latency_us + max over links of bytes / (line rate x the kernel's share of that link)

with the profile's ``hardware.ep_kernels`` (moe_core.schema.core.EpKernelConfig): the share of NVLink
and of the NIC a kernel reaches and its fixed cost (launch, the signals, the last message's flight).
Every executor prices a kernel through moe_core.sim.collectives.collective_op (the collective kinds in
:data:`KERNELS`): :func:`kernel_op` where the profile states its kernels, else the collective
library's all-to-all, which is what the dispatchers run on a testbed without the kernel libraries
(gloo). The dispatcher study, ``advise`` and the kernel-level validation
(experiments/external_dispatch.py) all go through it.

The formats' bytes per token are the kernels' (:func:`token_bytes`): FP8 is one byte per channel plus
one fp32 scale per 128 channels (DeepEP's per-token-group quantisation: 7,168 + 56 x 4 = 7,392 B for
DeepSeek-V3's hidden size), BF16 two bytes per channel (14,336 B).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from omegaconf import DictConfig

from moe_core.sim.topology import Transfer

# The kernels a dispatcher's traffic may name (moe_core.dispatch.base.Collective.kernel):
# node_forwarding, DeepEP's normal kernels and Hybrid-EP (a token once per destination node, then over
# NVLink); direct_sends, DeepEP's low-latency kernels and pplx (every selection its own message).
KERNELS = ("node_forwarding", "direct_sends")
FP8_GROUP = 128  # channels per fp32 scale (DeepEP's and DeepSeek-V3's per-token-group quantisation)
FORMATS = ("fp8", "bf16")


def token_bytes(hidden: int, fmt: str) -> int:
    """Bytes one token occupies in a kernel's message of format ``fmt``; ValueError for another."""
    if fmt == "fp8":
        return hidden + math.ceil(hidden / FP8_GROUP) * 4
    if fmt == "bf16":
        return 2 * hidden
    raise ValueError(f"unknown token format {fmt!r}; use one of {list(FORMATS)}")


def kernels_stated(hw: DictConfig) -> bool:
    """Whether the profile states its kernels' shares and latency (``hardware.ep_kernels``): the kernel
    libraries run there. Elsewhere (a CPU testbed, a cluster no kernel was measured on) a kernel
    dispatcher's exchange runs on, and is priced as, the collective library's all-to-all."""
    k = hw.ep_kernels
    return k.nvlink_efficiency > 0 and k.nic_efficiency > 0 and k.latency_us > 0


def kernel_shares(hw: DictConfig) -> tuple[float, float]:
    """(NVLink, NIC) share of the line rate the profile's kernels reach; the collective library's where
    the profile states none (what a kernel's exchange is then priced at)."""
    if kernels_stated(hw):
        return hw.ep_kernels.nvlink_efficiency, hw.ep_kernels.nic_efficiency
    return hw.intra_node_efficiency, hw.nic_efficiency


def kernel_op(hw: DictConfig, topo, transfer: Transfer) -> dict:
    """Op keyword arguments (transfer, latency_s) of a kernel with footprint ``transfer`` on the cluster
    ``topo`` whose profile states its kernels (:func:`kernels_stated`): the one pricing decision for
    kernels.

    The topology's links hold the collective library's shares of the line rates; the kernel's bytes on
    each NVLink and NIC link are weighted by library share / kernel share, so that alone they take
    bytes / (line rate x kernel share), and concurrent traffic shares the links as usual. The latency
    is the profile's per kernel (its messages are all in flight at once: no step per peer)."""
    nvlink, nic = kernel_shares(hw)
    scale = np.ones(len(transfer.links))
    scale[np.isin(transfer.links, np.r_[topo.intra_out, topo.intra_in])] = hw.intra_node_efficiency / nvlink
    scale[np.isin(transfer.links, np.r_[topo.nic_out, topo.nic_in])] = hw.nic_efficiency / nic
    latency_s = hw.ep_kernels.latency_us * 1e-6
    return {"transfer": replace(transfer, nbytes=transfer.nbytes * scale, efficiency=1.0), "latency_s": latency_s}
