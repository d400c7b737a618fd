"""Lina (Li et al., USENIX ATC'23): all-to-all-aware training and inference scheduling.

* ``config``: the ``lina`` and ``inference`` config sections;
* ``decisions``: the training decisions (priority, partitioning, pipelining, packing) and the plan;
* ``policy``: the measured priority scheduler and the registration of Lina's policies;
* ``packing``: expert packing inside a training run (decide, then move the experts);
* ``placement`` + ``inference``: inference placement decisions and the placed expert-parallel layer.
"""

from . import config, policy, sweeps  # noqa: F401  (each registers itself)
