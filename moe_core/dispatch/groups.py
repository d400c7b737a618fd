"""The process groups a dispatcher's study round trip runs on, by name.

A dispatcher declares the names it needs (moe_core.dispatch.base.Dispatcher.study_groups); the
study (experiments/dispatchers.py) builds each declared name once, on every rank, from the
study's layout: ``world`` ranks, one expert per rank, or ``tp`` ranks sharing each expert's tokens.
A dispatcher that needs a group none of these is registers its builder here, beside its class.
Builders import torch inside: the registry is read when a config is validated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from moe_core.parallel.layout import expert_layout
from moe_core.registry import Registry


@dataclass(frozen=True)
class StudyLayout:
    """What the study's groups are built from: this rank, the study's ranks and "tp" size, the
    ranks per node, and the collective timeout."""

    rank: int
    world: int
    tp: int
    devices_per_node: int
    timeout: timedelta


STUDY_GROUPS: Registry[Callable[[StudyLayout], Any]] = Registry("dispatcher study process group")


def build_study_groups(names: set[str], layout: StudyLayout) -> dict[str, Any]:
    """Every group in ``names``, built once and in sorted order on every rank (group creation is
    collective, so all ranks must create the same groups in the same order)."""
    return {name: STUDY_GROUPS.lookup(name)(layout) for name in sorted(names)}


def _flat(s: StudyLayout):
    """Every rank, one expert each: the expert-parallel group of the flat layout."""
    from moe_core.parallel.parallelize import own_group

    return own_group(expert_layout(s.world, s.world, 1).groups("ep"), s.rank, s.timeout)


def _two_phase(s: StudyLayout):
    """The flat group's intra- and inter-node subgroups (moe_core.comm.hierarchical_a2a)."""
    from moe_core.comm.hierarchical_a2a import hierarchical_groups

    return hierarchical_groups(expert_layout(s.world, s.world, 1).groups("ep").tolist(), s.devices_per_node, s.timeout)


def _sharded(axis: str) -> Callable[[StudyLayout], Any]:
    """This rank's ``axis`` group of the tensor-parallel layout (world / tp experts, "tp" innermost)."""

    def build(s: StudyLayout):
        from moe_core.parallel.parallelize import own_group

        return own_group(expert_layout(s.world, s.world // s.tp, 1, s.tp).groups(axis), s.rank, s.timeout)

    return build


STUDY_GROUPS.register("flat", _flat)
STUDY_GROUPS.register("two_phase", _two_phase)
STUDY_GROUPS.register("ep", _sharded("ep"))
STUDY_GROUPS.register("tp", _sharded("tp"))
