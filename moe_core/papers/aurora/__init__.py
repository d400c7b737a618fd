"""Aurora (Li et al., arXiv 2410.17043): MoE inference time from transmission order and deployment.

* ``config``: the ``aurora`` config section;
* ``transmission_order``: Algorithm 1 and the SJF / RCS baselines (registered orders);
* ``colocation``: expert-to-GPU assignment and two-model colocation;
* ``deployment``: per setting and policy, where each served model's experts sit and the order of
  their all-to-alls;
* ``policy``: the training policies ``aurora``, ``aurora-sjf``, ``aurora-rcs`` (registered);
* ``inference_sim`` + ``study``: the deployments timed by the simulator's forward executor on the
  big switch, and the simulated experiments.
"""

from moe_core.papers.aurora import config, policy, transmission_order  # noqa: F401  (each registers itself)
