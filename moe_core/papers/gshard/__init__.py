"""GShard (Lepikhin et al., arXiv 2006.16668): the MoE model, its measured training step, and its
scaling study on the TPU v3 torus.

GShard's mechanisms are the suite's core (moe_core.model.gating: top-2 gating with capacity and random
routing; moe_core.model.layer and model: the MoE transformer; the ``sequential`` and ``overlap`` policies
of moe_core.schedule.policies), so the measured sweep (``paper: gshard``) needs no code of its own. The
simulated scaling study is this folder's (experiments/gshard.py runs it):

* ``models``: Table 1's models, Table 3's batches and training-cost arithmetic, and how the
  decoder-only step simulator stands in for GShard's encoder-decoder;
* ``memory``: per-core memory by kind (Fig 7): replicated and distributed weights, Adafactor's
  state, activations;
* ``roofline``: FLOPs of the simulated step's components and their time at peak, and the
  all-to-all's bandwidth bound (Fig 8);
* ``torus``: slices of the TPU v3 pod for the collectives' scaling (Fig 9);
* ``study``: the study's experiments and points, and the simulation of each (the entry point writes
  their records);
* ``config``: the ``gshard`` config section, every unstated parameter with its reasoning.
"""

from moe_core.papers.gshard import config  # noqa: F401  (registers the config section)
