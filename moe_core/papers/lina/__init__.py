"""Lina (Li et al., USENIX ATC'23): all-to-all-aware training and inference scheduling.

* ``config``: the ``lina`` and ``inference`` config sections;
* ``decisions``: the training decisions (priority, partitioning, pipelining, packing), the plan,
  and the registration of Lina's policies;
* ``policy``: the measured executor of the priority rule;
* ``packing``: expert packing inside a training run (decide, then move the experts);
* ``placement`` + ``inference``: inference placement decisions and the placed expert-parallel layer.
"""

from moe_core.papers.lina import config, decisions, sweeps  # noqa: F401  (each registers itself)
