"""Slices of the TPU v3 pod for the collectives' scaling (Fig 9: 16 to 2048 partitions).

A slice of ``chips`` keeps the pod profile's chips and links and is a 2D torus of the most square shape
(x <= y, x * y = chips): 8 chips are 2 x 4, 64 are 8 x 8, 512 are 16 x 32, as Cloud TPU v3 slices are
shaped [UNC: Cloud TPU documentation, not in reference/]. The slices of 64 and 256 chips are the
committed gshard-tpuv3-64chip and gshard-tpuv3-256chip profiles' tori.

(Paper-neutral: the torus counterpart of experiments/simulate.py's ``sized_hardware``, which grows a
cluster profile by nodes.)
"""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf


def torus_dims(chips: int) -> list[int]:
    """The most square [x, y] with x * y = ``chips`` and x <= y."""
    x = max(d for d in range(1, math.isqrt(chips) + 1) if chips % d == 0)
    return [x, chips // x]


def torus_slice(pod: DictConfig, chips: int) -> DictConfig:
    """The profile ``pod`` (a torus2d profile) cut to a torus of ``chips`` of its chips; ValueError
    when it is not a torus or has fewer chips."""
    if pod.topology != "torus2d":
        raise ValueError(f"hardware '{pod.name}' is topology {pod.topology}, not a torus2d profile to slice")
    if not 2 <= chips <= pod.nodes:
        raise ValueError(f"a slice of {chips} chips does not fit hardware '{pod.name}' of {pod.nodes} chips")
    sliced = OmegaConf.to_container(pod)
    sliced.update(nodes=chips, torus_dims=torus_dims(chips))
    return OmegaConf.create(sliced)
