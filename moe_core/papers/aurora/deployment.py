"""Aurora's deployments per setting and policy: which GPU holds each expert of each served model, and
the transmission order of their all-to-alls (pure decisions; inference_sim.py times them).

Li et al., arXiv 2410.17043, Sections 5-8 (reference/papers.md §5.3-5.4). A served model's MoE layer
is its ``colocation.LayerStats`` (token shard i sends ``traffic[i, j]`` bytes to expert j); shard i
and expert i of a model sit on one GPU, every layer deployed from its own statistics (the ones a
policy plans on: with imprecise statistics, the traffic it is timed on differs). The settings and
their policies, the first Aurora's, the others its baselines:

* exclusive (one model on its own n GPUs): ``aurora`` assigns experts by Theorem 5.1 (on a
  homogeneous cluster any assignment is as good) and runs Aurora's order; ``rga`` assigns at random; ``naive``, ``sjf``
  and ``rcs`` keep experts in place and run that order (Fig 11a's baselines).
* colocated (two models, one expert of each per GPU): ``aurora`` pairs experts by Case II's
  bottleneck matching (homogeneous) or Section 7's two matchings (heterogeneous); ``rec`` pairs at
  random, ``rga+rec`` also assigns at random; ``lina`` packs each model's experts two per GPU
  (popular with unpopular) on its own half of the GPUs; ``aurora-exclusive`` (Fig 12) runs each model
  alone on GPUs of its own of the same kind (twice the GPUs).

Outside the exclusive homogeneous setting every all-to-all runs in Aurora's order (``exact``), so a
speedup isolates the deployment decision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moe_core.papers.aurora import colocation

SETTINGS = ("exclusive-homogeneous", "exclusive-heterogeneous", "colocated-homogeneous", "colocated-heterogeneous")
DEPLOYMENT_POLICIES = {
    "exclusive-homogeneous": ("aurora", "naive", "sjf", "rcs"),
    "exclusive-heterogeneous": ("aurora", "rga"),
    "colocated-homogeneous": ("aurora", "lina", "rec", "aurora-exclusive"),
    "colocated-heterogeneous": ("aurora", "lina", "rec", "rga+rec", "aurora-exclusive"),
}
RANDOM_POLICIES = ("rcs", "rga", "rec", "rga+rec")  # one sample per random draw
ORDER_BASELINES = ("naive", "sjf", "rcs")  # moe_core.comm.transmission.ORDERS names
DEPLOYMENT_ORDER = "exact"  # Aurora's order: the BvN schedule of Theorem 4.2's proof, T* exactly


@dataclass(frozen=True)
class Hosted:
    """One served model on a group of GPUs: per layer, ``gpu_of[l][e]`` (an index into ``devices``)
    holds expert e and token shard e."""

    model: int  # 0 = model a, 1 = model b
    devices: tuple[int, ...]  # the cluster's GPUs of the group
    gpu_of: tuple[np.ndarray, ...]  # per layer, (experts,)


@dataclass(frozen=True)
class Deployment:
    """The served models' groups, each run apart from the others (on GPUs of its own), and the
    transmission order of every all-to-all. The models of one group share its GPUs."""

    groups: tuple[tuple[Hosted, ...], ...]
    order: str


def exclusive(layers: list[colocation.LayerStats], speed: np.ndarray, policy: str, seed: int) -> Deployment:
    """Model a (its layers' statistics) alone on the cluster's GPUs (``speed``: per GPU, relative)."""
    return Deployment(((_exclusive_model(0, layers, speed, policy, seed),),), _order(policy))


def colocated(
    layers: tuple[list[colocation.LayerStats], list[colocation.LayerStats]],
    bandwidth: np.ndarray,
    speed: np.ndarray,
    policy: str,
    seed: int,
) -> Deployment:
    """Models a and b (their layers' statistics) on the cluster's GPUs (``bandwidth`` and ``speed``
    per GPU)."""
    n = len(speed)
    devices = tuple(range(n))
    if policy == "lina":
        half = n // 2
        return Deployment(
            tuple(
                (Hosted(m, devices[m * half : (m + 1) * half], (_lina_gpu_of(model[0]),) * len(model)),)
                for m, model in enumerate(layers)
            ),
            DEPLOYMENT_ORDER,
        )
    if policy == "aurora-exclusive":
        return Deployment(
            tuple((_exclusive_model(m, model, speed, "aurora", seed),) for m, model in enumerate(layers)),
            DEPLOYMENT_ORDER,
        )
    homogeneous = np.ptp(bandwidth) == 0 and np.ptp(speed) == 0
    a_of, b_of = [], []
    for pa, pb in zip(*layers, strict=True):
        if policy == "aurora" and homogeneous:  # Case II: bottleneck matching, GPUs interchangeable
            partner, gpu_of = colocation.pair_bottleneck(pa.send, pa.recv, pb.send, pb.recv), np.arange(n)
        elif policy == "aurora":  # Section 7's two bottleneck matchings
            partner, gpu_of = colocation.colocate_heterogeneous(pa, pb, bandwidth, speed)
        elif policy == "rec":
            partner, gpu_of = colocation.random_colocation(n, seed), np.arange(n)
        elif policy == "rga+rec":
            partner, gpu_of = colocation.random_colocation(n, seed), colocation.random_assignment(n, seed + 1)
        else:
            raise ValueError(f"unknown colocation policy {policy!r}")
        a_of.append(gpu_of)
        b_of.append(partnered(partner, gpu_of))
    return Deployment(((Hosted(0, devices, tuple(a_of)), Hosted(1, devices, tuple(b_of))),), DEPLOYMENT_ORDER)


def partnered(partner: np.ndarray, gpu_of: np.ndarray) -> np.ndarray:
    """GPU of each b expert when b's expert ``partner[i]`` shares a's expert i's GPU ``gpu_of[i]``."""
    gpu_of_b = np.empty(len(partner), dtype=np.int64)
    gpu_of_b[np.asarray(partner)] = gpu_of
    return gpu_of_b


def _exclusive_model(model: int, layers: list[colocation.LayerStats], speed, policy: str, seed: int) -> Hosted:
    n = len(speed)
    if policy == "aurora":  # Theorem 5.1, by each layer's load
        gpu_of = [colocation.assign_exclusive(layer.load, speed) for layer in layers]
    elif policy == "rga":
        gpu_of = [colocation.random_assignment(n, seed)] * len(layers)
    elif policy in ORDER_BASELINES:
        gpu_of = [np.arange(n)] * len(layers)
    else:
        raise ValueError(f"unknown exclusive policy {policy!r}")
    return Hosted(model, tuple(range(n)), tuple(gpu_of))


def _order(policy: str) -> str:
    return policy if policy in ORDER_BASELINES else DEPLOYMENT_ORDER


def _lina_gpu_of(layer: colocation.LayerStats) -> np.ndarray:
    """Lina's packing of one model's experts, two per GPU on ``n / 2`` GPUs, from its first layer's loads."""
    gpu_of = np.empty(len(layer.send), dtype=np.int64)
    for gpu, (i, j) in enumerate(colocation.lina_pairing(layer.load)):
        gpu_of[[i, j]] = gpu
    return gpu_of
