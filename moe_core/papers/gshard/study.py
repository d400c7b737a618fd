"""The names of the scaling study's records (experiments/gshard.py writes them, analysis/papers/gshard.py
reads them): its experiments and how a point is named."""

from __future__ import annotations

from moe_core.papers.gshard.models import GShardModel

PAPER = "gshard"
SCALING = "gshard_scaling"  # Table 1's models simulated: step, rooflines, memory as trained (Table 3, Fig 8)
MEMORY = "gshard_memory"  # memory per core of Fig 7's models
COLLECTIVES = "gshard_collectives"  # the collectives vs partitions on torus slices (Fig 9)
COLLECTIVE_KINDS = ("all_to_all", "all_reduce")


def scaling_point(model: GShardModel) -> str:
    return f"model{model.id}_{model.experts}e_{model.n_layers}l"


def memory_point(n_layers: int, experts: int) -> str:
    return f"{n_layers}l_{experts}e"


def collective_point(kind: str, partitions: int, size_bytes: int) -> str:
    return f"{kind}_p{partitions}_{size_bytes}"
