"""The roofline of a simulated GShard training step (Fig 8): each component's FLOPs per device at the
device's peak FLOP/s, and the all-to-all's bound at the torus links' line rate.

The FLOPs are those of the simulated stand-in (the suite's decoder blocks with GShard's dimensions,
moe_core/papers/gshard/models.py), written as GShard's einsums (Algorithm 2, papers.md §2.1); a
training step computes each three times (forward, and the input and weight gradients), and a block's
forward once more where the step rematerializes its blocks (``train.recompute=full``, the 36-layer
models, moe_core.papers.gshard.study.recompute):

* transformer: per layer the attention's projections (Q, K, V, output: 4 x 2 T d^2) and its scores
  and weighted sums (2 x 2 T s d); the dense FFNs (wi, wo: 2 x 2 T d h); the softmax head (2 T d V);
* gate: the gating einsum GSM,ME->GSE (2 T d E) per MoE layer;
* MoE FFN: EGCM,EMH->EGCH and EGCH,EHM->GECM (2 x 2 R d h) per MoE layer, R the capacity slots the
  device's experts compute, padding included (the einsums compute them).

* dispatch and combine: GSEC,GSM->EGCM and GSEC,GECM->GSM (2 S E C d per group each) per MoE layer,
  forward both, backward the combine's two gradients and the dispatch's one (its mask is constant):
  the GEMMs the simulated step prices under ``moe.permute=einsum`` (moe_core.sim.kernels). Fig 8 has
  no component of their own: they join the transformer's in ``dense_roofline_ms``, as the simulated
  step counts them in ``dense_ms``.
"""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from moe_core.model.capacity import DTYPE_BYTES, dispatch_rows_per_expert, moe_blocks
from moe_core.sim.topology import Transfer

PASSES = 3  # forward, and backward at twice its FLOPs
EXCHANGES_PER_MOE_LAYER = 4  # dispatch and combine, in the forward and the backward pass


def component_flops(cfg: DictConfig) -> dict[str, float]:
    """FLOPs per device of one training step of the simulated model ``cfg``, per Fig 8 component."""
    m, E = cfg.model, cfg.moe.num_experts
    T = cfg.train.batch_size * m.seq_len  # tokens per device
    moe_layers = len(moe_blocks(m.n_layers, m.moe_every))
    # every device is in the one expert-parallel group (experts = cores): its experts compute the slots
    # every device sends them
    rows = E * dispatch_rows_per_expert(cfg)
    groups = T // (cfg.moe.group_size or T)
    recomputed = int(cfg.train.recompute == "full")  # every block's forward once more
    attention = 2 * T * 4 * m.d_model**2 + 2 * 2 * T * m.seq_len * m.d_model
    blocks = m.n_layers * attention + (m.n_layers - moe_layers) * 2 * 2 * T * m.d_model * m.d_ff
    # one group's (S, E C) mask against its (S, d) tokens: 2 T (E C) d over the groups
    slot_gemm = moe_layers * 2 * T * (rows // groups) * m.d_model
    return {
        "transformer": (PASSES + recomputed) * blocks + PASSES * 2 * T * m.d_model * m.vocab_size,
        "gate": (PASSES + recomputed) * moe_layers * 2 * T * m.d_model * E,
        "expert": (PASSES + recomputed) * moe_layers * 2 * 2 * rows * m.d_model * m.d_ff,
        "dispatch_combine": (5 + 2 * recomputed) * slot_gemm,
    }


def line_rate_s(transfer: Transfer, topo) -> float:
    """The time of ``transfer`` at its links' line rate, no latency: its busiest link's bytes over
    that link's bandwidth."""
    return float(np.max(transfer.nbytes / topo.capacity[transfer.links]))


def a2a_bound_s(cfg: DictConfig, topo) -> float:
    """One MoE all-to-all (the uniform exchange of the dispatch buffer over the whole torus) at line rate."""
    m = cfg.model
    buffer_bytes = cfg.moe.num_experts * dispatch_rows_per_expert(cfg) * m.d_model * DTYPE_BYTES[cfg.train.dtype]
    return line_rate_s(topo.uniform_all_to_all(np.arange(topo.n), buffer_bytes), topo)


def roofline_ms(cfg: DictConfig, topo) -> dict[str, float]:
    """Each component's roofline in ms per step: compute at the profile's peak FLOP/s, the all-to-alls
    at line rate (``<component>_roofline_ms``)."""
    peak = cfg.hardware.peak_tflops * 1e12
    times = {name: 1e3 * flops / peak for name, flops in component_flops(cfg).items()}
    moe_layers = len(moe_blocks(cfg.model.n_layers, cfg.model.moe_every))
    times["dense"] = times["transformer"] + times["dispatch_combine"]
    times["a2a"] = 1e3 * EXCHANGES_PER_MOE_LAYER * moe_layers * a2a_bound_s(cfg, topo)
    return {f"{name}_roofline_ms": ms for name, ms in times.items()}
