"""Aurora's training-time policies: sequential gradient sync, every MoE all-to-all in a
transmission order planned from the exchange's real traffic matrix (Li et al., arXiv 2410.17043).

* ``aurora``: the paper's Algorithm 1 (bottleneck GPU first, conflict-free);
* ``aurora-sjf``: shortest flow first per sender; ``aurora-rcs``: random order per sender (the
  paper's baselines).

The orders are registered by ``transmission_order.py``; the plan's exchange is the all-to-all in
that order (moe_core.dispatch.scheduled.Ordered), which all-gathers the traffic matrix before each
forward exchange (timed as part of the all-to-all) and runs the order as point-to-point rounds
(moe_core.comm.ordered_a2a), on the shared executor (moe_core.schedule.executor.CommPolicy).
"""

from __future__ import annotations

from dataclasses import replace

from moe_core.dispatch.scheduled import Ordered
from moe_core.papers.aurora import transmission_order  # noqa: F401  (registers the orders named below)
from moe_core.schedule.plan import CommPlan
from moe_core.schedule.policies import PlanInputs, PolicySpec, register_policy, sequential_plan

POLICY_ORDERS = {"aurora": "aurora", "aurora-sjf": "sjf", "aurora-rcs": "rcs"}


def ordered_plan(order: str, inputs: PlanInputs) -> CommPlan:
    """The sequential baseline's gradient sync, with every all-to-all in ``order``."""
    return replace(sequential_plan(inputs), exchange=Ordered(order=order))


for _name, _order in POLICY_ORDERS.items():
    register_policy(PolicySpec(_name, lambda inputs, order=_order: ordered_plan(order, inputs), a2a_order=_order))
