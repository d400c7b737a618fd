"""GShard top-1/top-2 gating with local group dispatching, capacity and random routing.

Follows GShard Algorithm 1 (arXiv 2006.16668v1) and its reference code (lingvo
``Top2GatingOnLogits``), for tokens already split into G groups of S tokens:

* gates g = softmax(logits); top-1 expert e1 and (top-2) second expert e2;
  with top-2 both gates are renormalised, g1 <- g1/(g1+g2), g2 <- g2/(g1+g2); top-1 keeps raw g1.
* Buffer positions: top-1 assignments take slots before any top-2 assignment of the same group
  (lingvo offsets position_in_expert_2 by the top-1 count); positions past the capacity C are
  dropped. A token whose every assignment is dropped gets a zero combine vector and passes through
  the residual connection ("overflowed" in the paper).
* Random routing: the 2nd expert is kept only if 2*g2 > U(0,1) (lingvo's threshold 0.5). As in
  lingvo, a rejected assignment takes no slot (the paper's pseudo-code counts it anyway).
* Auxiliary load-balancing loss, per group l_aux = (1/E) sum_e (c_e/S) m_e, where c_e counts tokens
  whose top-1 is e and m_e is the mean gate of e; averaged over groups. ``aux_loss_scale="e2"``
  multiplies by E^2 (lingvo, DeepSpeed, Tutel), so perfectly uniform routing gives 1 instead of 1/E^2
  (c_e/S = m_e = 1/E for every e: (1/E) * E * (1/E^2)).
* Dropless mode (``capacity=None``): every assignment is kept.

The result is a dispatch plan, independent of how tokens are moved (all-to-all or local copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GatingResult:
    expert_index: torch.Tensor  # (G, S, k) long: chosen expert per token and choice
    slot: torch.Tensor  # (G, S, k) long: position in the expert's buffer of that group
    combine_weight: torch.Tensor  # (G, S, k) float: gate weight, 0 where not kept
    kept: torch.Tensor  # (G, S, k) bool: assignment dispatched
    aux_loss: torch.Tensor  # () float
    tokens_per_expert: torch.Tensor  # (E,) long: kept assignments per expert, summed over groups
    dropped_fraction: torch.Tensor  # () float: share of wanted assignments dropped by capacity


def gshard_gating(
    logits: torch.Tensor,
    top_k: int,
    capacity: int | None,
    noise: torch.Tensor | None = None,
    aux_loss_scale: str = "e2",
) -> GatingResult:
    """Route tokens of G groups to experts.

    Args:
        logits: (G, S, E) gate logits.
        top_k: 1 or 2.
        capacity: slots per expert and group (C), or None for dropless routing.
        noise: (G, S) U(0,1) draws for random routing of the 2nd expert; None keeps every 2nd choice.
        aux_loss_scale: "paper" for GShard's (1/E) sum_e (c_e/S) m_e, "e2" for E^2 times that.
    """
    if top_k not in (1, 2):
        raise ValueError(f"top_k must be 1 or 2, got {top_k}")
    G, S, E = logits.shape
    gates = F.softmax(logits.float(), dim=-1)  # (G, S, E)
    g1, e1 = gates.max(dim=-1)  # (G, S)
    mask1 = F.one_hot(e1, E)  # (G, S, E)

    density = mask1.float().mean(dim=1)  # (G, E): c_e / S
    mean_gate = gates.mean(dim=1)  # (G, E): m_e
    aux = (density * mean_gate).sum(dim=-1).mean() / E
    if aux_loss_scale == "e2":
        aux = aux * E * E
    elif aux_loss_scale != "paper":
        raise ValueError(f"aux_loss_scale must be 'paper' or 'e2', got {aux_loss_scale!r}")

    count1 = mask1.sum(dim=1, keepdim=True)  # (G, 1, E)
    slot1 = ((mask1.cumsum(dim=1) - 1) * mask1).sum(dim=-1)  # (G, S)
    if top_k == 1:
        experts, slots, weights = e1[..., None], slot1[..., None], g1[..., None]
        wanted = torch.ones_like(slots, dtype=torch.bool)
    else:
        g2, e2 = gates.masked_fill(mask1.bool(), -1.0).max(dim=-1)  # (G, S)
        denom = g1 + g2
        g1, g2 = g1 / denom, g2 / denom
        keep2 = torch.ones_like(g2, dtype=torch.bool) if noise is None else 2.0 * g2 > noise
        mask2 = F.one_hot(e2, E) * keep2[..., None]  # (G, S, E)
        slot2 = ((mask2.cumsum(dim=1) - 1 + count1) * mask2).sum(dim=-1)  # (G, S)
        experts = torch.stack([e1, e2], dim=-1)
        slots = torch.stack([slot1, slot2], dim=-1)
        weights = torch.stack([g1, g2], dim=-1)
        wanted = torch.stack([torch.ones_like(keep2), keep2], dim=-1)

    kept = wanted if capacity is None else wanted & (slots < capacity)
    combine = weights * kept
    tokens_per_expert = F.one_hot(experts, E).mul(kept[..., None]).sum(dim=(0, 1, 2))
    n_wanted = wanted.sum()
    dropped = (n_wanted - kept.sum()).float() / n_wanted.clamp(min=1)
    return GatingResult(experts, slots, combine, kept, aux, tokens_per_expert, dropped)
