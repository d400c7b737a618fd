"""AxoNN (Singh et al., arXiv 2305.13525): 3D tensor parallelism of every linear layer on a 4D grid
(data x depth x row x col; the mechanism is the core's, moe_core.parallel.grid and moe_core.parallel.grid_parallel),
its overlaps of collectives with compute, and a communication model that ranks grids.

* ``comm_model``: the ring costs of the grid's collectives with the Plexus placement-aware
  bandwidths, memory, the enumeration and ranking of grids;
* ``models``: the GPT models of the weak-scaling study;
* ``baseline``: the Megatron-LM-style layout and pipeline schedule AxoNN is compared against;
* ``config``: the ``axonn`` config section and the overlap variants;
* ``sweeps``: the measured grid sweep's points, their record params and the model's prediction for each;
* ``study``: the simulated Perlmutter-scale study: its experiments and points, and the simulation of
  each (experiments/axonn.py writes their records).
"""

from moe_core.papers.axonn import config, sweeps  # noqa: F401  (each registers itself: the section, the run checks)
