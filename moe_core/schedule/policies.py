"""Communication policies: the registry and the baselines' decisions.

A policy is registered once (:func:`register_policy`) with its decisions (a plan builder: step
shapes -> moe_core.schedule.plan.CommPlan) and the name of its measured executor (a
moe_core.schedule.executor.CommPolicy subclass that runs the plan on torch.distributed, imported only by the
measured run). The simulator reads the plan of the same builder (:func:`build_plan`), so both
executors follow one set of decisions. The config's allowed policy names, the sweeps and the CLI
help come from ``POLICIES``; the papers' policies register from moe_core/papers/<paper>. This module
imports no torch, so configs load and validate quickly (the workflow, the launcher, the analysis).

Baselines:

* ``sequential``: all gradient buckets are all-reduced after the backward pass; nothing overlaps.
* ``overlap``: DDP/DeepSpeed-like. A bucket is all-reduced asynchronously, on its own communicator,
  as soon as all its gradients are ready, so it runs concurrently with (and contends with) the
  backward all-to-alls. This is the contention baseline Lina and Aurora compare against.

moe_core.schedule.executor.CommPolicy executes every plan feature that needs no scheduling of its own, so
these baselines and Aurora's policies use it as it is; Lina's priority rule has its own executor.

The plan's token exchange is the configured dispatcher (``moe.dispatcher``, moe_core.dispatch),
as the policy schedules it: a policy that schedules the all-to-all its own way decides a schedule
(moe_core.dispatch.scheduled: Lina's micro-ops, Aurora's transmission order) that the plan wraps
around the dispatcher; the baselines leave it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from moe_core.dispatch import Dispatcher, configured
from moe_core.dispatch.scheduled import Scheduled
from moe_core.parallel.grid import GridOverlaps
from moe_core.parallel.layout import grid_config
from moe_core.registry import Registry
from moe_core.schedule.plan import CommPlan, GradientTensor, Relayout, bucket_units

DEFAULT_EXECUTOR = "moe_core.schedule.executor:CommPolicy"


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is decided from: one rank's gradient tensors and the configured unit sizes."""

    tensors: list[GradientTensor]  # in the order backward produces them
    element_bytes: int  # of one gradient element as the executor reduces it
    bucket_bytes: int  # comm.bucket_mb
    micro_op_bytes: float  # comm.partition_mb


@dataclass(frozen=True)
class PolicySpec:
    """A registered policy: its decisions and its measured executor (``module:Class``, imported by
    moe_core.schedule.executor.make_policy when a measured run starts).

    ``a2a_order``: the transmission order its all-to-alls run in (None: the library's), also offered
    to the measured inference (``inference.a2a_policy``). ``micro_op_size_in_name``: its results
    depend on ``comm.partition_mb``, so the point's name carries it.
    """

    name: str
    decide: Callable[[PlanInputs], CommPlan]
    executor: str = DEFAULT_EXECUTOR
    a2a_order: str | None = None
    micro_op_size_in_name: bool = False


POLICIES: Registry[PolicySpec] = Registry("communication policy")


def register_policy(spec: PolicySpec) -> PolicySpec:
    return POLICIES.register(spec.name, spec)


def policy_spec(name: str) -> PolicySpec:
    return POLICIES.lookup(name)


def step_exchange(cfg, schedule: Scheduled | None) -> Dispatcher:
    """The token exchange a step of ``cfg`` runs: the configured dispatcher, under the policy's
    ``schedule`` where it decides one."""
    chosen = configured(cfg)
    return chosen if schedule is None else schedule.over(chosen)


def build_plan(cfg, tensors: list[GradientTensor], element_bytes: int) -> CommPlan:
    """The plan of ``cfg.comm.policy`` (and ``moe.dispatcher``) for one rank's gradient ``tensors``
    (moe_core.schedule.gradients.gradient_tensors): the one decision both executors follow (``element_bytes``: a
    gradient element's size as that executor reduces it)."""
    plan = policy_spec(cfg.comm.policy).decide(_plan_inputs(cfg, tensors, element_bytes))
    return replace(
        plan,
        tensors=tuple(tensors),
        exchange=step_exchange(cfg, plan.exchange),
        grid_overlaps=None if grid_config(cfg).is_trivial else GridOverlaps(**cfg.comm.grid_overlap),
    )


def _plan_inputs(cfg, tensors: list[GradientTensor], element_bytes: int) -> PlanInputs:
    return PlanInputs(tensors, element_bytes, int(cfg.comm.bucket_mb * 2**20), cfg.comm.partition_mb * 2**20)


def layout_decisions(cfg, element_bytes: int) -> tuple[Dispatcher, Relayout | None]:
    """What ``cfg``'s plan decides whatever the gradients: the step's token exchange and its
    re-layout hook (decided on no gradients). An executor that takes the layout decision before
    the step (the simulator) reads them first, then builds the plan once, on the layout it trains on."""
    plan = policy_spec(cfg.comm.policy).decide(_plan_inputs(cfg, [], element_bytes))
    return step_exchange(cfg, plan.exchange), plan.relayout


def step_refusal(cfg) -> tuple[str, str] | None:
    """(config key, why) where ``cfg``'s step cannot run the policy's schedule of its dispatcher or
    its re-layout, None where it can (the dispatcher's own needs: moe_core.dispatch.configuration_refusal,
    which config validation checks first). Each part states its own needs (``refusal``); the key is
    ``comm.policy``, whose plan is decided on no gradients, so torch-free and instant."""
    plan = policy_spec(cfg.comm.policy).decide(PlanInputs([], 4, 1, 1.0))
    exchange = step_exchange(cfg, plan.exchange)
    policy = f"policy '{cfg.comm.policy}': "
    if plan.exchange is not None and (reason := exchange.refusal(cfg)):
        return "comm.policy", policy + reason
    if plan.relayout is not None and (reason := plan.relayout.refusal(cfg, exchange)):
        return "comm.policy", policy + reason
    return None


def gradient_features(cfg) -> list[str]:
    """What ``cfg.comm.policy``'s plan decides for the gradients beyond DDP's buckets and launch
    rule (decided on one probe tensor, so torch-free and instant): full data sharding replaces the
    plan's gradient units by FSDP's per-block ones, so config validation refuses these with it."""
    plan = policy_spec(cfg.comm.policy).decide(PlanInputs([GradientTensor("probe", 1, "dense")], 4, 1, 1.0))
    features = {
        "yields its gradients to the all-to-alls": plan.gradients_yield_to_a2a,
        "cuts its gradients into micro-ops": any(not unit.fused for unit in plan.gradient_units),
    }
    return [name for name, on in features.items() if on]


def sequential_plan(inputs: PlanInputs) -> CommPlan:
    units = bucket_units(inputs.tensors, inputs.element_bytes, inputs.bucket_bytes)
    return CommPlan(units, launch_when_ready=False)


def overlap_plan(inputs: PlanInputs) -> CommPlan:
    units = bucket_units(inputs.tensors, inputs.element_bytes, inputs.bucket_bytes)
    return CommPlan(units, launch_when_ready=True)


register_policy(PolicySpec("sequential", sequential_plan))
register_policy(PolicySpec("overlap", overlap_plan))
