"""MoNTA (Guo et al., arXiv 2411.00662): the MoE all-to-all under tensor parallelism, pipelined with
the all-gather that restores the tensor-parallel duplicates, and a network-traffic-aware choice of
the parallel layout.

* ``performance_model``: the alpha-beta model of the three dispatch paths, the chunk count and the
  ranking of (tp, ep, dp) layouts;
* ``decisions``: the ``monta`` dispatch (registered), its chunk count from the model;
* ``config``: the ``monta`` config section;
* ``sweeps``: its measured and simulated training-step points;
* ``study``: the performance model at the paper's setting: the strategy ranking and the chunk-count
  curve, point by point (experiments/monta.py writes their records).
"""

from moe_core.papers.monta import config, decisions, sweeps  # noqa: F401  (each registers itself)
