"""The training step's metrics, one definition for both executors.

The measured run (experiments/train_step.py, from its phase timers) and the simulator
(moe_core.sim.timeline, from its simulated timeline) each time the same things, the step, the MoE layers' phases,
the exposed gradient sync, and hand them here, so a record of either executor names and composes its
terms the same way: the step is dense compute + MoE layers (gate, all-to-all, experts) + exposed
gradient sync + exposed parameter gathers, ``dense_ms`` being what is left.
"""

from __future__ import annotations

# The timed phases of an MoE layer in a training step, each recorded as ``<phase>.fwd`` and
# ``<phase>.bwd`` (measured) and as ops of these phases (simulated); both report ``<phase>_ms``.
STEP_PHASES = ("gate", "dispatch_a2a", "expert", "combine_a2a")
MOE_TERMS = ("gate_ms", "a2a_ms", "expert_ms")  # the MoE layers' terms: moe_layer_ms is their sum


def step_terms(
    step_ms: float,
    phases_ms: dict[str, float],
    a2a_ms: float,
    a2a_fwd_ms: float,
    a2a_bwd_ms: float,
    allreduce_exposed_ms: float,
    param_gather_exposed_ms: float = 0.0,
) -> dict[str, float]:
    """The step's terms in ms from its measured or simulated times: ``phases_ms`` per STEP_PHASES
    (forward + backward), the all-to-all wait ``a2a_ms`` (dispatch + combine) and by direction, the
    gradient sync's exposed wait and a sharded run's exposed parameter gathers."""
    moe = phases_ms["gate"] + a2a_ms + phases_ms["expert"]  # MOE_TERMS
    return {
        "step_ms": step_ms,
        **{f"{p}_ms": phases_ms[p] for p in STEP_PHASES},
        "a2a_ms": a2a_ms,
        "a2a_fwd_ms": a2a_fwd_ms,
        "a2a_bwd_ms": a2a_bwd_ms,
        "moe_layer_ms": moe,
        "allreduce_exposed_ms": allreduce_exposed_ms,
        # attention, embeddings, dense FFNs (with a grid's collectives), loss, optimizer
        "dense_ms": step_ms - moe - allreduce_exposed_ms - param_gather_exposed_ms,
    }


def a2a_shares(a2a_ms: float, moe_layer_ms: float, step_ms: float) -> dict[str, float]:
    """The all-to-all's share of the step and of the MoE layers (0 without MoE time)."""
    return {"a2a_share": a2a_ms / step_ms, "a2a_share_of_moe": a2a_ms / moe_layer_ms if moe_layer_ms else 0.0}
