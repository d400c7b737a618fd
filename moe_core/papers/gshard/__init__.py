"""GShard (Lepikhin et al., arXiv 2006.16668): the MoE model and its measured training step.

GShard's mechanisms are the suite's core (moe_core.gating: top-2 gating with capacity and random
routing; moe_core.layer and model: the MoE transformer; the ``sequential`` and ``overlap`` policies
of moe_core.policies), so this paper holds no code of its own: it names the measured sweep
(``paper: gshard``) and the figures of analysis/papers/gshard.py.
"""
